"""tmpl.harness.HarnessRollout: what tmpl adds to each harness run, outside the harness's own time.

    python benchmarks/harness.py [--quick] [--levels 1 8 32] [--runs 32] [--rounds 3] [--long 10]

Gateway: Qwen2.5 (``tmpl.ChatTemplate``) over a ``Scripted`` backend that answers ``ok`` at once, served
in-process (``HarnessRollout`` serves it on its own event loop). Harness: a trivial program, ``python -I
-S`` with the standard library only (no SDK: its import time is not tmpl's), that POSTs one chat
completion to its session's base URL with ``urllib``, writes ``answer.txt`` and exits. Task: two small
files laid into the working directory; verifier: ``CommandVerifier(["test", "-s", "answer.txt"])``.

Per concurrency level (``--levels``), in the same process, on the same gateway, ``--rounds`` rounds of
two batches each, the two kinds taking turns (bare, tmpl, bare, tmpl...: a load that drifts meanwhile,
as other work on the machine comes and goes, weighs on both alike):

- ``bare``: the harness command started directly (``asyncio.create_subprocess_exec``, output to
  ``/dev/null``) with its environment pointed at a fresh session, ``--runs`` of them at the level's
  concurrency: the harness's own time, process start included (the baseline);
- ``tmpl``: the same harness through ``HarnessRollout(..., concurrency=level)``.

``overhead``: each ``tmpl`` run's seconds minus the median ``bare`` run of the same round (p50 and p95
over every round's runs): the figure the goal (<= 300 ms per run) is read against, and its share of a
10-second harness (the goal <= 5 %). The phases (p50 and p95, ms) are each run's ``timings``: ``open``
(the session), ``setup`` (directories, the task's files copied, the harness rendered), ``start`` (the
keeper forked from the batch's keeper server), ``harness+`` (the harness's time under its keeper minus
the round's bare median: exec through the keeper, and the CPU share the other phases take), ``kill``
(its exit to its tree reaped), ``verifier``, ``drain`` (output tails, the episode read, reward set,
session finished and taken) and ``cleanup`` (the directory removed). ``CPU per run``: the CPU seconds
of this process and of every process it started (``RUSAGE_SELF`` + ``RUSAGE_CHILDREN``) over the
batches, per run: what tmpl adds there depends far less on what else loads the machine than wall
times do. Last, a 10-second harness (the same program sleeping 10 s after its call) at concurrency 8,
bare then tmpl: its runs' seconds against 10 s.

Every figure shares this machine's cores with whatever else runs (``uptime`` is printed before and
after each level): on a busy machine process starts slow down, bare and tmpl alike. At a concurrency
above the cores, every run's processes queue for CPU (a run's seconds are about the batch's), so a
run's overhead there is the CPU tmpl adds, times the runs, over the cores, plus that queueing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
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


#: the phases of a run, as the table names them, and the ``timings`` key each reads
PHASES = {
    "open": "open",
    "setup": "setup",
    "start": "start",
    "harness+": "harness",
    "kill": "kill",
    "verifier": "verifier",
    "drain": "finish",
    "cleanup": "cleanup",
}


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def level_figures(gateway, script: Path, runs: int, level: int, rounds: int, sleep: float = 0.0) -> dict:
    """``rounds`` rounds of a bare batch then a tmpl batch: per-run overheads, phases, walls, CPU."""
    over: list[float] = []
    phases: dict[str, list[float]] = {name: [] for name in PHASES}
    bares: list[float] = []
    tmpls: list[float] = []
    walls = {"bare": 0.0, "tmpl": 0.0}
    cpus = {"bare": 0.0, "tmpl": 0.0}
    for _ in range(rounds):
        c0 = cpu()
        plain, wall_b = asyncio.run(bare(gateway, script, runs, level, sleep))
        c1 = cpu()
        results, wall_t = through_tmpl(gateway, script, runs, level, sleep)
        c2 = cpu()
        cpus["bare"] += c1 - c0
        cpus["tmpl"] += c2 - c1
        walls["bare"] += wall_b
        walls["tmpl"] += wall_t
        base = statistics.median(plain)
        bares += plain
        for r in results:
            tmpls.append(r.seconds)
            over.append(r.seconds - base)
            for name, key in PHASES.items():
                phases[name].append(r.timings.get(key, 0.0) - (base if name == "harness+" else 0.0))
    n = runs * rounds
    return {
        "over": over,
        "phases": phases,
        "bare": bares,
        "tmpl": tmpls,
        "walls": walls,
        "cpu": {k: v / n for k, v in cpus.items()},
        "rest": [t - b for t, b in zip(tmpls, bares)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--runs", type=int, default=32, help="runs per batch (at least the level)")
    parser.add_argument("--rounds", type=int, default=3, help="bare/tmpl batch pairs per level")
    parser.add_argument("--long", type=float, default=10.0, help="the long harness's seconds (0: skip it)")
    parser.add_argument("--quick", action="store_true", help="16 runs per batch, 2 rounds, a 5-second long harness")
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "tokenizers"))
    args = parser.parse_args()
    if args.quick:
        args.runs, args.rounds, args.long = 16, 2, min(args.long, 5.0)

    gateway = build(Path(args.data))
    script = Path(tempfile.mkdtemp(prefix="bench-harness-")) / "agent.py"
    script.write_text(AGENT)
    print(f"cpus={os.cpu_count()} runs/batch={args.runs} rounds={args.rounds} python={sys.version.split()[0]}")
    through_tmpl(gateway, script, 2, 2, 0.0)  # warm: imports, the first uvicorn start
    verdicts = []
    for level in args.levels:
        runs = max(args.runs, level)
        print(f"\n== concurrency {level}: {runs} runs per batch x {args.rounds} rounds | before: {uptime()}")
        f = level_figures(gateway, script, runs, level, args.rounds)
        print(
            f"run seconds p50: bare {statistics.median(f['bare']) * 1e3:.0f} ms, tmpl "
            f"{statistics.median(f['tmpl']) * 1e3:.0f} ms | batch wall (sum of rounds): bare "
            f"{f['walls']['bare']:.2f} s, tmpl {f['walls']['tmpl']:.2f} s | CPU per run: bare "
            f"{f['cpu']['bare'] * 1e3:.0f} ms, tmpl {f['cpu']['tmpl'] * 1e3:.0f} ms (tmpl adds "
            f"{(f['cpu']['tmpl'] - f['cpu']['bare']) * 1e3:.0f} ms)"
        )
        print(f"{'phase (ms)':>12} " + " ".join(f"{name:>9}" for name in PHASES) + f" {'OVERHEAD':>9}")
        for q in (50, 95):
            cells = [pct(values, q) for values in f["phases"].values()] + [pct(f["over"], q)]
            print(f"{'p' + str(q):>12} " + " ".join(f"{v * 1e3:>9.0f}" for v in cells))
        p50, p95 = pct(f["over"], 50), pct(f["over"], 95)
        verdicts.append((level, p50, p95))
        print(
            f"overhead p50 {p50 * 1e3:.0f} ms = {p50 / 10:.1%} of a 10-second harness (p95 {p95 * 1e3:.0f} ms = "
            f"{p95 / 10:.1%}) | after: {uptime()}"
        )
    print()
    for level, p50, p95 in verdicts:
        ok = "met" if p50 <= 0.3 and p50 / 10 <= 0.05 else "NOT met"
        print(
            f"goal <= 300 ms per run and <= 5 % of a 10-second harness, concurrency {level}: p50 "
            f"{p50 * 1e3:.0f} ms ({p50 / 10:.1%}), p95 {p95 * 1e3:.0f} ms: {ok}"
        )
    if args.long > 0:
        level = 8
        f = level_figures(gateway, script, level, level, 1, args.long)
        base, mine = statistics.median(f["bare"]), statistics.median(f["tmpl"])
        share = (mine - base) / args.long
        print(
            f"{args.long:g}-second harness, concurrency {level}: bare {base:.2f} s, tmpl {mine:.2f} s per run: "
            f"overhead {(mine - base) * 1e3:.0f} ms = {share:.1%} of the harness's time; goal <= 5 %: "
            f"{'met' if share <= 0.05 else 'NOT met'} | {uptime()}"
        )


if __name__ == "__main__":
    main()
