"""tmpl's verl Continuous Token builder against full renders and against verl's own builders.

Runs only where verl is installed (``tests/run_envs.sh`` runs this file with
``build/venv-verl/bin/python``, made by ``.ci/run``: verl 0.9.1 needs transformers<5.11). Ground truth is transformers' full ``apply_chat_template``
render of the whole conversation (``tests/contract.py``), never tmpl's output. For every family
tokenizer and every catalog template, each tool turn is merged by tmpl's builder and by the builder
verl itself would pick (by the ``config.json`` ``model_type`` of the family's model; for a catalog
template, of its host tokenizer's model); the side-by-side table is printed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip(
    "verl.utils.tokenizer.continuous_token",
    reason="verl is not installed here; tests/run_envs.sh runs it in build/venv-verl (made by .ci/run: verl 0.9.1, transformers<5.11)",
)

import tmpl  # noqa: E402
from tmpl.integrations.verl import TmplContinuousTokenBuilder, create_tmpl_builder  # noqa: E402

from .conftest import DATA, FAMILIES, catalog, template_under_test  # noqa: E402
from .contract import HARD_CONTENTS, HISTORIES, TOOLS, assistant_turn, full_render, marker, tool_results  # noqa: E402

#: config.json ``model_type`` of each family's model (read off the models' configs on the hub)
MODEL_TYPES = {
    "qwen2.5-instruct": "qwen2",
    "qwen3": "qwen3",
    "llama-3.2-instruct": "llama",
    "gemma-2-it": "gemma2",
    "gemma-3-it": "gemma3_text",
    "gemma-4-it": "gemma4",
    "mistral-nemo-instruct-2407": "mistral",
    "phi-3-mini-4k-instruct": "phi3",
    "phi-4-mini-instruct": "phi3",
    "deepseek-v3": "deepseek_v3",
    "gpt-oss": "gpt_oss",
}
CONTENTS = list(HARD_CONTENTS.values())
KEYS = list(FAMILIES) + [e["template"] for e in catalog()]
TABLE: dict[str, dict[str, int]] = {}
BUILDER: dict[str, str] = {}  # template -> the verl builder class compared
#: one wrong merge of verl's per template: what it appended and what the full render has
VERL_WRONG: list[str] = []
#: cases verl's builder gets right and tmpl refuses (with tmpl's reason): printed with the table
REFUSED_WHERE_VERL_EXACT: list[str] = []


def truth(tpl, history, assistant, results):
    """(runtime ids, the full render's tail after the completion) or None when there is no such turn.

    The completion is the full render's tokens after the prompt up to the first stop token after the
    last call; the tail is everything the full render has after it.
    """
    try:
        text, full = full_render(tpl, history + [assistant] + results)
        prompt, _ = full_render(tpl, history)
    except Exception:
        return None
    prompt_ids = tpl.tokenizer.apply_chat_template(
        history, tools=TOOLS, chat_template=tpl.template, add_generation_prompt=True, **tpl.template_kwargs
    )
    prompt_ids = list(prompt_ids["input_ids"] if hasattr(prompt_ids, "keys") else prompt_ids)
    start = next((i for i, (a, b) in enumerate(zip(prompt_ids, full)) if a != b), min(len(prompt_ids), len(full)))
    ends = [text.find(marker(0, i)) for i in range(len(assistant["tool_calls"]))]
    pos = max(e + len(marker(0, 0)) for e in ends) if min(ends) >= 0 else len(tpl.tokenizer.decode(full[:start]))
    enc = tpl.tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
    if enc.ids != full:
        return None
    stops = tpl.stop_token_ids
    j = next((t for t, (s, _) in enumerate(enc.offsets) if s >= pos and full[t] in stops), None)
    if j is None:
        return None
    return prompt_ids, prompt_ids + full[start : j + 1], full[j + 1 :]


def cases():
    for k in (1, 2, 3):
        for h in ("user", "system"):
            assistant = assistant_turn(k)
            contents = [CONTENTS[(k + i) % len(CONTENTS)] for i in range(k)]
            yield f"{k} call(s), {h} history", list(HISTORIES[h]), assistant, tool_results(assistant, contents)


def verl_builder(key: str, tpl):
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    if key in FAMILIES:
        family, kwargs = key, {}
    else:  # the template on its host tokenizer: verl picks by the host model's model_type
        family = next(e for e in catalog() if e["template"] == key)["host_tokenizer"]
        kwargs = {"chat_template": tpl.template}
    return create_continuous_token_builder(
        tpl.tokenizer, hf_model_type=MODEL_TYPES.get(family), chat_template_kwargs=kwargs
    )


@pytest.mark.parametrize("key", KEYS, ids=[k if k in FAMILIES else Path(k).name for k in KEYS])
def test_builder_equals_full_render_where_verls_may_not(key):
    tpl = template_under_test(key)
    ours = TmplContinuousTokenBuilder(tpl.tokenizer, template=tpl, fallback="error")
    theirs = verl_builder(key, tpl)
    BUILDER[key] = type(theirs).__name__.replace("ContinuousTokenBuilder", "") or "(default)"
    row = dict.fromkeys(("cases", "tmpl exact", "tmpl refused", "verl exact", "verl wrong", "verl raised"), 0)
    for case, history, assistant, results in cases():
        t = truth(tpl, history, assistant, results)
        if t is None:
            continue
        prompt, runtime, expected = t
        row["cases"] += 1
        try:
            initial = ours.build_initial_tokens(history, tools=TOOLS)
        except (tmpl.errors.TemplateError, tmpl.errors.MessageError):
            initial = None
        assert initial is None or initial == prompt, f"{key}: first prompt differs from apply_chat_template's"
        previous, updated = history + [assistant], history + [assistant] + results
        refusal = None
        try:
            merged = ours.merge_context_tokens(previous, updated, runtime, tools=TOOLS)
        except tmpl.errors.ContinuousTokenError as exc:
            row["tmpl refused"] += 1
            refusal = str(exc)
        else:
            assert merged.token_ids == runtime + expected, (
                f"{key}: tmpl's merge differs from the full render\n"
                f"  tmpl: {tpl.codec.decode(merged.token_ids[len(runtime) :])!r}\n  full: {tpl.codec.decode(expected)!r}"
            )
            assert merged.kind == "context" and merged.appended_token_count == len(expected)
            row["tmpl exact"] += 1
        try:
            theirs_merged = theirs.merge_context_tokens(previous, updated, list(runtime), tools=TOOLS)
        except Exception:
            row["verl raised"] += 1
        else:
            exact = theirs_merged.token_ids == runtime + expected
            row["verl exact" if exact else "verl wrong"] += 1
            if not exact and row["verl wrong"] == 1:
                got = tpl.codec.decode(
                    theirs_merged.token_ids[len(runtime) - theirs_merged.removed_prefix_token_count :]
                )
                VERL_WRONG.append(
                    f"{key} ({case}):\n    verl: {got[:160]!r}\n    full: {tpl.codec.decode(expected)[:160]!r}"
                )
            if exact and refusal is not None:
                REFUSED_WHERE_VERL_EXACT.append(f"{key} ({case}): {refusal}")
    TABLE[key] = row


def test_print_side_by_side_table(capsys):
    if not TABLE:
        pytest.skip("no template was compared (TMPL_TEST_DATA absent?)")
    lines = [
        f"{'template':48} {'verl builder':12} {'cases':>5} {'tmpl':>5} {'refused':>7} {'verl':>5} {'wrong':>5} {'raised':>6}"
    ]
    total = dict.fromkeys(next(iter(TABLE.values())), 0)
    for key, row in TABLE.items():
        name = key if key in FAMILIES else Path(key).name
        lines.append(
            f"{name[:48]:48} {BUILDER[key][:12]:12} {row['cases']:5} {row['tmpl exact']:5} {row['tmpl refused']:7} "
            f"{row['verl exact']:5} {row['verl wrong']:5} {row['verl raised']:6}"
        )
        for k, v in row.items():
            total[k] += v
    lines.append(
        f"{'TOTAL':48} {'':12} {total['cases']:5} {total['tmpl exact']:5} {total['tmpl refused']:7} "
        f"{total['verl exact']:5} {total['verl wrong']:5} {total['verl raised']:6}"
    )
    lines += ["verl wrong (first case per template):"] + [f"  {c}" for c in VERL_WRONG or ["(none)"]]
    lines += ["verl exact where tmpl refuses:"] + [f"  {c}" for c in REFUSED_WHERE_VERL_EXACT or ["(none)"]]
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert total["tmpl exact"] >= total["verl exact"]


def test_any_model_type_gets_tmpl_builder(tokenizer_of):
    tok = tokenizer_of("mistral-nemo-instruct-2407")
    builder = create_tmpl_builder(tok, hf_model_type="no_such_model_type", chat_template_kwargs={})
    assert isinstance(builder, TmplContinuousTokenBuilder)


def test_non_tool_append_falls_back_or_raises(tokenizer_of):
    tok = tokenizer_of("qwen2.5-instruct")
    history = list(HISTORIES["user"])
    reply = {"role": "assistant", "content": "Hello."}
    runtime = tmpl.ChatTemplate(tok).prompt_ids(history) + tok.encode("Hello.<|im_end|>", add_special_tokens=False)
    user = {"role": "user", "content": "And Tokyo?"}
    strict = TmplContinuousTokenBuilder(tok, fallback="error")
    with pytest.raises(tmpl.errors.ContinuousTokenError, match="appended roles"):
        strict.merge_context_tokens(history + [reply], history + [reply, user], runtime)
    lenient = TmplContinuousTokenBuilder(tok, hf_model_type="qwen2")
    merged = lenient.merge_context_tokens(history + [reply], history + [reply, user], runtime)
    assert lenient.fallbacks == 1
    full = tok.apply_chat_template(history + [reply, user], add_generation_prompt=True, tokenize=True)
    full = list(full["input_ids"] if hasattr(full, "keys") else full)
    assert merged.token_ids == full  # verl's Qwen builder, asked by tmpl's, renders a user turn exactly


def test_use_tmpl_builders_patches_verls_agent_loops():
    import verl.experimental.agent_loop.agent_loop as agent_loop

    from tmpl.integrations.verl import use_tmpl_builders

    before = agent_loop.create_continuous_token_builder
    try:
        use_tmpl_builders()
        assert agent_loop.create_continuous_token_builder is create_tmpl_builder
    finally:
        agent_loop.create_continuous_token_builder = before


def test_data_dir_is_present():
    if not DATA.is_dir():
        pytest.skip(f"TMPL_TEST_DATA={DATA} absent")


#: the families whose templates render parallel calls (tests/test_suffix_families.py's MAX_CALLS == 3)
PARALLEL = [
    "qwen2.5-instruct",
    "qwen3",
    "gemma-4-it",
    "mistral-nemo-instruct-2407",
    "deepseek-v3",
    "phi-4-mini-instruct",
]


def test_hard_contents_side_by_side(capsys, tokenizer_of):
    """108 cases: 6 families x 1-3 calls x each hard content (empty, whitespace, unicode, JSON, 10 kB...),
    merged by tmpl's builder, by verl's builder for the family's model_type, and by verl's default builder
    (what verl uses for any model_type it has no builder for)."""
    from verl.utils.tokenizer.continuous_token import ContinuousTokenBuilder

    head = f"{'family':28} {'cases':>5} {'tmpl':>5} {'verl':>5} {'default':>7}  verl / default wrong on"
    lines, total = [head], [0, 0, 0, 0]
    for family in PARALLEL:
        tpl = tmpl.ChatTemplate(tokenizer_of(family), name=family)
        ours = TmplContinuousTokenBuilder(tpl.tokenizer, template=tpl, fallback="error")
        contenders = [verl_builder(family, tpl), ContinuousTokenBuilder(tpl.tokenizer)]
        row, wrong = [0, 0, 0, 0], (set(), set())
        for k in (1, 2, 3):
            for cname, content in HARD_CONTENTS.items():
                history, assistant = list(HISTORIES["user"]), assistant_turn(k)
                results = tool_results(assistant, [content] * k)
                t = truth(tpl, history, assistant, results)
                assert t is not None, f"{family}: {k} call(s), {cname}: no full render to compare with"
                _, runtime, expected = t
                previous, updated = history + [assistant], history + [assistant] + results
                merged = ours.merge_context_tokens(previous, updated, runtime, tools=TOOLS)
                assert merged.token_ids == runtime + expected, f"{family}: {k} call(s), {cname}"
                row[0] += 1
                row[1] += 1
                for j, builder in enumerate(contenders):
                    try:
                        got = builder.merge_context_tokens(previous, updated, list(runtime), tools=TOOLS).token_ids
                        exact = got == runtime + expected
                    except Exception:
                        exact = False
                    row[2 + j] += exact
                    if not exact:
                        wrong[j].add(cname)
        total = [a + b for a, b in zip(total, row)]
        why = " / ".join(", ".join(sorted(w)) or "-" for w in wrong)
        lines.append(f"{family:28} {row[0]:5} {row[1]:5} {row[2]:5} {row[3]:7}  {why}")
    lines.append(f"{'TOTAL':28} {total[0]:5} {total[1]:5} {total[2]:5} {total[3]:7}")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert total[0] == total[1] == 108
