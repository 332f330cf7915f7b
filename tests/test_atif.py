"""ATIF (the Agent Trajectory Interchange Format) import and export: ``tmpl.export.to_atif`` / ``from_atif``.

ATIF files here are written by the ``atif`` package's own pydantic models, with real token IDs: the
Qwen2.5 tokenizer's ``apply_chat_template`` render of a tool conversation (each agent step's prompt is the
render of the conversation before it, its completion what the full render adds for that turn). Oracles:
that render, the arrays the documents were built from, and the real rollouts' own arrays.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import tmpl
from tmpl import export
from tmpl.cli import main
from tmpl.errors import AtifError

from .conftest import DATA, load_tokenizer

atif = pytest.importorskip("atif", reason="the atif extra is not installed")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CONVERSATION = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
    {"role": "assistant", "content": "It is sunny in Paris, 21 C."},
]


@pytest.fixture(scope="module")
def qwen():
    tok = load_tokenizer("qwen2.5-instruct")
    return tok, tmpl.ChatTemplate(tok, name="qwen2.5-instruct")


def render(tok, messages, tools=TOOLS, gen=True) -> list[int]:
    out = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=gen, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def turn_ids(tok, messages, k, tools=TOOLS) -> tuple[list[int], list[int]]:
    """The prompt before assistant message ``k`` and its completion (up to its <|im_end|>), both from the
    template's render."""
    prompt = render(tok, messages[:k], tools)
    full = render(tok, messages[: k + 1], tools, gen=False)
    assert full[: len(prompt)] == prompt
    end = tok.convert_tokens_to_ids("<|im_end|>")
    rest = full[len(prompt) :]
    return prompt, rest[: rest.index(end) + 1]


def logprobs(n, seed) -> list[float]:
    return (-np.random.default_rng(seed).random(n) * 4).astype(np.float32).tolist()


def weather_document(tok, *, completion=None) -> atif.Trajectory:
    """An ATIF trajectory of CONVERSATION built with the atif models, token IDs from the real render."""
    p1, c1 = turn_ids(tok, CONVERSATION, 1)
    p2, c2 = turn_ids(tok, CONVERSATION, 3)
    c2 = c2 if completion is None else completion
    return atif.Trajectory(
        schema_version="ATIF-v1.8",
        session_id="run-7",
        agent=atif.Agent(
            name="some-harness", version="2.1", model_name="Qwen2.5-1.5B-Instruct", tool_definitions=TOOLS
        ),
        steps=[
            atif.Step(step_id=1, source="user", message=CONVERSATION[0]["content"]),
            atif.Step(
                step_id=2,
                source="agent",
                message="",
                tool_calls=[
                    atif.ToolCall(tool_call_id="call_1", function_name="get_weather", arguments={"city": "Paris"})
                ],
                observation=atif.Observation(
                    results=[atif.ObservationResult(source_call_id="call_1", content="Sunny, 21 C")]
                ),
                metrics=atif.Metrics(prompt_token_ids=p1, completion_token_ids=c1, logprobs=logprobs(len(c1), 1)),
            ),
            atif.Step(
                step_id=3,
                source="agent",
                message=CONVERSATION[3]["content"],
                metrics=atif.Metrics(prompt_token_ids=p2, completion_token_ids=c2, logprobs=logprobs(len(c2), 2)),
            ),
        ],
    )


def write(doc, path):
    path.write_text(json.dumps(doc.to_json_dict(), indent=2), encoding="utf-8")
    return path


def step_arrays(doc) -> list[tuple]:
    """Every agent step's (trajectory, step, prompt IDs, completion IDs, logprobs, mask flag), embedded ones too."""
    d = doc.to_json_dict() if hasattr(doc, "to_json_dict") else doc
    out = []
    for s in d["steps"]:
        m = s.get("metrics") or {}
        trained = ((s.get("extra") or {}).get("tmpl") or {}).get("trained", True)
        if "completion_token_ids" in m:
            out.append(
                (
                    d.get("trajectory_id"),
                    s["step_id"],
                    m["prompt_token_ids"],
                    m["completion_token_ids"],
                    m["logprobs"],
                    trained,
                )
            )
    for sub in d.get("subagent_trajectories") or []:
        out += step_arrays(sub)
    return out


# -- ATIF written by the atif package, read by tmpl --------------------------------------------------


def test_an_atif_file_reads_as_the_templates_render(qwen, tmp_path):
    tok, _ = qwen
    doc = weather_document(tok)
    [r] = export.from_atif(write(doc, tmp_path / "trajectory.json"))
    # the calls extend one another: one sequence (append mode), the whole conversation's render
    assert not r.from_calls and len(r.sequences) == 1
    ids = np.concatenate([r.prompt_ids, r.completion_ids]).tolist()
    full = render(tok, CONVERSATION, gen=False)
    assert full[: len(ids)] == ids and tok.decode(full[len(ids) :]) == "\n"  # the render's last newline
    # the mask is exactly the two sampled turns, with their logprobs; the rest is context
    p = len(r.prompt_ids)
    steps = doc.steps[1:]
    sampled = [(ids.index(s.metrics.completion_token_ids[0], p), s.metrics) for s in steps]
    want_mask = np.zeros(len(r.completion_ids), dtype=np.uint8)
    want_lp = np.zeros(len(r.completion_ids), dtype=np.float32)
    for start, m in sampled:
        n = len(m.completion_token_ids)
        assert ids[start : start + n] == m.completion_token_ids
        want_mask[start - p : start - p + n] = 1
        want_lp[start - p : start - p + n] = m.logprobs
    assert np.array_equal(r.mask, want_mask) and np.array_equal(r.logprobs, want_lp)
    assert (r.versions == -1).all()  # ATIF has no policy versions: unknown
    assert r.messages == CONVERSATION
    assert r.turns == 2 and r.tool_calls == 1 and r.status.name == "DONE"


def test_atif_to_tmpl_to_atif_keeps_every_array_and_message(qwen, tmp_path):
    tok, _ = qwen
    doc = weather_document(tok)
    results = export.from_atif(write(doc, tmp_path / "in.json"))
    [out] = export.to_atif(results, tmp_path / "out.json")
    assert isinstance(out, atif.Trajectory)
    assert step_arrays(out)[0][1:] == step_arrays(doc)[0][1:] and len(step_arrays(out)) == 2
    assert [a[1:] for a in step_arrays(out)] == [a[1:] for a in step_arrays(doc)]
    # the steps say the same conversation: messages, tool calls and their results
    for a, b in zip(doc.steps, out.steps):
        assert (a.source, a.message, a.tool_calls, a.observation) == (b.source, b.message, b.tool_calls, b.observation)
    # and once more: tmpl's own document comes back whole
    [again] = export.to_atif(export.from_atif(tmp_path / "out.json"))
    assert again.to_json_dict() == json.loads((tmp_path / "out.json").read_text())


def test_tmpl_replay_rerenders_atif_and_finds_drift(qwen, tmp_path, capsys):
    tok, _ = qwen
    # the same answer text, sampled as other tokens (one per character): the re-render merges them
    _, c2 = turn_ids(tok, CONVERSATION, 3)
    text = tok.decode(c2[:-1])
    split = [t for ch in text for t in tok.encode(ch, add_special_tokens=False)] + c2[-1:]
    assert tok.decode(split) == tok.decode(c2) and split != c2
    docs = [weather_document(tok), weather_document(tok, completion=split)]
    path = tmp_path / "run.jsonl"  # ATIF as JSON lines, under a name that says nothing: known by content
    path.write_text("".join(json.dumps(d.to_json_dict()) + "\n" for d in docs), encoding="utf-8")
    # tools: each trajectory's agent.tool_definitions
    assert main(["replay", str(path), "--tokenizer", str(DATA / "qwen2.5-instruct")]) == 1
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("| 0 |", "| 1 |"))]
    assert "| false |" in rows[0]
    assert "| true | bpe_merge |" in rows[1]
    assert f"| {len(render(tok, CONVERSATION[:3]))} |" in rows[1]  # the first differing token: the answer's
    assert "2 samples, 2 measured, 1 drifted: bpe_merge 1" in out


# -- branches and sub-agents: ATIF's embedded trajectories --------------------------------------------


def test_branches_and_subagents_round_trip(qwen, tmp_path):
    tok, _ = qwen
    p1, c1 = turn_ids(tok, CONVERSATION, 1)
    # the second call's history was compacted: a summary instead of the first turn (a branch)
    compacted = [{"role": "user", "content": "Summary: the weather tool said Paris is sunny, 21 C. Answer the user."}]
    p2 = render(tok, compacted)
    c2 = turn_ids(tok, [*compacted, {"role": "assistant", "content": "It is sunny in Paris, 21 C."}], 1)[1]
    task = [{"role": "user", "content": "Find the weather in Paris."}]
    sp, sc = turn_ids(tok, [*task, {"role": "assistant", "content": "Paris: sunny, 21 C."}], 1, tools=None)
    doc = atif.Trajectory(
        schema_version="ATIF-v1.8",
        agent=atif.Agent(name="harness", version="1"),
        steps=[
            atif.Step(step_id=1, source="user", message=CONVERSATION[0]["content"]),
            atif.Step(
                step_id=2,
                source="agent",
                message="",
                tool_calls=[
                    atif.ToolCall(tool_call_id="call_1", function_name="get_weather", arguments={"city": "Paris"})
                ],
                observation=atif.Observation(
                    results=[
                        atif.ObservationResult(source_call_id="call_1", content="Sunny, 21 C"),
                        atif.ObservationResult(
                            subagent_trajectory_ref=[atif.SubagentTrajectoryRef(trajectory_id="research")]
                        ),
                    ]
                ),
                metrics=atif.Metrics(prompt_token_ids=p1, completion_token_ids=c1, logprobs=logprobs(len(c1), 3)),
            ),
            atif.Step(
                step_id=3,
                source="agent",
                message="It is sunny in Paris, 21 C.",
                metrics=atif.Metrics(prompt_token_ids=p2, completion_token_ids=c2, logprobs=logprobs(len(c2), 4)),
            ),
        ],
        subagent_trajectories=[
            atif.Trajectory(
                schema_version="ATIF-v1.8",
                trajectory_id="research",
                agent=atif.Agent(name="researcher", version="1"),
                steps=[
                    atif.Step(step_id=1, source="user", message=task[0]["content"]),
                    atif.Step(
                        step_id=2,
                        source="agent",
                        message="Paris: sunny, 21 C.",
                        metrics=atif.Metrics(
                            prompt_token_ids=sp, completion_token_ids=sc, logprobs=logprobs(len(sc), 5)
                        ),
                    ),
                ],
            )
        ],
    )
    [r] = export.from_atif(write(doc, tmp_path / "t.json"))
    seqs = r.sequences
    assert [(s.agent, s.parent, s.branch.kind) for s in seqs] == [
        (None, None, "first"),
        ("research", "step-2", "subagent"),
        (None, None, "diverged"),
    ]
    # each sequence is its calls' prompt and sampled IDs; each sampled token in exactly one mask
    assert seqs[0].ids.tolist() == p1 + c1 and seqs[2].ids.tolist() == p2 + c2 and seqs[1].ids.tolist() == sp + sc
    assert [int(s.mask.sum()) for s in seqs] == [len(c1), len(sc), len(c2)]
    assert seqs[0].branch.kind == "first" and seqs[2].branch.token == _common(p1, p2)

    [out] = export.to_atif([r])
    # the ids are the document's: none for its root, the embedded trajectory's own
    assert [a[0] for a in step_arrays(out)] == [None, None, "research"]
    assert [a[2:] for a in step_arrays(out)] == [a[2:] for a in step_arrays(doc)]
    refs = [x.subagent_trajectory_ref for x in out.steps[1].observation.results if x.subagent_trajectory_ref]
    assert refs and refs[0][0].trajectory_id == out.subagent_trajectories[0].trajectory_id
    [back] = export.from_atif([out])
    assert [(s.agent, s.ids.tolist(), s.mask.tolist(), s.logprobs.tolist()) for s in back.sequences] == [
        (s.agent, s.ids.tolist(), s.mask.tolist(), s.logprobs.tolist()) for s in seqs
    ]


def _common(a, b) -> int:
    return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)


# -- tmpl rollouts to ATIF and back ------------------------------------------------------------------


def _same_result(a, b):
    for key in ("prompt_ids", "completion_ids", "mask", "logprobs", "versions", "loss_mask"):
        x, y = getattr(a, key), getattr(b, key)
        assert x.dtype == y.dtype and np.array_equal(x, y), key
    assert (a.index, a.sample, a.status, a.reason, a.turns, a.tool_calls, a.finish_reason, a.version) == (
        b.index,
        b.sample,
        b.status,
        b.reason,
        b.turns,
        b.tool_calls,
        b.finish_reason,
        b.version,
    )
    assert a.spans == b.spans and a.messages == b.messages
    assert len(a.sequences) == len(b.sequences)
    for s, t in zip(a.sequences, b.sequences):
        for key in ("ids", "mask", "logprobs", "versions"):
            assert np.array_equal(getattr(s, key), getattr(t, key)), key
        # a branch's first differing message and field come from the messages, which records do not keep
        assert (s.agent, s.parent, s.branch.kind, s.branch.token, s.branch.edit) == (
            t.agent,
            t.parent,
            t.branch.kind,
            t.branch.token,
            t.branch.edit,
        )
        assert s.calls == t.calls and s.spans == t.spans
    # sequence statuses as tmpl's own records keep them (an append-mode sample with sub-agents reads its
    # sequences back RUNNING from JSON lines too: its episode record says unfinished)
    ref = export.from_records(export.to_records([a]))[0]
    assert [s.status for s in b.sequences] == [s.status for s in ref.sequences]


@pytest.fixture(scope="module")
def rollouts(qwen):
    """Real rollouts: the tiny tool-calling Qwen2.5 model (torch, CPU) in append mode, and a scripted
    engine in template mode (the same tokenizer and template)."""
    from .fixture_models import QUESTIONS, QWEN, get_time, get_weather, missing

    if missing(QWEN):
        pytest.skip(missing(QWEN))
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from tmpl.backends import Scripted

    tok, tpl = qwen  # the fixture model's tokenizer files are these (../shared/models/README.md)
    model = AutoModelForCausalLM.from_pretrained(str(QWEN), dtype=torch.float32).eval()
    tools = [get_time, get_weather]
    sampling = tmpl.backends.Sampling(temperature=1.0, seed=0)
    rollout = tmpl.Rollout(
        tpl, tmpl.backends.Torch(model, tokenizer=tok), tools=tools, max_turns=2, max_length=1024, sampling=sampling
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is fastest on CI's two busy cores
    try:
        out = {"append": rollout.run(QUESTIONS[:1])}
    finally:
        torch.set_num_threads(threads)
    call = tpl.codec.encode('<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>')
    answer = tpl.codec.encode("It is 10:00 in Paris.<|im_end|>")

    def engine(req):
        ids = call if req.request_id.endswith("-0") else answer
        return ids, logprobs(len(ids), len(req.prompt_ids))

    scripted = tmpl.Rollout(tpl, Scripted(engine), tools=tools, max_turns=3, history="template")
    out["template"] = scripted.run(QUESTIONS[:2])

    # an edit_history hook that blanks all but the last tool result: branches with the edit's label
    out["edit_history"] = edit_history_rollout(tpl)
    return tpl, out, tmpl.Toolbox(tools).schemas


def edit_history_rollout(tpl):
    """A scripted rollout (the Qwen2.5 template) whose ``edit_history`` hook blanks all but the last tool
    result (tests/test_history_modes.py's ``window``): two branches, each with the edit's label."""
    from tmpl.backends import Scripted

    from .fixture_models import QUESTIONS, get_time, get_weather
    from .test_history_modes import window

    answer = tpl.codec.encode("It is 10:00 in Paris.<|im_end|>")
    script = [
        tpl.codec.encode(f'<tool_call>\n{{"name": "get_time", "arguments": {{"city": "{c}"}}}}\n</tool_call><|im_end|>')
        for c in ["Paris", "Tokyo", "Lima"]
    ] + [answer]

    def by_turn(req):
        ids = script[int(req.request_id.rsplit("-", 1)[1])]
        return ids, logprobs(len(ids), len(req.prompt_ids))

    tools = [get_time, get_weather]
    edited = tmpl.Rollout(tpl, Scripted(by_turn), tools=tools, max_turns=6, edit_history=window(1))
    results = edited.run(QUESTIONS[:1])
    assert {s.branch.edit for r in results for s in r.sequences[1:]} == {"edit_history: window"}
    return results


@pytest.mark.parametrize("history", ["append", "template", "edit_history"])
def test_a_real_rollout_to_atif_and_back_is_identical(rollouts, history, tmp_path):
    tpl, rolled, schemas = rollouts
    results = rolled[history]
    assert any(r.tool_calls for r in results) and all(r.mask.sum() for r in results)
    docs = export.to_atif(results, tmp_path / "run.jsonl", tools=schemas)
    assert all(isinstance(d, atif.Trajectory) for d in docs)
    for r, d in zip(results, docs):
        # each agent step's prompt is the template's full render of the conversation before it
        agent = [s for s in d.steps if s.metrics is not None]
        # every call is an agent step: the first sequence's on the root, each branch's in its trajectory
        assert len(step_arrays(d)) == len(r.episode.calls) >= 1
        assert [s.extra["tmpl"]["call"] for s in agent] == list(r.sequences[0].calls)
        assert len(d.subagent_trajectories or []) == len(r.sequences) - 1
        before = [i for i, m in enumerate(r.messages) if m["role"] == "assistant"]
        for step, i in zip(agent, before if history != "edit_history" else []):  # (edited: other histories)
            assert step.metrics.prompt_token_ids == render(tpl.tokenizer, r.messages[:i], schemas)
    back = export.from_atif(tmp_path / "run.jsonl")
    assert len(back) == len(results)
    for a, b in zip(results, back):
        _same_result(a, b)
    # and ATIF -> tmpl -> ATIF of that file: every document the same
    assert [d.to_json_dict() for d in export.to_atif(back, tools=schemas)] == [d.to_json_dict() for d in docs]


def test_a_subagent_rollout_embeds_its_trajectory(tmp_path):
    from tmpl.backends import Scripted
    from tmpl.rollout import SubAgent

    from .test_subagents import Engine, get_weather

    tpl = tmpl.ChatTemplate(load_tokenizer("qwen2.5-instruct"), name="qwen2.5-instruct")
    backend = Scripted(Engine(tpl))
    research = SubAgent(
        tmpl.Rollout(tpl, backend, tools=[get_weather], max_turns=4), name="research", description="Look it up."
    )
    [res] = tmpl.Rollout(tpl, backend, tools=[research], max_turns=4).run([[{"role": "user", "content": "Umbrella?"}]])
    [doc] = export.to_atif([res], tmp_path / "sub.json")
    [sub] = doc.subagent_trajectories
    assert sub.trajectory_id == "research"
    # referenced from the step whose call ran it; its steps are the sub-agent's calls
    ref_steps = [
        s.step_id
        for s in doc.steps
        for x in (s.observation.results if s.observation else [])
        if x.subagent_trajectory_ref
    ]
    assert ref_steps == [2]
    sub_calls = [c for c in res.episode.calls if c.agent == "research"]
    assert [s.metrics.completion_token_ids for s in sub.steps] == [c.completion_ids.tolist() for c in sub_calls]
    [back] = export.from_atif(tmp_path / "sub.json")
    _same_result(res, back)


def _refs(step) -> list:
    return [
        ref for x in (step.observation.results if step.observation else []) for ref in x.subagent_trajectory_ref or []
    ]


def test_an_edit_history_rollouts_branches_are_embedded_trajectories(qwen, tmp_path):
    _, tpl = qwen
    [r] = edit_history_rollout(tpl)
    first, *branches = r.sequences
    assert len(branches) == 2
    schemas = tmpl.Toolbox(_tools()).schemas
    path = tmp_path / "edited.json"
    [doc] = export.to_atif([r], path, tools=schemas)
    # the file as written, validated by the atif package's models alone
    model = atif.Trajectory.model_validate(json.loads(path.read_text(encoding="utf-8")))
    assert model.to_json_dict() == doc.to_json_dict()
    calls = {c.id: c for c in r.episode.calls}
    assistant = [m for m in r.messages if m["role"] == "assistant"]
    # the root: the whole conversation, its agent steps' tokens the first sequence's calls only
    assert [s.extra["tmpl"]["call"] for s in model.steps if s.metrics is not None] == list(first.calls)
    assert [s.message for s in model.steps if s.source == "agent"] == [m["content"] for m in assistant]
    # one embedded trajectory per branch, marked as a branch (not a sub-agent), holding the branch's calls
    assert [t.trajectory_id for t in model.subagent_trajectories] == [f"branch-{s.index}" for s in branches]
    for t, seq in zip(model.subagent_trajectories, branches):
        assert t.extra["tmpl"]["branch"] == {
            "sequence": seq.index,
            "kind": "diverged",
            "against": seq.branch.against,
            "token": seq.branch.token,
            "edit": "edit_history: window",
        }
        assert [s.extra["tmpl"]["call"] for s in t.steps] == list(seq.calls)
        for s in t.steps:
            c = calls[s.extra["tmpl"]["call"]]
            assert s.metrics.prompt_token_ids == c.prompt_ids.tolist()
            assert s.metrics.completion_token_ids == c.completion_ids.tolist()
            assert s.metrics.logprobs == c.logprobs.tolist()
            assert s.extra["tmpl"].get("edit") == ("edit_history: window" if c.id == seq.calls[0] else None)
        # referenced from the root step where it diverged: its first call's message, without metrics
        [holder] = [s for s in model.steps if any(ref.trajectory_id == t.trajectory_id for ref in _refs(s))]
        opened = calls[seq.calls[0]]
        assert holder.metrics is None and holder.message == assistant[opened.turn]["content"]
        assert holder.extra["tmpl"] == {"call": opened.id, "in": t.trajectory_id}
        [ref] = [ref for ref in _refs(holder) if ref.trajectory_id == t.trajectory_id]
        assert ref.extra == {"tmpl": {"branch": True}}
    # every call's sampled tokens in exactly one step of the document
    assert sorted(a[3] for a in step_arrays(model)) == sorted(c.completion_ids.tolist() for c in calls.values())
    # read back: the same sample, its branches the same branches (ids, masks, logprobs, versions, labels)
    [back] = export.from_atif(path)
    _same_result(r, back)
    assert [(s.branch.kind, s.branch.edit, s.agent, s.parent) for s in back.sequences] == [
        ("first", None, None, None),
        ("diverged", "edit_history: window", None, None),
        ("diverged", "edit_history: window", None, None),
    ]
    # and ATIF -> tmpl -> ATIF: the document
    [again] = export.to_atif([back], tools=schemas)
    assert again.to_json_dict() == model.to_json_dict()


def _nested(trajectory) -> list:
    """(trajectory id, its steps' call ids, its branch marker) of every embedded trajectory, depth first."""
    out = []
    for t in trajectory.subagent_trajectories or []:
        calls = [s.extra["tmpl"]["call"] for s in t.steps]
        out.append((t.trajectory_id, calls, bool((t.extra or {}).get("tmpl", {}).get("branch"))))
        out += _nested(t)
    return out


def test_subagents_of_branches_and_branches_of_subagents_nest(qwen):
    from tmpl.atif import records_to_documents

    _, tpl = qwen
    [r] = edit_history_rollout(tpl)
    [record] = export.to_records([r])
    calls = record["episode"]["calls"]

    def call(cid, parent, prompt, completion, agent="helper"):
        n = len(completion)
        return dict(id=cid, prompt_ids=prompt, completion_ids=completion, logprobs=[-0.5] * n, versions=[0] * n,
                    trained=True, parent=parent, agent=agent, turn=None, reward=None)  # fmt: skip

    # a sub-agent run by the first branch's call, whose third call is a branch of its own (a compaction)
    k = [c["id"] for c in calls].index("turn-2") + 1
    calls[k:k] = [
        call("h0", "turn-2", [1, 2], [3]),
        call("h1", "turn-2", [1, 2, 3, 4], [5]),
        call("h2", "turn-2", [1, 9], [6]),
    ]
    record["episode"]["edits"]["h2"] = "compaction"
    calls.insert(1, call("g0", "turn-0", [7], [8], agent="other"))  # and one run by a root call
    want = export.from_records([record])[0]
    [doc] = records_to_documents([record])
    assert _nested(doc) == [
        ("other", ["g0"], False),
        ("branch-2", ["turn-2"], True),
        ("helper", ["h0", "h1"], False),
        ("branch-4", ["h2"], True),
        ("branch-5", ["turn-3"], True),
    ]
    branch = doc.subagent_trajectories[1]
    assert [ref.trajectory_id for ref in _refs(branch.steps[0])] == ["helper"]  # referenced from its call's step
    helper = branch.subagent_trajectories[0]
    assert [ref.trajectory_id for ref in _refs(helper.steps[1])] == ["branch-4"]  # diverged after h1
    [back] = export.from_atif([doc])
    _same_result(want, back)
    # another program's file, marked as docs/atif.md says (only ``extra.tmpl.branch`` on the branches):
    # its branches read back as branches of the same agent, and the file comes back as written
    d = _without_tmpl(export.to_atif([r])[0].to_json_dict())
    for t in d["subagent_trajectories"]:
        t["extra"] = {"tmpl": {"branch": True}}
    [theirs] = export.from_atif([d])
    assert [(s.agent, s.parent, s.branch.kind) for s in theirs.sequences] == [(None, None, "first")] + [
        (None, None, "diverged")
    ] * 2
    assert [s.ids.tolist() for s in theirs.sequences] == [s.ids.tolist() for s in r.sequences]
    assert _without_tmpl(export.to_atif([theirs])[0].to_json_dict()) == _without_tmpl(d)


def _tools():
    from .fixture_models import get_time, get_weather

    return [get_time, get_weather]


#: An ATIF file tmpl wrote before branches were embedded trajectories (the same edit_history rollout as
#: :func:`edit_history_rollout`): every call an agent step of the root, a branch's edit label in its step.
BEFORE = Path(__file__).parent / "data" / "atif_edit_history_before_branches_embedded.jsonl"


def test_files_written_with_branches_as_root_steps_still_read():
    [d] = [json.loads(line) for line in BEFORE.read_text(encoding="utf-8").splitlines()]
    assert "subagent_trajectories" not in d
    steps = [s for s in d["steps"] if "metrics" in s]
    assert len(steps) == 4 and [s["extra"]["tmpl"].get("edit") for s in steps] == [
        None,
        None,
        "edit_history: window",
        "edit_history: window",
    ]
    [old] = export.from_atif(BEFORE)
    # the sequences of the steps' IDs: the first two calls appended, then each branch its call alone
    m = [s["metrics"] for s in steps]
    p0, c0, p1, c1 = (
        m[0]["prompt_token_ids"],
        m[0]["completion_token_ids"],
        m[1]["prompt_token_ids"],
        m[1]["completion_token_ids"],
    )
    assert p1[: len(p0) + len(c0)] == p0 + c0
    want = [p1 + c1, m[2]["prompt_token_ids"] + m[2]["completion_token_ids"]]
    want.append(m[3]["prompt_token_ids"] + m[3]["completion_token_ids"])
    assert [s.ids.tolist() for s in old.sequences] == want
    assert [int(s.mask.sum()) for s in old.sequences] == [len(c0) + len(c1)] + [
        len(x["completion_token_ids"]) for x in m[2:]
    ]
    assert [(s.branch.kind, s.branch.edit) for s in old.sequences] == [
        ("first", None),
        ("diverged", "edit_history: window"),
        ("diverged", "edit_history: window"),
    ]
    # ATIF -> tmpl -> ATIF: the document back as it was written, branches still root steps
    [same] = export.to_atif([old])
    assert same.to_json_dict() == atif.Trajectory.model_validate(d).to_json_dict()
    # the same sample written afresh (no source document): its branches embedded, read back the same
    fresh = export.from_records(export.to_records([old]))
    [new] = export.to_atif(fresh)
    assert [t.trajectory_id for t in new.subagent_trajectories] == ["branch-1", "branch-2"]
    assert len([s for s in new.steps if s.metrics is not None]) == 2
    [back] = export.from_atif([new])
    _same_result(old, back)


# -- bad input -----------------------------------------------------------------------------------------


def _doc_dict(tok) -> dict:
    return weather_document(tok).to_json_dict()


def test_unequal_arrays_name_the_step_and_field(qwen):
    tok, _ = qwen
    d = _doc_dict(tok)
    d["steps"][2]["metrics"]["logprobs"].pop()
    with pytest.raises(AtifError) as err:
        export.from_atif([d])
    assert err.value.step == 3 and err.value.field == "metrics.logprobs"
    assert "steps[2] (step 3): metrics.logprobs has" in str(err.value) and "completion_token_ids has" in str(err.value)

    d = _doc_dict(tok)
    del d["steps"][1]["metrics"]["prompt_token_ids"]
    with pytest.raises(AtifError) as err:
        export.from_atif([d])
    assert err.value.step == 2 and err.value.field == "metrics.prompt_token_ids"

    d = _doc_dict(tok)
    d["steps"][1]["metrics"]["logprobs"][0] = 0.5  # not a log probability
    with pytest.raises(AtifError, match=r"step 2: .*logprobs"):
        export.from_atif([d])


@pytest.mark.parametrize(
    "change, expect",
    [
        (lambda d: d["steps"][1].update(step_id=7), r"step_id=7 is not sequential"),
        (lambda d: d.pop("agent"), r"agent: Field required"),
        (lambda d: d["steps"][1].update(source="robot"), r"steps\[1\] \(step 2\)\.source"),
        (lambda d: d["steps"][0].update(metrics={"prompt_token_ids": [1]}), r"only valid on `source='agent'`"),
    ],
    ids=["step-order", "no-agent", "bad-source", "user-metrics"],
)
def test_a_wrong_schema_is_refused_by_the_atif_models(qwen, change, expect):
    tok, _ = qwen
    d = _doc_dict(tok)
    change(d)
    with pytest.raises(AtifError, match=expect):
        export.from_atif([d])


def test_corrupt_files_and_other_formats(qwen, tmp_path, capsys, rolled_jsonl):
    tok, _ = qwen
    line = json.dumps(_doc_dict(tok))
    cut = tmp_path / "cut.jsonl"
    cut.write_text(line + "\n" + line[: len(line) // 2], encoding="utf-8")
    with pytest.raises(AtifError, match=r"cut\.jsonl:2: not JSON: .*truncated file"):
        export.from_atif(cut)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(_doc_dict(tok), indent=2)[:-40], encoding="utf-8")
    with pytest.raises(AtifError, match="broken.json: not JSON"):
        export.from_atif(broken)
    with pytest.raises(AtifError, match=r"not an ATIF trajectory: .*schema_version: Field required"):
        export.from_atif(rolled_jsonl)  # a tmpl JSON-lines export is not ATIF
    no_ids = _doc_dict(tok)
    for s in no_ids["steps"]:
        s.pop("metrics", None)
    with pytest.raises(AtifError, match="no step carries token IDs"):
        export.from_atif([no_ids])
    # the command line: one line naming the file and line, status 2
    assert main(["replay", str(cut)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tmpl replay: ") and "cut.jsonl:2" in err[0]
    # a tmpl export still replays as before (not taken for ATIF)
    assert main(["replay", str(rolled_jsonl)]) == 0


@pytest.fixture
def rolled_jsonl(qwen, tmp_path):
    tok, tpl = qwen
    from tmpl.backends import Scripted

    answer = tpl.codec.encode("Hi.<|im_end|>")
    [r] = tmpl.Rollout(tpl, Scripted(lambda req: (answer, [-0.25] * len(answer))), max_turns=1).run(
        [[{"role": "user", "content": "Hello"}]]
    )
    return export.to_jsonl([r], tmp_path / "rollouts.jsonl")


def test_atif_to_tmpl_to_atif_keeps_what_tmpl_does_not_model(qwen):
    """Timestamps, model names, costs, notes, extras, and a writer's float64 logprobs come back as written."""
    tok, _ = qwen
    d = weather_document(tok).to_json_dict()
    d["notes"], d["extra"] = "written by hand", {"run": "r1"}
    d["final_metrics"] = {"total_cost_usd": 0.01, "total_steps": 3}
    d["steps"][0]["timestamp"] = "2026-11-28T12:00:00Z"
    step = d["steps"][1]
    step.update(timestamp="2026-11-28T12:00:01Z", model_name="qwen", llm_call_count=1, extra={"retries": 0})
    step["reasoning_content"] = "I should call the tool."
    step["metrics"].update(cost_usd=0.001, cached_tokens=10, extra={"reasoning_tokens": 0})
    step["metrics"]["logprobs"] = [x - 1e-9 for x in step["metrics"]["logprobs"]]  # float64, not float32 values
    assert any(float(np.float32(x)) != x for x in step["metrics"]["logprobs"])
    step["tool_calls"][0]["extra"] = {"timeout": 5}
    step["observation"]["results"][0]["extra"] = {"exit_code": 0}
    want = atif.Trajectory.model_validate(d).to_json_dict()

    [r] = export.from_atif([d])
    assert r.logprobs.dtype == np.float32 and r.atif == want  # tmpl keeps float32; the document rides along
    [out] = export.to_atif([r])
    assert _without_tmpl(out.to_json_dict()) == want
    # a result that was not read from ATIF has no document: the steps are tmpl's alone
    plain = tmpl.export.from_records(tmpl.export.to_records([r]))
    [bare] = export.to_atif(plain)
    assert bare.steps[1].timestamp is None and bare.steps[1].metrics.logprobs == r.episode.calls[0].logprobs.tolist()


def _without_tmpl(x):
    """A document less tmpl's own ``extra["tmpl"]`` entries (and extras left empty)."""
    if isinstance(x, dict):
        out = {k: _without_tmpl(v) for k, v in x.items() if k != "tmpl"}
        if out.get("extra") == {}:
            del out["extra"]
        return out
    if isinstance(x, list):
        return [_without_tmpl(v) for v in x]
    return x


def test_atif_is_known_by_content_wherever_schema_version_sits(qwen, tmp_path, capsys):
    from tmpl.atif import looks_like_atif

    tok, _ = qwen
    d = weather_document(tok).to_json_dict()
    version = d.pop("schema_version")
    d["steps"][1]["extra"] = {"log": "x" * 70_000}  # the version after 64 KiB of steps
    d["schema_version"] = version
    lines = tmp_path / "export.jsonl"
    lines.write_text(json.dumps(d) + "\n", encoding="utf-8")
    assert looks_like_atif(lines) and not looks_like_atif(tmp_path / "nothing")
    assert main(["replay", str(lines)]) == 0  # read as ATIF (a tmpl reader would refuse its format)
    assert "1 samples, 0 measured" in capsys.readouterr().out


def _image_message(d):
    d["steps"][0]["message"] = [
        {"type": "text", "text": "What is the weather here?"},
        {"type": "image", "source": {"media_type": "image/png", "path": "images/street.png"}},
    ]


def _file_ref(d):
    d["steps"][2]["observation"] = {"results": [{"subagent_trajectory_ref": [{"trajectory_path": "sub.json"}]}]}


def _text_only_step(d):
    d["steps"].insert(2, {"step_id": 3, "source": "agent", "message": "Let me answer.", "llm_call_count": 0})
    for k, step in enumerate(d["steps"]):
        step["step_id"] = k + 1


@pytest.mark.parametrize(
    "change",
    [_image_message, _file_ref, _text_only_step, lambda d: d["steps"][1].update(is_copied_context=True)],
    ids=["content-parts", "file-ref", "text-only-step", "copied-context"],
)
def test_other_writers_shapes_come_back_as_written(qwen, change):
    tok, _ = qwen
    d = weather_document(tok).to_json_dict()
    change(d)
    want = atif.Trajectory.model_validate(d).to_json_dict()
    [r] = export.from_atif([d])
    [out] = export.to_atif([r])
    assert _without_tmpl(out.to_json_dict()) == want
    sampled = [len(s["metrics"]["completion_token_ids"]) for s in d["steps"] if s.get("metrics")]
    trained = [
        n for s, n in zip([s for s in d["steps"] if s.get("metrics")], sampled) if not s.get("is_copied_context")
    ]
    assert [int(s.mask.sum()) for s in r.sequences] == [sum(trained)]  # a copied step is context, never trained


# -- generated trajectories ----------------------------------------------------------------------------

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies


@st.composite
def trajectories(draw):
    """ATIF documents with calls that extend the context, branch off it, or run in an embedded sub-agent;
    float64 logprobs; token IDs from the int32 range."""
    ids = st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=6)
    steps = [{"step_id": 1, "source": "user", "message": draw(st.text(max_size=8))}]
    context: list[int] = draw(ids)
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["extend", "branch"]))
        prompt = context + draw(ids) if how == "extend" else draw(ids)
        completion = draw(ids)
        lps = draw(st.lists(st.floats(-30, 0, allow_nan=False), min_size=len(completion), max_size=len(completion)))
        steps.append(
            {
                "step_id": len(steps) + 1,
                "source": "agent",
                "message": draw(st.text(max_size=8)),
                "metrics": {"prompt_token_ids": prompt, "completion_token_ids": completion, "logprobs": lps},
            }
        )
        context = prompt + completion
    doc = {"schema_version": "ATIF-v1.8", "agent": {"name": "gen", "version": "0"}, "steps": steps}
    if draw(st.booleans()):  # a sub-agent run by the first call
        sub_ids = draw(ids)
        doc["subagent_trajectories"] = [
            {
                "schema_version": "ATIF-v1.8",
                "trajectory_id": "helper",
                "agent": {"name": "helper", "version": "0"},
                "steps": [
                    {
                        "step_id": 1,
                        "source": "agent",
                        "message": "",
                        "metrics": {
                            "prompt_token_ids": draw(ids),
                            "completion_token_ids": sub_ids,
                            "logprobs": [-1.5] * len(sub_ids),
                        },
                    }
                ],
            }
        ]
        steps[1]["observation"] = {"results": [{"subagent_trajectory_ref": [{"trajectory_id": "helper"}]}]}
    return doc


@hypothesis.settings(max_examples=60, deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(trajectories())
def test_generated_trajectories_round_trip_and_train_each_sampled_token_once(doc):
    want = atif.Trajectory.model_validate(doc).to_json_dict()
    [r] = export.from_atif([doc])
    [out] = export.to_atif([r])
    assert _without_tmpl(out.to_json_dict()) == want
    arrays = step_arrays(want)
    # every sampled token is in exactly one sequence's mask, with its logprob (at float32)
    assert sum(int(s.mask.sum()) for s in r.sequences) == sum(len(a[3]) for a in arrays)
    got = sorted(round(float(x), 4) for s in r.sequences for x in s.logprobs[s.mask.astype(bool)])
    assert got == sorted(round(float(np.float32(x)), 4) for a in arrays for x in a[4])
    # and tmpl's own document reads back to the same sequences
    [again] = export.from_atif([out])
    assert [(s.ids.tolist(), s.mask.tolist()) for s in again.sequences] == [
        (s.ids.tolist(), s.mask.tolist()) for s in r.sequences
    ]
