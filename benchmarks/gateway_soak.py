"""A bounded soak of the gateway: sessions opening, calling, branching and finishing for a while; is
resident memory flat after warm-up? And what one open session, and 1,000 finished episodes waiting for a
reader, take.

    python benchmarks/gateway_soak.py [--minutes 10] [--sessions 1024] [--store] [--delay 0.2]

In process (no HTTP: the memory of the gateway, not of a load generator): Qwen2.5 template, one tool,
a backend that sleeps ``--delay`` and answers the canned tool call (or, at the last turn, an answer).
``--sessions`` agents run at once, each an episode after another: ``--turns`` calls (a tool result
appended each time), one in four episodes also a branch (its third call sends its first call's
history again with the user's question edited), then finish. A reader drains (and acknowledges, with
``--store``) every second. Resident memory (``/proc/self/statm``) is sampled each ``--every`` seconds;
the slope over the second half of the run is printed as a share of the mean (goal: within 5%).

First, on a fresh gateway: RSS per open session (``--sessions`` opened, one call each) and per 1,000
finished episodes waiting unread.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
ANSWER = "It is sunny.<|im_end|>"
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


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def slope(points: list[tuple[float, int]]) -> float:
    """Least-squares bytes per second of ``points``."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points) or 1.0
    return sum((t - mt) * (v - mv) for t, v in points) / den


def build(tpl, delay: float, store: str | None):
    from tmpl.backends import Scripted
    from tmpl.gateway.service import Gateway

    call_ids = tpl.tokenizer.encode(CALL, add_special_tokens=False)
    answer_ids = tpl.tokenizer.encode(ANSWER, add_special_tokens=False)

    class Slow(Scripted):
        async def agenerate(self, request):
            await asyncio.sleep(delay)
            return await super().agenerate(request)

    def policy(req):
        return answer_ids if req.max_tokens == 63 else call_ids

    return Gateway(tpl, Slow(policy, record=False), store=store, max_sessions=100_000, max_finished=100_000)


async def episode(gateway, key: str, turns: int, branch: bool) -> None:
    from tmpl.gateway.service import CallParams

    messages: list[dict] = [{"role": "user", "content": f"Weather in Paris? ({key})"}]
    first = None
    for t in range(turns):
        last = t == turns - 1
        done = await gateway.complete(key, messages, TOOLS, CallParams(max_tokens=63 if last else 64))
        reply = dict(done.replies[0].message)
        messages.append(reply)
        if first is None:
            first = [dict(m) for m in messages]
        for c in reply.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": "sunny, 21 C"})
        if branch and t == 1 and first is not None:  # an edited history: a branch of the episode
            edited = [{"role": "user", "content": f"Weather in Lima? ({key})"}, *first[1:]]
            await gateway.complete(key, edited, TOOLS, CallParams(max_tokens=64))
    gateway.finish(key)


async def soak(args, tpl) -> None:
    folder = tempfile.mkdtemp(prefix="tmpl-soak-")
    gateway = build(tpl, args.delay, f"{folder}/gw.db" if args.store else None)
    end = time.monotonic() + args.minutes * 60
    started = time.monotonic()
    counter = 0
    finished = 0
    samples: list[tuple[float, int]] = []

    async def agent(i: int) -> None:
        nonlocal counter
        while time.monotonic() < end:
            counter += 1
            await episode(gateway, f"a{i}-{counter}", args.turns, counter % 4 == 0)

    async def reader() -> None:
        nonlocal finished
        while time.monotonic() < end + 5:
            batch = gateway.drain()
            finished += len(batch)
            gateway.ack([d.ack for d in batch if d.ack is not None])
            await asyncio.sleep(1.0)

    async def sampler() -> None:
        while time.monotonic() < end:
            samples.append((time.monotonic() - started, rss()))
            await asyncio.sleep(args.every)

    from tmpl.gateway.loopwatch import LoopWatch

    watch = LoopWatch(every=0.005, threshold=0.010)
    watch.start()
    full: list[float] = []  # full (generation 2) collections' pauses, seconds
    mark: list[float] = []

    def collected(phase: str, info: dict) -> None:
        if phase == "start":
            mark[:] = [time.perf_counter()]
        elif mark and info.get("generation") == 2:
            full.append(time.perf_counter() - mark[0])

    gc.callbacks.append(collected)
    agents = [asyncio.ensure_future(agent(i)) for i in range(args.sessions)]
    side = [asyncio.ensure_future(reader()), asyncio.ensure_future(sampler())]
    await asyncio.gather(*agents)
    await asyncio.gather(*side)
    watch.stop()
    gc.callbacks.remove(collected)
    half = [p for p in samples if p[0] >= samples[-1][0] / 2]
    mean = sum(v for _, v in half) / len(half)
    rate = slope(half)
    span = half[-1][0] - half[0][0]
    print(
        f"soak: {args.minutes:g} min, {args.sessions} sessions, store {'on' if args.store else 'off'}: "
        f"{finished} episodes finished and read; RSS {samples[0][1] / 2**20:.0f} -> {samples[-1][1] / 2**20:.0f} MiB"
    )
    print(
        f"   second half ({span:.0f} s): mean {mean / 2**20:.1f} MiB, slope {rate / 2**10:+.1f} KiB/s, "
        f"{rate * span / mean * 100:+.2f}% of the mean over it (goal: within 5%)"
    )
    print(
        f"   event loop: longest pause {watch.longest * 1e3:.1f} ms, {watch.over} pauses over 10 ms in "
        f"{watch.wakes} wakes; full collections: "
        + (f"{len(full)}, longest {max(full) * 1e3:.0f} ms" if full else "none")
    )
    if gateway.durable is not None:
        log = gateway.durable.log
        print(
            f"   store: {log.rows} rows in {log.commits} commits ({log.rows / max(log.commits, 1):.1f} per commit), "
            f"{log.size() / 2**20:.1f} MiB on disk at the end"
        )
    gateway.close()


async def footprint(args, tpl) -> None:
    folder = tempfile.mkdtemp(prefix="tmpl-soak-")
    gateway = build(tpl, 0.0, f"{folder}/gw.db" if args.store else None)
    from tmpl.gateway.service import CallParams

    for i in range(300):  # warm-up: caches filled, and memory freed back to the allocator's pools
        await gateway.complete(f"w{i}", [{"role": "user", "content": f"Weather? (w{i})"}], TOOLS, CallParams())
        gateway.finish(f"w{i}")
    gateway.ack([d.ack for d in gateway.drain() if d.ack is not None])
    gc.collect()
    before = rss()
    n = args.sessions
    for i in range(n):
        await gateway.complete(
            f"o{i}", [{"role": "user", "content": f"Weather in Paris? (o{i})"}], TOOLS, CallParams(max_tokens=64)
        )
    gc.collect()
    opened = rss()
    k = 1000
    for i in range(k):
        key = f"f{i}"
        await gateway.complete(key, [{"role": "user", "content": f"Weather in Paris? ({key})"}], TOOLS, CallParams())
        gateway.finish(key)
    gc.collect()
    after = rss()
    print(
        f"memory (fresh gateway, before the soak): {(opened - before) / n / 1024:.1f} KiB per open session (one call "
        f"of ~300 tokens, {n} opened); {(after - opened) / 2**20:.2f} MiB per 1,000 finished episodes waiting unread "
        "(one call each)"
    )
    gateway.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.environ.get("TMPL_TEST_DATA", REPO.parent / "shared" / "tokenizers"))
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the soak runs (default 10)")
    parser.add_argument("--sessions", type=int, default=1024, help="agents at once (default 1024)")
    parser.add_argument("--turns", type=int, default=4, help="calls per episode (default 4)")
    parser.add_argument("--delay", type=float, default=0.2, help="the backend's seconds per call (default 0.2)")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between RSS samples (default 5)")
    parser.add_argument("--store", action="store_true", help="with the durable store (a fresh file)")
    args = parser.parse_args()
    import tmpl
    from tmpl.rollout.collector import fewer_collections

    tpl = tmpl.ChatTemplate.from_pretrained(str(Path(args.data) / "qwen2.5-instruct"))
    with fewer_collections():
        asyncio.run(footprint(args, tpl))
        asyncio.run(soak(args, tpl))


if __name__ == "__main__":
    main()
