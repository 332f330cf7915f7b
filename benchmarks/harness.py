"""tmpl.harness.HarnessRollout: what tmpl adds to each harness run, outside the harness's own time.

    python benchmarks/harness.py [--quick] [--levels 1 8 32] [--runs 32] [--long 10]

Gateway: Qwen2.5 (``tmpl.ChatTemplate``) over a ``Scripted`` backend that answers ``ok`` at once, served
in-process (``HarnessRollout`` serves it on its own event loop). Harness: a trivial program, ``python -I
-S`` with the standard library only (no SDK: its import time is not tmpl's), that POSTs one chat
completion to its session's base URL with ``urllib``, writes ``answer.txt`` and exits. Task: two small
files laid into the working directory; verifier: ``CommandVerifier(["test", "-s", "answer.txt"])``.

Per concurrency level (``--levels``), in the same process, on the same gateway:

- ``bare``: the harness command started directly (``asyncio.create_subprocess_exec``, output to
  ``/dev/null``) with its environment pointed at a fresh session, ``--runs`` of them at the level's
  concurrency: the harness's own time, process start included (the baseline);
- ``tmpl``: the same harness through ``HarnessRollout(..., concurrency=level)``: session, working
  directory and HOME, file copy, the keeper (the subreaper around the command, forked from the batch's
  warm keeper server), kill and reap, the verifier's call (its own keeper too), the session finished and its
  episode taken, the directory removed.

``overhead`` = a ``tmpl`` run's seconds minus the ``bare`` median at that level (p50 and p90 over the
runs), the figure the goal (<= 300 ms per run) is read against; ``wall`` is each batch's elapsed time
and ``runs/s`` the throughput. The breakdown (medians, ms) comes from each result's ``timings``:
``setup`` (directories, files, rendering), ``harness`` minus ``bare`` (the keeper: its start, the
sweep), ``verifier``, ``finish`` (episode read, reward, finish), and ``rest`` (the directory's removal
and the scheduling around them). ``CPU per run``: the CPU seconds of this process and of every process it
started (``RUSAGE_SELF`` + ``RUSAGE_CHILDREN``) over each batch, per run: what tmpl adds there does not
depend on what else loads the machine, as wall times do. Last, a 10-second harness (the same program sleeping 10 s after its
call) at concurrency 8: its runs' seconds against 10 s, the goal being <= 5 %.

Every figure shares this machine's cores with whatever else runs (``load`` is printed): on a busy
machine process starts slow down, bare and tmpl alike; compare the two columns, not the absolutes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

AGENT = """\
import json, os, sys, time, urllib.request
body = {"model": os.environ["MODEL"], "messages": [{"role": "user", "content": sys.argv[1]}], "max_tokens": 8}
req = urllib.request.Request(os.environ["BASE_URL"] + "/chat/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
json.load(urllib.request.urlopen(req, timeout=120))
with open("answer.txt", "w") as f:
    f.write("ok")
time.sleep(float(sys.argv[2]))
"""


def cpu() -> float:
    """CPU seconds of this process and of every child it (and they) waited for: what a batch cost the
    machine's cores, whatever else runs on them."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))] if s else float("nan")


def build(data: Path):
    from transformers import AutoTokenizer

    import tmpl
    from tmpl.backends import Scripted
    from tmpl.gateway import Gateway

    tok = AutoTokenizer.from_pretrained(str(data / "qwen2.5-instruct"))
    ok = tok.encode("ok<|im_end|>", add_special_tokens=False)
    return Gateway(tmpl.ChatTemplate(tok), Scripted(lambda req: ok))


def harness(script: Path, sleep: float):
    from tmpl.harness import Harness

    return Harness(
        "trivial",
        (sys.executable, "-I", "-S", str(script), "{task}", str(sleep)),
        dialect="openai-chat",
        env={"BASE_URL": "{base_url}", "MODEL": "{model}"},
        timeout=600,
    )


async def bare(gateway, script: Path, runs: int, level: int, sleep: float) -> tuple[list[float], float]:
    """The harness command started directly, ``runs`` of them ``level`` at a time: each one's seconds."""
    from tmpl.harness.server import LocalGateway

    out: list[float] = []
    slots = asyncio.Semaphore(level)
    async with LocalGateway(gateway) as local:
        work = Path(tempfile.mkdtemp(prefix="bench-bare-"))

        async def one(k: int) -> None:
            key = f"bare-{uuid.uuid4().hex[:12]}"
            env = {**os.environ, "BASE_URL": f"{local.url}/s/{key}/v1", "MODEL": gateway.model}
            async with slots:
                began = time.perf_counter()
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-I", "-S", str(script), f"task {k}", str(sleep),
                    cwd=work, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
                )  # fmt: skip
                assert await proc.wait() == 0
                out.append(time.perf_counter() - began)
            gateway.finish(key)
            gateway.drain()

        began = time.perf_counter()
        await asyncio.gather(*(one(k) for k in range(runs)))
        wall = time.perf_counter() - began
    return out, wall


def through_tmpl(gateway, script: Path, runs: int, level: int, sleep: float):
    from tmpl.harness import CommandVerifier, HarnessRollout, HarnessTask

    tasks = [
        HarnessTask(
            f"task {k}",
            files={"README.md": "# a task\n", "src/main.py": "print('hi')\n"},
            verifier=CommandVerifier(["test", "-s", "answer.txt"]),
            id=f"t{k}",
        )
        for k in range(runs)
    ]
    rollout = HarnessRollout(harness(script, sleep), gateway, concurrency=level, progress=False)
    began = time.perf_counter()
    results = rollout.run(tasks)
    wall = time.perf_counter() - began
    bad = [(r.status, r.error) for r in results if r.status != "HARNESS_DONE" or r.reward != 1.0]
    assert not bad, bad[:3]
    return results, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--runs", type=int, default=32, help="runs per level (at least the level)")
    parser.add_argument("--long", type=float, default=10.0, help="the long harness's seconds (0: skip it)")
    parser.add_argument("--quick", action="store_true", help="16 runs per level, a 5-second long harness")
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "tokenizers"))
    args = parser.parse_args()
    if args.quick:
        args.runs, args.long = 16, min(args.long, 5.0)

    gateway = build(Path(args.data))
    script = Path(tempfile.mkdtemp(prefix="bench-harness-")) / "agent.py"
    script.write_text(AGENT)
    print(f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f} runs/level={args.runs} python={sys.version.split()[0]}")
    through_tmpl(gateway, script, 2, 2, 0.0)  # warm: imports, the first uvicorn start
    print(
        f"{'conc':>4} {'runs':>4} | {'bare p50':>8} {'tmpl p50':>8} | {'overhead p50':>12} {'p90':>6} | "
        f"{'wall bare':>9} {'wall tmpl':>9} {'runs/s b/t':>11} | setup keeper verif finish rest (ms p50)"
    )
    verdicts = []
    cpus: list[tuple[int, float, float]] = []
    for level in args.levels:
        runs = max(args.runs, level)
        c0 = cpu()
        plain, wall_b = asyncio.run(bare(gateway, script, runs, level, 0.0))
        c1 = cpu()
        results, wall_t = through_tmpl(gateway, script, runs, level, 0.0)
        c2 = cpu()
        cpus.append((level, (c1 - c0) / runs, (c2 - c1) / runs))
        base = statistics.median(plain)
        over = [r.seconds - base for r in results]
        parts = {
            "setup": statistics.median(r.timings["setup"] for r in results),
            "keeper": statistics.median(r.timings["harness"] for r in results) - base,
            "verifier": statistics.median(r.timings["verifier"] for r in results),
            "finish": statistics.median(r.timings["finish"] for r in results),
            "rest": statistics.median(r.seconds - sum(r.timings.values()) for r in results),
        }
        p50 = pct(over, 50)
        verdicts.append((level, p50))
        print(
            f"{level:>4} {runs:>4} | {base * 1e3:>6.0f}ms {statistics.median(r.seconds for r in results) * 1e3:>6.0f}ms | "
            f"{p50 * 1e3:>10.0f}ms {pct(over, 90) * 1e3:>4.0f}ms | {wall_b:>8.2f}s {wall_t:>8.2f}s "
            f"{runs / wall_b:>5.1f}/{runs / wall_t:<5.1f} | " + " ".join(f"{v * 1e3:>5.0f}" for v in parts.values())
        )
    for level, b, t in cpus:
        print(
            f"CPU per run at concurrency {level}: bare {b * 1e3:.0f} ms, tmpl {t * 1e3:.0f} ms: tmpl adds "
            f"{(t - b) * 1e3:.0f} ms of CPU (this process and every process it started, waited for)"
        )
    for level, p50 in verdicts:
        print(
            f"goal <= 300 ms per run at concurrency {level}: {p50 * 1e3:.0f} ms: {'met' if p50 <= 0.3 else 'NOT met'}"
        )
    if args.long > 0:
        level = 8
        plain, _ = asyncio.run(bare(gateway, script, level, level, args.long))
        results, wall = through_tmpl(gateway, script, level, level, args.long)
        base = statistics.median(plain)
        over = statistics.median(r.seconds for r in results) - base
        share = over / args.long
        print(
            f"{args.long:g}-second harness, concurrency {level}: bare {base:.2f} s, tmpl "
            f"{statistics.median(r.seconds for r in results):.2f} s per run (wall {wall:.2f} s): overhead "
            f"{over * 1e3:.0f} ms = {share:.1%} of the harness's time; goal <= 5 %: {'met' if share <= 0.05 else 'NOT met'}"
        )


if __name__ == "__main__":
    main()
