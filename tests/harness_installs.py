"""Waiting for the harness installs CI runs beside the suite.

``.ci/run`` installs the npm CLIs (``.ci/harnesses``) and the PyPI harnesses' venvs (``.ci/harnesses_py``) in
the background while the main suite runs, and sets ``TMPL_HARNESS_INSTALLS`` to a status file it writes when
they end (``0`` or the failing step). A harness test that starts first waits for it here; a failed install
fails the test (naming the log), so CI never passes by skipping what it was meant to run. Without the
variable (a developer's run) nothing waits: an absent harness is skipped by its test.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

#: longest wait for the installs (CI's budget is 30 minutes; they take ~6 from cold)
LIMIT_S = 20 * 60


def wait_for_installs() -> None:
    """Return once CI's harness installs have ended well; fail the test if they failed or never end."""
    status = os.environ.get("TMPL_HARNESS_INSTALLS")
    if not status:
        return
    path = Path(status)
    deadline = time.monotonic() + LIMIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the harness installs did not end within {LIMIT_S} s ({path} not written)")
        time.sleep(2.0)
    said = path.read_text().strip()
    if said != "0":
        pytest.fail(f"the harness installs failed: {said} (see build/harness-installs.log)")
