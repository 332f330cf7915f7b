"""Template reports: verdicts checked against ground truth computed directly with full renders."""

from __future__ import annotations

from pathlib import Path

import pytest

import tmpl
from tmpl.report import SAFE, SAFE_WITH, UNSAFE, UNSUPPORTED, check

from .conftest import DATA, catalog, template_under_test
from .contract import HISTORIES, TOOLS, assistant_turn, check_turn, renders_tool_turn, tool_results
from .counterexamples import reproduces

ENTRIES = catalog()


def _report(tok, name: str, template: str | None = None) -> tmpl.report.TemplateReport:
    return check(tmpl.ChatTemplate(tok, template, name=name))


def _ids(tpl, messages, gen: bool) -> list[int]:
    out = tpl.tokenizer.apply_chat_template(
        messages,
        tools=TOOLS,
        chat_template=tpl.template,
        tokenize=True,
        add_generation_prompt=gen,
        **tpl.template_kwargs,
    )
    return list(out["input_ids"])


# -- families: verdicts read off the templates (MANIFEST.md), not off tmpl ------------------------


@pytest.mark.parametrize(
    "family, tool_loop, multi_user",
    [
        ("qwen2.5-instruct", SAFE, SAFE),
        ("qwen3", None, UNSAFE),  # drops <think> of assistant turns before the last user query
        ("gpt-oss", None, UNSAFE),  # drops the analysis channel of earlier turns
        ("gemma-4-it", None, UNSAFE),  # strips thinking from earlier model turns
        ("deepseek-v3", UNSUPPORTED, UNSUPPORTED),  # calls do not render (content None is dropped)
        ("gemma-2-it", UNSUPPORTED, UNSUPPORTED),  # a 'tool' message raises
        ("gemma-3-it", UNSUPPORTED, UNSUPPORTED),
        ("phi-3-mini-4k-instruct", UNSUPPORTED, UNSUPPORTED),  # tool turns dropped silently
    ],
)
def test_family_verdicts(family, tool_loop, multi_user, tokenizer_of):
    report = _report(tokenizer_of(family), family)
    if tool_loop is not None:
        assert report.verdicts["tool_loop"].level in (tool_loop, SAFE_WITH), report.verdicts["tool_loop"].label
    assert report.verdicts["multi_user"].level in (multi_user, SAFE_WITH), report.verdicts["multi_user"].label


@pytest.mark.parametrize(
    "family, reasons",
    [
        # stock Qwen3 renders an empty think block for the last turn only (and drops earlier thinking)
        ("qwen3", {"empty thinking block rendered only when the assistant turn is last"}),
        # gpt-oss ends a final answer with <|return|> while last, <|end|> once a user follows
        ("gpt-oss", {"the turn's closing token changes once messages follow it"}),
        ("gemma-4-it", {"thinking stripped from earlier turns"}),
    ],
)
def test_thinking_templates_name_the_reason(family, reasons, tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of(family), name=family)
    check = tmpl.report.check(tpl).stability["user_append"]
    assert not check.ok and check.reason in reasons, check.reason
    assert _counterexample_fails(tpl, check)


def test_mistral_system_prompt_moves(tokenizer_of):
    report = _report(tokenizer_of("mistral-nemo-instruct-2407"), "mistral-nemo")
    check = report.stability["tool_append"]
    assert not check.ok and check.reason == "system prompt moved"
    assert report.verdicts["tool_loop"].level in (UNSAFE, SAFE_WITH)


def test_llama_date_injection_and_turn_close(tokenizer_of):
    report = _report(tokenizer_of("llama-3.2-instruct"), "llama-3.2")
    assert report.date_injected  # "Today Date: ..." from strftime_now
    assert report.tool_close == "<|eot_id|>" and report.close_is_eos
    assert report.max_parallel_calls == 1  # the template raises on parallel calls
    gemma = _report(tokenizer_of("gemma-4-it"), "gemma-4")
    assert gemma.tool_close == "<|tool_response>" and gemma.close_is_eos is False
    assert not gemma.date_injected


def test_report_serializes(tokenizer_of):
    report = _report(tokenizer_of("qwen2.5-instruct"), "qwen2.5")
    data = report.to_dict()
    assert data["verdicts"]["tool_loop"]["label"] == "SAFE"
    assert data["stop_tokens"] == ["<|im_end|>"]
    assert report.generation_prompt == "<|im_start|>assistant\n"
    assert report.after_close is not None and report.after_close.startswith("\n<|im_start|>user")
    md = report.to_markdown()
    assert "**tool loop (token-in/token-out): SAFE**" in md and "probe" not in md.lower().split("fingerprint")[0]


# -- every catalog template: its verdict against ground truth --------------------------------------


def _counterexample_fails(tpl, check) -> bool:
    return reproduces(tpl, check.counterexample)


@pytest.mark.skipif(not ENTRIES, reason=f"no templates/catalog.json under TMPL_TEST_DATA={DATA}")
@pytest.mark.parametrize("entry", ENTRIES, ids=[str(Path(e["template"]).relative_to("templates")) for e in ENTRIES])
def test_catalog_verdict_matches_ground_truth(entry):
    tpl = template_under_test(entry["template"])
    report = check(tpl)
    for use, verdict in report.verdicts.items():
        assert verdict.label and (verdict.level == SAFE or verdict.reason), (use, verdict)
    verdict = report.verdicts["tool_loop"]
    if verdict.level == SAFE:
        # independently: exact and prefix-stable on the test suite's own conversations
        for k in range(1, report.max_parallel_calls + 1):
            for hname in ("user", "multiturn"):
                assistant = assistant_turn(k)
                results = tool_results(assistant, ["sunny", " 21 C\n", "ü"][:k])
                checked = check_turn(tpl, list(HISTORIES[hname]), assistant, results)
                assert checked.prefix_stable, (k, hname)
    elif verdict.level == UNSUPPORTED:
        assistant = assistant_turn(1)
        results = tool_results(assistant, ["sunny"])
        if verdict.reason == "tool calls are not rendered":
            text = tpl.tokenizer.apply_chat_template(
                HISTORIES["user"] + [assistant] + results, tools=TOOLS, chat_template=tpl.template, tokenize=False
            )
            assert "Qz0m0Kv" not in text  # the call's marker argument is nowhere in the render
        elif renders_tool_turn(tpl, HISTORIES["user"], assistant, results):
            with pytest.raises(tmpl.errors.TmplError):
                tpl.suffix_ids(results, completion_ids=[0], tools=TOOLS, history=HISTORIES["user"])
    else:
        failed = [c for n, c in report.stability.items() if not c.ok and n in ("tool_append", "assistant_kept")]
        if report.splice_detail is not None:
            with pytest.raises(tmpl.errors.SpliceError):
                tpl.suffix_ids(tool_results(assistant_turn(1), ["x"]), completion_ids=[0], tools=TOOLS)
        else:
            assert failed and failed[0].counterexample, verdict.label
            assert _counterexample_fails(tpl, failed[0]), f"stored counterexample does not reproduce: {verdict.label}"
    if verdict.level == SAFE_WITH:  # the shipped template named really is safe and exact here
        variant = tmpl.ChatTemplate(tpl.tokenizer, tmpl.templates.load(verdict.template), name=verdict.template)
        assert check(variant).verdicts["tool_loop"].level == SAFE
        assistant = assistant_turn(1)
        assert check_turn(variant, list(HISTORIES["user"]), assistant, tool_results(assistant, ["ok"])).prefix_stable
    user = report.stability["user_append"]
    if report.verdicts["multi_user"].level in (UNSAFE, SAFE_WITH) and not user.ok and user.counterexample:
        assert _counterexample_fails(tpl, user)
