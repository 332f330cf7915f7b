"""``tmpl.integrations.renderers.TmplRenderer`` with the real ``renderers`` package, on real tokenizers.

Every "equals" is against transformers' own ``apply_chat_template(tokenize=True)`` render of the
whole conversation. The completion of a turn is what the model would have generated: the full
render's tokens after the prompt through the first stop token after the calls. Skips without
``renderers`` (``pip install 'tmpl[renderers]'``) or the tokenizer data.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

pytest.importorskip("renderers", reason="renderers is not installed (pip install 'tmpl[renderers]')")

from renderers import Qwen3RendererConfig, create_renderer
from renderers.base import MODEL_RENDERER_MAP, Renderer, ToolCallParseStatus, build_training_sample
from renderers.configs import CustomRendererConfig

import tmpl
from tmpl.integrations.renderers import TmplRenderer, TmplRendererConfig
from tmpl.report import SAFE, SAFE_WITH

from .conftest import FAMILIES, HUB_IDS, catalog, load_tokenizer, template_under_test
from .contract import TOOLS, assistant_turn, full_render, marker, renders_tool_turn, tool_results

IMPORT_PATH = "tmpl.integrations.renderers.TmplRenderer"
KEYS = list(FAMILIES) + [e["template"] for e in catalog()]
USER = [{"role": "user", "content": "What is the weather in Paris and Tokyo?"}]


def ids_of(tpl: tmpl.ChatTemplate, messages: list[dict], add_generation_prompt: bool, tools=TOOLS) -> list[int]:
    """transformers' own tokenized render (the ground truth)."""
    out = tpl.tokenizer.apply_chat_template(
        messages,
        tools=tools,
        chat_template=tpl.template,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        **tpl.template_kwargs,
    )
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def generated(
    tpl: tmpl.ChatTemplate, text: str, full: list[int], start: int, calls: int, round_: int
) -> list[int] | None:
    """The tokens the model generated in the full render: from ``start`` through the first stop token
    after the last call's marker (None when the render has none)."""
    enc = tpl.tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
    assert enc.ids == full
    found = [text.find(marker(round_, i)) for i in range(calls)]
    if min(found) < 0:  # the template does not render the calls: no completion ends there
        return None
    pos = max(f + len(marker(round_, i)) for i, f in enumerate(found))
    stop = next((t for t, (s, _) in enumerate(enc.offsets) if s >= pos and full[t] in tpl.stop_token_ids), None)
    return None if stop is None else full[start : stop + 1]


def play(renderer: TmplRenderer, tpl: tmpl.ChatTemplate, calls: int) -> list[tuple[list[int], object]]:
    """Two tool rounds token-in/token-out through ``renderer``: ``(full render, bridge)`` per round that
    transformers can render (the bridge's output is the next round's prompt)."""
    history = list(USER)
    try:
        prompt = renderer.render_ids(history, tools=TOOLS, add_generation_prompt=True)
    except tmpl.errors.TemplateRenderError:
        with pytest.raises(Exception):  # noqa: B017 - whatever the template raises, transformers raises it too
            ids_of(tpl, history, True)
        return []
    assert prompt == ids_of(tpl, history, True), "render_ids differs from apply_chat_template"
    out = []
    for round_ in (0, 1):
        assistant = assistant_turn(calls, round_=round_)
        results = tool_results(assistant, [f"result {round_}.{i}: 21 C" for i in range(calls)])
        if not renders_tool_turn(tpl, history, assistant, results):
            break
        text, full = full_render(tpl, history + [assistant] + results)
        completion = generated(tpl, text, full, len(prompt), calls, round_)
        if full[: len(prompt)] != prompt or completion is None:
            out.append((full, "no token-in/token-out prompt"))
            break
        bridged = renderer.bridge_to_next_turn(prompt, completion, results, tools=TOOLS)
        out.append((full, bridged))
        if bridged is None:
            break
        history += [assistant] + results
        prompt = bridged.token_ids
    return out


@pytest.fixture(scope="module")
def qwen25():
    return template_under_test("qwen2.5-instruct")


# -- the protocol and the plug-in ----------------------------------------------------------------
def test_plugs_in_through_custom_renderer_config_with_template_kwargs():
    tok = load_tokenizer("qwen3")
    renderer = create_renderer(tok, CustomRendererConfig(import_path=IMPORT_PATH, enable_thinking=False))
    assert isinstance(renderer, TmplRenderer) and isinstance(renderer, Renderer)
    assert renderer.tpl.template_kwargs == {"enable_thinking": False}
    messages = [{"role": "user", "content": "Hi"}]
    expected = tok.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False, tokenize=True)
    expected = list(expected["input_ids"] if hasattr(expected, "keys") else expected)
    assert renderer.render_ids(messages, add_generation_prompt=True) == expected
    # the kwarg changed the render: without it, Qwen3's generation prompt has no empty think block
    assert renderer.render_ids(messages, add_generation_prompt=True) != TmplRenderer(tok).render_ids(
        messages, add_generation_prompt=True
    )


def test_thinking_retention_is_refused_with_a_typed_error():
    with pytest.raises(tmpl.errors.TrainerConfigError, match="thinking_retention"):
        TmplRenderer(load_tokenizer("qwen2.5-instruct"), TmplRendererConfig(thinking_retention="all"))


def test_missing_renderers_says_how_to_install(monkeypatch):
    import importlib.util

    import tmpl.integrations.renderers as integration

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "renderers" else real(name, *a))
    with pytest.raises(tmpl.errors.IntegrationNotInstalledError, match=r"tmpl\[renderers\]"):
        integration.TmplRenderer  # noqa: B018


def test_stop_tokens_are_the_templates_turn_closes(qwen25):
    renderer = TmplRenderer.from_template(qwen25)
    im_end = qwen25.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in renderer.get_stop_token_ids()
    llama = TmplRenderer.from_template(template_under_test("llama-3.2-instruct"))
    assert llama.tpl.tokenizer.convert_tokens_to_ids("<|eot_id|>") in llama.get_stop_token_ids()


# -- the bridge on every family and catalog template ---------------------------------------------
@pytest.mark.parametrize("key", KEYS, ids=[Path(k).name for k in KEYS])
def test_bridge_is_the_full_renders_suffix_or_none_where_not_safe(key, caplog):
    tpl = template_under_test(key)
    renderer = TmplRenderer.from_template(tpl)
    verdict = tmpl.report.check(tpl).verdicts["tool_loop"]
    played = []
    for calls in (1, 2):
        with caplog.at_level(logging.INFO, logger="tmpl.integrations.renderers"):
            played += play(renderer, tpl, calls)
    bridges = [b for _, b in played if not isinstance(b, str)]
    if verdict.level != SAFE:
        assert all(b is None for b in bridges), f"{key}: bridged although the verdict is {verdict.label}"
        if bridges:
            assert verdict.label in renderer.last_bridge_reason
            assert any(verdict.label in r.getMessage() for r in caplog.records), "the refusal is not logged"
        if verdict.level == SAFE_WITH:  # tmpl's rewrite, asked for, bridges to exactly its own full render
            safe = TmplRenderer.from_template(tpl, TmplRendererConfig(training_safe=True))
            assert safe.tpl.name == verdict.template
            rewritten = [b for calls in (1, 2) for b in play(safe, safe.tpl, calls)]
            assert rewritten and all(not isinstance(b, (str, type(None))) and b.token_ids == f for f, b in rewritten)
        return
    # SAFE: every round that plays token-in/token-out bridges to exactly the full render
    assert played, f"{key}: SAFE but no tool conversation rendered"
    for full, bridged in played:
        assert not isinstance(bridged, str), f"{key}: SAFE but {bridged}"
        if bridged is None:  # the one documented refusal of a SAFE template: results depend on history
            assert "earlier messages" in renderer.last_bridge_reason
            continue
        assert bridged.token_ids == full, f"{key}: bridge differs from the full render"
        assert not any(bridged.sampled_mask)


def test_some_bridges_run(qwen25):
    """The parametrized test above cannot pass by refusing everything: Qwen2.5 and Llama 3.2 bridge."""
    for tpl in (qwen25, template_under_test("llama-3.2-instruct")):
        played = play(TmplRenderer.from_template(tpl), tpl, 1)
        assert len(played) == 2 and all(b is not None and b.token_ids == full for full, b in played)


def test_a_truncated_completion_gets_the_turn_close_then_the_suffix(qwen25):
    renderer = TmplRenderer.from_template(qwen25)
    prompt = renderer.render_ids(USER, tools=TOOLS, add_generation_prompt=True)
    assistant = {"role": "assistant", "content": "Let me check the weather in Paris and"}
    results = [{"role": "tool", "content": "cut"}]
    full = ids_of(qwen25, USER + [assistant] + results, True)
    close = qwen25.tokenizer.convert_tokens_to_ids("<|im_end|>")
    stop = full.index(close, len(prompt))
    truncated = full[len(prompt) : stop]  # the model ran out of tokens before its turn close
    bridged = renderer.bridge_to_next_turn(prompt, truncated, results, tools=TOOLS)
    assert bridged.token_ids == full


def test_new_user_and_assistant_messages_are_not_bridged(qwen25, caplog):
    renderer = TmplRenderer.from_template(qwen25)
    prompt = renderer.render_ids(USER, add_generation_prompt=True)
    close = qwen25.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for new in ([{"role": "user", "content": "And Rome?"}], [{"role": "assistant", "content": "x"}], []):
        with caplog.at_level(logging.INFO, logger="tmpl.integrations.renderers"):
            assert renderer.bridge_to_next_turn(prompt, [close], new) is None
        assert renderer.last_bridge_reason
    assert any("re-render" in r.getMessage() for r in caplog.records)


def test_bridge_attributes_tool_contents(qwen25):
    renderer = TmplRenderer.from_template(qwen25)
    prompt = renderer.render_ids(USER, tools=TOOLS, add_generation_prompt=True)
    assistant = assistant_turn(2)
    contents = ["result 0: 21 C", "result 1: sunny"]
    results = tool_results(assistant, contents)
    text, full = full_render(qwen25, USER + [assistant] + results)
    completion = generated(qwen25, text, full, len(prompt), 2, 0)
    bridged = renderer.bridge_to_next_turn(prompt, completion, results, tools=TOOLS)
    prior = len(prompt) + len(completion)
    assert bridged.message_indices[:prior] == [-1] * prior and not any(bridged.is_content[:prior])
    assert all(n > 0 for n in bridged.tokens_per_message(2))
    for j, content in enumerate(contents):
        picked = [t for t, c, i in zip(bridged.token_ids, bridged.is_content, bridged.message_indices) if c and i == j]
        assert qwen25.tokenizer.decode(picked) == content
    # the generation prompt closes the sequence and belongs to no message
    assert bridged.message_indices[-1] == -1


# -- where renderers' own renderer is exact, both agree ------------------------------------------
OWN = [f for f in FAMILIES if MODEL_RENDERER_MAP.get(HUB_IDS[f])]


def o200k_base(tokenizer_json: Path, folder: Path) -> None:
    """``o200k_base.tiktoken`` rebuilt from the gpt-oss ``tokenizer.json`` (renderers' gpt-oss renderer
    would download it): each byte-level BPE token's bytes, base64, and its rank (its ID below the specials)."""
    import base64
    import json

    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    byte_of = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            byte_of[chr(256 + extra)] = b
            extra += 1
    vocab = json.loads(tokenizer_json.read_text(encoding="utf-8"))["model"]["vocab"]
    lines = [
        f"{base64.b64encode(bytes(byte_of[ch] for ch in token)).decode()} {rank}\n"
        for token, rank in sorted(vocab.items(), key=lambda item: item[1])
        if rank < 199998  # o200k_base's ranks; gpt-oss's special tokens follow
    ]
    (folder / "o200k_base.tiktoken").write_text("".join(lines), encoding="ascii")


@pytest.mark.parametrize("family", OWN)
def test_agrees_with_renderers_own_renderer_where_that_is_exact(family, tmp_path, monkeypatch):
    tpl = template_under_test(family)
    if family == "gpt-oss":  # offline: openai-harmony reads the encoding from TIKTOKEN_ENCODINGS_BASE
        o200k_base(Path(tpl.tokenizer.name_or_path) / "tokenizer.json", tmp_path)
        monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(tmp_path))
    theirs = create_renderer(tpl.tokenizer, _own_config(family))
    verdict = tmpl.report.check(tpl).verdicts["tool_loop"]
    # a template tmpl proves only through its own rewrite: compare that (it renders these turns as the original)
    ours = TmplRenderer.from_template(tpl, TmplRendererConfig(training_safe=verdict.level == SAFE_WITH))
    played = 0
    for calls in (1, 2):
        history = list(USER)
        assistant = assistant_turn(calls)
        results = tool_results(assistant, [f"result {i}" for i in range(calls)])
        if not renders_tool_turn(tpl, history, assistant, results):
            continue
        text, full = full_render(tpl, history + [assistant] + results)
        prompt = ids_of(tpl, history, True)
        completion = generated(tpl, text, full, len(prompt), calls, 0)
        if full[: len(prompt)] != prompt or completion is None:
            continue
        played += 1
        mine = ours.bridge_to_next_turn(prompt, completion, results, tools=TOOLS)
        other = theirs.bridge_to_next_turn(prompt, completion, results, tools=TOOLS)
        if mine is not None:
            assert mine.token_ids == full
        if other is not None and other.token_ids == full:
            if mine is None:  # declined: only where tmpl's verdict is not SAFE, and it says so
                assert verdict.level != SAFE and verdict.label in ours.last_bridge_reason
            else:
                assert mine.token_ids == other.token_ids
    # DeepSeek V3's own template does not render the calls: no turn of it is token-in/token-out
    assert played or family == "deepseek-v3", f"{family}: no tool turn to compare"


def _own_config(family: str):
    from renderers import configs

    name = MODEL_RENDERER_MAP[HUB_IDS[family]]
    for cls in vars(configs).values():
        if isinstance(cls, type) and issubclass(cls, configs.BaseRendererConfig) and "name" in cls.model_fields:
            if cls.model_fields["name"].default == name:
                return cls()
    raise LookupError(name)


def test_qwen3_both_exact_and_equal():
    """The one family where both renderers bridge these turns: the comparison above is not vacuous."""
    tpl = template_under_test("qwen3")
    theirs = create_renderer(tpl.tokenizer, Qwen3RendererConfig())
    ours = TmplRenderer.from_template(tpl, TmplRendererConfig(training_safe=True))
    assert ours.tpl.name == "qwen3" and ours.tpl.template != tpl.template  # tmpl's rewrite
    history, assistant = list(USER), assistant_turn(2)
    results = tool_results(assistant, ["a", "b"])
    text, full = full_render(tpl, history + [assistant] + results)
    prompt = ids_of(tpl, history, True)
    completion = generated(tpl, text, full, len(prompt), 2, 0)
    mine = ours.bridge_to_next_turn(prompt, completion, results, tools=TOOLS)
    other = theirs.bridge_to_next_turn(prompt, completion, results, tools=TOOLS)
    assert mine.token_ids == other.token_ids == full


# -- parse_response ------------------------------------------------------------------------------
COMPLETIONS = {
    "ok": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
    "bad_json": '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}\n</tool_call><|im_end|>',
    "no_name": '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
    "unclosed": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n',
    "cut": '<tool_call>\n{"name": "get_weather", "argu',
    "mixed": 'Let me see.<tool_call>\n{"name": "get_time", "arguments": {"city": "Rome"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather" "arguments": {}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>',
    "text": "It is 21 C in Paris.<|im_end|>",
}


@pytest.mark.parametrize("case", list(COMPLETIONS))
def test_parse_response_statuses_match_renderers_qwen3(case):
    tok = load_tokenizer("qwen3")
    ids = tok.encode(COMPLETIONS[case], add_special_tokens=False)
    mine = TmplRenderer(tok).parse_response(ids, tools=TOOLS)
    other = create_renderer(tok, Qwen3RendererConfig(enable_thinking=False)).parse_response(ids, tools=TOOLS)
    assert [c.status for c in mine.tool_calls] == [c.status for c in other.tool_calls]
    ok = [(c.name, c.arguments, c.token_span) for c in mine.tool_calls if c.status == ToolCallParseStatus.OK]
    assert ok == [(c.name, c.arguments, c.token_span) for c in other.tool_calls if c.status == ToolCallParseStatus.OK]
    assert mine.content == other.content
    if case != "ok" and case != "text":
        assert any(c.status != ToolCallParseStatus.OK for c in mine.tool_calls)


# -- masks ---------------------------------------------------------------------------------------
def conversation() -> list[dict]:
    assistant = assistant_turn(2)
    return USER + [assistant] + tool_results(assistant, ["21 C", "sunny"]) + [{"role": "assistant", "content": "Warm."}]


def test_sampled_mask_is_what_the_model_generated(qwen25):
    """sampled_mask: 1 after each assistant turn's generation prompt through its stop token, from
    transformers' renders of each prefix; the loss mask of renderers' build_training_sample is it too."""
    messages = conversation()
    renderer = TmplRenderer.from_template(qwen25)
    rendered = renderer.render(messages, tools=TOOLS)
    full = ids_of(qwen25, messages, False)
    assert rendered.token_ids == full
    expected = [False] * len(full)
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            start = len(ids_of(qwen25, messages[:i], True))
            stop = next(t for t in range(start, len(full)) if full[t] in qwen25.stop_token_ids)
            expected[start : stop + 1] = [True] * (stop + 1 - start)
    assert rendered.sampled_mask == expected and sum(expected) > 10
    assert build_training_sample(renderer, messages, tools=TOOLS).loss_mask == expected
    # each sampled token is its assistant turn's; the user's content is content
    assert {rendered.message_indices[k] for k in range(len(full)) if expected[k]} == {1, 4}
    user = [t for t, c, i in zip(full, rendered.is_content, rendered.message_indices) if c and i == 0]
    assert qwen25.tokenizer.decode(user) == USER[0]["content"]


def test_sampled_mask_equals_the_generation_markers_of_tmpls_template():
    """On tmpl's qwen3 template (which marks generated text with {% generation %}), sampled_mask is
    transformers' own assistant mask."""
    renderer = TmplRenderer(load_tokenizer("qwen3"), TmplRendererConfig(chat_template="qwen3"))
    tpl = renderer.tpl
    assert tpl.template == tmpl.templates.load("qwen3")
    messages = conversation()
    out = tpl.tokenizer.apply_chat_template(
        messages,
        tools=TOOLS,
        chat_template=tpl.template,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    rendered = renderer.render(messages, tools=TOOLS)
    assert rendered.token_ids == list(out["input_ids"])
    assert [int(x) for x in rendered.sampled_mask] == list(out["assistant_masks"]) and any(rendered.sampled_mask)


def test_is_prefix_stable_follows_the_verdicts(qwen25):
    assert TmplRenderer.from_template(qwen25).is_prefix_stable is True
    tpl = template_under_test("qwen3")
    verdicts = tmpl.report.check(tpl).verdicts
    assert verdicts["tool_loop"].level != SAFE
    assert TmplRenderer.from_template(tpl).is_prefix_stable is False
