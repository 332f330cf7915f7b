"""Instruction counts of the suffix path (callgrind): stable where wall-clock timings are not.

On a loaded machine, timings drift between runs; instruction counts do not. This script is
the workload and the report:

    valgrind --tool=callgrind --collect-atstart=no --toggle-collect=functools_reduce \\
        --dump-after=functools_reduce --callgrind-out-file=OUT/cg.out \\
        "$(python -c 'import sys; print(sys.executable)')" benchmarks/suffix_callgrind.py run OUT
    python benchmarks/suffix_callgrind.py report OUT

(the real interpreter, not a pyenv shim: valgrind does not follow the shim's child). Each
measured loop runs inside one ``functools.reduce`` call, so callgrind counts exactly that loop
and dumps it; ``run`` writes the loops' labels in order to ``OUT/order.txt``. Per family and
size (10, 100, 2000 characters, one result): the floor (``tokenizers`` encode of the content
alone), ``suffix_ids``, and ``suffix_ids`` with its boundary cuts off (the whole-run path).
Slow under valgrind: about 20 minutes on a busy 2-core machine.
"""

from __future__ import annotations

import re
import sys
from functools import reduce
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

FAMILIES = ["qwen2.5-instruct", "llama-3.2-instruct", "mistral-nemo-instruct-2407"]
CALLS = 100
#: Dumps below this many instructions per measured call come from other ``reduce`` calls
#: (library code while loading); a measured loop is far above it.
MIN_PER_CALL = 10_000


def run(out: Path) -> None:
    import os

    from suffix import SIZES, _NoCuts, tool_messages
    from transformers import AutoTokenizer

    import tmpl

    data = Path(os.environ.get("TMPL_TEST_DATA", REPO.parent / "shared" / "tokenizers"))
    order = []
    for family in FAMILIES:
        tok = AutoTokenizer.from_pretrained(str(data / family))
        tpl = tmpl.ChatTemplate(tok, name=family)
        backend = tok.backend_tokenizer
        stop = [next(iter(tpl.stop_token_ids))]
        for label, content in SIZES.items():
            msgs = tool_messages([content])

            def call(msgs=msgs):
                return tpl.suffix_ids(msgs, completion_ids=stop)

            def floor(content=content):
                return backend.encode(content, add_special_tokens=False).ids

            call()  # builds the frame and learns the cuts' verdicts outside the measured loops
            for name, fn, context in [("floor", floor, None), ("tmpl", call, None), ("no cuts", call, _NoCuts(tpl))]:
                if context:
                    context.__enter__()
                fn()
                reduce(lambda acc, _, fn=fn: fn(), range(CALLS), None)
                if context:
                    context.__exit__(None, None, None)
                order.append(f"{family}|{label}|{name}")
    (out / "order.txt").write_text("\n".join(order) + "\n")


def report(out: Path) -> None:
    dumps = sorted(out.glob("cg.out.*"), key=lambda p: int(p.suffix[1:]))
    totals = [int(re.search(r"^summary: (\d+)", p.read_text(), re.M).group(1)) for p in dumps]
    totals = [t for t in totals if t >= MIN_PER_CALL * CALLS]
    order = (out / "order.txt").read_text().splitlines()
    if len(order) != len(totals):
        sys.exit(f"{len(order)} measured loops but {len(totals)} dumps: rerun")
    per_call = {key: total / CALLS for key, total in zip(order, totals)}
    print("Instructions per call (callgrind), one tool result; ratios to the floor (tokenizers encode of the content).")
    print(f"{'family':28s} {'result':20s} {'floor':>9s} {'tmpl':>9s} {'no cuts':>9s}  tmpl/floor  nocuts/floor")
    for key in order:
        family, label, name = key.split("|")
        if name != "floor":
            continue
        floor, tmpl_, old = (per_call[f"{family}|{label}|{n}"] for n in ("floor", "tmpl", "no cuts"))
        print(
            f"{family:28s} {label:20s} {floor / 1e3:8.1f}k {tmpl_ / 1e3:8.1f}k {old / 1e3:8.1f}k"
            f"  {tmpl_ / floor:9.2f}x  {old / floor:11.2f}x"
        )


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("run", "report"):
        sys.exit(__doc__)
    (run if sys.argv[1] == "run" else report)(Path(sys.argv[2]))
