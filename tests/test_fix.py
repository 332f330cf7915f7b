"""``make_training_safe`` / ``tmpl fix``: every unsafe template is fixed to SAFE or refused with a reason.

Ground truth here is transformers' own ``apply_chat_template`` on the test suite's conversations
(tests/contract.py), not the fixer's proof: a fixed template must be prefix-stable and exact
there, render the generation prompt and the assistant's close as the original does, and a refusal
must be backed by a failure that reproduces with transformers.

Cost: every catalog template is reported once; the fixer runs on the unsafe ones only (about 60 s
of CPU on the whole data set).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from jinja2 import nodes

import tmpl
from tmpl.errors import SpliceError, TemplateError, TemplateFixError
from tmpl.report import SAFE, SAFE_WITH, UNSAFE, check, make_training_safe
from tmpl.report import jinja_source as js
from tmpl.report.search import space_for
from tmpl.report.space import SPACE_TOOLS, generate, messages_of

from .conftest import DATA, catalog, template_under_test
from .contract import HARD_CONTENTS, HISTORIES, TOOLS, assistant_turn, check_turn, marker, tool_results
from .counterexamples import reproduces
from .fixes import fixed

ENTRIES = catalog()  # every one is reported; the fixer runs where the tool loop is UNSAFE
FAMILIES = ("qwen2.5-instruct", "qwen3", "llama-3.2-instruct", "gemma-4-it", "mistral-nemo-instruct-2407", "gpt-oss")
#: outcome per template, printed by the last test (run with -s to see it)
OUTCOMES: dict[str, str] = {}


def _template(key: str) -> tmpl.ChatTemplate:
    return template_under_test(key)


def _fix(key: str) -> tmpl.report.FixResult | TemplateFixError:
    return fixed(key)  # made once per process, shared with tests/test_generation_markers.py


def _render(
    tpl: tmpl.ChatTemplate, messages: list[dict], gen: bool, template: str | None = None, tools=TOOLS, **kwargs
) -> str:
    return tpl.tokenizer.apply_chat_template(
        messages,
        tools=tools,
        chat_template=template or tpl.template,
        tokenize=False,
        add_generation_prompt=gen,
        **{**tpl.template_kwargs, **kwargs},
    )


def _ids(tpl: tmpl.ChatTemplate, messages: list[dict], gen: bool, template: str) -> list[int]:
    out = tpl.tokenizer.apply_chat_template(
        messages,
        tools=tmpl.report.stability.PROBE_TOOLSET,
        chat_template=template,
        tokenize=True,
        add_generation_prompt=gen,
        return_dict=True,
        **tpl.template_kwargs,
    )
    return list(out["input_ids"])


KEYS = [e["template"] for e in ENTRIES] + list(FAMILIES)


@pytest.mark.parametrize("key", KEYS, ids=[Path(k).name for k in KEYS])
def test_unsafe_template_is_fixed_or_refused_with_a_reason(key):
    tpl = _template(key)
    report = check(tpl)
    verdict = report.verdicts["tool_loop"]
    if verdict.level not in (UNSAFE, SAFE_WITH):
        pytest.skip(f"tool loop {verdict.label}: nothing to fix")
    outcome = _fix(key)
    if isinstance(outcome, TemplateFixError):
        err = outcome
        assert err.template == tpl.name and tpl.name in str(err) and err.reason
        if report.splice_detail is not None:  # the host tokenizer has no single token for the close
            OUTCOMES[key] = "refused: turn close is not one token of the host tokenizer"
            with pytest.raises(SpliceError):
                tpl.suffix_ids(tool_results(assistant_turn(1), ["x"]), completion_ids=[0], tools=TOOLS)
            return
        # the refusal names a failure that reproduces with transformers, on the original (nothing was
        # worth rewriting) or on the rewrite the proof rejected
        template = err.source or tpl.template
        ce = err.counterexample
        assert ce is not None and ce["use"] == "tool_loop", err.reason
        assert reproduces(tpl, ce, template), err.reason
        if "BPE merge" in err.reason:
            OUTCOMES[key] = "refused: BPE merge across the end of the prompt"
        elif "prefills" in err.reason:
            OUTCOMES[key] = "refused: the generation prompt prefills text the assistant turn leaves out"
        else:
            OUTCOMES[key] = f"refused: {ce['reason']}"
        return
    result = outcome
    OUTCOMES[key] = f"fixed ({len(result.changes)} changes)"
    assert result.verdicts_after["tool_loop"] == SAFE and all(p.ok for p in result.proof)
    fixed = result.template
    lines = result.original.splitlines()
    for change in result.changes:  # line numbers are the original's
        assert change.before.split()[0] in lines[change.line - 1], change
    # ground truth on the suite's own conversations: exact and prefix-stable, with transformers
    for k in range(1, min(report.max_parallel_calls, 2) + 1):
        for hname in ("user", "multiturn"):
            history, assistant = list(HISTORIES[hname]), assistant_turn(k)
            results = tool_results(assistant, ["sunny", " 21 C\n"][:k])
            assert check_turn(fixed, history, assistant, results).prefix_stable, (k, hname)
            # the generation prompt and the assistant's turn close render as in the original
            if hname == "user":
                assert _render(fixed, history, True) == _render(tpl, history, True)
            mark = marker(0, k - 1)
            a, b = _render(tpl, history + [assistant], False), _render(fixed, history + [assistant], False)
            assert b[b.rfind(mark) :] == a[a.rfind(mark) :], (k, hname)


def test_families_fixed_by_rewriting_their_position_tests():
    """Qwen3 and Mistral Nemo are unsafe by if-tests on position; both are fixed, at those lines."""
    qwen3 = _fix("qwen3")
    assert not isinstance(qwen3, TemplateFixError), qwen3
    lines = qwen3.original.splitlines()
    pinned = [c for c in qwen3.changes if "pinned" in c.reason]
    assert {"loop.index0 > ns.last_query_index", "loop.last"} <= {
        t for c in pinned for t in ("loop.index0 > ns.last_query_index", "loop.last") if t in c.before
    }
    assert all("loop" in lines[c.line - 1] for c in pinned)
    nemo = _fix("mistral-nemo-instruct-2407")
    assert not isinstance(nemo, TemplateFixError), nemo
    assert any("loop.last and system_message is defined" in c.before for c in nemo.changes)
    assert nemo.verdicts_before["tool_loop"].startswith("UNSAFE") and nemo.verdicts_after["multi_user"] == SAFE


@pytest.mark.parametrize("family", ["qwen3", "mistral-nemo-instruct-2407"])  # the two families fixed from UNSAFE
def test_fixed_families_keep_the_suffix_contract_on_hard_tool_contents(family, twin):
    """Whitespace, unicode, JSON and 10k-character tool results: the fixed template's suffixes equal
    transformers' full renders, and the prompt is a prefix of them (both compiled and pure twins)."""
    result = _fix(family)
    assert not isinstance(result, TemplateFixError), result
    fixed = tmpl.ChatTemplate(result.template.tokenizer, result.source, name=f"{family}-fixed")  # fresh state
    for kind, content in HARD_CONTENTS.items():
        assistant = assistant_turn(1)
        checked = check_turn(fixed, list(HISTORIES["multiturn"]), assistant, tool_results(assistant, [content]))
        assert checked.prefix_stable, kind


def test_a_splice_unsafe_template_is_refused_by_name(tokenizer_of):
    tok = tokenizer_of("qwen3")
    path = DATA / "templates" / "llama.cpp" / "GLM-4.6.jinja"
    if not path.is_file():
        pytest.skip("GLM-4.6.jinja is not in TMPL_TEST_DATA")
    with pytest.raises(TemplateFixError) as info:
        make_training_safe(tmpl.ChatTemplate(tok, path.read_text(encoding="utf-8"), name="GLM-4.6.jinja"))
    assert isinstance(info.value, TemplateError)
    assert "'GLM-4.6.jinja'" in str(info.value) and "not a single token" in info.value.reason


MISTRAL_SMALL = "templates/llama.cpp/Mistral-Small-3.2-24B-Instruct-2506.jinja"


def test_date_is_pinned_through_a_kwarg_with_the_original_as_default():
    if not (DATA / MISTRAL_SMALL).is_file():
        pytest.skip(f"{MISTRAL_SMALL} is not in TMPL_TEST_DATA")
    fixed = _fix(MISTRAL_SMALL)  # writes strftime_now("%Y-%m-%d") into its default system message
    assert not isinstance(fixed, TemplateFixError), fixed
    assert any("strftime_now" in c.before and "date_string" in c.after for c in fixed.changes)
    assert any(p.name == "date pinned" and p.ok for p in fixed.proof)
    messages = [{"role": "user", "content": "hi"}]
    pinned = fixed.template.tokenizer.apply_chat_template(
        messages, chat_template=fixed.source, tokenize=False, add_generation_prompt=True, date_string="1999-12-31"
    )
    assert "The current date is 1999-12-31." in pinned
    original = _template(MISTRAL_SMALL)
    assert _render(fixed.template, messages, True) == _render(original, messages, True)  # same day, no kwarg
    llama = _fix("llama-3.2-instruct")
    if not isinstance(llama, TemplateFixError):  # Llama 3.2 already takes date_string: no date edit
        assert not any("strftime_now" in c.before for c in llama.changes)


#: shipped hand-written template -> family whose original template it was written from
SHIPPED = {
    "qwen2.5": "qwen2.5-instruct",
    "qwen3": "qwen3",
    "llama-3": "llama-3.2-instruct",
    "gpt-oss": "gpt-oss",
    "gemma-4": "gemma-4-it",
}


#: hand-written templates whose original no rewrite of if-tests makes safe: the rewrite is refused
#: with a counterexample (a tool-call turn with content: Gemma 4 renders that content after the tool
#: responses once they follow; gpt-oss renders it as analysis while last and drops it later)
REFUSED = {"gemma-4", "gpt-oss"}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_rewrites_are_explained_by_a_counterexample_the_hand_written_template_passes(name):
    family = SHIPPED[name]
    result = _fix(family)
    assert isinstance(result, TemplateFixError), "now proven: move it out of REFUSED"
    ce = result.counterexample
    assert ce is not None and ce["use"] == "tool_loop"
    original = _template(family)
    assert reproduces(original, ce, result.source)  # breaks the rewrite, with transformers
    turns = [m for m in ce["messages"] if m["role"] == "assistant" and m.get("tool_calls")]
    assert any(isinstance(m.get("content"), str) and m["content"] for m in turns)  # content next to calls
    assert not reproduces(original, ce, tmpl.templates.load(name))  # the hand-written template holds there


@pytest.mark.parametrize("name", sorted(set(SHIPPED) - REFUSED))
def test_fixed_original_renders_as_the_hand_written_template(name):
    family = SHIPPED[name]
    result = _fix(family)
    original = _template(family)
    assert not isinstance(result, TemplateFixError), result
    fixed = result.template
    hand = tmpl.ChatTemplate(original.tokenizer, tmpl.templates.load(name), name=name)
    compared = 0
    for messages, gen, tools, kwargs in _suite_and_search_renders(hand):
        try:
            want = _render(hand, messages, gen, tools=tools, **kwargs)
        except Exception:  # noqa: BLE001 - compared below
            want = None
        try:
            got = _render(fixed, messages, gen, tools=tools, **kwargs)
        except Exception:  # noqa: BLE001
            got = None
        if want == got:
            compared += want is not None
            continue
        raise AssertionError(f"{name} {kwargs} gen={gen} {messages}:\n fixed {got!r}\n hand  {want!r}")
    assert compared >= 100


def _suite_and_search_renders(hand: tmpl.ChatTemplate):
    """The renders compared: this suite's conversations, then each growth step of the search's conversations
    for ``hand`` (every prompt before an assistant turn, the turn rendered last, the whole conversation)."""
    for history in HISTORIES.values():
        for k in (1, 2):
            assistant = assistant_turn(k)
            results = tool_results(assistant, ["sunny", " 21 C\n"][:k])
            final = {"role": "assistant", "content": "Done."}
            yield list(history), True, TOOLS, {}
            yield history + [assistant], False, TOOLS, {}
            yield history + [assistant] + results, True, TOOLS, {}
            yield history + [assistant] + results + [final], False, TOOLS, {}
    probed = space_for(hand)
    for spec in generate(probed.space, seed=1, n=24):
        messages, kwargs = messages_of(spec), dict(spec.kwargs)
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                yield messages[:i], True, SPACE_TOOLS, kwargs
                yield messages[: i + 1], False, SPACE_TOOLS, kwargs
        yield messages, messages[-1]["role"] != "assistant", SPACE_TOOLS, kwargs


def test_expression_printer_round_trips_every_catalog_condition():
    env = js.environment()
    count = 0
    for entry in catalog():
        source = (DATA / entry["template"]).read_text(encoding="utf-8")
        try:
            tree = env.parse(source)
        except Exception:  # noqa: BLE001 - a template jinja cannot parse is no printer question
            continue
        for node in tree.find_all(nodes.If):
            assert js.parse_test(env, js.expr_source(node.test)) == node.test, (entry["template"], node.lineno)
            count += 1
    if not count:
        pytest.skip(f"no catalog under TMPL_TEST_DATA={DATA}")


def test_cli_fix_writes_the_template_and_refuses_with_status_1(tmp_path, capsys):
    from tmpl.cli import main

    if not (DATA / "qwen3").is_dir():
        pytest.skip("qwen3 is not in TMPL_TEST_DATA")
    out = tmp_path / "fixed.jinja"
    assert main(["fix", str(DATA / "qwen3"), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "line 39:" in printed and "PASS prefix stability" in printed
    result = _fix("qwen3")
    assert out.read_text(encoding="utf-8") == result.source
    glm = DATA / "templates" / "llama.cpp" / "GLM-4.6.jinja"
    if glm.is_file():
        assert main(["fix", str(glm), "--tokenizer", str(DATA / "qwen3")]) == 1
        err = capsys.readouterr().err
        assert "refused" in err and "GLM-4.6.jinja" in err
    assert main(["fix", str(glm)]) == 2  # a bare .jinja needs --tokenizer


def test_summary_of_outcomes():
    """How many unsafe templates were fixed, how many refused and why (run with -s to read it)."""
    if not OUTCOMES:
        pytest.skip("no template was unsafe here (no data?)")
    fixed = sorted(k for k, v in OUTCOMES.items() if v.startswith("fixed"))
    refused = Counter(v for v in OUTCOMES.values() if v.startswith("refused"))
    print(f"\nfixed {len(fixed)}: {', '.join(Path(k).name for k in fixed)}")
    for reason, n in refused.most_common():
        print(f"refused {n}: {reason}")
    assert {"qwen3", "mistral-nemo-instruct-2407"} <= set(fixed)
    assert not any(v == "refused: " for v in OUTCOMES.values())
