"""The learned tool-call parser: call syntax inferred from a template's own renders.

A held-out template (tests/data/plugin_calls.jinja, written for these tests: ChatML turns whose
calls are ``<|plugin_calls|>[{"tool": ..., "params": ..., "call_id": ...}]<|end_plugin_calls|>``)
has no hand-written parser: without learning it is NoToolParserError, with learning its round
trips read back. Every family and catalog template is also run with the learned parser alone
(hand-written parsers off) and fuzzed.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tmpl import ChatTemplate
from tmpl.errors import NoToolParserError
from tmpl.report.api import check
from tmpl.toolcalls import ParsedCompletion, ParseError, ToolCall, detect, parse_completion, parser_for
from tmpl.toolcalls.detect import detect_with
from tmpl.toolcalls.parsers.base import NAME_RE
from tmpl.toolcalls.types import PARSE_ERROR_KINDS

from .conftest import load_tokenizer
from .test_toolcalls_roundtrip import _check_calls, _render, _rendering_templates
from .toolcalls_data import CALLS, TOOLS, chat_template

FIXTURE = Path(__file__).parent / "data" / "plugin_calls.jinja"
detect_module = importlib.import_module("tmpl.toolcalls.detect")


@pytest.fixture(scope="module")
def plugin_tpl() -> ChatTemplate:
    return ChatTemplate(load_tokenizer("qwen2.5-instruct"), FIXTURE, name="plugin_calls")


def test_held_out_template_has_no_parser_without_learning(plugin_tpl, monkeypatch, tmp_path):
    found = detect_with(plugin_tpl.renderer, plugin_tpl.codec, learn=False)
    assert found.parser is None and "no parser reads back" in found.detail
    # a copy with another fingerprint, so the memoized detection of the fixture is not touched
    copy = tmp_path / "plugin_calls_unlearned.jinja"
    copy.write_text(FIXTURE.read_text() + "{#- unlearned copy -#}")
    fresh = ChatTemplate(load_tokenizer("qwen2.5-instruct"), copy, name="plugin_calls_unlearned")
    monkeypatch.setattr(detect_module, "learn_syntax", lambda *a, **k: (None, "learning switched off"))
    with pytest.raises(NoToolParserError, match="learning switched off"):
        parser_for(fresh)


def test_held_out_template_is_learned_and_round_trips(plugin_tpl):
    found = detect(plugin_tpl)
    assert (found.parser, found.how, found.is_learned) == ("learned", "learned", True)
    syntax = found.learned.syntax
    assert (syntax.block_open, syntax.block_close, syntax.shape) == ("<|plugin_calls|>", "<|end_plugin_calls|>", "list")
    assert (syntax.name_key, syntax.arguments_key, syntax.id_key) == (("tool",), ("params",), ("call_id",))
    for k in (1, 2, 3):
        ids, text = _render(plugin_tpl, CALLS[:k])
        parsed = parse_completion(plugin_tpl, ids, tools=TOOLS)
        _check_calls(parsed, CALLS[:k], text, [f"c{i}aBcDeFg" for i in range(k)])
        assert parsed.parser == "learned" and parsed.content == ""
        ids, text = _render(plugin_tpl, CALLS[:k], content="Checking that now.")
        parsed = parse_completion(plugin_tpl, ids, tools=TOOLS)
        _check_calls(parsed, CALLS[:k], text, [f"c{i}aBcDeFg" for i in range(k)])
        assert parsed.content == "Checking that now."


def test_held_out_template_reports_the_learned_parser(plugin_tpl):
    report = check(plugin_tpl)
    assert report.parser == "learned"
    assert "learned from the template" in report.to_markdown() and "<|plugin_calls|>" in report.parser_syntax


def test_unlearnable_template_says_why(plugin_tpl):
    """A template whose calls are not JSON (Gemma 4's own syntax) is not learned, and the reason is given."""
    tpl = chat_template("gemma-4-it")
    found = detect_with(tpl.renderer, tpl.codec, hand_written=False)
    assert found.parser is None and "no call syntax could be learned" in found.detail


#: templates the learned parser alone must read (every JSON-call family; a floor, not the count)
MUST_LEARN = {
    "qwen2.5-instruct",
    "qwen3",
    "llama-3.2-instruct",
    "mistral-nemo-instruct-2407",
    "llama.cpp/NVIDIA-Nemotron-Nano-v2.jinja",
    "llama.cpp/MiniMax-M1.jinja",
    "llama.cpp/unsloth-Apriel-1.5.jinja",
}


@pytest.mark.parametrize("key", _rendering_templates())
def test_learned_alone_round_trip(key):
    """Hand-written parsers off: where a syntax is learned, 1..3 calls (with and without content) read back."""
    tpl = chat_template(key)
    found = detect_with(tpl.renderer, tpl.codec, hand_written=False)
    if found.learned is None:
        assert key not in MUST_LEARN, found.detail
        pytest.skip(f"{key}: not learned ({found.detail[:100]})")
    parser = found.learned
    checked = 0
    for k in (1, 2, 3):
        for content in ("", "Checking that now."):
            ids, text = _render(tpl, CALLS[:k], content=content)
            if ids is None:
                continue
            parsed = parser.parse(ids, tools=TOOLS)
            _check_calls(parsed, CALLS[:k], text, [f"c{i}aBcDeFg" for i in range(k)])
            if content and content in text:
                assert content in parsed.content
            checked += 1
    assert checked >= 2


def test_learned_alone_count():
    """How many rendering templates the learned parser alone handles (printed; at least the JSON families)."""
    learned, total = [], 0
    for key in _rendering_templates():
        try:
            tpl = chat_template(key)
        except pytest.skip.Exception:
            continue
        total += 1
        if detect_with(tpl.renderer, tpl.codec, hand_written=False).learned is not None:
            learned.append(key)
    print(f"learned parser alone: {len(learned)} of {total} rendering templates")
    assert MUST_LEARN <= set(learned)


FRAGMENTS = [
    "<|plugin_calls|>",
    "<|end_plugin_calls|>",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    '"',
    "\n",
    " ",
    '"tool"',
    '"params"',
    '"call_id"',
    '"get_weather"',
    '{"city": "Paris"}',
    "null",
    "3",
    "'x'",
    '{"tool": "get_weather", "params": {"city": "Paris"}, "call_id": "a1"}',
    "<|im_end|>",
    "<tool_call>",
]


def _well_formed(parsed) -> None:
    assert isinstance(parsed, ParsedCompletion)
    for call in parsed.tool_calls:
        assert isinstance(call, ToolCall) and NAME_RE.match(call.name) and isinstance(call.arguments, dict)
        json.dumps(call.arguments)
    for err in parsed.errors:
        assert isinstance(err, ParseError) and err.kind in PARSE_ERROR_KINDS


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    parts=st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=6), max_size=24),
    noise=st.lists(st.integers(0, 151000), max_size=6),
)
def test_learned_parser_fuzz(plugin_tpl, parts, noise):
    """Whatever the tokens, the learned parser returns well-formed records and never raises."""
    parser = parser_for(plugin_tpl)
    ids = plugin_tpl.codec.encode("".join(parts)) + noise
    _well_formed(parser.parse(ids, tools=TOOLS))
    _well_formed(parser.parse(ids))


@settings(max_examples=150, deadline=None)
@given(parts=st.lists(st.sampled_from(FRAGMENTS + ["[TOOL_CALLS]", '{"name": "f", "arguments": {}}']), max_size=20))
def test_learned_parser_fuzz_on_mistral(parts):
    tpl = chat_template("mistral-nemo-instruct-2407")
    parser = detect_with(tpl.renderer, tpl.codec, hand_written=False).learned
    _well_formed(parser.parse(tpl.codec.encode("".join(parts)), tools=TOOLS))
