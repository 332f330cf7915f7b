"""History modes of ``tmpl.Rollout`` (issue 36, the loop side): append, template, the edit_history hook.

The oracle everywhere is the tokenizer's own ``apply_chat_template`` full render of the messages so
far; the sampled IDs are captured from the requests the (Scripted) backend gets and what it returns.
Some answers are sampled in a tokenization the tokenizer would not produce (``split``), so an
implementation that decoded and re-encoded them would fail the checks that they come back unchanged.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tmpl
from tmpl.backends import Scripted
from tmpl.episode import BranchKind
from tmpl.rollout import EndCode

from .conftest import load_tokenizer
from .test_rollout import FAMILIES, FUNCS, SCHEMAS, ScriptedConversation

USER = "Weather in Paris?"


def _tpl(family: str) -> tmpl.ChatTemplate:
    return tmpl.ChatTemplate(load_tokenizer(family), name=family)


def _render(tpl: tmpl.ChatTemplate, messages, *, tokenize: bool, tools=SCHEMAS):
    out = tpl.tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=tpl.template, add_generation_prompt=True, tokenize=tokenize
    )
    if tokenize:
        return list(out["input_ids"] if hasattr(out, "keys") else out)
    return out


def _sublist_at(haystack: list[int], needle: list[int]) -> int:
    n = len(needle)
    for k in range(len(haystack) - n + 1):
        if haystack[k : k + n] == needle:
            return k
    return -1


class Recorder:
    """A Scripted policy replaying ``completions[turn]`` (IDs) and recording each request's prompt."""

    def __init__(self, completions: list[list[int]]):
        self.completions = completions
        self.prompts: list[list[int]] = []
        self.sampled: list[list[int]] = []

    def __call__(self, request):
        turn = int(request.request_id.split("-")[2])
        self.prompts.append(list(request.prompt_ids))
        ids = self.completions[turn]
        self.sampled.append(list(ids))
        return ids


def more_users(*questions: str):
    """A hook that asks the next question after each final answer (a simulated user), edits nothing."""

    def hook(messages, ctx):
        asked = sum(1 for m in messages if m["role"] == "user") - 1
        if ctx.answered and asked < len(questions):
            return messages + [{"role": "user", "content": questions[asked]}]
        return None

    return hook


def _assistants(messages) -> list[int]:
    return [i for i, m in enumerate(messages) if m["role"] == "assistant"]


class Seen:
    """Wraps a hook: the messages each later turn's prompt renders (what the hook returned)."""

    def __init__(self, hook, first):
        self.hook = hook
        self.histories = [[dict(m) for m in first]]

    def __call__(self, messages, ctx):
        out = self.hook(messages, ctx)
        self.histories.append(messages if out is None else out)
        return out


def _check_prompts_are_full_renders(tpl, res, rec, tools=SCHEMAS, histories=None):
    """Every turn's prompt decodes to the full render of the messages before it; the first prompt and
    the text after the last sampled span are the tokenizer's own IDs. ``histories``: the messages
    each turn rendered (default: the result's messages before the turn's answer, for hooks that only add)."""
    starts = _assistants(res.messages)
    assert len(starts) == len(rec.prompts) == res.turns
    for t, prompt in enumerate(rec.prompts):
        so_far = res.messages[: starts[t]] if histories is None else histories[t]
        text = _render(tpl, so_far, tokenize=False, tools=tools)
        assert tpl.codec.decode(prompt) == text, f"turn {t}"
        full = _render(tpl, so_far, tokenize=True, tools=tools)
        if t == 0:
            assert prompt == full
            continue
        spans = [k for k in res.kept[t - 1] if k.size]
        if not spans:  # no sampled text kept (an edit removed it): the tokenizer's own IDs throughout
            assert prompt == full, f"turn {t}"
            continue
        head = min(k.at for k in spans)
        assert prompt[:head] == full[:head], f"turn {t}: IDs before the first sampled span"
        last = max(k.at + k.size for k in spans)
        tail = prompt[last:]
        assert tail == full[len(full) - len(tail) :], f"turn {t}: IDs after the last sampled span"


def _check_every_sampled_token_trained_once(res, rec):
    seqs = res.sequences
    assert sum(int(s.mask.sum()) for s in seqs) == sum(len(ids) for ids in rec.sampled)
    for s in seqs:
        for span in s.spans:
            turn = int(span.call.split("-")[1])
            assert s.ids[span.start : span.end].tolist() == rec.sampled[turn]
            assert s.mask[span.start : span.end].all()
    # every sequence is what the engine was sent plus what it sampled: its calls' prompts are prefixes
    for s in seqs:
        for span in s.spans:
            turn = int(span.call.split("-")[1])
            assert s.ids[: span.start].tolist() == rec.prompts[turn]


# -- (a) append mode: one sequence, today's trajectory -------------------------------------------


@pytest.mark.parametrize("family", ["qwen2.5-instruct", "qwen3", "llama-3.2-instruct", "gpt-oss"])
def test_append_mode_is_one_sequence_equal_to_the_trajectory(family):
    tpl = _tpl(family)
    plan, reasoning = FAMILIES[family]
    script = ScriptedConversation(tpl, USER, plan, reasoning)
    rollout = tmpl.Rollout(tpl, Scripted(lambda r: script.completion(int(r.request_id.split("-")[2]))), tools=FUNCS)
    assert rollout.history == "append"
    [res] = rollout.run([[{"role": "user", "content": USER}]])
    assert res.status.name == "DONE", res.reason
    [seq] = res.sequences
    p = len(res.prompt_ids)
    assert seq.ids.tolist() == res.prompt_ids.tolist() + res.completion_ids.tolist()
    assert seq.mask.tolist() == [0] * p + res.mask.tolist()
    assert seq.logprobs.tolist() == [0.0] * p + res.logprobs.tolist()
    assert seq.versions.tolist() == [-1] * p + res.versions.tolist()
    assert seq.turns == tuple(range(len(plan))) and seq.branch.kind == BranchKind.FIRST
    assert seq.status is tmpl.Status.DONE and res.kept == []
    # the trajectory is the template's full render, as ever (the append path did not change)
    assert seq.ids.tolist()[: len(script.turn_prompts[-1])] == script.turn_prompts[-1]


# -- (b) template mode on Qwen3: thinking in several user turns ----------------------------------

QWEN3_CALL = (
    '<think>\n{r}\n</think>\n\n<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{c}"}}}}\n'
    "</tool_call><|im_end|>"
)


def split(tpl, text: str, at: str) -> list[int]:
    """``text`` sampled in a tokenization of its own: encoded in two pieces cut before ``at``."""
    k = text.index(at)
    return tpl.codec.encode(text[:k]) + tpl.codec.encode(text[k:])


def _qwen3_script(tpl):
    enc = tpl.codec.encode
    return [
        enc(QWEN3_CALL.format(r="I need the weather.", c="Paris")),
        split(tpl, "<think>\nIt said sunny.\n</think>\n\nIt is sunny in Paris.<|im_end|>", "ny in"),
        enc(QWEN3_CALL.format(r="Now Tokyo.", c="Tokyo")),
        split(tpl, "<think>\nTokyo is sunny too.\n</think>\n\nSunny in Tokyo as well.<|im_end|>", "ny in"),
        enc("<think>\nA short one.\n</think>\n\nYou are welcome.<|im_end|>"),
    ]


def _qwen3_three_users(tpl, **kwargs):
    """The Qwen3 episode of three user turns (a simulated user asks twice more), template mode:
    (its result, the recorder of what the engine got and sampled, the rollout)."""
    rec = Recorder(_qwen3_script(tpl))
    rollout = _qwen3_rollout(tpl, rec, **kwargs)
    [res] = rollout.run([[{"role": "user", "content": USER}]])
    return res, rec, rollout


def _qwen3_rollout(tpl, rec, **kwargs):
    """A template-mode Qwen3 rollout on ``rec``'s script, a simulated user asking twice more."""
    return tmpl.Rollout(
        tpl,
        Scripted(rec),
        tools=FUNCS,
        history="template",
        edit_history=more_users("And in Tokyo?", "Thanks!"),
        max_turns=8,
        **kwargs,
    )


def test_qwen3_template_mode_renders_as_deployed_and_reuses_sampled_ids(twin):
    tpl = _tpl("qwen3")
    assert not tpl.codec.encode("It is sunny in Paris.") == split(tpl, "It is sunny in Paris.", "ny in")
    res, rec, rollout = _qwen3_three_users(tpl)
    assert res.code is EndCode.FINISHED and res.status.name == "DONE", res.reason
    assert res.turns == 5 and [m["role"] for m in res.messages].count("user") == 3
    _check_prompts_are_full_renders(tpl, res, rec)
    _check_every_sampled_token_trained_once(res, rec)

    think_end = tpl.codec.encode("</think>")[0]
    starts = _assistants(res.messages)
    users = [i for i, m in enumerate(res.messages) if m["role"] == "user"]
    for t, sampled in enumerate(rec.sampled[:-1]):
        for later in range(t + 1, len(rec.prompts)):
            prompt = rec.prompts[later]
            same_user_turn = not any(starts[t] < u < starts[later] for u in users)
            if same_user_turn:  # the template keeps the turn whole: its sampled IDs come back whole
                assert _sublist_at(prompt, sampled) >= 0, (t, later)
            else:  # its thinking is dropped: the answer after </think> comes back as sampled
                k = sampled.index(think_end)
                assert tpl.codec.decode(sampled[k + 1 : k + 2]) == "\n\n"
                assert _sublist_at(prompt, sampled) < 0
                assert _sublist_at(prompt, sampled[k + 2 :]) >= 0, (t, later)
    # three user turns, thinking dropped twice: three sequences, each branch naming the reasoning
    seqs = res.sequences
    assert [s.turns for s in seqs] == [(0, 1), (2, 3), (4,)]
    for s in seqs[1:]:
        b = s.branch
        assert b.kind == BranchKind.DIVERGED and b.against == s.index - 1
        # the first message that differs: the thinking of the first turn of the sequence it left
        assert b.message == starts[seqs[b.against].turns[0]] and b.field == "reasoning_content"
        assert b.edit == "template dropped reasoning"
    assert all(s.status is tmpl.Status.DONE for s in seqs)
    # the result's trajectory is the last branch: its prompt is the last prompt sent
    assert res.prompt_ids.tolist() == rec.prompts[-1]
    # the rollout's metrics count every branch's sampled tokens, not only the last trajectory's
    assert rollout.metrics.tokens_generated == sum(len(x) for x in rec.sampled) > int(res.mask.sum())


def test_streamed_template_mode_equals_run_and_builds_no_suffix(twin, monkeypatch):
    """Rollout.stream_sync in template mode gives what run gives, and never asks for a tool suffix (the
    next prompt is rendered): a template whose suffix cannot be built still trains in template mode."""
    tpl = _tpl("qwen3")

    def refuse(*args, **kwargs):
        raise tmpl.errors.SpliceError(tpl.name, "after the turn close (made up by this test)")

    monkeypatch.setattr(tpl, "suffix_ids_batch", refuse)
    monkeypatch.setattr(tpl, "suffix_ids", refuse)
    outs = {}
    for how in ("run", "stream"):
        rec = Recorder(_qwen3_script(tpl))
        rollout = _qwen3_rollout(tpl, rec)
        conversations = [[{"role": "user", "content": USER}]]
        if how == "run":
            [res] = rollout.run(conversations)
        else:
            [[res]] = list(rollout.stream_sync(conversations))
        assert res.code is EndCode.FINISHED, (how, res.code, res.reason)
        outs[how] = (res, rec)
    (a, rec_a), (b, rec_b) = outs["run"], outs["stream"]
    assert rec_a.prompts == rec_b.prompts and len(rec_a.prompts) == 5
    assert [s.ids.tolist() for s in a.sequences] == [s.ids.tolist() for s in b.sequences]
    assert [s.mask.tolist() for s in a.sequences] == [s.mask.tolist() for s in b.sequences]
    _check_every_sampled_token_trained_once(b, rec_b)


def test_rows_collate_one_row_per_sequence_with_its_loss_mask(twin):
    """RolloutResult.rows(): tmpl.collate gets one row per sequence, each its prompt (up to its first sampled
    token) and completion, the loss mask the sequence's; a withheld sample's rows train nothing."""
    tpl = _tpl("qwen3")
    res, rec, rollout = _qwen3_three_users(tpl)
    rows = res.rows()
    assert len(rows) == len(res.sequences) == 3
    batch = tmpl.trajectory.collate_arrays(rows, pad_id=0)
    for b, seq in enumerate(res.sequences):
        p = int(batch["prompt_lengths"][b])
        c = int(batch["completion_lengths"][b])
        prompt = batch["prompt_ids"][b][batch["prompt_ids"].shape[1] - p :].tolist()
        assert prompt + batch["completion_ids"][b][:c].tolist() == seq.ids.tolist()
        assert p == seq.spans[0].start and prompt == rec.prompts[int(seq.spans[0].call.split("-")[1])]
        assert batch["tool_mask"][b][:c].tolist() == seq.mask[p:].tolist()
    assert int(batch["tool_mask"][batch["completion_mask"] == 1].sum()) == sum(len(x) for x in rec.sampled)
    res.stale_action = "withhold"  # as max_staleness leaves a sample too stale to train on
    assert all(int(r.loss_mask.sum()) == 0 for r in res.rows())


def _same_sequences(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for name in ("ids", "mask", "logprobs", "versions"):
            assert getattr(x, name).tolist() == getattr(y, name).tolist(), name
        assert (x.turns, x.agent, x.parent, x.status, x.branch.kind, x.branch.edit) == (
            y.turns,
            y.agent,
            y.parent,
            y.status,
            y.branch.kind,
            y.branch.edit,
        )


def test_export_keeps_every_sequence_of_a_template_mode_sample(twin, tmp_path, capsys):
    """tmpl.export writes a template-mode sample's calls: read back (JSON Lines, and a Dataset), its
    sequences and collate rows are the same; an append-mode sample writes none (its trajectory is all)."""
    tpl = _tpl("qwen3")
    res, rec, rollout = _qwen3_three_users(tpl)
    assert len(res.sequences) == 3
    tmpl.export.to_jsonl([res], tmp_path / "r.jsonl")
    [back] = tmpl.export.from_jsonl(tmp_path / "r.jsonl")
    _same_sequences(res.sequences, back.sequences)
    a = tmpl.trajectory.collate_arrays(res.rows(), pad_id=0)
    b = tmpl.trajectory.collate_arrays(back.rows(), pad_id=0)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    pytest.importorskip("datasets")
    [again] = tmpl.export.from_dataset(tmpl.export.to_dataset([res]))
    _same_sequences(res.sequences, again.sequences)
    append = tmpl.Rollout(tpl, Scripted(Recorder(_qwen3_script(tpl)[:2])), tools=FUNCS)
    [plain] = append.run([[{"role": "user", "content": USER}]])
    [record] = tmpl.export.to_records([plain])
    assert record["episode"] is None
    _same_sequences(plain.sequences, tmpl.export.from_records([record])[0].sequences)
    # tmpl replay names the template-mode sample's sequences and measures no drift it cannot have
    from tmpl.cli import main

    tmpl.export.to_jsonl([res, plain], tmp_path / "both.jsonl")
    assert main(["replay", str(tmp_path / "both.jsonl")]) == 0
    out = capsys.readouterr().out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [(row[3], row[4]) for row in rows] == [("3", "not measured (history: template)"), ("1", "not measured")]


def test_a_bad_episode_record_is_refused_by_sample(tmp_path):
    tpl = _tpl("qwen3")
    rollout = tmpl.Rollout(
        tpl, Scripted(Recorder(_qwen3_script(tpl))), tools=FUNCS, history="template", edit_history=more_users("And?")
    )
    [record] = tmpl.export.to_records(rollout.run([[{"role": "user", "content": USER}]]))
    del record["episode"]["calls"][1]["completion_ids"]
    with pytest.raises(tmpl.errors.ExportError, match=r"records\[0\].*episode.*completion_ids"):
        tmpl.export.from_records([record])


def test_qwen3_template_mode_without_rewrites_is_one_sequence(twin):
    """One user turn with tool calls: nothing is dropped, so template mode equals append mode."""
    tpl = _tpl("qwen3")
    script = _qwen3_script(tpl)[:2]
    runs = {}
    for history in ("append", "template"):
        rec = Recorder(script)
        rollout = tmpl.Rollout(tpl, Scripted(rec), tools=FUNCS, history=history)
        [res] = rollout.run([[{"role": "user", "content": USER}]])
        assert res.status.name == "DONE", res.reason
        runs[history] = (res, rec)
    (a, rec_a), (t, rec_t) = runs["append"], runs["template"]
    assert rec_a.prompts == rec_t.prompts
    [sa], [st_] = a.sequences, t.sequences
    for name in ("ids", "mask", "logprobs", "versions"):
        assert getattr(sa, name).tolist() == getattr(st_, name).tolist(), name
    assert [k.whole for k in t.kept[0]] == [True]


# -- (c) gpt-oss: the analysis channel dropped once a final answer follows ------------------------

GPT_OSS_CALL = (
    "<|channel|>analysis<|message|>{r}<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json"
    '<|message|>{{"city": "{c}"}}<|call|>'
)
GPT_OSS_FINAL = "<|channel|>analysis<|message|>{r}<|end|><|start|>assistant<|channel|>final<|message|>{a}<|return|>"


def test_gpt_oss_template_mode_drops_analysis_and_reuses_sampled_ids(twin):
    tpl = _tpl("gpt-oss")
    enc = tpl.codec.encode
    script = [
        enc(GPT_OSS_CALL.format(r="Need the weather.", c="Paris")),
        split(tpl, GPT_OSS_FINAL.format(r="Got it.", a="It is sunny in Paris."), "ny in"),
        enc(GPT_OSS_CALL.format(r="Now Tokyo.", c="Tokyo")),
        enc(GPT_OSS_FINAL.format(r="Same.", a="Sunny in Tokyo too.")),
    ]
    rec = Recorder(script)
    rollout = tmpl.Rollout(
        tpl, Scripted(rec), tools=FUNCS, history="template", edit_history=more_users("And Tokyo?"), max_turns=6
    )
    [res] = rollout.run([[{"role": "user", "content": USER}]])
    assert res.code is EndCode.FINISHED, res.reason
    _check_prompts_are_full_renders(tpl, res, rec)
    _check_every_sampled_token_trained_once(res, rec)
    # after the tool result the analysis is still there: the first turn comes back whole
    assert _sublist_at(rec.prompts[1], rec.sampled[0]) >= 0
    # after the final answer and the next user message it is gone; the final answer comes back as
    # sampled from its channel header up to (not including) <|return|>, which the render writes <|end|>
    later = rec.prompts[2]
    assert tpl.codec.decode(later).count("Need the weather.") == 0
    final = rec.sampled[1]
    header = _sublist_at(final, enc("<|start|>assistant<|channel|>final"))
    assert header > 0 and tpl.codec.decode(final[-1:]) == "<|return|>"
    assert _sublist_at(later, final[header:-1]) >= 0
    call = rec.sampled[0]
    assert _sublist_at(later, call[_sublist_at(call, enc("<|start|>")) :]) >= 0
    [s0, s1] = res.sequences
    assert s0.turns == (0, 1) and s1.turns == (2, 3)
    assert s1.branch.kind == BranchKind.DIVERGED and s1.branch.edit == "template dropped reasoning"
    assert (s1.branch.message, s1.branch.field) == (1, "reasoning_content")


# -- (d) the edit_history hook ---------------------------------------------------------------------


def _calls_script(tpl, n: int) -> list[list[int]]:
    enc = tpl.codec.encode
    cities = ["Paris", "Tokyo", "Lima", "Oslo", "Rome"]
    return [enc(QWEN3_CALL.format(r=f"Step {k}.", c=cities[k])) for k in range(n)] + [
        enc("<think>\nDone.\n</think>\n\nAll sunny.<|im_end|>")
    ]


def window(keep: int):
    """Replace the content of all but the last ``keep`` tool results."""

    def hook(messages, ctx):
        ctx.label = "window"
        tools = [i for i, m in enumerate(messages) if m["role"] == "tool"]
        old = set(tools[: max(0, len(tools) - keep)])
        return [dict(m, content="[omitted]") if i in old else m for i, m in enumerate(messages)]

    return hook


def test_a_window_over_old_tool_results_branches_with_the_edit_named(twin):
    tpl = _tpl("qwen3")
    rec = Recorder(_calls_script(tpl, 3))
    first = [{"role": "user", "content": USER}]
    seen = Seen(window(1), first)
    rollout = tmpl.Rollout(tpl, Scripted(rec), tools=FUNCS, edit_history=seen, max_turns=6)
    [res] = rollout.run([first])
    assert res.code is EndCode.FINISHED, res.reason
    assert [m["content"] for m in res.messages if m["role"] == "tool"][:2] == ["[omitted]", "[omitted]"]
    _check_prompts_are_full_renders(tpl, res, rec, histories=seen.histories)
    _check_every_sampled_token_trained_once(res, rec)
    seqs = res.sequences
    # turn 1 sees one tool result, nothing omitted: it continues; turn 2 omits the first: a branch...
    assert [s.turns for s in seqs] == [(0, 1), (2,), (3,)]
    tool_indices = [i for i, m in enumerate(res.messages) if m["role"] == "tool"]
    for s, omitted in zip(seqs[1:], tool_indices):
        assert s.branch.kind == BranchKind.DIVERGED
        assert s.branch.edit == "edit_history: window"
        assert (s.branch.message, s.branch.field) == (omitted, "content")


def test_a_raising_hook_ends_the_sample_named_and_loses_no_sampled_token(twin):
    tpl = _tpl("qwen3")
    rec = Recorder(_calls_script(tpl, 3))

    def hook(messages, ctx):
        if ctx.turn == 1:
            raise KeyError("summary service down")
        return None

    rollout = tmpl.Rollout(tpl, Scripted(rec), tools=FUNCS, edit_history=hook, max_turns=6)
    [res] = rollout.run([[{"role": "user", "content": USER}]])
    assert res.code is EndCode.EDIT_FAILED and res.status is tmpl.Status.ABORTED
    assert "edit_history raised KeyError after turn 1" in res.reason and "summary service down" in res.reason
    assert res.turns == 2 and len(rec.sampled) == 2
    _check_every_sampled_token_trained_once(res, rec)
    [seq] = res.sequences
    assert seq.status is tmpl.Status.ABORTED and seq.reason == res.reason


@pytest.mark.parametrize(
    ("returned", "needle"),
    [
        (lambda m: m + [{"role": "narrator", "content": "x"}], "unknown role 'narrator'"),
        (lambda m: "not messages", "not a list of messages"),
        (lambda m: [*m[:2], {"role": "user", "content": "x"}], "1 tool call(s) but 0 tool message(s)"),
        # Qwen3's template calls .startswith on a user message's content: a dict makes it raise
        (lambda m: [{"role": "user", "content": {"q": "x"}}, *m[1:]], "cannot render"),
    ],
)
def test_a_hook_returning_what_the_template_rejects_ends_with_edit_rejected(twin, returned, needle):
    tpl = _tpl("qwen3")
    rec = Recorder(_calls_script(tpl, 2))
    rollout = tmpl.Rollout(tpl, Scripted(rec), tools=FUNCS, edit_history=lambda m, ctx: returned(m), max_turns=6)
    [res] = rollout.run([[{"role": "user", "content": USER}]])
    assert res.code is EndCode.EDIT_REJECTED and res.status is tmpl.Status.ABORTED, res.reason
    assert needle in res.reason
    _check_every_sampled_token_trained_once(res, rec)


def test_a_summary_call_is_recorded_untrained(twin):
    tpl = _tpl("qwen3")
    rec = Recorder(_calls_script(tpl, 1))
    summary = tpl.codec.encode("Paris is sunny.<|im_end|>")

    def compact(messages, ctx):
        if ctx.answered:
            return None
        ctx.label = "compaction"
        ctx.record_call(tpl.codec.encode("Summarize: ..."), summary)
        return [messages[0], {"role": "assistant", "content": "Paris is sunny."}, {"role": "user", "content": "Go on."}]

    first = [{"role": "user", "content": USER}]
    seen = Seen(compact, first)
    rollout = tmpl.Rollout(tpl, Scripted(rec), tools=FUNCS, edit_history=seen, max_turns=4)
    [res] = rollout.run([first])
    assert res.code is EndCode.FINISHED, res.reason
    _check_prompts_are_full_renders(tpl, res, rec, histories=seen.histories)
    seqs = res.sequences
    summaries = [s for s in seqs if s.agent == "edit_history"]
    assert len(summaries) == 1 and summaries[0].trained_tokens == 0 and int(summaries[0].sampled.sum()) == len(summary)
    policy = [s for s in seqs if s.agent is None]
    assert [s.turns for s in policy] == [(0,), (1,)]
    assert policy[1].branch.edit == "edit_history: compaction"
    assert sum(s.trained_tokens for s in seqs) == sum(len(x) for x in rec.sampled)


def _budgeted(tpl, script, question: str, max_length: int):
    """The scripted Qwen3 sample, a second user turn ``question`` added by the hook, under ``max_length``:
    its recorder and its result."""
    rec = Recorder(script)
    rollout = tmpl.Rollout(
        tpl,
        Scripted(rec),
        tools=FUNCS,
        history="template",
        edit_history=more_users(question),
        max_turns=8,
        max_length=max_length,
    )
    [res] = rollout.run([[{"role": "user", "content": USER}]])
    return rec, res


def test_a_branch_over_max_length_is_truncated_with_the_reason_named(twin):
    tpl = _tpl("qwen3")
    script = _qwen3_script(tpl)
    probe = Recorder(script)
    tmpl.Rollout(
        tpl, Scripted(probe), tools=FUNCS, history="template", edit_history=more_users("And in Tokyo?"), max_turns=8
    ).run([[{"role": "user", "content": USER}]])
    branch_prompt = len(probe.prompts[2])  # the second user turn starts a new sequence
    rec, res = _budgeted(tpl, script, "And in Tokyo?", branch_prompt + 5)
    # the engine is asked for what the branch leaves (5 tokens): the turn ends at its limit, as in append mode
    assert res.code is EndCode.TURN_LIMIT and res.status is tmpl.Status.TRUNCATED
    assert rec.prompts[2] == probe.prompts[2]
    s0, s1 = res.sequences
    assert s0.status is tmpl.Status.DONE
    assert s1.status is tmpl.Status.TRUNCATED and s1.reason == res.reason and "token limit (5)" in s1.reason
    assert len(s1.ids) == branch_prompt + 5 and s1.trained_tokens == 5
    assert s0.trained_tokens + s1.trained_tokens == sum(len(x) for x in rec.sampled[:2]) + 5
    # a branch prompt that does not fit at all (a long question): the sample ends before generating, named
    long = "And in Tokyo? " * 60
    probe = Recorder(script)
    [res] = tmpl.Rollout(
        tpl, Scripted(probe), tools=FUNCS, history="template", edit_history=more_users(long), max_turns=8
    ).run([[{"role": "user", "content": USER}]])
    first = len(res.sequences[0].ids)
    branch_prompt = len(probe.prompts[2])
    assert branch_prompt > first + 1
    rec, res = _budgeted(tpl, script, long, branch_prompt - 1)
    assert res.code is EndCode.NO_BUDGET and res.status is tmpl.Status.TRUNCATED
    assert f"starts a new sequence of {branch_prompt} tokens, max_length={branch_prompt - 1}" in res.reason
    assert len(rec.prompts) == 2  # nothing was sent for the branch that does not fit
    [seq] = res.sequences
    assert seq.status is tmpl.Status.TRUNCATED and seq.reason == res.reason
    assert seq.trained_tokens == sum(len(x) for x in rec.sampled)


def test_bad_history_arguments():
    tpl = _tpl("qwen2.5-instruct")
    with pytest.raises(ValueError, match="history must be one of"):
        tmpl.Rollout(tpl, Scripted(lambda r: []), history="rewrite")
    with pytest.raises(TypeError, match="edit_history must be callable"):
        tmpl.Rollout(tpl, Scripted(lambda r: []), edit_history="window")


# -- (e) generated conversations: every prompt decodes to the full render ------------------------


def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: The key.
    """
    return RESULTS.get(key, "?")


RESULTS: dict[str, str] = {}
TEXT = st.text(alphabet="abcxyz ABC.,!?é中\n", min_size=1, max_size=24)


@st.composite
def conversations(draw):
    """User turns, each with 0-2 tool calls, then an answer; answers sampled in a tokenization of their own."""
    users = draw(st.integers(1, 3))
    plan = []
    for _ in range(users):
        plan += [("call", draw(st.sampled_from("abcd")), draw(TEXT)) for _ in range(draw(st.integers(0, 2)))]
        plan.append(("answer", draw(TEXT), draw(TEXT), draw(st.integers(0, 8))))
    results = {k: draw(TEXT) for k in "abcd"}
    return plan, results


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conversations())
def test_generated_conversations_render_as_deployed(case):
    plan, results = case
    RESULTS.clear()
    RESULTS.update(results)
    tpl = _tpl("qwen3")
    enc = tpl.codec.encode
    completions = []
    for step in plan:
        if step[0] == "call":
            args = json.dumps({"key": step[1]})
            completions.append(
                enc(f'<think>\n{step[2]}\n</think>\n\n<tool_call>\n{{"name": "lookup", "arguments": {args}}}\n')
                + enc("</tool_call><|im_end|>")
            )
        else:
            _, reason, answer, cut = step
            head = f"<think>\n{reason}\n</think>\n\n"
            cut = min(cut, len(answer))
            completions.append(enc(head) + enc(answer[:cut]) + enc(answer[cut:]) + enc("<|im_end|>"))
    questions = [f"Question {k}?" for k in range(1, sum(1 for s in plan if s[0] == "answer"))]
    rec = Recorder(completions)
    rollout = tmpl.Rollout(
        tpl,
        Scripted(rec),
        tools=[lookup],
        history="template",
        edit_history=more_users(*questions),
        max_turns=len(plan),
        max_length=1 << 16,
    )
    [res] = rollout.run([[{"role": "user", "content": "Question 0?"}]])
    assert res.code is EndCode.FINISHED, res.reason
    assert res.turns == len(plan)
    schemas = tmpl.Toolbox([lookup]).schemas
    starts = _assistants(res.messages)
    for t, prompt in enumerate(rec.prompts):
        text = _render(tpl, res.messages[: starts[t]], tokenize=False, tools=schemas)
        assert tpl.codec.decode(prompt) == text, t
    seqs = res.sequences
    assert sum(s.trained_tokens for s in seqs) == sum(len(x) for x in rec.sampled)
    for s in seqs:  # each sequence is a prompt sent plus what was sampled after it
        for span in s.spans:
            turn = int(span.call.split("-")[1])
            assert s.ids[: span.start].tolist() == rec.prompts[turn]
            assert np.array_equal(s.ids[span.start : span.end], rec.sampled[turn])


# -- tmpl check names the history mode --------------------------------------------------------------


def test_check_names_template_mode_where_the_deployed_render_rewrites_the_history():
    """Qwen3 drops earlier turns' thinking: `tmpl check` says history "template", and a template-mode
    rollout of it does branch (the deployed prompts are not one append-only sequence); the mode is
    "append" exactly where both uses are SAFE; it is in the report's JSON and markdown."""
    tpl = _tpl("qwen3")
    report = tmpl.report.check(tpl)
    mode, why = report.history_mode()
    assert mode == "template" and "several user turns" in why, why
    assert report.to_dict()["history_mode"] == [mode, why]
    assert f"history mode that trains it as deployed: {mode}**" in report.to_markdown()
    rec = Recorder(_qwen3_script(tpl))
    rollout = tmpl.Rollout(
        tpl, Scripted(rec), tools=FUNCS, history="template", edit_history=more_users("And in Tokyo?"), max_turns=8
    )
    [res] = rollout.run([[{"role": "user", "content": USER}]])
    _check_prompts_are_full_renders(tpl, res, rec)
    assert len(res.sequences) > 1  # append-only would have trained on prompts the template never renders
    for family in ("qwen2.5-instruct", "llama-3.2-instruct"):
        other = tmpl.report.check(_tpl(family))
        both_safe = all(other.verdicts[u].level == tmpl.report.SAFE for u in ("tool_loop", "multi_user"))
        assert (other.history_mode()[0] == "append") == both_safe, (family, other.history_mode())
