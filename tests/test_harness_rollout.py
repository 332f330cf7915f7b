"""``tmpl.harness.HarnessRollout``: one harness run per sample, each a real separate process.

The harness is tests/harness_rollout_agent.py: the real ``openai`` SDK against its session's base URL,
one tool it runs itself, its answer written to ``answer.txt``. The gateway is a Qwen2.5 template over a
Scripted backend that answers a ``get_weather`` call until the tool's result is in the prompt, then text.
Each call's prompt is checked against the template's own ``apply_chat_template`` of the raw request the
SDK sent (kept as it arrived), and each run's rows against its calls. Process checks read ``/proc``:
every PID a harness (or its daemon, or a verifier) wrote must be gone once its run ended.
"""

from __future__ import annotations

import asyncio
import doctest
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tmpl
from tmpl.backends import Scripted
from tmpl.errors import HarnessTaskError
from tmpl.gateway import Gateway, create_app
from tmpl.gateway.dialects import openai_chat
from tmpl.harness import Harness
from tmpl.harness.rollout import HarnessRollout
from tmpl.harness.task import HarnessTask
from tmpl.harness.verifier import CommandVerifier

from .conftest import load_tokenizer
from .gateway_util import full_render_ids, served

pytest.importorskip("openai", reason="the openai SDK is not installed (pip install -e '.[test]')")
pytest.importorskip("fastapi", reason="FastAPI is not installed (pip install -e '.[gateway]')")
pytest.importorskip("uvicorn", reason="uvicorn is not installed (pip install -e '.[gateway]')")

AGENT = Path(__file__).with_name("harness_rollout_agent.py")
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
ANSWER = "It is sunny in Paris.<|im_end|>"
#: seconds a normal run may take: the agent imports the openai SDK, seconds on a loaded 2-core machine
SLOW = 240.0


def agent(timeout: float = SLOW) -> Harness:
    return Harness(
        "test-agent",
        (sys.executable, str(AGENT), "{task}"),
        dialect="openai-chat",
        env={"OPENAI_BASE_URL": "{base_url}", "OPENAI_API_KEY": "unused", "MODEL": "{model}"},
        timeout=timeout,
    )


class World:
    """A Qwen2.5 gateway on a Scripted policy, every raw chat request body as it arrived."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, **gateway_kw) -> None:
        self.tok = load_tokenizer("qwen2.5-instruct")
        self.sampled: dict[str, list[int]] = {}
        self.backend = Scripted(self.policy)
        self.gateway = Gateway(tmpl.ChatTemplate(self.tok), self.backend, **gateway_kw)
        self.bodies: list[dict] = []
        real = openai_chat.parse

        def keep(body):
            self.bodies.append(json.loads(json.dumps(body)))
            return real(body)

        monkeypatch.setattr(openai_chat, "parse", keep)

    def policy(self, req) -> list[int]:
        text = self.tok.decode(list(req.prompt_ids))
        ids = self.tok.encode(ANSWER if "sunny, Paris" in text else CALL, add_special_tokens=False)
        self.sampled[req.request_id] = ids
        return ids

    def renders(self) -> list[list[int]]:
        """The template's full render of every request body that arrived (computed here, not by tmpl)."""
        out = []
        for body in self.bodies:
            messages = [{**m, "content": m.get("content") or ""} for m in body["messages"]]
            out.append(full_render_ids(self.tok, messages, body.get("tools")))
        return out


def check_rows(world: World, result) -> None:
    """The run's calls are the requests its SDK sent, fully rendered, and its one row is those calls."""
    episode = result.episode
    calls = episode.calls
    assert result.calls == len(calls) == 2
    renders = world.renders()
    for call in calls:
        assert call.prompt_ids.tolist() in renders, "a call's prompt is not the full render of any request sent"
        assert call.completion_ids.tolist() == world.sampled[call.id]
    rows = result.rows()
    assert len(rows) == 1
    ids = rows[0].sequence.ids.tolist()
    first, last = calls
    assert ids == last.prompt_ids.tolist() + last.completion_ids.tolist()
    p = len(first.prompt_ids)
    assert ids[p : p + len(first.completion_ids)] == first.completion_ids.tolist()
    assert int(rows[0].sequence.mask.sum()) == len(first.completion_ids) + len(last.completion_ids)
    assert episode.reward == result.reward


def gone(pid: int) -> bool:
    """Whether process ``pid`` no longer exists (a zombie counts as left behind)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "X"


def pids(folder: Path, session: str, kind: str) -> list[int]:
    path = folder / f"{session}.{kind}"
    return [int(path.read_text())] if path.exists() else []


def test_doctests_of_the_harness_run_modules():
    from tmpl.harness import keeper, process, result, rollout, task, verifier

    for module in (task, verifier, result, keeper, process, rollout):
        assert doctest.testmod(module, optionflags=doctest.ELLIPSIS).failed == 0, module.__name__


def test_rows_are_the_recorded_calls_in_groups_of_n(monkeypatch, tmp_path):
    world = World(monkeypatch)
    root = tmp_path / "runs"
    root.mkdir()

    def answered(workdir: Path, episode) -> float:
        return float((workdir / "answer.txt").read_text() == "It is sunny in Paris." and len(episode.calls) == 2)

    tasks = [
        HarnessTask(
            "mode:ok Weather in Paris?", verifier=CommandVerifier("grep -q 'sunny in Paris' answer.txt"), id="a"
        ),
        HarnessTask("mode:ok What about Paris?", files={"notes/hint.txt": "Paris"}, verifier=answered, id="b"),
    ]
    results = HarnessRollout(agent(), world.gateway, n=2, concurrency=4, root=root, progress=False).run(tasks)

    assert [(r.task_id, r.sample) for r in results] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert len({r.session for r in results}) == 4
    for r in results:
        assert (r.status, r.exit_code, r.reward, r.error) == ("HARNESS_DONE", 0, 1.0, ""), r.stderr_tail
        check_rows(world, r)
        assert "done" in r.stdout_tail
        assert r.seconds >= r.timings["harness"] > 0
        # every phase timed, in order, none overlapping: together they are the run's seconds, less the waits between
        phases = ("open", "setup", "start", "harness", "kill", "verifier", "finish", "cleanup")
        assert list(r.timings) == list(phases) and min(r.timings.values()) >= 0, r.timings
        assert r.seconds - 0.5 < sum(r.timings.values()) <= r.seconds, (r.seconds, r.timings)
    # every request sent was recorded once, in its own run's episode
    assert len(world.bodies) == sum(r.calls for r in results) == 8
    assert {c.id for r in results for c in r.episode.calls} == set(world.sampled)
    # episodes were taken as runs ended: none left in the gateway (open or queued), no directory left
    assert len(world.gateway.sessions) == 0 and world.gateway.drain() == []
    assert list(root.iterdir()) == []
    # a harness run exports like any episode (what `tmpl view` opens), its reward kept
    path = tmpl.export.episodes_to_jsonl(results, tmp_path / "runs.jsonl")
    back = tmpl.export.episodes_from_jsonl(path)
    assert [e.sequences[0].ids.tolist() for e in back] == [r.episode.sequences[0].ids.tolist() for r in results]
    assert [e.reward for e in back] == [1.0] * 4
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["session"] for line in lines] == [r.session for r in results]
    from tmpl.view import write_page

    summary = write_page(path, tmp_path / "view.html")  # `tmpl view` of the runs
    assert (summary.shown, summary.total, summary.problems) == (4, 4, [])


def test_eight_concurrent_runs_each_named_and_no_process_left(monkeypatch, tmp_path):
    world = World(monkeypatch)
    marks = tmp_path / "pids"
    marks.mkdir()
    tasks = [
        HarnessTask("mode:ok Weather in Paris?", id="ok1", verifier=CommandVerifier("test -s answer.txt")),
        HarnessTask("mode:ok Weather in Paris?", id="ok2"),
        HarnessTask("mode:ok Weather in Paris?", id="ok3"),
        HarnessTask("mode:daemon Weather in Paris?", id="daemon", verifier=CommandVerifier("test -s answer.txt")),
        HarnessTask("mode:sleep Weather in Paris?", id="sleeper", timeout=20.0),
        HarnessTask("mode:exit3 Weather in Paris?", id="exit3"),
        HarnessTask("mode:nocall Weather in Paris?", id="nocall"),
        HarnessTask("mode:ok Weather in Paris?", id="ok4"),
    ]
    began = time.monotonic()
    rollout = HarnessRollout(agent(), world.gateway, concurrency=8, env={"PIDS_DIR": str(marks)}, progress=False)
    results = rollout.run(tasks)
    by = {r.task_id: r for r in results}
    assert len(results) == 8

    for name in ("ok1", "ok2", "ok3", "ok4", "daemon"):
        assert by[name].status == "HARNESS_DONE", (name, by[name].error, by[name].stderr_tail)
        check_rows(world, by[name])
    assert by["ok1"].reward == by["daemon"].reward == 1.0 and by["ok2"].reward is None

    sleeper = by["sleeper"]
    assert sleeper.status == "HARNESS_TIMEOUT" and "timeout of 20 s" in sleeper.error
    assert 20.0 <= sleeper.timings["harness"] < 90
    # its kill: SIGTERM to its keeper, which killed the tree and was reaped (KILL_WAIT is 15 s: well within)
    assert 0 < sleeper.timings["kill"] < 15 and by["ok1"].timings["kill"] < 15
    assert by["exit3"].status == "HARNESS_EXITED" and by["exit3"].exit_code == 3
    assert "exited with code 3" in by["exit3"].error
    check_rows(world, by["exit3"])  # its calls are kept: the trainer decides
    nocall = by["nocall"]
    assert (nocall.status, nocall.calls, nocall.episode, nocall.rows()) == ("NO_CALLS", 0, None, [])
    assert "nothing to do" in nocall.stdout_tail

    # every process any run started is gone: the harnesses, the daemon, the sleeper's child
    left = []
    for r in results:
        for kind in ("pid", "daemon", "child"):
            left += [(r.task_id, kind, p) for p in pids(marks, r.session, kind) if not gone(p)]
    assert pids(marks, by["daemon"].session, "daemon") and pids(marks, sleeper.session, "child")
    assert left == []
    assert len(world.gateway.sessions) == 0
    assert time.monotonic() - began < SLOW


def test_verifiers(monkeypatch, tmp_path):
    world = World(monkeypatch)
    marks = tmp_path / "pids"
    marks.mkdir()

    def crashes(workdir, episode):
        return 1 / 0

    def hangs(workdir, episode):
        time.sleep(30)
        return 1.0

    def says_yes(workdir, episode):
        return "yes"

    async def reads(workdir, episode):  # a coroutine function is awaited
        await asyncio.sleep(0)
        return 0.5 if (workdir / "answer.txt").exists() else 0.0

    verifiers = {
        "hangs-cmd": CommandVerifier(f"echo $$ > {marks}/verifier.pid; sleep 60", timeout=2),
        "prints": CommandVerifier(["sh", "-c", "echo checking; echo 0.25"]),
        "fails": CommandVerifier("exit 1"),
        "missing": CommandVerifier(["no-such-verifier-tmpl"]),
        "crashes": crashes,
        "hangs-fn": hangs,
        "says-yes": says_yes,
        "reads": reads,
    }
    tasks = [HarnessTask("mode:ok Weather in Paris?", id=k, verifier=v) for k, v in verifiers.items()]
    results = HarnessRollout(agent(), world.gateway, concurrency=8, verifier_timeout=2, progress=False).run(tasks)
    by = {r.task_id: r for r in results}
    failed = {k: r.error for k, r in by.items() if r.status == "VERIFIER_FAILED"}
    assert sorted(failed) == ["crashes", "hangs-cmd", "hangs-fn", "missing", "says-yes"], {
        k: (r.status, r.error) for k, r in by.items()
    }
    assert "did not finish within 2 s" in failed["hangs-cmd"]
    assert gone(int((marks / "verifier.pid").read_text()))
    assert "no-such-verifier-tmpl" in failed["missing"]
    assert "raised ZeroDivisionError" in failed["crashes"]
    assert "did not return within 2 s" in failed["hangs-fn"]
    assert "returned 'yes', not a finite number" in failed["says-yes"]
    assert (by["prints"].reward, by["fails"].reward, by["reads"].reward) == (0.25, 0.0, 0.5)
    for r in results:  # a verifier that failed leaves the run's rows and no reward
        check_rows(world, r)
        assert (r.reward is None) == (r.status == "VERIFIER_FAILED")


def test_bad_input_is_named_and_other_runs_untouched(monkeypatch, tmp_path):
    world = World(monkeypatch, max_session_tokens=2000)
    gone_dir = tmp_path / "task-files"
    gone_dir.mkdir()
    (gone_dir / "x.txt").write_text("x")
    vanishing = HarnessTask("mode:ok Weather in Paris?", files=gone_dir, id="vanished")
    shutil.rmtree(gone_dir)
    with pytest.raises(HarnessTaskError, match="is not a directory"):
        HarnessTask("x", files=tmp_path / "never-there")
    root = tmp_path / "runs"
    root.mkdir()
    tasks = [
        HarnessTask("mode:flood Weather in Paris?", id="flood"),
        vanishing,
        HarnessTask("mode:ok Weather in Paris?", id="fine", verifier=CommandVerifier("test -s answer.txt")),
    ]
    results = HarnessRollout(agent(), world.gateway, concurrency=3, root=root, progress=False).run(tasks)
    by = {r.task_id: r for r in results}

    flood = by["flood"]
    assert flood.status == "CALLS_REFUSED", (flood.error, flood.stderr_tail)
    assert "over the limit of 2000" in flood.error and flood.refused[0].startswith("400: ")
    assert flood.calls == 1 and "refused:" in flood.stderr_tail  # its first call is kept, once
    assert by["vanished"].status == "SETUP_FAILED" and "is gone" in by["vanished"].error
    assert by["vanished"].exit_code is None
    assert by["fine"].status == "HARNESS_DONE" and by["fine"].reward == 1.0
    check_rows(world, by["fine"])
    assert len(world.bodies) == 4  # flood: 2 sent (1 refused), vanished: none, fine: 2
    assert list(root.iterdir()) == []

    # a harness whose program is missing, or whose file would land outside its places: named, nothing run
    missing = Harness("missing", ("no-such-harness-tmpl", "{task}"), dialect="openai-chat")
    stray = Harness("stray", ("true",), dialect="openai-chat", files={"/etc/tmpl-stray.json": "{{}}"})
    for harness, why in ((missing, "'no-such-harness-tmpl' is not on PATH"), (stray, "neither under {home}")):
        [r] = HarnessRollout(harness, world.gateway, root=root, progress=False).run(["mode:ok x"])
        assert r.status == "SETUP_FAILED" and why in r.error, r.error
    assert not Path("/etc/tmpl-stray.json").exists()
    # a gateway at a URL that went away: the run that cannot read its episode says so, the batch goes on
    quiet = Harness("quiet", ("true",), dialect="openai-chat")
    [r] = HarnessRollout(quiet, "http://127.0.0.1:9", model="m", root=root, progress=False).run(["x"])
    assert (r.status, r.exit_code) == ("GATEWAY_FAILED", 0) and "ConnectError" in r.error, r.error
    assert list(root.iterdir()) == []


def test_a_gateway_at_a_url(monkeypatch, tmp_path):
    world = World(monkeypatch)
    task = HarnessTask("mode:ok Weather in Paris?", verifier=CommandVerifier("grep -q sunny answer.txt"), id="url")
    with served(create_app(world.gateway, admin_token="s3cret")) as url:
        [r] = HarnessRollout(agent(), url, admin_token="s3cret", progress=False).run([task])
        queued = world.gateway.drain()
        # without the gateway's admin token its trainer routes refuse: named, the run's calls not taken
        [refused] = HarnessRollout(agent(), url, progress=False).run(["mode:ok Weather in Paris?"])
    assert refused.status == "GATEWAY_FAILED" and "401" in refused.error, refused.error
    assert "the gateway failed reading its episode" in refused.error
    assert r.status == "HARNESS_DONE" and r.reward == 1.0, (r.error, r.stderr_tail)
    check_rows(world, r)
    # the reward went through the gateway's route: its finished episode (the one the trainer could drain) has it
    [done] = queued
    assert done.key == r.session and done.episode.reward == 1.0
    assert [s.ids.tolist() for s in done.episode.sequences] == [s.ids.tolist() for s in r.episode.sequences]


def _bwrap_works() -> str | None:
    """Why the sandbox cannot run here, or None."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed: apt-get install -y bubblewrap"
    probe = ["bwrap", "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/", "--proc", "/proc", "true"]
    done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    return None if done.returncode == 0 else f"bwrap cannot make namespaces here: {done.stderr.strip()}"


def test_sandboxed_runs_reach_the_gateway_and_nothing_else(monkeypatch, tmp_path):
    why = _bwrap_works()
    if why:
        pytest.skip(why)
    world = World(monkeypatch)
    outside = tmp_path / "escaped.txt"
    host = socket.socket()  # a host service the harness must not reach
    host.bind(("127.0.0.1", 0))
    host.listen(4)
    host.setblocking(False)
    env = {"ESCAPE_TO": str(outside), "ESCAPE_PORT": str(host.getsockname()[1])}

    def checked(workdir: Path, episode) -> float:
        return float((workdir / "answer.txt").read_text() == "It is sunny in Paris.")

    tasks = [
        HarnessTask("mode:escape Weather in Paris?", id="escape", verifier=checked),
        HarnessTask("mode:daemon Weather in Paris?", id="daemon", verifier=checked),
    ]
    rollout = HarnessRollout(
        agent(),
        world.gateway,
        isolation="sandbox",
        env=env,
        sandbox={"read_only": [sys.prefix, str(AGENT.parent)]},
        keep_workdirs=True,
        progress=False,
    )
    results = []
    try:
        results = rollout.run(tasks)
        by = {r.task_id: r for r in results}
        for r in results:  # the gateway alone was reachable: both made their calls, exactly
            assert (r.status, r.reward) == ("HARNESS_DONE", 1.0), (r.error, r.stderr_tail)
            check_rows(world, r)
        said = by["escape"].stderr_tail
        assert "write: blocked" in said and not outside.exists()
        assert "connect 127.0.0.1: blocked" in said and "connect 1.1.1.1: blocked" in said
        with pytest.raises(BlockingIOError):
            host.accept()
        home = (by["escape"].workdir / "home.txt").read_text()
        assert home == str(by["escape"].workdir.parent / "home")
    finally:
        host.close()
        for r in results:
            if r.workdir is not None:
                shutil.rmtree(r.workdir.parent, ignore_errors=True)


def test_an_npm_cli_per_sample_eight_at_once(monkeypatch):
    """The issue's test: Codex CLI (the catalog's spec, unmodified) run per sample on a Scripted backend,
    8 concurrent runs, a verifier that checks the file the harness's own shell tool wrote."""
    from tmpl.harness.catalog.npm import HARNESSES

    from .harness_util import NPM_BIN, PROOF_FILE, PROOF_TEXT, TASK, gateway_for, npm_bin, shell_command

    npm_bin("codex")
    spec = HARNESSES["codex"]

    def wrote(workdir: Path, episode) -> float:
        proof = workdir / PROOF_FILE
        return float(proof.exists() and proof.read_text() == PROOF_TEXT)

    with gateway_for("qwen2.5-instruct", "exec_command", {"cmd": shell_command()}, monkeypatch) as served_gw:
        rollout = HarnessRollout(
            spec,
            served_gw.url,
            n=8,
            concurrency=8,
            env={"PATH": f"{NPM_BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}", "NO_COLOR": "1"},
            model="tmpl",
            progress=False,
        )
        results = rollout.run([HarnessTask(TASK, verifier=wrote, id="codex")])
    assert [r.sample for r in results] == list(range(8)) and len({r.session for r in results}) == 8
    for r in results:
        assert (r.status, r.reward) == ("HARNESS_DONE", 1.0), (r.error, r.stderr_tail[-2000:])
        assert r.calls >= 2
        policy_calls = [c for c in r.episode.calls if c.id in served_gw.policy.calls]
        assert len(policy_calls) == 1  # one call of its shell tool per run, then the answer
        for call in r.episode.calls:  # what the engine sampled, unchanged, in exactly one loss mask
            assert call.completion_ids.tolist() == served_gw.policy.sampled[call.id]
        masked = sum(int(s.mask.sum()) for s in r.episode.sequences)
        assert masked == sum(len(c.completion_ids) for c in r.episode.calls)


def test_a_trainer_killed_mid_run_takes_every_harness_tree_with_it(tmp_path):
    """SIGKILL to the trainer (no cleanup of its own runs): its keeper server dies with it, and each keeper,
    told by its parent-death signal, kills its harness and the daemon that harness started."""
    marks = tmp_path / "marks"
    marks.mkdir()
    trainer = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("harness_dying_trainer.py")), str(marks)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + SLOW
        while len(list(marks.glob("*.pid"))) + len(list(marks.glob("*.daemon"))) < 4:
            assert trainer.poll() is None, trainer.stderr.read().decode()
            assert time.monotonic() < deadline, "the harnesses did not start"
            time.sleep(0.1)
        time.sleep(0.3)  # the files are written as the processes start: let them all be running
        found = [int(p.read_text()) for p in (*marks.glob("*.pid"), *marks.glob("*.daemon"))]
        assert not any(gone(p) for p in found)
    finally:
        trainer.kill()
        trainer.wait()
    deadline = time.monotonic() + 30
    while not all(gone(p) for p in found) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in found if not gone(p)] == []


def test_the_async_twin_and_run_from_inside_a_loop(monkeypatch):
    """``await arun(...)`` serves the in-process gateway on the caller's loop; ``run(...)`` called from a
    coroutine (a notebook, a trainer's loop) runs the batch on a thread of its own instead of failing."""
    world = World(monkeypatch)
    rollout = HarnessRollout(agent(), world.gateway, n=2, progress=False)

    async def both():
        awaited = await rollout.arun(["mode:nocall a"])
        nested = rollout.run(["mode:nocall b"])
        return awaited, nested

    awaited, nested = asyncio.run(both())
    for results in (awaited, nested):
        assert [(r.status, r.sample, r.exit_code) for r in results] == [("NO_CALLS", 0, 0), ("NO_CALLS", 1, 0)]
        assert all("nothing to do" in r.stdout_tail for r in results)
