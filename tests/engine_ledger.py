"""The session's ledger of real-engine starts: each vLLM server or offline engine a test started,
with the seconds until it was ready and the test that started it.

``conftest.py`` names a file for it in ``TMPL_ENGINE_LEDGER`` when the session starts (unless a
parent process already did, so subprocesses and workers write to the same one);
``tests/vllm_servers.py`` writes a line per start; the terminal summary lists them and
``tests/test_engine_budget.py`` fails when they exceed the budget.
"""

from __future__ import annotations

import json
import os

LEDGER_ENV = "TMPL_ENGINE_LEDGER"


def record_start(kind: str, what: str, seconds: float) -> None:
    """Note one real-engine start (a server or an offline engine) in the session's ledger, which
    ``tests/test_engine_budget.py`` holds to a budget and the terminal summary lists."""
    path = os.environ.get(LEDGER_ENV)
    if not path:
        return
    line = json.dumps({"kind": kind, "what": what, "seconds": round(seconds, 1), "test": _current_test()})
    with open(path, "a", encoding="utf-8") as f:  # one short line per write: appends do not interleave
        f.write(line + "\n")


def record_retry(reason: str) -> None:
    """Note one try of a real-engine test that missed its timing and ran again (``reason``): the
    terminal summary lists them, so a slow run shows where its retries went."""
    path = os.environ.get(LEDGER_ENV)
    if not path:
        return
    line = json.dumps({"kind": "retry", "what": reason[:300], "seconds": 0, "test": _current_test()})
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def _current_test() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]


def read_ledger(retries: bool = False) -> list[dict]:
    """The session's engine starts (``retries``: its retried tries instead)."""
    path = os.environ.get(LEDGER_ENV)
    if not path or not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        entries = [json.loads(line) for line in f if line.strip()]
    return [e for e in entries if (e["kind"] == "retry") == retries]


#: starts of vLLM servers and offline engines in one run of the main suite: 9 today (5 servers, 4
#: offline engines; CHANGELOG, issue 41), so a change that adds half as many again fails the run
BUDGET_STARTS = 14
#: their seconds until ready, summed: 978 s in a cold run on the 2-core CI machine (a server 90-190 s,
#: an offline engine 10-23 s, both slower beside the other worker); the bound catches starts gone
#: pathologically slow, the count above catches more of them
BUDGET_SECONDS = 3000
BUDGET_ENV = "TMPL_ENGINE_BUDGET"  # "STARTS,SECONDS": another budget (tests of this check)


def budget() -> tuple[int, float]:
    override = os.environ.get(BUDGET_ENV)
    if override:
        starts, seconds = override.split(",")
        return int(starts), float(seconds)
    return BUDGET_STARTS, float(BUDGET_SECONDS)


def over_budget(starts: list[dict]) -> str | None:
    """Why the session's starts exceed the budget (with the list of them), or None within it."""
    max_starts, max_seconds = budget()
    total = sum(s["seconds"] for s in starts)
    if len(starts) <= max_starts and total <= max_seconds:
        return None
    listing = "\n".join(f"{s['seconds']:7.1f} s  {s['kind']:8s} {s['what']:40s} {s['test']}" for s in starts)
    return (
        f"{len(starts)} real-engine starts taking {total:.0f} s until ready, over the budget of {max_starts} "
        f"starts and {max_seconds:.0f} s (tests/engine_ledger.py: share a server, or raise the budget with "
        f"the reason):\n{listing}"
    )
