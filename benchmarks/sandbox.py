"""What a bubblewrap sandbox costs per call and per worker, against ``isolation="process"``.

    python benchmarks/sandbox.py [--repeats 7] [--workers 2]

Each measurement runs both modes in the same run, alternately, and prints their ratio:

1. per call: ``Toolbox.run_batch`` of 2,000 calls of a trivial tool (``add``) and of 256 calls of
   a tool that sleeps 1 ms (``nap``): the median over ``--repeats`` batches, per call;
2. per worker: building a Toolbox (it starts one worker and waits until it loaded its tools);
   and a worker replaced after a timeout (a call that hangs past a 0.2 s timeout, then a call
   that needs a fresh worker: the time of both, less the timeout);
3. the threads baseline for scale (per call, ``add``).

Tools here are functions of this script, so each worker (forkserver child, or sandboxed
interpreter) imports it as ``__mp_main__``: keep the work under ``if __name__ == "__main__"``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def add(a: int, b: int) -> int:
    """Add.

    Args:
        a: A number.
        b: Another.
    """
    return a + b


def nap(a: int, b: int) -> int:
    """Sleep 1 ms, then add.

    Args:
        a: A number.
        b: Another.
    """
    time.sleep(0.001)
    return a + b


def hang(a: int, b: int) -> int:
    """Sleep past any timeout.

    Args:
        a: A number.
        b: Another.
    """
    time.sleep(3600)
    return a + b


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _alternate(fns: dict, repeats: int) -> dict[str, list[float]]:
    """Each of ``fns`` timed ``repeats`` times, in turn (load from other work hits them alike)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(_timed(fn))
    return times


def main() -> None:
    import tmpl

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    tools = [add, nap, hang]
    common = {"workers": args.workers, "timeouts": {"hang": 0.2}}

    def build(isolation: str):
        return tmpl.Toolbox(tools, isolation=isolation, **common)

    boxes = {"process": build("process"), "sandbox": build("sandbox")}  # warm: forkserver, page cache
    threads = tmpl.Toolbox(tools)
    print(f"cpus={os.cpu_count()} workers={args.workers} repeats={args.repeats} load={os.getloadavg()[0]:.1f}")

    print("1. per call (Toolbox.run_batch, median of batches)")
    for name, n in (("add", 2000), ("nap", 256)):
        batch = [[{"name": name, "arguments": {"a": i, "b": 1}}] for i in range(n)]
        fns = {mode: (lambda box=box: box.run_batch(batch)) for mode, box in boxes.items()}
        times = _alternate(fns, args.repeats)
        p, s = (statistics.median(times[m]) / n for m in ("process", "sandbox"))
        print(
            f"   {name:4s} x{n:5d}: process {p * 1e6:8.1f} us/call   sandbox {s * 1e6:8.1f} us/call   "
            f"ratio {s / p:5.2f}x"
        )

    print("2. per worker (median)")
    built: dict[str, list[float]] = {"process": [], "sandbox": []}
    for _ in range(args.repeats):
        for mode in built:
            start = time.perf_counter()
            box = tmpl.Toolbox(tools, isolation=mode, **common)
            built[mode].append(time.perf_counter() - start)
            box.close()
    p, s = statistics.median(built["process"]), statistics.median(built["sandbox"])
    print(
        f"   a Toolbox built (one worker started)   process {p * 1e3:7.1f} ms   sandbox {s * 1e3:7.1f} ms   ratio {s / p:5.1f}x"
    )

    hung = [[{"name": "hang", "arguments": {"a": 1, "b": 1}}]]
    again = [[{"name": "add", "arguments": {"a": 1, "b": 1}}]]

    def replace(box):
        def run() -> None:
            assert box.run_batch(hung).outcomes[0][0].error == "timeout"
            assert box.run_batch(again).messages[0][0]["content"] == "2"

        return run

    boxes1 = {mode: tmpl.Toolbox(tools, isolation=mode, workers=1, timeouts={"hang": 0.2}) for mode in boxes}
    times = _alternate({mode: replace(box) for mode, box in boxes1.items()}, args.repeats)
    p, s = (statistics.median(times[m]) - 0.2 for m in ("process", "sandbox"))
    print(
        f"   a worker killed and replaced           process {p * 1e3:7.1f} ms   sandbox {s * 1e3:7.1f} ms   ratio {s / p:5.1f}x"
    )

    batch = [[{"name": "add", "arguments": {"a": i, "b": 1}}] for i in range(2000)]
    t = statistics.median(_alternate({"t": lambda: threads.run_batch(batch)}, args.repeats)["t"]) / 2000
    print(f"3. threads, for scale: add {t * 1e6:.1f} us/call")
    for box in (*boxes.values(), *boxes1.values(), threads):
        box.close()


if __name__ == "__main__":
    main()
