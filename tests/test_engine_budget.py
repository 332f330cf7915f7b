"""The real-engine budget fails a run that starts too many engines.

Every vLLM server and offline engine a test starts is recorded in the session's ledger
(``tests/engine_ledger.py``, written by ``tests/vllm_servers.py``); once every test ran, the session
(the controller under pytest-xdist) checks the ledger against ``BUDGET_STARTS`` and
``BUDGET_SECONDS`` and fails the run above them, listing each start. Starts are most of the suite's
time on a 2-core machine, so a change that doubles them is noticed, not found when CI runs past its
limit. Here a small session records starts through the real hooks and the real ledger.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from .conftest import PRISTINE_ENV, REPO

SESSION = """
from tests.engine_ledger import record_start


def test_starts_engines():
    for k in range({starts}):
        record_start("server", f"stand-in {{k}}", 2.0)
"""


def run_session(tmp_path, starts: int, budget: str) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_configure, pytest_sessionfinish, pytest_terminal_summary, "
        "pytest_unconfigure  # noqa: F401\n"
    )
    (tmp_path / "test_session.py").write_text(textwrap.dedent(SESSION.format(starts=starts)))
    env = {k: v for k, v in PRISTINE_ENV.items() if k != "TMPL_ENGINE_LEDGER"}
    env.update(PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""), TMPL_ENGINE_BUDGET=budget)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_session_over_the_budget_fails_and_lists_its_starts(tmp_path):
    done = run_session(tmp_path, starts=3, budget="2,100")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 passed" in done.stdout  # every test passed: the budget alone failed the run
    assert "REAL-ENGINE BUDGET EXCEEDED" in done.stdout and "3 real-engine starts" in done.stdout
    assert "stand-in 2" in done.stdout and "test_session.py::test_starts_engines" in done.stdout


def test_a_session_over_the_seconds_fails_too(tmp_path):
    done = run_session(tmp_path, starts=2, budget="5,3")
    assert done.returncode == 1 and "4 s until ready, over the budget" in done.stdout, done.stdout


def test_a_session_within_the_budget_passes_and_still_lists_its_starts(tmp_path):
    done = run_session(tmp_path, starts=2, budget="2,100")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "real-engine starts: 2, 4 s until ready" in done.stdout
    assert "BUDGET EXCEEDED" not in done.stdout
