"""Harness runs spread over ``DistributedRollout`` workers (issue 51, item 4): each worker process builds one
``HarnessRollout`` with its own in-process gateway (a Scripted engine on the real Qwen2.5 tokenizer), the
tasks' groups sharded over the workers. A worker killed mid-run: its shard runs again elsewhere with fresh
sessions and working directories, nothing recorded twice, its harness process gone with it.

The harness is a trivial real process (the standard library's ``urllib``, one chat call): it notes its session
key and its pid in a folder the test reads, and the one task named ``slow`` waits (until the test has killed
its worker) after its call.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="FastAPI is not installed (pip install -e '.[gateway]')")

import tmpl  # noqa: E402
from tmpl.harness import Harness, HarnessTask  # noqa: E402
from tmpl.harness.distributed import HarnessSettings  # noqa: E402

from .conftest import load_tokenizer  # noqa: E402
from .harness_trainers import answer_ids, render, verifier  # noqa: E402

AGENT = """
import json, os, sys, time, urllib.request
base, model, task, marks = sys.argv[1:5]
open(os.path.join(marks, os.environ["SESSION"]), "w").write(str(os.getpid()))
body = json.dumps({"model": model, "messages": [{"role": "user", "content": task}]}).encode()
request = urllib.request.Request(base + "/chat/completions", body, {"Content-Type": "application/json"})
reply = json.load(urllib.request.urlopen(request, timeout=60))["choices"][0]["message"]["content"]
open("answer.txt", "w").write(reply)
while task == "slow" and not os.path.exists(os.path.join(marks, "killed")):
    time.sleep(0.05)
"""


def harness(marks: Path) -> Harness:
    argv = (
        sys.executable,
        "-c",
        AGENT.replace("{", "{{").replace("}", "}}"),
        "{base_url}",
        "{model}",
        "{task}",
        str(marks),
    )
    return Harness("urllib-agent", argv, dialect="openai-chat", env={"SESSION": "{session}"}, timeout=120)


def make_gateway():
    """Built in each worker: a gateway on the Qwen2.5 template answering every call with 'Done.'."""
    from tmpl.backends import Scripted
    from tmpl.gateway import Gateway

    tok = load_tokenizer("qwen2.5-instruct")
    answer = answer_ids(tok)
    return Gateway(tmpl.ChatTemplate(tok), Scripted(lambda request: list(answer)))


def check(results, tasks, n, tok):
    answer = answer_ids(tok)
    assert [(r.task_id, r.sample) for r in results] == [(f"task{k}", s) for k in range(len(tasks)) for s in range(n)]
    assert len({r.session for r in results}) == len(results)  # a session per run
    for r in results:
        k = int(r.task_id[4:])
        assert r.status == "HARNESS_DONE" and r.reward == 1.0, (r.status, r.error, r.stderr_tail)
        [row] = r.rows()
        assert row.trajectory.prompt_ids.tolist() == render(tok, tasks[k])
        assert row.trajectory.completion_ids.tolist() == answer and row.loss_mask.tolist() == [1] * len(answer)


def test_harness_runs_spread_over_worker_processes(tmp_path):
    tok = load_tokenizer("qwen2.5-instruct")
    marks = tmp_path / "marks"
    marks.mkdir()
    tasks = ["note a", "note b", "note c"]
    settings = HarnessSettings(harness(marks), make_gateway, {"n": 2, "concurrency": 4})
    with tmpl.DistributedRollout(settings, workers=2, shard_size=1, mode="process") as runner:
        results = runner.run([HarnessTask(t, verifier=verifier) for t in tasks])
        assert runner.attempts == [1, 1, 1] and not runner.deaths
    check(results, tasks, 2, tok)
    assert sorted(p.name for p in marks.iterdir()) == sorted(r.session for r in results)
    assert runner.metrics.samples == 6 and runner.metrics.end_codes == {"HARNESS_DONE": 6}


def _ancestors(pid: int) -> list[int]:
    out = []
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        out.append(pid)
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_workers_runs_run_again_with_fresh_sessions_and_nothing_twice(tmp_path):
    import threading

    tok = load_tokenizer("qwen2.5-instruct")
    marks = tmp_path / "marks"
    marks.mkdir()
    tasks = ["note a", "slow", "note c"]
    settings = HarnessSettings(harness(marks), make_gateway, {"n": 1})
    killed: dict[str, int] = {}

    def kill_the_slow_runs_worker(runner):
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            for mark in marks.glob("task1-*"):
                pid = int(mark.read_text() or 0)
                worker = next((w for w in _ancestors(pid) if w in runner.pids()), None)
                if pid and worker:
                    killed.update(session=mark.name, harness=pid, worker=worker)
                    (marks / "killed").write_text("")  # the run again does not wait
                    os.kill(worker, signal.SIGKILL)
                    return
            time.sleep(0.05)

    with tmpl.DistributedRollout(settings, workers=2, shard_size=1, mode="process") as runner:
        killer = threading.Thread(target=kill_the_slow_runs_worker, args=(runner,))
        killer.start()
        results = runner.run([HarnessTask(t, verifier=verifier) for t in tasks])
        killer.join()
        assert killed, "the slow run's worker was never found"
        assert len(runner.deaths) == 1 and runner.attempts == [1, 2, 1], (runner.deaths, runner.attempts)
    check(results, tasks, 1, tok)
    # the killed attempt's session is not among the results: the run again had a fresh one
    assert killed["session"] not in {r.session for r in results}
    assert results[1].session.startswith("task1-") and results[1].session != killed["session"]
    assert len(list(marks.glob("task1-*"))) == 2  # the killed attempt and the one that counted
    # the killed worker's harness process went with it (its keeper's lifeline)
    deadline = time.monotonic() + 15
    while _alive(killed["harness"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(killed["harness"]), "the killed worker's harness process is still running"


def test_ray_actors_share_one_served_gateway_and_record_each_run_once(tmp_path):
    """Two Ray actors, one shared gateway (its URL: the ``tmpl serve`` path, its trainer routes): every run
    finished there once, its episode in the gateway's drain queue once, the results the same as in processes."""
    from tmpl.gateway import create_app

    from .gateway_util import served
    from .ray_cluster import local_ray

    tok = load_tokenizer("qwen2.5-instruct")
    marks = tmp_path / "marks"
    marks.mkdir()
    tasks = ["note a", "note b"]
    gateway = make_gateway()
    with local_ray(), served(create_app(gateway)) as url:
        settings = HarnessSettings(harness(marks), url, {"n": 2})
        with tmpl.DistributedRollout(settings, workers=2, shard_size=1) as runner:
            assert runner.mode == "ray"
            results = runner.run([HarnessTask(t, verifier=verifier) for t in tasks])
            pids = runner.pids()
        assert len(set(pids)) == 2 and os.getpid() not in pids
        check(results, tasks, 2, tok)
        drained = [f.key for f in gateway.sessions.drain()]
    assert sorted(drained) == sorted(r.session for r in results)  # each run recorded once, by the gateway


def test_a_workers_error_reaches_the_driver_whole():
    """What a worker sends when a shard's own error does not pickle (``pools.portable``) unpickles again, each
    subclass with its attributes (the driver raises it, rather than failing to read the worker's answer)."""
    import pickle

    from tmpl.errors import WorkerError, WorkerLostError, WorkerSetupError
    from tmpl.rollout.scale.pools import portable

    class Local(Exception):  # a class pickle cannot find by name
        pass

    sent = portable(Local("the tool raised"), "process 1")
    back = pickle.loads(pickle.dumps(sent))
    assert type(back) is WorkerError and back.worker == "process 1" and "the tool raised" in str(back)
    for err in (
        WorkerSetupError("process 0", "no factory"),
        WorkerLostError("ray actor 1", "shard 2 (conversations 4-5)", "killed", 3),
    ):
        again = pickle.loads(pickle.dumps(err))
        assert type(again) is type(err) and str(again) == str(err) and again.__dict__ == err.__dict__
