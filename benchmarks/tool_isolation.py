"""What isolating tools costs, and what one flooding tool costs its batch.

    python benchmarks/tool_isolation.py [--data ../shared/tokenizers] [--samples 256] [--repeats 5]

Three measurements, each against a baseline timed in the same run (Qwen2.5 template, the
``Scripted`` backend, so what is timed is everything outside the engine):

1. flood: a rollout of ``--samples`` samples (one tool call each, then an answer), all ordinary,
   against the same rollout where one sample's tool returns 5 MB of text. With the cut
   (results bounded before tokenization) and without it (``cut_to_tokens`` patched out and no
   ``max_output_chars``: how it was before, the whole result tokenized, then cut to the budget).
2. per call: ``Toolbox.run_batch`` of 2,000 calls of a trivial sync tool with threads against
   worker processes, and of 256 calls of a tool that sleeps 1 ms.
3. rollout: the ordinary rollout with ``isolation="process"`` against threads.

Rollouts compared run alternately, ``--repeats`` times each; printed: the fastest run of each
(the least disturbed by other work on a shared machine), their ratio, and the median of the
per-pair ratios. Per-call costs: medians.
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

FLOOD_CHARS = 5 * 2**20


def get_weather(city: str) -> str:
    """Current weather in a city.

    Args:
        city: The city name.
    """
    return f'{{"city": "{city}", "temperature_c": 21.5, "conditions": "partly cloudy"}}'


def flood(city: str) -> str:
    """A scraper that returns a whole site.

    Args:
        city: The city name.
    """
    return ("The quick brown fox jumps over the lazy dog in " + city + ". ") * (FLOOD_CHARS // 52)


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


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _paired(base, other, repeats: int) -> tuple[float, float, float, float]:
    """``base`` and ``other`` run alternately: their fastest runs, the ratio of those, and the median
    of the per-pair ratios (each pair ran back to back, so load from other work hits both alike).
    The fastest run is the one least disturbed by other work on a shared machine."""
    a, b = [], []
    for _ in range(repeats):
        a.append(_median(base, 1))
        b.append(_median(other, 1))
    return min(a), min(b), min(b) / min(a), statistics.median(y / x for x, y in zip(a, b))


def main() -> None:
    from transformers import AutoTokenizer

    import tmpl
    from tmpl.backends import Scripted
    from tmpl.rollout import toolround

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.environ.get("TMPL_TEST_DATA", str(REPO.parent / "shared" / "tokenizers")))
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    tpl = tmpl.ChatTemplate(AutoTokenizer.from_pretrained(str(Path(args.data) / "qwen2.5-instruct")), name="qwen2.5")
    calls = {
        name: tpl.codec.encode(
            f'<tool_call>\n{{"name": "{name}", "arguments": {{"city": "Paris"}}}}\n</tool_call><|im_end|>'
        )
        for name in ("get_weather", "flood")
    }
    final = tpl.codec.encode("It is partly cloudy in Paris.<|im_end|>")
    convs = [[{"role": "user", "content": f"Weather in Paris, question {i}?"}] for i in range(args.samples)]

    def rollout(box, flooding: bool):
        def policy(req):
            i, _, turn = req.request_id.split("-")[:3]
            if turn != "0":
                return final
            return calls["flood" if flooding and i == "0" else "get_weather"]

        r = tmpl.Rollout(tpl, Scripted(policy), tools=box, max_turns=3, max_length=8192, max_completion_length=4096)
        return lambda: r.run(convs)

    threads = tmpl.Toolbox([get_weather, flood, add, nap])
    processes = tmpl.Toolbox([get_weather, flood, add, nap], isolation="process")
    n_workers = processes.pool.size if processes.pool is not None else 0
    rollout(threads, False)()  # warm: suffix frames, parser, worker threads
    rollout(processes, False)()

    print(f"samples={args.samples} repeats={args.repeats} cpus={os.cpu_count()} process workers={n_workers}")
    ordinary, flooded, ratio, paired = _paired(rollout(threads, False), rollout(threads, True), args.repeats)
    real_cut = toolround.cut_to_tokens
    toolround.cut_to_tokens = lambda codec, text, budget, total=None: None  # as before: tokenize it all
    raw = tmpl.Toolbox([get_weather, flood], max_output_chars=None)
    try:
        base, uncut, before, _ = _paired(rollout(threads, False), rollout(raw, True), max(1, args.repeats // 4))
    finally:
        toolround.cut_to_tokens = real_cut
    print("1. one 5 MB result among the samples (rollout seconds: fastest of the runs, alternated)")
    print(f"   ordinary batch            {ordinary:8.3f} s")
    print(
        f"   one 5 MB result, cut      {flooded:8.3f} s   ratio {ratio:5.2f}x  (goal <= 1.2x; "
        f"median of paired ratios {paired:.2f}x)"
    )
    print(f"   one 5 MB result, not cut  {uncut:8.3f} s   ratio {before:5.2f}x  (before; its ordinary: {base:.3f} s)")

    print("2. per call (Toolbox.run_batch, median)")
    for name, n in (("add", 2000), ("nap", 256)):
        batch = [[{"name": name, "arguments": {"a": i, "b": 1}}] for i in range(n)]
        t = _median(lambda: threads.run_batch(batch), args.repeats) / n
        p = _median(lambda: processes.run_batch(batch), args.repeats) / n
        print(
            f"   {name:4s} x{n:5d}: threads {t * 1e6:8.1f} us/call   processes {p * 1e6:8.1f} us/call   ratio {p / t:6.1f}x"
        )

    ordinary, proc_rollout, ratio, paired = _paired(rollout(threads, False), rollout(processes, False), args.repeats)
    print("3. the ordinary rollout, tools in worker processes (fastest runs, alternated)")
    print(
        f"   threads {ordinary:8.3f} s   processes {proc_rollout:8.3f} s   ratio {ratio:5.2f}x  "
        f"(median of paired ratios {paired:.2f}x)"
    )
    threads.close()
    processes.close()


if __name__ == "__main__":
    main()
