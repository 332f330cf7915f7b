"""tmpl view at scale: a 10,000-sample export written as a page, opened in Chromium, made interactive.

    python benchmarks/view.py [--samples 10000] [--screenshots docs/] [--export real.jsonl --tools tools.json]

The export is built from Qwen2.5 rollouts (a scripted policy through the real tokenizer and template, as
tests/test_view.py makes them: tool rounds, direct answers, aborts), replicated to ``--samples`` samples with
varied rewards, staleness, versions and drift, about 600 tokens each, written with ``tmpl.export.to_jsonl``'s
record shape. Printed: the export's size, the time to write the page (``tmpl.view.write_page``, with the
tokenizer's text for every token) and its size; then in headless Chromium (Debian's, through Selenium):
the time from navigation to the page's script having drawn the table and histograms (``performance.now()``
at the end of the script, and the browser's own ``loadEventEnd``), the time to filter all samples, to sort
them, and to open one sample (its tokens decoded and drawn). The issue asks for < 3 s to interactive.

``--screenshots DIR`` also saves ``view-table.png`` (the table of this export) and ``view-sample.png`` (one
sample of ``--export``, e.g. a real rollout's export, else of this one) for docs/view.md.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def base_records(folder: Path) -> tuple[list[dict], object]:
    from tests.test_view import make_export

    path, records, tpl = make_export(folder)
    return records, tpl


def write_export(path: Path, records: list[dict], n: int) -> None:
    rng = random.Random(0)
    causes = ["json_reserialized", "bpe_merge", "whitespace", "reasoning_stripped"]
    with open(path, "w", encoding="utf-8") as f:
        for k in range(n):
            r = dict(records[k % 4])
            r["index"], r["sample"] = k // 4, k % 4
            r["reward"] = round(rng.random(), 3)
            r["version"] = rng.randint(0, 6)
            r["staleness"] = rng.randint(0, 3)
            r["versions"] = [r["version"] - r["staleness"] if m else -1 for m in r["mask"]]
            r["episode"] = None
            if r.get("drift"):
                r["drift_cause"] = rng.choice(causes)
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,900"):
        options.add_argument(arg)
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options)


def open_timed(driver, page: Path) -> dict[str, float]:
    t0 = time.perf_counter()
    driver.get(page.as_uri())
    wall = time.perf_counter() - t0
    ready = driver.execute_script("return window.tmplReadyMs")
    load = driver.execute_script(
        "var e = performance.getEntriesByType('navigation')[0]; return e ? e.loadEventEnd : null;"
    )
    return {"wall": wall, "ready": ready / 1000, "load": (load or 0) / 1000}


def interact(driver) -> dict[str, float]:
    filt = driver.execute_script(
        "var t = performance.now(), s = document.getElementById('f-drift'); s.value = 'yes';"
        " s.dispatchEvent(new Event('change')); var r = performance.now() - t;"
        " s.value = ''; s.dispatchEvent(new Event('change')); return r;"
    )
    sort = driver.execute_script(
        "var t = performance.now(); document.querySelector('#thead div[data-key=\"reward\"]').click();"
        " return performance.now() - t;"
    )
    sample = driver.execute_script(
        "var t = performance.now(); location.hash = 'sample=1234'; return performance.now() - t;"
    )
    count = driver.execute_script("return document.querySelectorAll('#s-tokens .tok').length")
    return {"filter": filt / 1000, "sort": sort / 1000, "open sample": sample / 1000, "tokens drawn": count}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--screenshots", type=Path, default=None)
    ap.add_argument("--export", type=Path, default=None, help="an export to screenshot a sample of")
    ap.add_argument("--tools", type=Path, default=None, help="the tool schemas --export's rollout rendered with")
    args = ap.parse_args()
    from tmpl.view import write_page

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        records, tpl = base_records(folder)
        export = folder / "big.jsonl"
        write_export(export, records, args.samples)
        print(f"export: {args.samples} samples, {export.stat().st_size / 1e6:.1f} MB")
        page = folder / "big.html"
        t0 = time.perf_counter()
        summary = write_page(export, page, tpl=tpl, max_samples=None)
        print(
            f"write_page: {time.perf_counter() - t0:.2f} s, page {summary.bytes / 1e6:.1f} MB, {summary.shown} samples"
        )
        driver = browser()
        try:
            for run in range(args.runs):
                t = open_timed(driver, page)
                i = interact(driver)
                errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
                print(
                    f"run {run + 1}: interactive {t['ready']:.2f} s after navigation (load event {t['load']:.2f} s,"
                    f" driver.get {t['wall']:.2f} s); filter {i['filter'] * 1000:.0f} ms, sort"
                    f" {i['sort'] * 1000:.0f} ms, open a sample {i['open sample'] * 1000:.0f} ms"
                    f" ({i['tokens drawn']} tokens); console errors: {len(errors)}"
                )
            if args.screenshots is not None:
                args.screenshots.mkdir(parents=True, exist_ok=True)
                driver.get(page.as_uri())
                driver.save_screenshot(str(args.screenshots / "view-table.png"))
                sample_page = page
                if args.export is not None:
                    sample_page = folder / "export.html"
                    tools = json.loads(args.tools.read_text()) if args.tools else None
                    write_page(args.export, sample_page, tpl=tpl, tools=tools)
                driver.get(sample_page.as_uri())
                first = driver.execute_script(
                    "for (var i = 0; i < window.tmplColumns.drift.length; i++) if (window.tmplColumns.drift[i]) return i;"
                    " return 0;"
                )
                driver.execute_script("location.hash = arguments[0]", f"sample={first}")
                driver.execute_script("window.scrollTo(0, 0)")
                driver.save_screenshot(str(args.screenshots / "view-sample.png"))
                print(f"screenshots: {args.screenshots / 'view-table.png'}, {args.screenshots / 'view-sample.png'}")
        finally:
            driver.quit()


if __name__ == "__main__":
    main()
