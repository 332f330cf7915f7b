"""``tmpl check``'s ``env_turns`` verdict: can a template take a user or system turn after an assistant turn
(after its answer, or after its tool results), as an environment or a simulated user appends one?

Real templates: Mistral-Nemo's strictly alternates (a user turn after tool results, a system turn anywhere
but first, raise) and Gemma 2's refuses system turns (its report, as ``tmpl check`` prints and gates it):
each is refused with a counterexample that is checked
against ``apply_chat_template`` itself (it raises on the counterexample, renders its control). Qwen2.5 and
Llama 3.2 pass; Qwen2.5 renders no developer role, which the report says per role (checked: the developer's
text is absent from the template's render). The search is seeded: a Hypothesis test runs it from other
seeds and finds the same refusal.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tmpl
from tmpl.report.report import build_report
from tmpl.report.search import space_for
from tmpl.report.space import SPACE_TOOLS
from tmpl.report.turns import search_turns

from .conftest import template_under_test


def render(tpl, messages, **kwargs):
    """The tokenizer's own render (the oracle), with the tools the search renders with."""
    return tpl.tokenizer.apply_chat_template(
        messages, tools=SPACE_TOOLS, tokenize=False, add_generation_prompt=True, **kwargs
    )


@pytest.fixture(scope="module")
def nemo():
    tpl = template_under_test("mistral-nemo-instruct-2407")
    return tpl, search_turns(tpl, space_for(tpl).space)


def test_a_template_that_alternates_strictly_is_refused_with_its_counterexample(nemo):
    tpl, found = nemo
    verdict = found.verdict()
    assert verdict.level == "UNSUPPORTED"
    assert "a user turn after tool results raises" in verdict.reason
    assert "roles must alternate" in verdict.reason
    ce = found.counterexamples["user"]
    roles = [m["role"] for m in ce["messages"]]
    at = roles.index("tool")
    assert roles[at + 1] == "user"  # the turn after the tool results
    # the oracle: the template itself raises on the counterexample, and renders it without that turn
    with pytest.raises(Exception, match="roles must alternate"):
        render(tpl, ce["messages"])
    assert "TmPl" in render(tpl, ce["messages"][: at + 1])
    # a system turn after an answer: refused too, its own counterexample
    assert found.roles["system"].level == "UNSUPPORTED"
    with pytest.raises(Exception, match="alternate"):
        render(tpl, found.counterexamples["system"]["messages"])


def test_tmpl_check_shows_the_verdict_and_gates_on_it(capsys):
    """Gemma 2's template raises on a system turn anywhere but first: the report (what ``tmpl check``
    prints) refuses it with the counterexample; ``--require env_turns`` exits 3."""
    tpl = template_under_test("gemma-2-it")
    report = build_report(tpl, shipped=False)  # what tmpl check reports, without trying shipped templates
    verdict = report.verdicts["env_turns"]
    assert verdict.level == "UNSUPPORTED" and "a system turn after an answer raises" in verdict.reason
    assert report.env_turns["roles"]["user"]["level"] == "SAFE"  # a user turn after an answer renders
    ce = report.env_turns["counterexamples"]["system"]
    assert [m["role"] for m in ce["messages"]][:3] == ["user", "assistant", "system"]
    with pytest.raises(Exception, match="alternate"):
        render(tpl, ce["messages"])
    text = report.to_markdown()
    assert "user and system turns after an assistant turn (environments): UNSUPPORTED" in text
    assert "## Counterexample: a system turn after an assistant turn" in text and ce["error"] in text
    assert report.to_dict()["verdicts"]["env_turns"]["level"] == "UNSUPPORTED"

    from tmpl.cli import _gate

    assert _gate("check", report, ("env_turns",)) == 3  # tmpl check --require env_turns: UNSUPPORTED exits 3
    assert "env_turns is UNSUPPORTED (a system turn after an answer raises" in capsys.readouterr().err
    assert _gate("check", report, ("multi_user",)) == 3  # the other verdicts as before (no tool calls: UNSUPPORTED)


@pytest.mark.parametrize("family", ["qwen2.5-instruct", "llama-3.2-instruct"])
def test_qwen25_and_llama32_pass(family):
    tpl = template_under_test(family)
    found = search_turns(tpl, space_for(tpl).space)
    verdict = found.verdict()
    assert verdict.level == "SAFE", verdict.label
    assert found.roles["user"].cases > 0 and found.roles["system"].cases > 0
    assert set(found.places) == {
        f"{role} after {where}" for role in ("user", "system", "developer") for where in ("an answer", "tool results")
    }


def test_a_role_the_template_drops_is_reported_per_role():
    tpl = template_under_test("qwen2.5-instruct")
    found = search_turns(tpl, space_for(tpl).space)
    developer = found.roles["developer"]
    assert developer.level == "UNSUPPORTED" and "is not rendered" in developer.reason
    assert found.verdict().level == "SAFE"  # developer turns are reported, not gated
    messages = found.counterexamples["developer"]["messages"]
    text = next(m["content"] for m in messages if m["role"] == "developer")
    assert text not in render(tpl, messages)  # the oracle: the template's own render leaves it out
    assert all(m["content"] in render(tpl, messages) for m in messages if m["role"] == "user")


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(min_value=1, max_value=2**31))
def test_the_search_finds_the_refusal_from_any_seed(seed):
    tpl = template_under_test("mistral-nemo-instruct-2407")
    found = search_turns(tpl, space_for(tpl).space, seed=seed)
    assert found.roles["system"].level == "UNSUPPORTED"
    assert found.roles["user"].level == "UNSUPPORTED"
    assert isinstance(tpl, tmpl.ChatTemplate)
