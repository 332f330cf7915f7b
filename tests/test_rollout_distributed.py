"""tmpl.DistributedRollout: one rollout sharded over worker processes and Ray actors (a real local cluster).

The rollouts here are scripted (deterministic): what a sample's model writes depends only on its
conversation's index in the whole input, its sample number and its turn, so a sharded run must give
exactly what one process gives, token for token, wherever a shard ran, however often it ran.
Every worker started here is stopped by its test; no process is left behind (checked).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

import tmpl
from tmpl.backends import Backend, GenerationResult, Sampling, Scripted
from tmpl.errors import RayNotInstalledError, ToolIsolationError, WorkerLostError, WorkerSetupError
from tmpl.rollout.scale import DistributedRollout, RolloutSettings, merge_metrics
from tmpl.rollout.scale.worker import Shard, WorkerRuntime

from .conftest import DATA
from .ray_cluster import local_ray

QWEN = DATA / "qwen2.5-instruct"
if not (QWEN / "tokenizer_config.json").is_file():
    pytest.skip(f"tokenizer data not found at {QWEN} (set TMPL_TEST_DATA)", allow_module_level=True)


def get_weather(city: str) -> str:
    """Current weather in a city.

    Args:
        city: The city name.
    """
    return f"Sunny in {city}, 21 C."


def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: The key.
    """
    if key.endswith("0"):
        raise KeyError(f"no entry {key}")
    return f"{key} = {len(key)}"


def conversations(n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"Request {i}: weather and keys, please."}] for i in range(n)]


class Policy:
    """The scripted model: conversation ``i``, sample ``s``, turn ``t`` (read from the request id, which
    carries the index in the whole input) calls tools until turn ``(i + s) % 4``, then answers.

    ``kill_at``: the request id at which the worker process kills itself with SIGKILL, once (a file
    ``marker`` remembers it was done, so the shard's second run goes through).
    """

    def __init__(self, tpl, kill_at: str | None = None, marker: str | None = None):
        self.tpl, self.kill_at, self.marker = tpl, kill_at, marker

    def __call__(self, req):
        turn_id = "-".join(req.request_id.split("-")[:3])  # a shard run again has ids ending -w2, -w3...
        if turn_id == self.kill_at and not os.path.exists(self.marker):
            with contextlib.suppress(OSError):  # a marker that cannot be written: it kills every time
                Path(self.marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        i, s, t = (int(x) for x in req.request_id.split("-")[:3])
        if t < (i + s) % 4:
            calls = [f'{{"name": "get_weather", "arguments": {{"city": "City{i}-{s}-{t}"}}}}']
            if (i + t) % 3 == 0:
                calls.append(f'{{"name": "lookup", "arguments": {{"key": "k{i}{t}"}}}}')
            text = "\n".join(f"<tool_call>\n{c}\n</tool_call>" for c in calls) + "<|im_end|>"
        else:
            text = f"Done with request {i}, sample {s}.<|im_end|>"
        ids = self.tpl.codec.encode(text)
        return ids, [-0.01 * ((i + s + t + k) % 7) for k in range(len(ids))]


def make_rollout(kill_at: str | None = None, marker: str | None = None, n: int = 2) -> tmpl.Rollout:
    """The factory each worker calls (module level: it pickles by name)."""
    tpl = tmpl.ChatTemplate.from_pretrained(str(QWEN))
    return tmpl.Rollout(
        tpl,
        Scripted(Policy(tpl, kill_at, marker), record=False),
        tools=[get_weather, lookup],
        max_turns=4,
        max_length=2048,
        max_completion_length=1024,
        measure_drift=0.5,  # chosen by the conversation's global index: the same samples as in one process
        sampling=Sampling(n=n),
        progress=False,
    )


def without_call_ids(messages: list[dict]) -> list[dict]:
    """The messages with the tool-call ids left out (the Toolbox draws them at random)."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if k != "tool_call_id"}
        if m.get("tool_calls"):
            m["tool_calls"] = [{k: v for k, v in c.items() if k != "id"} for c in m["tool_calls"]]
        out.append(m)
    return out


def fields(r) -> tuple:
    return (
        r.index,
        r.sample,
        r.trajectory.sample_id,
        r.prompt_ids.tolist(),
        r.completion_ids.tolist(),
        r.mask.tolist(),
        r.logprobs.tolist(),
        [tuple(sp) for sp in r.spans],
        without_call_ids(r.messages),
        r.status,
        r.reason,
        r.code,
        r.turns,
        r.tool_calls,
        r.tool_failures,
        r.drift,
        r.drift_detail,
    )


CONVERSATIONS = conversations(10)


@pytest.fixture(scope="module")
def baseline():
    rollout = make_rollout()
    results = rollout.run(CONVERSATIONS)
    assert sum(r.tool_calls for r in results) > 10 and sum(r.tool_failures for r in results) > 0
    assert any(r.drift is not None for r in results) and any(r.drift is None for r in results)
    return results, rollout.metrics


def gone(pids, limit: float = 30.0) -> bool:
    """Whether every process in ``pids`` has ended (waits up to ``limit`` seconds: Ray kills asynchronously)."""
    deadline = time.monotonic() + limit
    for pid in pids:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
    return True


def check_equal(results, baseline_results) -> None:
    assert [(r.index, r.sample) for r in results] == [(r.index, r.sample) for r in baseline_results]
    for r, b in zip(results, baseline_results):
        assert fields(r) == fields(b), (r.index, r.sample)


def check_metrics(metrics, baseline_metrics) -> None:
    for name in ("samples", "done", "truncated", "aborted", "turns_mean", "turns_max", "tool_calls"):
        assert getattr(metrics, name) == pytest.approx(getattr(baseline_metrics, name)), name
    for name in ("tool_failures", "tokens_generated", "tokens_appended", "drift_measured", "drift_samples"):
        assert getattr(metrics, name) == getattr(baseline_metrics, name), name
    for name in ("end_codes", "tool_failure_kinds", "drift_causes"):
        assert getattr(metrics, name) == getattr(baseline_metrics, name), name


def test_processes_give_what_one_process_gives_even_when_a_worker_is_killed(baseline, tmp_path):
    """SIGKILL inside a worker while it runs a shard (others of its samples mid-way through their turns):
    the shard runs again on a worker started in its place; every sample once, equal to one process's.
    The workers stay up for the next run, which runs every shard once."""
    factory = functools.partial(make_rollout, kill_at="4-1-1", marker=str(tmp_path / "killed"))
    with DistributedRollout(factory, workers=2, mode="process", shard_size=3) as runner:
        results = runner.run(CONVERSATIONS)
        killed = int((tmp_path / "killed").read_text())
        assert runner.mode == "process" and runner.fingerprint == make_rollout().tpl.fingerprint
        assert [d[1:] for d in runner.deaths] == [("killed by SIGKILL", "shard 1 (conversations 3-5)")]
        assert runner.attempts == [1, 2, 1, 1]
        pids = runner.pids()
        assert killed not in pids and len(set(pids)) == 2 and None not in pids and os.getpid() not in pids
        check_equal(results, baseline[0])
        check_metrics(runner.metrics, baseline[1])

        again = runner.run(CONVERSATIONS)  # the kill was once: this run is undisturbed
        assert runner.pids() == pids and runner.deaths == [] and runner.attempts == [1, 1, 1, 1]
        check_equal(again, baseline[0])
        check_metrics(runner.metrics, baseline[1])
        fewer = runner.run(CONVERSATIONS[3:5])  # indices are those of this run's input
        assert [(r.index, r.sample) for r in fewer] == [(0, 0), (0, 1), (1, 0), (1, 1)]
        check_equal(fewer, make_rollout().run(CONVERSATIONS[3:5]))
    assert gone([*pids, killed])


def test_a_shard_that_kills_every_worker_raises_worker_lost(tmp_path):
    # the marker is a folder that cannot be written: the policy dies before it can remember the kill
    factory = functools.partial(make_rollout, kill_at="0-0-0", marker=str(tmp_path / "no" / "such" / "dir"))
    with DistributedRollout(factory, workers=1, mode="process", max_attempts=2) as runner:
        with pytest.raises(WorkerLostError) as caught:
            runner.run(CONVERSATIONS[:2])
        pids = [p for p in runner.pids() if p]
    assert caught.value.attempts == 2 and "shard 0" in str(caught.value), str(caught.value)
    assert gone(pids)


class SlowBackend(Backend):
    """A server-like backend whose generations take a minute (they are cancelled long before); each
    request leaves a file named after its id in ``started`` when it starts."""

    batching = False

    def __init__(self, started: str):
        self.started = Path(started)

    async def agenerate(self, request):
        (self.started / request.request_id).touch()
        await asyncio.sleep(60)
        return GenerationResult(request.request_id, [], [], "stop")


def make_slow_rollout(started: str) -> tmpl.Rollout:
    return tmpl.Rollout(
        tmpl.ChatTemplate.from_pretrained(str(QWEN)),
        SlowBackend(started),
        max_turns=2,
        sampling=Sampling(n=2),
        progress=False,
    )


def test_cancel_reaches_every_worker_and_every_request(tmp_path):
    factory = functools.partial(make_slow_rollout, str(tmp_path))
    with DistributedRollout(factory, workers=2, mode="process", shard_size=2) as runner:

        async def go():
            task = asyncio.create_task(runner.run_async(CONVERSATIONS[:4]))
            deadline = time.monotonic() + 60
            while len(list(tmp_path.iterdir())) < 8:  # both workers' requests (2 conversations x n=2 each) started
                assert not task.done() and time.monotonic() < deadline, sorted(p.name for p in tmp_path.iterdir())
                await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(go())
        # each worker's rollout told its backend to cancel each request in flight: 2 conversations x n=2 each
        assert sorted(runner.cancelled) == ["0-0-0", "0-1-0", "1-0-0", "1-1-0", "2-0-0", "2-1-0", "3-0-0", "3-1-0"]
        pids = runner.pids()
        assert all(pids)  # the workers live on: the next run uses them
    assert gone(pids)


def test_tools_and_factories_that_cannot_reach_a_worker_say_so(monkeypatch):
    settings = RolloutSettings(str(QWEN), "http://127.0.0.1:9", tools=[get_weather, lambda city: city])
    with pytest.raises(ToolIsolationError, match="'<lambda>' cannot run in a worker process.*module level"):
        DistributedRollout(settings, mode="process")
    # a factory of tools is called in the worker instead: nothing to pickle but the factory
    DistributedRollout(RolloutSettings(str(QWEN), "http://127.0.0.1:9", tools=tools_factory), mode="process").close()
    local = 1
    with pytest.raises(WorkerSetupError, match="does not pickle"):
        DistributedRollout(lambda: make_rollout() if local else None, mode="process")
    with pytest.raises(WorkerSetupError, match="not a Rollout"):
        DistributedRollout(make_rollout(), mode="process")
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(RayNotInstalledError, match="pip install"):
        DistributedRollout(make_rollout, mode="ray")
    assert DistributedRollout(make_rollout).mode == "process"  # auto without ray: processes


def tools_factory():
    return [get_weather]


def broken_factory():
    raise RuntimeError("no GPU here")


def test_a_factory_that_fails_in_the_worker_raises_worker_setup_error():
    runner = DistributedRollout(broken_factory, workers=1, mode="process")
    with pytest.raises(WorkerSetupError, match="process 0: cannot set up: the rollout factory raised RuntimeError"):
        runner.run(CONVERSATIONS[:1])
    assert runner.pids() == [None]  # closed


def test_shards_run_in_one_worker_and_merged_equal_the_whole(baseline):
    """What a worker does with each shard (global ids, indices and drift choice), in this process."""
    runtime = WorkerRuntime(make_rollout, "here")
    outputs = [
        asyncio.run(runtime.run_shard(Shard(k, start, CONVERSATIONS[start:end])))
        for k, (start, end) in enumerate([(7, 10), (0, 4), (4, 7)])
    ]
    check_equal([r for out in (outputs[1], outputs[2], outputs[0]) for r in out.results], baseline[0])
    check_metrics(merge_metrics([out.metrics for out in outputs], wall_time=1.0), baseline[1])
    runtime.close()


def test_a_shard_output_is_packed_by_the_standard_pickler_or_left_to_rays(baseline):
    """A Ray actor returns its shard's output pickled once (``Packed``, read back equal to what one
    process gives); an output only cloudpickle takes (a lambda inside) is returned as it is."""
    import pickle

    from tmpl.rollout.scale.pools import Packed, packed

    runtime = WorkerRuntime(make_rollout, "here")
    output = asyncio.run(runtime.run_shard(Shard(0, 0, CONVERSATIONS)))
    runtime.close()
    box = packed(output)
    assert isinstance(box, Packed)
    check_equal(pickle.loads(box.data).results, baseline[0])
    odd = {"results": output.results, "hook": lambda: 1}
    assert packed(odd) is odd
    # a process worker has no other pickler: it says which shard, instead of leaving the driver waiting
    from tmpl.errors import WorkerError
    from tmpl.rollout.scale.pools import done_message

    kind, index, error, _ = done_message(odd, Shard(4, 12, CONVERSATIONS[:2]), "process 1")
    assert (kind, index) == ("failed", 4) and isinstance(error, WorkerError)
    assert "shard 4 (conversations 12-13)" in str(error) and "do not pickle" in str(error), str(error)
    assert done_message(output, Shard(0, 0, CONVERSATIONS), "process 1")[0] == "done"


LOG: list[tuple[str, int]] = []


def _unpickled(k: int) -> str:
    LOG.append(("unpickled", k))
    return f"output {k}"


class _Output:
    """Stands for shard k's output: unpickling it is logged."""

    def __init__(self, k: int) -> None:
        self.k = k

    def __reduce__(self):
        return (_unpickled, (self.k,))


class _OneWorkerPool:
    """A pool of one worker that finishes each shard at the next poll, its output packed."""

    def __init__(self) -> None:
        self.running: list[int] = []

    def live(self) -> list[int]:
        return [0]

    def submit(self, slot: int, shard: Shard) -> None:
        LOG.append(("submitted", shard.index))
        self.running.append(shard.index)

    def poll(self, timeout: float):
        from tmpl.rollout.scale.pools import Event, packed

        done, self.running = self.running, []
        return [Event("done", 0, k, packed(_Output(k))) for k in done]


def test_the_driver_hands_a_worker_its_next_shard_before_unpickling_the_last_output():
    """A worker never idles while the driver unpickles what it sent: shard k + 1 is submitted before
    shard k's output is read, and every output still comes back, in shard order."""
    from tmpl.rollout.scale.pools import Packed, packed

    assert isinstance(packed(_Output(0)), Packed)  # so the driver gets bytes, unpickled when it chooses
    runner = DistributedRollout(make_rollout, workers=1, mode="process")
    runner._start = _OneWorkerPool  # type: ignore[method-assign]
    LOG.clear()
    shards = [Shard(k, k, [CONVERSATIONS[k]]) for k in range(3)]
    assert runner._drive(shards, threading.Event()) == ["output 0", "output 1", "output 2"]
    assert LOG == [
        ("submitted", 0),
        ("submitted", 1),
        ("unpickled", 0),
        ("submitted", 2),
        ("unpickled", 1),
        ("unpickled", 2),
    ]


# -- Ray, a real local cluster ------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster():
    with local_ray() as ray:
        yield ray


def test_a_local_ray_cluster_gives_what_processes_give(ray_cluster, baseline):
    with DistributedRollout(make_rollout, workers=2, shard_size=3) as runner:  # auto: ray is initialized
        assert runner.mode == "ray"
        results = runner.run(CONVERSATIONS)
        pids = runner.pids()
        assert len(set(pids)) == 2 and os.getpid() not in pids
        assert runner.attempts == [1, 1, 1, 1]
        check_equal(results, baseline[0])
        check_metrics(runner.metrics, baseline[1])
    assert gone(pids)


def test_a_killed_ray_actor_loses_no_sample(ray_cluster, baseline, tmp_path):
    factory = functools.partial(make_rollout, kill_at="7-0-2", marker=str(tmp_path / "killed"))
    with DistributedRollout(factory, workers=2, shard_size=3) as runner:
        results = runner.run(CONVERSATIONS)
        killed = int((tmp_path / "killed").read_text())
        assert len(runner.deaths) == 1 and runner.deaths[0][2] == "shard 2 (conversations 6-8)", runner.deaths
        assert "actor died" in runner.deaths[0][1]
        assert runner.attempts == [1, 1, 2, 1]
        check_equal(results, baseline[0])
        check_metrics(runner.metrics, baseline[1])
        pids = runner.pids()  # the actor started in place of the dead one has no pid until it is ready
        assert killed not in pids
    assert gone([*(p for p in pids if p), killed])
