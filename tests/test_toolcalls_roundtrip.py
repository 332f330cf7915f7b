"""Round trip: render an assistant message with 1..3 calls, parse its tokens, get the same calls back.

Every family and catalog template whose detected parser was read back from a render is checked.
The expected calls are the ones put into the message (``toolcalls_data.CALLS``); values are
compared with their types. A template that accepts fewer calls per turn (Llama: one; gpt-oss
renders only the first) is checked for the counts it renders.
"""

from __future__ import annotations

import pytest

from tmpl.errors import TemplateRenderError
from tmpl.toolcalls import detect, parse_completion

from .conftest import catalog
from .toolcalls_data import CALLS, FAMILIES, TOOLS, assistant_message, chat_template, completion_ids, same, template_ids

CONTENT = "Checking that now."
REASONING = "TmPlThInKiNgAbOuT the weather"


def _rendering_templates() -> list[str]:
    """Families, and catalog templates whose tool conversation visibly renders the call."""
    return [
        k
        for k in template_ids()
        if k in FAMILIES or any(e["template"] == "templates/" + k and e.get("tool_call_visible") for e in catalog())
    ]


def _render(tpl, calls, **kwargs):
    """The completion IDs of the calls as the template renders them (arguments as a dict, or as
    JSON text for templates that want that), or (None, None) when it does not render them all."""
    for as_text in (False, True):
        try:
            ids = completion_ids(tpl, assistant_message(calls, as_text=as_text, **kwargs))
            break
        except TemplateRenderError:
            continue
    else:
        return None, None
    text = tpl.codec.decode(ids)
    if not all(name in text for name, _ in calls):  # the template rendered fewer calls than given
        return None, None
    return ids, text


def _check_calls(parsed, calls, text, ids_given):
    assert not parsed.errors, parsed.errors
    got = [(c.name, c.arguments) for c in parsed.tool_calls]
    assert len(got) == len(calls), got
    for (name, args), (want_name, want_args) in zip(got, calls):
        assert name == want_name
        assert same(args, want_args), (args, want_args)
    for call, given in zip(parsed.tool_calls, ids_given):
        if given in text:  # the template writes ids (Mistral): the parsed id is the one written
            assert call.id == given and not call.id_generated
        assert call.id and (call.id.isalnum() and len(call.id) == 9 or not call.id_generated)


@pytest.mark.parametrize("key", _rendering_templates())
def test_round_trip(key):
    tpl = chat_template(key)
    found = detect(tpl)
    if found.how != "render":
        reason = (
            "renders no calls"
            if found.how == "vocabulary" or found.calls == 0 and "nothing" in found.detail
            else "writes calls in a format no parser reads"
        )
        pytest.skip(f"{key}: the template {reason} ({found.detail[:80]})")
    checked = 0
    for k in (1, 2, 3):
        calls = CALLS[:k]
        given = [f"c{i}aBcDeFg" for i in range(k)]
        ids, text = _render(tpl, calls)
        if ids is None:
            assert k > 1, f"{key}: a single call must render"
            continue
        parsed = parse_completion(tpl, ids, tools=TOOLS)
        _check_calls(parsed, calls, text, given)
        # no piece of a call leaks into the content (host-tokenizer turn markers may remain)
        assert not any(s in parsed.content for s in ("get_weather", 'Pa"ris', "{", "café")), parsed.content
        # token spans cover each call's raw text, in order
        spans = [c.token_span for c in parsed.tool_calls]
        assert all(a < b for a, b in spans) and all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))
        for call in parsed.tool_calls:
            assert call.name in tpl.codec.decode(ids[call.token_span[0] : call.token_span[1]])
        checked += 1

        # the same calls with visible content: the content is read as content (or, where the
        # template renders it into the analysis channel, as reasoning), never as a call
        ids, text = _render(tpl, calls, content=CONTENT)
        if ids is not None:
            parsed = parse_completion(tpl, ids, tools=TOOLS)
            _check_calls(parsed, calls, text, given)
            seen = parsed.content + (parsed.reasoning or "")
            assert (CONTENT in seen) == (CONTENT in text)

        # with reasoning, where the template renders it: reasoning is not content, calls unchanged
        if found.reasoning_key:
            ids, text = _render(tpl, calls, reasoning=(found.reasoning_key, REASONING))
            if ids is not None and REASONING in text:
                parsed = parse_completion(tpl, ids, tools=TOOLS)
                _check_calls(parsed, calls, text, given)
                assert REASONING in (parsed.reasoning or "") and REASONING not in parsed.content
    assert checked >= 1


@pytest.mark.parametrize("family", ["qwen3", "gemma-4-it", "gpt-oss", "mistral-nemo-instruct-2407"])
def test_round_trip_on_both_twins(family, twin):
    tpl = chat_template(family)
    ids, text = _render(tpl, CALLS[:1])
    parsed = parse_completion(tpl, ids, tools=TOOLS)
    _check_calls(parsed, CALLS[:1], text, ["c0aBcDeFg"])


def test_without_tools_values_keep_their_written_types():
    """Without schemas, JSON formats keep JSON types and XML formats read JSON literals."""
    for key in ("qwen3", "llama.cpp/Qwen3-Coder.jinja", "llama.cpp/GLM-4.6.jinja", "gemma-4-it"):
        tpl = chat_template(key)
        ids, _ = _render(tpl, CALLS[:2])
        parsed = parse_completion(tpl, ids)
        assert not parsed.errors
        assert same(parsed.tool_calls[0].arguments, CALLS[0][1]), (key, parsed.tool_calls[0].arguments)
        assert same(parsed.tool_calls[1].arguments, CALLS[1][1]), (key, parsed.tool_calls[1].arguments)


def test_families_cover_the_issue_formats():
    """Every format the issue lists is read back from some real template render."""
    formats = {detect(chat_template(k)).parser for k in FAMILIES if detect(chat_template(k)).how == "render"}
    formats |= {
        detect(chat_template(k)).parser
        for k in (
            "llama.cpp/Qwen3-Coder.jinja",
            "llama.cpp/GLM-4.6.jinja",
            "llama.cpp/deepseek-ai-DeepSeek-V3.1.jinja",
            "llama.cpp/unsloth-mistral-Devstral-Small-2507.jinja",
        )
    }
    assert formats >= {"hermes", "qwen3_xml", "llama3_json", "mistral", "gemma4", "harmony", "deepseek_v3", "glm4"}
