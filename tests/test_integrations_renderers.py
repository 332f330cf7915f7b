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
from .contract import (
    HARD_CONTENTS,
    HISTORIES,
    TOOLS,
    assistant_turn,
    full_render,
    marker,
    renders_tool_turn,
    tool_results,
)

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
def test_template_mode_bridges_to_the_full_render_where_it_extends(key, caplog):
    """Template mode (the default): every round played token-in/token-out (the prompt a prefix of the full
    render, the completion the full render's tokens) extends, so it bridges, to exactly the full render;
    a None is a branch the renderer names (the completion read back by tmpl's parser renders otherwise)
    or a conversation the template cannot render. A template whose tool_loop verdict is SAFE bridges
    every round, as before the modes existed."""
    tpl = template_under_test(key)
    renderer = TmplRenderer.from_template(tpl)
    assert renderer.history == "template"
    verdict = tmpl.report.check(tpl).verdicts["tool_loop"]
    played = []
    for calls in (1, 2):
        with caplog.at_level(logging.INFO, logger="tmpl.integrations.renderers"):
            played += play(renderer, tpl, calls)
    for full, bridged in played:
        if isinstance(bridged, str):
            continue
        if bridged is None:
            assert verdict.level != SAFE, f"{key}: SAFE but {renderer.last_bridge_reason}"
            reason = renderer.last_bridge_reason
            assert renderer.last_branch is not None or "cannot render" in reason or "decode" in reason, reason
            assert any(reason in r.getMessage() for r in caplog.records), "the refusal is not logged"
            continue
        assert bridged.token_ids == full, f"{key}: bridge differs from the full render"
        assert not any(bridged.sampled_mask)
    if verdict.level == SAFE:
        assert played and all(b is not None and not isinstance(b, str) for _, b in played), key
    if verdict.level == SAFE_WITH:  # tmpl's rewrite, asked for, bridges to exactly its own full render
        safe = TmplRenderer.from_template(tpl, TmplRendererConfig(training_safe=True))
        assert safe.tpl.name == verdict.template
        rewritten = [b for calls in (1, 2) for b in play(safe, safe.tpl, calls)]
        assert rewritten and all(not isinstance(b, (str, type(None))) and b.token_ids == f for f, b in rewritten)


@pytest.mark.parametrize("key", KEYS, ids=[Path(k).name for k in KEYS])
def test_append_mode_bridges_every_round_tmpl_can_suffix(key):
    """Append mode, whatever the verdict: every tool round played token-in/token-out bridges to the
    prompt, the completion, then the full render's tail (the suffix tmpl builds is that tail), or None
    where tmpl cannot build the suffix, saying why."""
    tpl = template_under_test(key)
    renderer = TmplRenderer.from_template(tpl, TmplRendererConfig(history="append"))
    played = [r for calls in (1, 2) for r in play(renderer, tpl, calls)]
    bridged = 0
    for full, out in played:
        if isinstance(out, str):
            continue
        if out is None:
            assert renderer.last_bridge_reason and renderer.last_branch is None
            continue
        assert out.token_ids == full, f"{key}: append bridge differs from the full render"
        bridged += 1
    if tmpl.report.check(tpl).verdicts["tool_loop"].level == SAFE:
        assert bridged == len(played), key


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


def test_new_user_and_assistant_messages_by_mode(qwen25, caplog):
    """Append mode bridges tool results only; template mode renders a new user turn too (to exactly the
    full render, on Qwen2.5); neither bridges an assistant message (it would re-tokenize sampled text)."""
    answer = {"role": "assistant", "content": "It is 21 C."}
    user = [{"role": "user", "content": "And Rome?"}]
    appended = TmplRenderer.from_template(qwen25, TmplRendererConfig(history="append"))
    template = TmplRenderer.from_template(qwen25)
    prompt = template.render_ids(USER, add_generation_prompt=True)
    assert appended.render_ids(USER, add_generation_prompt=True) == prompt
    full = ids_of(qwen25, USER + [answer] + user, True, tools=None)
    answer_ids = full[len(prompt) : full.index(qwen25.tokenizer.convert_tokens_to_ids("<|im_end|>"), len(prompt)) + 1]
    for new in (user, [{"role": "assistant", "content": "x"}], []):
        with caplog.at_level(logging.INFO, logger="tmpl.integrations.renderers"):
            assert appended.bridge_to_next_turn(prompt, answer_ids, new) is None
        assert appended.last_bridge_reason
    assert any("re-render" in r.getMessage() for r in caplog.records)
    for new in ([{"role": "assistant", "content": "x"}], []):
        assert template.bridge_to_next_turn(prompt, answer_ids, new) is None and template.last_bridge_reason
    bridged = template.bridge_to_next_turn(prompt, answer_ids, user)
    assert bridged is not None and bridged.token_ids == full
    picked = [t for t, c, i in zip(bridged.token_ids, bridged.is_content, bridged.message_indices) if c and i == 0]
    assert qwen25.tokenizer.decode(picked) == "And Rome?"


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


# -- the held-out cases: 6 families x 1-3 calls x each hard content (tests/test_integrations_verl.py) --
#: the families whose templates render parallel calls (tests/test_suffix_families.py's MAX_CALLS == 3)
PARALLEL = [
    "qwen2.5-instruct",
    "qwen3",
    "gemma-4-it",
    "mistral-nemo-instruct-2407",
    "deepseek-v3",
    "phi-4-mini-instruct",
]


def _common(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def held_out_truth(tpl, history, assistant, results):
    """(prompt, prompt + completion, the full render's tail after the completion), from transformers' renders
    alone, as the verl builder's test builds them: the completion is the full render's tokens after the
    prompt's common prefix through the first stop token after the last call (after the prompt where the
    template does not render the calls)."""
    text, full = full_render(tpl, history + [assistant] + results)
    prompt = ids_of(tpl, history, True)
    start = _common(prompt, full)
    ends = [text.find(marker(0, i)) for i in range(len(assistant["tool_calls"]))]
    pos = max(e + len(marker(0, 0)) for e in ends) if min(ends) >= 0 else len(tpl.tokenizer.decode(full[:start]))
    enc = tpl.tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
    assert enc.ids == full
    j = next(t for t, (s, _) in enumerate(enc.offsets) if s >= pos and full[t] in tpl.stop_token_ids)
    return prompt, prompt + full[start : j + 1], full[j + 1 :]


def test_held_out_cases_both_modes_bridge_all_exactly(capsys):
    """The 108 held-out cases of the verl builder: append mode bridges every one to the prompt, the
    completion and the full render's tail (as tmpl's verl builder does), template mode too (each render
    extends its prompt); before the modes, only the SAFE templates' cases bridged. renderers' own choice
    for the family's hub id (MODEL_RENDERER_MAP, else its DefaultRenderer) is counted beside them."""
    head = f"{'family':28} {'cases':>5} {'append':>6} {'template':>8} {'SAFE only':>9} {'renderers':>9}"
    lines, total = [head], [0, 0, 0, 0, 0]
    for family in PARALLEL:
        tpl = template_under_test(family)
        modes = {m: TmplRenderer.from_template(tpl, TmplRendererConfig(history=m)) for m in ("append", "template")}
        safe = tmpl.report.check(tpl).verdicts["tool_loop"].level == SAFE
        name = MODEL_RENDERER_MAP.get(HUB_IDS[family])
        theirs = create_renderer(tpl.tokenizer, _own_config(family)) if name and family != "gpt-oss" else None
        row = [0, 0, 0, 0, 0]
        for k in (1, 2, 3):
            for cname, content in HARD_CONTENTS.items():
                history, assistant = list(HISTORIES["user"]), assistant_turn(k)
                results = tool_results(assistant, [content] * k)
                prompt, runtime, expected = held_out_truth(tpl, history, assistant, results)
                row[0] += 1
                for j, renderer in enumerate(modes.values()):
                    assert renderer.render_ids(history, tools=TOOLS, add_generation_prompt=True) == prompt
                    out = renderer.bridge_to_next_turn(prompt, runtime[len(prompt) :], results, tools=TOOLS)
                    where = f"{family}, {k} call(s), {cname}, {renderer.history}: {renderer.last_bridge_reason}"
                    assert out is not None and out.token_ids == runtime + expected, where
                    assert not any(out.sampled_mask) and out.message_indices[: len(runtime)] == [-1] * len(runtime)
                    row[1 + j] += 1
                row[3] += safe
                if theirs is not None:
                    other = theirs.bridge_to_next_turn(prompt, runtime[len(prompt) :], results, tools=TOOLS)
                    row[4] += other is not None and other.token_ids == runtime + expected
        total = [a + b for a, b in zip(total, row)]
        lines.append(f"{family:28} {row[0]:5} {row[1]:6} {row[2]:8} {row[3]:9} {row[4]:9}")
    lines.append(f"{'TOTAL':28} {total[0]:5} {total[1]:6} {total[2]:8} {total[3]:9} {total[4]:9}")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert total[0] == total[1] == total[2] == 108
    assert total[3] < 108 and total[4] < 108  # the modes bridge cases neither the old rule nor renderers' own did


# -- template mode: None exactly where a branch starts -------------------------------------------
R1 = "templates/llama.cpp/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
#: the families whose stock template rewrites the history (its catalog host tokenizer for DeepSeek R1)
REWRITING = ["qwen3", "gpt-oss", "gemma-4-it", R1]


def _generated(tpl, before: list[dict], message: dict, after: str | None) -> list[int]:
    """What the model generates for ``message`` after the prompt of ``before``, from transformers' renders:
    the full render's tokens (``message`` last, no generation prompt) after their common prefix with the
    prompt, through the first stop token after the text ``after`` (None: through the last stop token)."""
    prompt = ids_of(tpl, before, True)
    kwargs = dict(tools=TOOLS, chat_template=tpl.template, add_generation_prompt=False, **tpl.template_kwargs)
    text = tpl.tokenizer.apply_chat_template(before + [message], tokenize=False, **kwargs)
    full = ids_of(tpl, before + [message], False)
    enc = tpl.tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
    assert enc.ids == full
    start = _common(prompt, full)
    stops = [t for t in range(start, len(full)) if full[t] in tpl.stop_token_ids]
    if after is not None:
        stops = [t for t in stops if enc.offsets[t][0] >= text.find(after)]
    return full[start : stops[0 if after is not None else -1] + 1]


def episode_turns() -> list[tuple[dict, list[dict], str | None]]:
    """A tool call with reasoning, its result; an answer with reasoning, a new user question; another
    call, its result: ``(assistant message, new messages, text the call holds)`` per turn."""
    a0 = dict(assistant_turn(1), reasoning_content="I need the weather.")
    a1 = {"role": "assistant", "content": "It is sunny in Paris.", "reasoning_content": "It said sunny."}
    a2 = dict(assistant_turn(1, round_=1), reasoning_content="Now Tokyo.")
    return [
        (a0, tool_results(a0, ["Paris: 21 C, sunny"]), marker(0, 0)),
        (a1, [{"role": "user", "content": "And in Tokyo?"}], None),
        (a2, tool_results(a2, ["Tokyo: 18 C"]), marker(1, 0)),
    ]


def play_episode(renderer: TmplRenderer, tpl) -> list[dict]:
    """The three turns of :func:`episode_turns` through ``renderer`` as a caller runs them (a None: the
    caller re-renders the conversation). Per turn: the prompt, the completion, the bridge, the full render
    (transformers') of the conversation so far with the generation prompt, the branch and the reason."""
    history = list(USER)
    prompt = renderer.render_ids(history, tools=TOOLS, add_generation_prompt=True)
    assert prompt == ids_of(tpl, history, True)
    out = []
    for message, new, after in episode_turns():
        completion = _generated(tpl, USER, message, after)  # what the model writes does not depend on the history
        bridged = renderer.bridge_to_next_turn(prompt, completion, new, tools=TOOLS)
        history = history + [message] + new
        full = ids_of(tpl, history, True)
        out.append(
            dict(
                prompt=prompt,
                completion=completion,
                bridged=bridged,
                full=full,
                branch=renderer.last_branch,
                reason=renderer.last_bridge_reason,
                messages=list(history),
            )
        )
        prompt = (
            bridged.token_ids
            if bridged is not None
            else renderer.render(history, tools=TOOLS, add_generation_prompt=True).token_ids
        )
    return out


@pytest.mark.parametrize("key", REWRITING, ids=[Path(k).name for k in REWRITING])
def test_template_mode_returns_none_exactly_where_a_branch_starts(key):
    """On the stock templates that rewrite the history: a bridge exactly where transformers' full render of
    the conversation so far extends the previous prompt and completion, equal to that render; None
    elsewhere, naming the branch; and tmpl's episode, given the calls the caller made (the bridge or its
    re-render as each prompt), starts a sequence exactly at each None."""
    from tmpl.episode import BranchKind, Call, Episode

    tpl = template_under_test(key)
    renderer = TmplRenderer.from_template(tpl)
    assert renderer.is_prefix_stable is False
    turns = play_episode(renderer, tpl)
    nones = 0
    for k, turn in enumerate(turns):
        prior = turn["prompt"] + turn["completion"]
        extends = turn["full"][: len(prior)] == prior
        assert (turn["bridged"] is not None) == extends, (key, k, turn["reason"])
        if extends:
            assert turn["bridged"].token_ids == turn["full"], (key, k)
            assert turn["reason"] is None and turn["branch"] is None
            continue
        nones += 1
        branch = turn["branch"]
        assert branch is not None and branch.kind == BranchKind.DIVERGED, turn["reason"]
        assert branch.token == _common(prior, turn["full"]) and branch.expected == prior[branch.token]
        assert "a branch starts" in turn["reason"] and f"at token {branch.token}" in turn["reason"]
        # the reasoning of the first assistant turn, sampled, is gone from the render: the first difference named
        sampled, render = tpl.tokenizer.decode(prior), tpl.tokenizer.decode(turn["full"])
        if "I need the weather." in sampled and "I need the weather." not in render:
            assert (branch.message, branch.field) == (1, "reasoning_content"), turn["reason"]
            assert branch.edit == "template dropped reasoning"
        else:  # the messages agree: what differs is how the ones before message N render (R1's dropped <think>)
            assert branch.message is not None and branch.field is None, turn["reason"]
    assert nones >= 1, f"{key}: the template rewrote nothing in this episode"
    # tmpl's episode of the same calls: a new sequence exactly at each None
    ep = Episode(sample_id=key)
    for k, turn in enumerate(turns):
        n = len(turn["completion"])
        ep.add_call(Call(turn["prompt"], turn["completion"], [0.0] * n, id=f"turn-{k}", turn=k))
    assert len(ep.sequences) == 1 + sum(t["bridged"] is None for t in turns[:-1])  # the last None has no next call
    starts = [s.turns[0] for s in ep.sequences[1:]]
    assert starts == [k + 1 for k, t in enumerate(turns) if t["bridged"] is None and k + 1 < len(turns)]
    assert sum(int(s.mask.sum()) for s in ep.sequences) == sum(len(t["completion"]) for t in turns)


def test_template_mode_never_branches_where_the_template_rewrites_nothing(qwen25):
    """The same episode on Qwen2.5 (both verdicts SAFE, is_prefix_stable): every turn bridges, each to the full render."""
    renderer = TmplRenderer.from_template(qwen25)
    assert renderer.is_prefix_stable is True
    for turn in play_episode(renderer, qwen25):
        assert turn["bridged"] is not None and turn["bridged"].token_ids == turn["full"], turn["reason"]


def test_template_mode_keeps_sampled_ids_in_a_tokenization_of_their_own():
    """Qwen3, two tool rounds whose calls were sampled in a tokenization the tokenizer would not produce:
    each bridge keeps them verbatim (prompt + completion as given), decodes to the full render's text,
    and the next bridge still knows the conversation (it extends the first)."""
    tpl = template_under_test("qwen3")
    renderer = TmplRenderer.from_template(tpl)
    history = list(USER)
    prompt = renderer.render_ids(history, tools=TOOLS, add_generation_prompt=True)
    for round_ in (0, 1):
        assistant = dict(assistant_turn(1, round_=round_), reasoning_content=f"Step {round_}.")
        results = tool_results(assistant, [f"result {round_}"])
        canonical = _generated(tpl, history, assistant, marker(round_, 0))
        text = tpl.codec.decode(canonical)
        cut = text.index("weather")
        completion = tpl.codec.encode(text[:cut]) + tpl.codec.encode(text[cut:])
        assert completion != canonical and tpl.codec.decode(completion) == text
        bridged = renderer.bridge_to_next_turn(prompt, completion, results, tools=TOOLS)
        history = history + [assistant] + results
        kwargs = dict(tools=TOOLS, chat_template=tpl.template, add_generation_prompt=True)
        assert bridged is not None, renderer.last_bridge_reason
        assert bridged.token_ids[: len(prompt) + len(completion)] == prompt + completion
        assert tpl.codec.decode(bridged.token_ids) == tpl.tokenizer.apply_chat_template(
            history, tokenize=False, **kwargs
        )
        prompt = bridged.token_ids


def test_a_prompt_no_renderer_built(qwen25):
    """Template mode needs the conversation before the prompt: a prompt no TmplRenderer built is refused,
    saying so, unless tmpl proved the template's tool rounds append (Qwen2.5: the suffix, as before);
    append mode needs it only where the suffix does."""
    user = [{"role": "user", "content": "A question no other test renders: the weather in Quito?"}]
    assistant = assistant_turn(1)
    results = tool_results(assistant, ["Quito: 14 C"])
    for tpl in (qwen25, template_under_test("qwen3")):
        text, full = full_render(tpl, user + [assistant] + results)
        prompt = ids_of(tpl, user, True)  # transformers', not a renderer's
        completion = generated(tpl, text, full, len(prompt), 1, 0)
        template = TmplRenderer.from_template(tpl)
        appended = TmplRenderer.from_template(tpl, TmplRendererConfig(history="append"))
        assert appended.bridge_to_next_turn(prompt, completion, results, tools=TOOLS).token_ids == full
        out = template.bridge_to_next_turn(prompt, completion, results, tools=TOOLS)
        if tpl is qwen25:
            assert out is not None and out.token_ids == full
        else:
            assert out is None and "not known" in template.last_bridge_reason
            # once a renderer built the prompt, the same bridge renders the conversation
            assert template.render_ids(user, tools=TOOLS, add_generation_prompt=True) == prompt
            assert template.bridge_to_next_turn(prompt, completion, results, tools=TOOLS).token_ids == full


def test_append_mode_gives_the_suffix_the_conversation_where_the_template_needs_it():
    """DeepSeek V3 opens its tool-outputs block once per conversation, so its second tool round's suffix
    depends on the first: append mode passes the conversation it remembers (two rounds, each equal to the
    full render's tail), and refuses a prompt no renderer built, saying the conversation is not known."""
    tpl = template_under_test("deepseek-v3")
    user = [{"role": "user", "content": "Weather in Lima, then in Oslo?"}]
    renderer = TmplRenderer.from_template(tpl, TmplRendererConfig(history="append"))
    history = list(user)
    prompt = renderer.render_ids(history, tools=TOOLS, add_generation_prompt=True)
    for round_ in (0, 1):
        assistant = assistant_turn(1, round_=round_)
        results = tool_results(assistant, [f"result {round_}"])
        given, runtime, expected = held_out_truth(tpl, history, assistant, results)
        assert given == prompt  # round 1: the full render of round 0 is its bridge
        completion = runtime[len(given) :]
        bridged = renderer.bridge_to_next_turn(prompt, completion, results, tools=TOOLS)
        assert bridged is not None, renderer.last_bridge_reason
        assert bridged.token_ids[len(prompt) + len(completion) :] == expected, round_
        if round_ == 1:
            with pytest.raises(tmpl.errors.HistoryRequiredError):
                tpl.suffix_ids(results, completion_ids=completion, tools=TOOLS)
            stranger = [1] + prompt  # the same conversation, but a prompt no renderer built
            assert renderer.bridge_to_next_turn(stranger, completion, results, tools=TOOLS) is None
            assert "not known" in renderer.last_bridge_reason
        history = history + [assistant] + results
        prompt = bridged.token_ids


def test_the_prompt_store_is_bounded_and_shared_per_template(qwen25):
    """Prompts are remembered least recently used first out, by their IDs (not a prefix or a look-alike),
    and every renderer of one template in the process sees the same store."""
    from tmpl.integrations.renderers.conversations import Known, Store, store_for

    store = Store(capacity=2)
    nodes = [Known.root([{"role": "user", "content": str(k)}], str(k), [k, k + 1]) for k in range(3)]
    store.put([0, 1], nodes[0])
    store.put([1, 2], nodes[1])
    assert store.get([0, 1]) is nodes[0]  # used: now the most recent
    store.put([2, 3], nodes[2])
    assert store.get([1, 2]) is None and store.get([0, 1]) is nodes[0] and store.get([2, 3]) is nodes[2]
    assert store.get([0]) is None and store.get([0, 1, 0]) is None and len(store) == 2
    a, b = TmplRenderer.from_template(qwen25), TmplRenderer.from_template(qwen25, TmplRendererConfig(history="append"))
    assert a._known is b._known is store_for(qwen25.fingerprint)
    prompt = a.render_ids([{"role": "user", "content": "Shared?"}], add_generation_prompt=True)
    assert b._known.get(prompt).state.messages == [{"role": "user", "content": "Shared?"}]


def test_history_is_a_config_field_through_renderers_plug_in():
    tok = load_tokenizer("qwen2.5-instruct")
    renderer = create_renderer(tok, CustomRendererConfig(import_path=IMPORT_PATH, history="append"))
    assert isinstance(renderer, TmplRenderer) and renderer.history == "append"
    assert renderer.tpl.template_kwargs == {}  # not a template kwarg
    assert TmplRenderer(tok).history == "template"
    with pytest.raises(ValueError, match="history"):
        TmplRendererConfig(history="replay")


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
        prompt = ours.render_ids(history, tools=TOOLS, add_generation_prompt=True)
        assert prompt == ids_of(tpl, history, True)
        completion = generated(tpl, text, full, len(prompt), calls, 0)
        if full[: len(prompt)] != prompt or completion is None:
            continue
        played += 1
        mine = ours.bridge_to_next_turn(prompt, completion, results, tools=TOOLS)
        other = theirs.bridge_to_next_turn(prompt, completion, results, tools=TOOLS)
        if mine is not None:
            assert mine.token_ids == full
        if other is not None and other.token_ids == full:
            if mine is None:  # declined: only where tmpl's verdict is not SAFE, and it says why
                assert verdict.level != SAFE and ours.last_bridge_reason
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
    """The same answer in both modes (renderers asks it of full renders, the template's in both); what it
    promises in each is checked by the branch tests below (template mode) and the held-out cases (append)."""
    for history in ("template", "append"):
        config = TmplRendererConfig(history=history)
        assert TmplRenderer.from_template(qwen25, config).is_prefix_stable is True
        tpl = template_under_test("qwen3")
        verdicts = tmpl.report.check(tpl).verdicts
        assert verdicts["tool_loop"].level != SAFE
        assert TmplRenderer.from_template(tpl, config).is_prefix_stable is False
