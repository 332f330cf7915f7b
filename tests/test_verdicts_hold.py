"""A SAFE verdict holds on conversations tmpl did not make: hypothesis searches for a counterexample.

The conversations here come from this file's own strategy (not from ``tmpl.report.space``):
system or not, 1-2 user turns, 0-2 tool rounds each, 1..max calls per turn (the same tool
twice allowed), call turns with text, ``None``, ``""`` or no content, reasoning under
``reasoning_content``/``thinking``/``reasoning``, hard arguments (quotes, unicode, newlines,
nested JSON), final answers or not, and the kwargs thinking templates read. Each is played
through token-in/token-out with transformers' own tokenized renders (``tokenize=True``):
every append must leave the stream built so far a prefix of the longer render, and each
turn's generation prompt a prefix of the turn's own render. A failure whose use the report
calls SAFE is a wrong verdict; a render that raises must be a shape the report lists as
refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tmpl
from tmpl.report import SAFE

from .conftest import DATA, catalog, template_under_test
from .counterexamples import REASONING_FIELDS, as_generated, first_failure, kwargs_refused

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {
                "type": "object",
                "properties": {k: {"type": t} for k, t in params.items()},
                "required": [next(iter(params))],
            },
        },
    }
    for name, params in (
        ("lookup", {"query": "string"}),
        ("book_table", {"place": "string", "details": "object"}),
        ("convert", {"amount": "number", "unit": "string"}),
    )
]
TEXTS = st.sampled_from(["Lyon", 'a "quoted" word', "naïve café ☕ 東京", "two\nlines", "{curly} \\ back"])


@st.composite
def call(draw: st.DrawFn, ident: str) -> dict[str, Any]:
    tool = draw(st.sampled_from(TOOLS))["function"]["name"]
    text = f"HyPaRg {draw(TEXTS)}"
    args: dict[str, Any] = {
        "lookup": {"query": text},
        "book_table": {"place": text, "details": {"people": 2, "tags": ["quiet", "ü"], "at": {"h": 20}}},
        "convert": {"amount": 12.5, "unit": text},
    }[tool]
    return {"id": ident, "type": "function", "function": {"name": tool, "arguments": args}}


@st.composite
def assistant(draw: st.DrawFn, tag: str, calls: int, thinking: bool) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant"}
    shape = draw(st.sampled_from(["text", "none", "empty", "absent"])) if calls else "text"
    if shape == "text":
        msg["content"] = f"HyPtExT {tag} {draw(TEXTS)}"
    elif shape != "absent":
        msg["content"] = None if shape == "none" else ""
    if thinking and draw(st.booleans()):
        msg[draw(st.sampled_from(REASONING_FIELDS))] = f"HyPrEaSoN {tag}"
    if calls:
        msg["tool_calls"] = [draw(call(f"h{tag}{i}x7k2z"[:9])) for i in range(calls)]
    return msg


@st.composite
def conversation(draw: st.DrawFn, max_calls: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    kwargs: dict[str, Any] = {}
    if draw(st.booleans()):
        kwargs["enable_thinking"] = draw(st.booleans())
    if draw(st.booleans()):
        kwargs["reasoning_effort"] = draw(st.sampled_from(["low", "high"]))
    thinking = kwargs.get("enable_thinking") is not False  # thinking off: the model writes none
    msgs: list[dict[str, Any]] = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": "HyPsYsTeM be brief"})
    users = draw(st.integers(1, 2))
    for u in range(users):
        msgs.append({"role": "user", "content": f"HyPuSeR {u} {draw(TEXTS)}"})
        for r in range(draw(st.integers(0, 2))):
            a = draw(assistant(f"{u}{r}", draw(st.integers(1, max_calls)), thinking))
            msgs.append(a)
            for c in a["tool_calls"]:
                msgs.append(
                    {"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"], "content": draw(TEXTS)}
                )
        if u < users - 1 or msgs[-1]["role"] != "tool" or draw(st.booleans()):
            msgs.append(draw(assistant(f"{u}f", 0, thinking)))
    return msgs, kwargs


def assert_verdicts_hold(tpl: tmpl.ChatTemplate, examples: int) -> None:
    report = tmpl.report.check(tpl)
    # the uses this search plays (first_failure): env_turns has its own search (tests/test_report_user_turns.py)
    safe = {use for use, v in report.verdicts.items() if v.level == SAFE and use in ("tool_loop", "multi_user")}
    if not safe:
        pytest.skip(f"{tpl.name}: no SAFE verdict to test ({report.verdicts['tool_loop'].label})")
    refused = " | ".join(r["error"] for r in report.refused_shapes)

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(conversation(max(report.max_parallel_calls, 1)))
    def holds(case: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
        msgs, kwargs = case
        try:
            msgs = as_generated(tpl, msgs, kwargs)
            use = first_failure(tpl, msgs, kwargs, TOOLS)
        except Exception as exc:  # noqa: BLE001 - a shape the template refuses: the report must list it
            if isinstance(exc, AssertionError):
                raise
            if kwargs_refused(tpl, kwargs):
                return  # a kwarg value the template does not take (e.g. an effort it does not know)
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            assert text in refused, f"{tpl.name} raises on a shape its report does not list: {text}"
            return
        assert use not in safe, f"{tpl.name}: {use} is SAFE but this conversation breaks it:\n" + json.dumps(
            {"messages": msgs, "kwargs": kwargs}, ensure_ascii=False, indent=1
        )

    holds()


FAMILIES = ["qwen2.5-instruct", "qwen3", "llama-3.2-instruct", "gemma-4-it", "gpt-oss", "mistral-nemo-instruct-2407"]
SHIPPED = [("qwen2.5-instruct", "qwen2.5"), ("qwen3", "qwen3"), ("llama-3.2-instruct", "llama-3")]
SHIPPED += [("gemma-4-it", "gemma-4"), ("gpt-oss", "gpt-oss")]


@pytest.mark.parametrize("family", FAMILIES)
def test_family_safe_verdicts_hold(family, tokenizer_of):
    assert_verdicts_hold(tmpl.ChatTemplate(tokenizer_of(family), name=family), examples=40)


@pytest.mark.parametrize("family, name", SHIPPED)
def test_shipped_templates_hold(family, name, tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of(family), tmpl.templates.load(name), name=name)
    assert tmpl.report.check(tpl).verdicts["tool_loop"].level == SAFE
    assert_verdicts_hold(tpl, examples=40)


ENTRIES = catalog()


@pytest.mark.skipif(not ENTRIES, reason=f"no templates/catalog.json under TMPL_TEST_DATA={DATA}")
@pytest.mark.parametrize("entry", ENTRIES, ids=[str(Path(e["template"]).relative_to("templates")) for e in ENTRIES])
def test_catalog_safe_verdicts_hold(entry):
    tpl = template_under_test(entry["template"])
    assert_verdicts_hold(tpl, examples=12)


@pytest.mark.parametrize("family", ["gemma-4-it", "gpt-oss"])
def test_this_search_finds_what_the_stock_templates_break(family, tokenizer_of):
    """Not vacuous: the same strategy finds a tool-loop break in the stock Gemma 4 and gpt-oss
    templates (content next to calls; reasoning dropped once the answer follows)."""
    from hypothesis import find

    tpl = tmpl.ChatTemplate(tokenizer_of(family), name=family)

    def breaks(case: tuple[list[dict[str, Any]], dict[str, Any]]) -> bool:
        try:
            return first_failure(tpl, *case, TOOLS) == "tool_loop"
        except AssertionError:
            raise
        except Exception:  # noqa: BLE001 - a refused shape is not a break
            return False

    msgs, _ = find(conversation(3), breaks, settings=settings(max_examples=300, derandomize=True, database=None))
    assert any(m.get("tool_calls") for m in msgs)
    assert tmpl.report.check(tpl).verdicts["tool_loop"].level != SAFE
