"""Time to probe templates: one report per template, and the whole catalog matrix.

    python benchmarks/probe.py [--data ../shared/tokenizers]

Prints, for every catalog template with its host tokenizer, the time of ``check(tpl)`` from a
cold cache (turn probes, frame building and verification, stability checks, shipped-template
fit), then mean / median / max, and the wall time of ``tmpl matrix`` over the whole catalog
(tokenizer loading included). Targets from the issue: probing under 200 ms on average, the
~100-template matrix under 30 s on a 2-core machine. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import tmpl  # noqa: E402
from tmpl.report import check, matrix  # noqa: E402
from tmpl.suffix import clear_caches  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.environ.get("TMPL_TEST_DATA", REPO.parent / "shared" / "tokenizers"))
    args = parser.parse_args()
    catalog = Path(args.data) / "templates" / "catalog.json"
    if not catalog.is_file():
        sys.exit(f"no catalog at {catalog}; pass --data or set TMPL_TEST_DATA")
    from transformers import AutoTokenizer

    entries = json.loads(catalog.read_text(encoding="utf-8"))
    hosts = {}
    start = time.perf_counter()
    for e in entries:
        folder = Path(args.data) / e["host_tokenizer"]
        if folder.is_dir() and e["host_tokenizer"] not in hosts:
            hosts[e["host_tokenizer"]] = AutoTokenizer.from_pretrained(str(folder))
    load_time = time.perf_counter() - start
    times = []
    for e in entries:
        tok = hosts.get(e["host_tokenizer"])
        if tok is None:
            continue
        text = (Path(args.data) / e["template"]).read_text(encoding="utf-8")
        clear_caches()
        tmpl.chat_template._REPORTS.clear()
        t0 = time.perf_counter()
        check(tmpl.ChatTemplate(tok, text, name=Path(e["template"]).name))
        times.append(time.perf_counter() - t0)
    print(f"{len(times)} templates probed cold ({len(hosts)} host tokenizers, loaded in {load_time:.1f} s)")
    print(
        f"  report per template: mean {statistics.mean(times) * 1e3:.0f} ms, median "
        f"{statistics.median(times) * 1e3:.0f} ms, max {max(times) * 1e3:.0f} ms (target: mean < 200 ms)"
    )
    clear_caches()
    tmpl.chat_template._REPORTS.clear()
    matrix._TOKENIZERS.clear()
    t0 = time.perf_counter()
    rows = matrix.run_matrix(matrix.sources_from_paths([catalog]), progress=False)
    print(
        f"  tmpl matrix over the catalog ({len(rows)} rows, tokenizers loaded included): "
        f"{time.perf_counter() - t0:.1f} s (target: < 30 s)"
    )


if __name__ == "__main__":
    main()
