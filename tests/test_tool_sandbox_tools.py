"""Tools for tests/test_tool_sandbox.py: module-level, stdlib only, so a worker (sandboxed or not)
imports them quickly (no tests here). Each does what code the model chose might try."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

SLEEPER = "import time; time.sleep(3600)"
ROLES = ("child", "grandchild", "setsid", "daemon")


def marked(marker: str) -> dict[str, int]:
    """Processes alive now whose command line ends with ``<marker>-<role>``: role -> PID."""
    found: dict[str, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        for arg in args:
            text = arg.decode(errors="replace")
            if text.startswith(marker + "-") and text[len(marker) + 1 :] in ROLES:
                found[text[len(marker) + 1 :]] = int(name)
    return found


def spawn_tree(marker: str, then: str) -> str:
    """Start a child (which starts a grandchild), a child in a session of its own (``setsid``) and
    a daemon (double fork, ``setsid``, its parent gone), wait until all four run, then ``then``:
    "hang" (sleep past any timeout) or "exit" (``os._exit(3)`` a second later).

    Args:
        marker: Names the processes (their last argument is ``<marker>-<role>``).
        then: "hang" or "exit".
    """
    py = sys.executable
    grand = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-I', '-S', '-c', {SLEEPER!r}, sys.argv[1][:-6] + '-grandchild']); time.sleep(3600)"
    daemon = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(3600)\n"
    subprocess.Popen([py, "-I", "-S", "-c", grand, marker + "-child"])
    subprocess.Popen([py, "-I", "-S", "-c", SLEEPER, marker + "-setsid"], start_new_session=True)
    subprocess.Popen([py, "-I", "-S", "-c", daemon, marker + "-daemon"]).wait()  # its child lives on, orphaned
    until = time.monotonic() + 20
    while len(marked(marker)) < len(ROLES) and time.monotonic() < until:
        time.sleep(0.02)
    time.sleep(0.5)  # the test sees them all
    if then == "exit":
        os._exit(3)
    time.sleep(3600)
    return "late"


def read_file(path: str) -> str:
    """Read a file.

    Args:
        path: Its path.
    """
    with open(path) as f:
        return f.read()


def write_file(path: str, text: str) -> str:
    """Write a file.

    Args:
        path: Its path.
        text: What to write.
    """
    with open(path, "w") as f:
        f.write(text)
    return f"wrote {len(text)} characters to {path}"


def connect(port: int) -> str:
    """Open a TCP connection to 127.0.0.1.

    Args:
        port: The port.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        return "connected"


def fork_many(n: int) -> str:
    """Start ``n`` processes that sleep (each a fork of this one); stops at the first refusal.

    Args:
        n: How many.
    """
    started = 0
    try:
        for _ in range(n):
            if os.fork() == 0:
                time.sleep(3600)
                os._exit(0)
            started += 1
    except OSError as exc:
        raise OSError(exc.errno, f"{exc.strerror} after {started} processes") from None
    return f"started {started} processes"


def fork_bomb(seconds: float) -> str:
    """Fork forever, in every process, for ``seconds``.

    Args:
        seconds: How long.
    """
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            os.fork()
        except OSError:
            time.sleep(0.001)
    return "done"


def fill_disk(mb: int) -> str:
    """Write ``mb`` megabytes into the working directory.

    Args:
        mb: How many.
    """
    written = 0
    block = b"x" * 2**20
    fd = os.open("filler.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for _ in range(mb):
            try:
                written += os.write(fd, block)
            except OSError as exc:
                raise OSError(exc.errno, f"{exc.strerror} after {written // 2**20} MB") from None
    finally:
        os.close(fd)
    return f"wrote {mb} MB"


def where() -> dict:
    """Where the tool runs: its working directory, user, and the files there."""
    return {"cwd": os.getcwd(), "uid": os.getuid(), "files": sorted(os.listdir("."))}


def add(a: int, b: int) -> int:
    """Add.

    Args:
        a: A number.
        b: Another.
    """
    return a + b
