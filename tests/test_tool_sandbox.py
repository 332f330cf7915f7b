"""``Toolbox(isolation="sandbox")`` confines code the model chose, and a killed worker takes its whole
process tree with it (``isolation="process"`` and ``"sandbox"``).

Every hostile tool is checked twice: the message the model gets, and the real world outside the
sandbox (the file, the socket, the process table). Where the check could pass by accident, the
same call with ``isolation="process"`` shows it does reach the trainer's world.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

import tmpl
from tmpl.errors import SandboxError, ToolboxError
from tmpl.tools.proctree import descendants
from tmpl.tools.sandbox import Sandbox

from . import test_tool_isolation_tools as hostile
from . import test_tool_sandbox_tools as tools

REPO = Path(__file__).resolve().parent.parent
SCRATCH_MB = 8
MAX_PROCESSES = 16
TOOLS = [
    tools.spawn_tree,
    tools.read_file,
    tools.write_file,
    tools.connect,
    tools.fill_disk,
    tools.where,
    tools.add,
    hostile.segfaults,
    hostile.allocates,
    hostile.floods,
]
TIMEOUTS = {"spawn_tree": 4.0}


def _bwrap_works() -> str | None:
    """Why the sandbox cannot run here, or None."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    probe = ["bwrap", "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/", "--proc", "/proc", "true"]
    done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    return None if done.returncode == 0 else f"bwrap cannot make namespaces here: {done.stderr.strip()}"


WHY = _bwrap_works()
needs_bwrap = pytest.mark.skipif(WHY is not None, reason=WHY or "")


@pytest.fixture(scope="module")
def sandboxed():
    box = tmpl.Toolbox(
        TOOLS,
        isolation="sandbox",
        workers=1,
        timeout=20.0,
        timeouts=TIMEOUTS,
        memory_mb=256,
        max_output_chars=1000,
        sandbox=Sandbox(scratch_mb=SCRATCH_MB, max_processes=MAX_PROCESSES),
    )
    yield box
    box.close()


@pytest.fixture(scope="module")
def processes():
    box = tmpl.Toolbox(TOOLS, isolation="process", workers=1, timeout=20.0, timeouts=TIMEOUTS)
    yield box
    box.close()


def _call(box, name, **arguments) -> str:
    return box.run_batch([[{"name": name, "arguments": arguments}]]).messages[0][0]["content"]


# -- process trees ---------------------------------------------------------------------------
@needs_bwrap
@pytest.mark.parametrize("isolation", ["process", "sandbox"])
@pytest.mark.parametrize("then", ["hang", "exit"])
def test_a_killed_worker_takes_its_whole_tree(request, isolation, then):
    """A child, its grandchild, a ``setsid`` child and an orphaned daemon all run while the call
    does; once it is answered (timed out: the worker killed; or the worker exited by itself),
    none of their PIDs is left in /proc, not even as a zombie."""
    box = request.getfixturevalue("sandboxed" if isolation == "sandbox" else "processes")
    assert _call(box, "add", a=1, b=1) == "2"
    worker = box.pool._slots[0].proc  # the keeper (process), or bwrap (sandbox): reaped after
    handles = [worker.pid] + ([worker.init] if isolation == "sandbox" else [])
    marker = f"tree{uuid.uuid4().hex[:8]}"
    seen: dict[str, int] = {}
    answer: list[str] = []
    call = threading.Thread(target=lambda: answer.append(_call(box, "spawn_tree", marker=marker, then=then)))
    call.start()
    while call.is_alive():
        seen.update(tools.marked(marker))
        call.join(0.02)
    expected = {
        "hang": "Error: spawn_tree timed out after 4 s",
        "exit": "Error: spawn_tree crashed: its worker process exited with code 3",
    }[then]
    assert answer == [expected]
    assert sorted(seen) == sorted(tools.ROLES)  # each ran, under its own PID
    assert [role for role, pid in seen.items() if os.path.exists(f"/proc/{pid}")] == []
    assert [pid for pid in handles if os.path.exists(f"/proc/{pid}")] == []  # not even a zombie
    assert _call(box, "add", a=2, b=3) == "5"  # a fresh worker took over


TRAINER = """
import json, os, sys, threading, time
import tmpl
from tests import test_tool_sandbox_tools as tools
marker = sys.argv[1]
for isolation in ("process", "sandbox"):
    box = tmpl.Toolbox([tools.spawn_tree], isolation=isolation, workers=1, timeout=600)
    call = [[{"name": "spawn_tree", "arguments": {"marker": marker + isolation, "then": "hang"}}]]
    threading.Thread(target=box.run_batch, args=(call,), daemon=True).start()
    while len(tools.marked(marker + isolation)) < len(tools.ROLES):
        time.sleep(0.02)
print(json.dumps([pid for isolation in ("process", "sandbox") for pid in tools.marked(marker + isolation).values()]))
sys.stdout.flush()
os._exit(0)  # the trainer dies, its tools still hanging
"""


@needs_bwrap
def test_a_trainer_that_dies_takes_the_trees_with_it():
    """The keeper learns the trainer is gone from its lifeline (a pipe only the trainer holds)."""
    marker = f"dead{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", TRAINER, marker], capture_output=True, text=True, timeout=120, env=env, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    pids = json.loads(done.stdout)
    assert len(pids) == 2 * len(tools.ROLES)
    until = time.monotonic() + 20
    while [p for p in pids if os.path.exists(f"/proc/{p}")] and time.monotonic() < until:
        time.sleep(0.05)
    assert [p for p in pids if os.path.exists(f"/proc/{p}")] == []


# -- the sandbox -------------------------------------------------------------------------------
@needs_bwrap
def test_it_cannot_read_the_trainers_files(sandboxed, processes, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    assert _call(processes, "read_file", path=str(secret)) == "s3cret"  # outside a sandbox it can
    for path in (secret, REPO / "README.md", REPO / "pyproject.toml"):
        message = _call(sandboxed, "read_file", path=str(path))
        assert message.startswith("Error: read_file raised FileNotFoundError: [Errno 2] No such file"), message
    assert "s3cret" not in _call(sandboxed, "read_file", path=str(secret))


@needs_bwrap
def test_it_has_no_network(sandboxed, processes):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        server.settimeout(5)
        port = server.getsockname()[1]
        assert _call(processes, "connect", port=port) == "connected"  # outside a sandbox it can
        server.accept()[0].close()
        message = _call(sandboxed, "connect", port=port)
        assert message.startswith("Error: connect raised ConnectionRefusedError"), message
        server.settimeout(0.3)
        with pytest.raises(TimeoutError):  # nothing reached the trainer's listening socket
            server.accept()


@needs_bwrap
def test_it_writes_only_in_its_scratch(sandboxed, tmp_path):
    outside = tmp_path / "written.txt"
    message = _call(sandboxed, "write_file", path=str(outside), text="x")
    assert message.startswith("Error: write_file raised FileNotFoundError"), message
    in_repo = REPO / "tmpl" / "sandbox_was_here.py"
    message = _call(sandboxed, "write_file", path=str(in_repo), text="x")
    assert message == f"Error: write_file raised OSError: [Errno 30] Read-only file system: '{in_repo}'"
    message = _call(sandboxed, "write_file", path="/usr/bin/tool", text="x")
    assert message == "Error: write_file raised OSError: [Errno 30] Read-only file system: '/usr/bin/tool'"
    assert not outside.exists() and not in_repo.exists() and not Path("/usr/bin/tool").exists()
    assert _call(sandboxed, "write_file", path="/scratch/notes.txt", text="kept") == (
        "wrote 4 characters to /scratch/notes.txt"
    )
    assert _call(sandboxed, "read_file", path="/scratch/notes.txt") == "kept"  # the worker's scratch lasts
    assert not Path("/scratch/notes.txt").exists()
    where = sandboxed.run_batch([[{"name": "where", "arguments": {}}]]).outcomes[0][0].output
    assert where["cwd"] == "/scratch" and "notes.txt" in where["files"]
    if os.getuid() == 0:  # root runs the sandbox as a user of its own
        assert where["uid"] >= 2_000_000_000


@needs_bwrap
def test_filling_the_disk_fills_only_its_scratch(sandboxed):
    message = _call(sandboxed, "fill_disk", mb=10 * SCRATCH_MB)
    assert message.startswith("Error: fill_disk raised OSError: [Errno 28] No space left on device after "), message
    assert int(message.rsplit(" after ", 1)[1].split()[0]) <= SCRATCH_MB
    assert not Path("filler.bin").exists()
    assert _call(sandboxed, "write_file", path="/scratch/filler.bin", text="") == (
        "wrote 0 characters to /scratch/filler.bin"
    )  # freed, for the tests after


@needs_bwrap
def test_the_limits_of_process_isolation_hold(sandboxed):
    assert _call(sandboxed, "allocates", city="Paris") == (
        "Error: allocates crashed: it ran out of its memory limit of 256 MB"
    )
    assert _call(sandboxed, "segfaults", city="Paris").startswith(
        "Error: segfaults crashed: its worker process was killed by SIGSEGV"
    )
    flood = _call(sandboxed, "floods", city="Paris")
    assert flood.startswith("sunny and warm, ") and "\n[tool output cut: " in flood
    assert _call(sandboxed, "add", a=2, b=3) == "5"


@needs_bwrap
def test_a_fork_bomb_is_bounded_and_its_processes_die_with_the_sandbox(sandboxed):
    """(Also: each Toolbox's sandboxes have scratches of their own.)"""
    assert _call(sandboxed, "write_file", path="/scratch/notes.txt", text="mine") == (
        "wrote 4 characters to /scratch/notes.txt"
    )
    box = tmpl.Toolbox(
        [tools.fork_many, tools.fork_bomb, tools.read_file],
        isolation="sandbox",
        workers=1,
        timeout=20,
        sandbox=Sandbox(max_processes=MAX_PROCESSES),
    )
    try:
        message = _call(box, "read_file", path="/scratch/notes.txt")  # the other sandbox's scratch
        assert message.startswith("Error: read_file raised FileNotFoundError"), message
        assert _call(box, "fork_bomb", seconds=1.0) == "done"  # its forks, back in the worker's loop, left
        message = _call(box, "fork_many", n=200)
        prefix = "Error: fork_many raised BlockingIOError: [Errno 11] Resource temporarily unavailable after "
        assert message.startswith(prefix), message
        started = int(message[len(prefix) :].split()[0])
        # bounded: the fork bomb's own forks may still hold every slot (cold run 20: 0 started), never more
        assert 0 <= started < MAX_PROCESSES
        init = box.pool._slots[0].proc.init
        inside = descendants(init)
        assert len(inside) >= started + 1  # the worker and its sleeping children, seen from here
    finally:
        box.close()
    assert [pid for pid in inside if os.path.exists(f"/proc/{pid}")] == []


def test_a_missing_bwrap_is_a_clear_error():
    with pytest.raises(SandboxError, match=r"bubblewrap \('no-such-bwrap'\) is not installed: `apt-get install"):
        tmpl.Toolbox([tools.add], isolation="sandbox", sandbox=Sandbox(bwrap="no-such-bwrap"))
    with pytest.raises(ToolboxError, match="sandbox= is for isolation='sandbox', not 'process'"):
        tmpl.Toolbox([tools.add], isolation="process", sandbox=Sandbox())
    with pytest.raises(SandboxError, match="scratch_mb must be a positive integer, not 0"):
        Sandbox(scratch_mb=0)
