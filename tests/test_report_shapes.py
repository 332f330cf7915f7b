"""Regression: the per-shape table of the proof issue, on Gemma 4 and gpt-oss, stock and fixed.

One user turn, one call, then the tool result and the final answer; the tool-call turn carries
reasoning, content, both, or neither. Each conversation is played through token-in/token-out with
transformers' tokenized renders (``tests/counterexamples.py``), and the report's verdict must agree:
a shape that breaks makes the tool loop UNSAFE (never SAFE), a shape that raises is listed as refused.
"""

from __future__ import annotations

from typing import Any

import pytest

import tmpl
from tmpl.errors import TemplateFixError
from tmpl.report import SAFE, UNSAFE

from .counterexamples import first_failure

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SHAPES = {
    "reasoning+calls": {"reasoning": True, "content": ""},
    "content+calls": {"reasoning": False, "content": "Let me check."},
    "calls only": {"reasoning": False, "content": ""},
    "reasoning+content+calls": {"reasoning": True, "content": "Let me check."},
}


def conversation(shape: str, field: str) -> list[dict[str, Any]]:
    turn: dict[str, Any] = {
        "role": "assistant",
        "content": SHAPES[shape]["content"],
        "tool_calls": [
            {"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
        ],
    }
    if SHAPES[shape]["reasoning"]:
        turn[field] = "The user wants the weather; call the tool."
    return [
        {"role": "user", "content": "Weather in Oslo?"},
        turn,
        {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "4 C, snow"},
        {"role": "assistant", "content": "It is 4 C and snowing in Oslo."},
    ]


def outcome(tpl: tmpl.ChatTemplate, shape: str, field: str) -> str:
    try:
        use = first_failure(tpl, conversation(shape, field), {}, [TOOL])
    except AssertionError:
        raise
    except Exception as exc:  # noqa: BLE001 - the template refuses the shape
        return f"raises: {str(exc).strip().splitlines()[0]}"
    return "ok" if use is None else f"BROKEN ({use})"


#: (family, field its template reads reasoning from) -> the issue's table, stock template
STOCK = {
    ("gemma-4-it", "reasoning_content"): {
        "reasoning+calls": "ok",
        "content+calls": "BROKEN (tool_loop)",
        "calls only": "ok",
        "reasoning+content+calls": "BROKEN (tool_loop)",
    },
    ("gpt-oss", "thinking"): {
        "reasoning+calls": "BROKEN (tool_loop)",
        "content+calls": "BROKEN (tool_loop)",
        "calls only": "ok",
        "reasoning+content+calls": "raises",
    },
}


@pytest.mark.parametrize("family, field", list(STOCK), ids=[f for f, _ in STOCK])
def test_stock_templates_break_as_the_issue_measured_and_the_report_says_unsafe(family, field, tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of(family), name=family)
    got = {shape: outcome(tpl, shape, field) for shape in SHAPES}
    assert {s: o.split(":")[0] for s, o in got.items()} == STOCK[(family, field)]
    report = tmpl.report.check(tpl)
    own = report.verdicts["tool_loop"]
    assert own.level != SAFE and own.reason.startswith(UNSAFE), own  # UNSAFE, or SAFE WITH a shipped template
    for shape, o in got.items():
        if o.startswith("raises"):  # listed as refused, with the template's own message
            assert any(o.removeprefix("raises: ") in r["error"] for r in report.refused_shapes), (shape, o)


@pytest.mark.parametrize("family, field", list(STOCK), ids=[f for f, _ in STOCK])
def test_their_rewrites_are_refused_with_the_counterexample(family, field, tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of(family), name=family)
    with pytest.raises(TemplateFixError) as info:
        tmpl.report.make_training_safe(tpl)
    ce = info.value.counterexample
    assert ce is not None and ce["use"] == "tool_loop" and ce["messages"]
    assert "content of a tool-call turn" in ce["reason"]


@pytest.mark.parametrize(
    "family, field, name", [("gemma-4-it", "reasoning_content", "gemma-4"), ("gpt-oss", "thinking", "gpt-oss")]
)
def test_the_shipped_templates_hold_on_every_shape(family, field, name, tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of(family), tmpl.templates.load(name), name=name)
    report = tmpl.report.check(tpl)
    assert report.verdicts["tool_loop"].level == SAFE
    for shape in SHAPES:
        o = outcome(tpl, shape, field)
        assert o == "ok" or (
            o.startswith("raises") and any(o.removeprefix("raises: ") in r["error"] for r in report.refused_shapes)
        ), (shape, o)


@pytest.mark.parametrize("family", ["qwen2.5-instruct", "llama-3.2-instruct"])
def test_families_the_issue_found_sound_stay_safe(family, tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of(family), name=family)
    assert {shape: outcome(tpl, shape, "reasoning_content") for shape in SHAPES} == dict.fromkeys(SHAPES, "ok")
    assert tmpl.report.check(tpl).verdicts["tool_loop"].level == SAFE


def test_the_report_says_which_content_shape_calls_render_with(tokenizer_of):
    """Issue 26: tool-call turns are probed with content text, None, "" and absent, and checked under the
    shapes that render the calls. Qwen3's template reads ``message.content`` on every turn: None and a
    missing key raise (transformers drops None), text and "" render, and are the shapes searched."""
    tpl = tmpl.ChatTemplate(tokenizer_of("qwen3"), name="qwen3")
    report = tmpl.report.check(tpl)
    assert report.call_content is not None and report.call_content.startswith(
        'tool-call turns render their calls with content text, ""'
    )
    refused = {r["shape"][0]: r["error"] for r in report.refused_shapes}
    assert "'dict object' has no attribute 'content'" in refused["1 call, content None"]
    assert refused["1 call, content None"] == refused["1 call, no content key"]
    assert any("content ''" in s for s in report.shapes) and not any("content None" in s for s in report.shapes)


def test_deepseek_v3_gets_a_real_verdict(tokenizer_of):
    """DeepSeek V3 renders calls only for ``content is none``, which transformers never passes: every
    shape is tried, each is listed with what happened, and the verdict says the calls do not render."""
    tpl = tmpl.ChatTemplate(tokenizer_of("deepseek-v3"), name="deepseek-v3")
    report = tmpl.report.check(tpl)
    assert report.verdicts["tool_loop"].label == "UNSUPPORTED (tool calls are not rendered)"
    refused = {r["shape"][0]: r["error"] for r in report.refused_shapes}
    assert refused["1 call, content text"] == refused["1 call, content ''"] == "the tool calls are not rendered"
    assert refused["1 call, content None"] == refused["1 call, no content key"]
    assert "transformers drops `content: None`" in (report.call_content or "")
    text = tpl.tokenizer.apply_chat_template(  # ground truth: the call's argument is nowhere in the render
        conversation("calls only", "reasoning_content"), tools=[TOOL], tokenize=False
    )
    assert text.count("Oslo") == 2  # the question and the answer; not the call's argument
