"""Harness runs exported and viewed like any episode: ``tmpl.export.to_atif``/``from_atif``,
``to_jsonl``/``from_jsonl``, ``episodes_to_jsonl`` and ``tmpl view`` of :class:`tmpl.harness.HarnessResult`.

The runs are real: tests/harness_rollout_agent.py (the openai SDK, its own process) on the Qwen2.5
gateway over a Scripted policy of tests/test_harness_rollout.py (one run that ends well with a
verifier's reward, one that exits 3). Oracles: the template's own ``apply_chat_template`` render of each
request body the SDK sent (every agent step's prompt IDs are one), the ``atif`` package's models (every
document re-validated from the file), and the runs' own episodes (every sequence, lineage and branch
read back the same). A constructed result adds what a simple agent does not make: a sub-agent's lineage
and a compaction branch, and a run without calls.
"""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest

from tmpl import export
from tmpl.cli import main
from tmpl.episode import Call, Episode
from tmpl.harness import HarnessResult
from tmpl.harness.rollout import HarnessRollout
from tmpl.harness.task import HarnessTask
from tmpl.harness.verifier import CommandVerifier

from .test_harness_rollout import World, agent

atif = pytest.importorskip("atif", reason="the atif extra is not installed (pip install -e '.[atif]')")


@pytest.fixture(scope="module")
def runs():
    mp = pytest.MonkeyPatch()
    try:
        world = World(mp)
        tasks = [
            HarnessTask("mode:ok Weather in Paris?", id="ok", verifier=CommandVerifier("echo 0.5")),
            HarnessTask("mode:exit3 Weather in Paris?", id="exits"),
        ]
        results = HarnessRollout(agent(), world.gateway, concurrency=2, progress=False).run(tasks)
        yield world, results + [branched(), HarnessResult(status="NO_CALLS", session="none-0-x", harness="test-agent")]
    finally:
        mp.undo()


def branched() -> HarnessResult:
    """A run whose episode has a sub-agent's lineage and a compaction branch of the root's."""
    ep = Episode(sample_id="br-0-x")
    ep.add_call(Call([1, 2, 3], [4, 5], [-0.5, -0.2], id="a", turn=0))
    ep.add_call(Call([7, 8], [9], [-0.3], id="sub", parent="a", agent="explorer"))
    ep.add_call(Call([1, 2, 3, 4, 5, 6], [10], [-0.1], id="b", turn=1))
    ep.add_call(Call([1, 11], [12, 13], [-0.4, -0.6], id="c", turn=2), edit="compaction")
    return HarnessResult(
        status="HARNESS_TIMEOUT",
        reward=0.25,
        episode=ep,
        session="br-0-x",
        task_id="br",
        calls=4,
        seconds=61.5,
        error="ran past its 60 s timeout",
        stdout_tail="working…\n",
        stderr_tail="killed\n",
        harness="test-agent",
        timings={"harness": 60.0, "verifier": 1.5},
    )


def sequences(ep: Episode | None) -> list[tuple]:
    if ep is None:
        return []
    return [
        (
            s.ids.tolist(),
            s.mask.tolist(),
            np.round(s.logprobs, 6).tolist(),
            s.versions.tolist(),
            s.agent,
            s.parent,
            s.branch.kind,
            s.branch.edit,
            list(s.calls),
        )
        for s in ep.sequences
    ]


def same_run(a: HarnessResult, b: HarnessResult) -> None:
    for name in ("status", "exit_code", "reward", "stdout_tail", "stderr_tail", "seconds", "calls", "session"):
        assert getattr(a, name) == getattr(b, name), name
    for name in ("task_id", "sample", "error", "refused", "timings", "harness"):
        assert getattr(a, name) == getattr(b, name), name
    assert sequences(a.episode) == sequences(b.episode)
    assert (a.episode is None) or a.episode.reward == b.episode.reward


def test_the_real_runs_are_what_the_export_is_checked_on(runs):
    world, results = runs
    ok, exits = results[:2]
    assert (ok.status, ok.reward, ok.exit_code, ok.harness) == ("HARNESS_DONE", 0.5, 0, "test-agent")
    assert (exits.status, exits.exit_code) == ("HARNESS_EXITED", 3)
    assert "done" in ok.stdout_tail and ok.calls == 2


def test_atif_of_harness_runs_validates_and_reads_back_the_same(runs, tmp_path):
    world, results = runs
    path = tmp_path / "runs.atif.jsonl"
    export.to_atif(results, path)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(results)
    docs = [atif.Trajectory.model_validate(json.loads(line)) for line in lines]  # the atif package's own model
    renders = world.renders()
    for doc, r in zip(docs[:2], results[:2]):
        assert doc.agent.name == "test-agent" and doc.session_id == r.session
        assert r.status in doc.notes
        steps = [s for s in doc.steps if s.metrics is not None and s.metrics.completion_token_ids]
        assert len(steps) == r.calls == 2
        for step in steps:  # each step's prompt is the template's render of a request the SDK sent
            assert list(step.metrics.prompt_token_ids) in renders
        run = doc.extra["tmpl"]["harness"]
        assert (run["exit_code"], run["stdout_tail"], run["task_id"]) == (r.exit_code, r.stdout_tail, r.task_id)
    # the constructed run: the sub-agent and the branch are embedded trajectories of their own
    embedded = {t.trajectory_id: t for t in docs[2].subagent_trajectories}
    assert set(embedded) == {"explorer", "branch-2"}
    assert embedded["branch-2"].extra["tmpl"]["branch"]["edit"] == "compaction"
    assert [s.metrics.completion_token_ids for s in embedded["explorer"].steps] == [[9]]
    assert docs[3].steps == [] and "NO_CALLS" in docs[3].notes
    back = export.from_atif(path)
    assert [type(b) for b in back] == [HarnessResult] * len(results)
    for a, b in zip(results, back):
        same_run(a, b)


def test_jsonl_of_harness_runs_reads_back_the_same(runs, tmp_path):
    _, results = runs
    path = export.to_jsonl(results, tmp_path / "runs.jsonl")
    back = export.from_jsonl(path)
    for a, b in zip(results, back, strict=True):
        same_run(a, b)
    with pytest.raises(Exception, match="harness.status 'DONE' is none of"):
        record = json.loads(path.read_text().splitlines()[0])
        record["harness"]["status"] = "DONE"
        export.from_records([record])


def test_tmpl_replay_names_a_harness_run_instead_of_failing(runs, tmp_path, capsys):
    _, results = runs
    path = export.to_jsonl(results[:1], tmp_path / "runs.jsonl")
    assert main(["replay", str(path)]) != 0
    assert "sample 0 is a harness run" in capsys.readouterr().err


def _details(page) -> tuple[dict, dict[int, dict]]:
    text = page.read_text(encoding="utf-8")
    found = re.findall(r'<script type="application/json" id="s(\d+)">(.*?)</script>', text)
    summary = json.loads(re.search(r'<script type="application/json" id="tmpl-summary">(.*?)</script>', text).group(1))
    return summary, {int(k): json.loads(v) for k, v in found}


def _ids(text: str) -> list[int]:
    return np.frombuffer(base64.b64decode(text), "<i4").tolist()


@pytest.mark.parametrize("kind", ["jsonl", "atif", "episodes"])
def test_tmpl_view_shows_a_harness_run_with_its_status_reward_and_tails(runs, tmp_path, kind):
    _, results = runs
    shown = results if kind != "episodes" else results[:3]  # an episode line needs an episode
    path = tmp_path / f"runs.{kind}.jsonl"
    if kind == "jsonl":
        export.to_jsonl(shown, path)
    elif kind == "atif":
        export.to_atif(shown, path)
    else:
        export.episodes_to_jsonl(shown, path)
    page = tmp_path / "page.html"
    assert main(["view", str(path), "-o", str(page)]) == 0
    summary, details = _details(page)
    columns = summary["columns"]
    assert columns["status"] == [r.status for r in shown]
    assert columns["reward"] == [r.reward for r in shown]
    assert columns["end"] == [r.reason for r in shown]
    for k, r in enumerate(shown):
        info = details[k]["info"]
        assert info["harness"] == "test-agent"
        assert info.get("exit_code") == r.exit_code
        assert info.get("stdout_tail", "") == r.stdout_tail and info.get("stderr_tail", "") == r.stderr_tail
        if r.episode is not None:
            seqs = details[k]["episode"]["sequences"]
            assert [_ids(s["ids"]) for s in seqs] == [s.ids.tolist() for s in r.episode.sequences]
    assert details[1]["problems"] == []
