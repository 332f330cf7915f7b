"""Run a command so that it can never outlive the test process that started it.

    python tests/reaper.py COMMAND [ARG ...]

The test process starts this script (in a new session, so it leads its own process group) instead
of the command itself. The kernel sends this script SIGTERM the moment its parent dies, however the
parent died (``PR_SET_PDEATHSIG``: a pytest killed with SIGKILL, a CI run stopped at its limit);
the script then ends its whole process group, the command and every process the command started
(vLLM's API server, its engine core and its workers), SIGTERM first and SIGKILL 10 s later. A
normal stop (``vllm_servers.stop``: SIGTERM to the group) goes the same way. Only the standard
library, so any interpreter (verl's environment too) can run it.

>>> subprocess.Popen([sys.executable, "tests/reaper.py", "sleep", "60"], start_new_session=True)  # doctest: +SKIP
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
GRACE = 10.0  # seconds between SIGTERM and SIGKILL to the group


def _end_group(signum: int, _frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group's SIGTERM reaches this script too
    try:
        os.killpg(0, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + GRACE
    while time.monotonic() < deadline:
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                time.sleep(0.2)
        except ChildProcessError:  # the command and its children have all ended
            break
    os.killpg(0, signal.SIGKILL)  # what is left, this script included


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        print(f"reaper: prctl failed (errno {ctypes.get_errno()})", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _end_group)
    if os.getppid() != parent:  # the parent died before prctl took effect
        _end_group(signal.SIGTERM, None)
    child = subprocess.Popen(argv)
    code = child.wait()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the command ended by itself: what it started goes too
    os.killpg(0, signal.SIGTERM)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
