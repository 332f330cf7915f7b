"""A process a test starts through ``tests/reaper.py`` (every vLLM server: ``vllm_servers.start_server``)
ends with the test process, however that ends: here the test process is a child that starts a tree
of processes (a child, a grandchild) as ``start_server`` starts a server, then is killed with SIGKILL.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

from .vllm_servers import REAPER, stop

#: a command that starts a child and a grandchild and waits: each prints its pid
TREE = "sleep 300 & echo $!; (sleep 301 & echo $!; wait) & wait"

PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    proc = subprocess.Popen([sys.executable, {reaper!r}, "bash", "-c", {tree!r}], start_new_session=True)
    print(proc.pid, flush=True)
    time.sleep(600)
    """
)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def wait_gone(pids: list[int], limit: float = 20.0) -> list[int]:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def read_pids(stream, n: int, limit: float = 20.0) -> list[int]:
    pids: list[int] = []
    deadline = time.monotonic() + limit
    while len(pids) < n and time.monotonic() < deadline:
        line = stream.readline()
        if line.strip():
            pids.append(int(line))
    assert len(pids) == n, f"read {pids} of {n} pids"
    return pids


def test_a_killed_test_process_takes_the_servers_process_tree_with_it():
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT.format(reaper=str(REAPER), tree=TREE)], stdout=subprocess.PIPE, text=True
    )
    try:
        [reaper] = read_pids(parent.stdout, 1)
        tree = _children_pids(reaper)
        assert len(tree) >= 4, tree  # bash, its sleep, the subshell and its sleep
        assert all(alive(p) for p in [reaper, *tree])
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        assert wait_gone([reaper, *tree]) == [], "processes outlived the killed test process"
    finally:
        parent.kill()


def test_stop_ends_the_whole_tree_and_a_tree_whose_command_ends_goes_too():
    proc = subprocess.Popen([sys.executable, str(REAPER), "bash", "-c", TREE], start_new_session=True)
    tree = _children_pids(proc.pid)
    stop(proc)  # what the test fixtures call: SIGTERM to the group
    assert wait_gone([proc.pid, *tree]) == []
    # the command exits on its own (a server that crashed): what it started does not linger
    proc = subprocess.Popen(
        [sys.executable, str(REAPER), "bash", "-c", "sleep 300 & echo $!; exit 3"],
        start_new_session=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    [orphan] = read_pids(proc.stdout, 1)
    assert proc.wait(20) == 3
    assert wait_gone([orphan]) == []


def _children_pids(root: int, limit: float = 20.0) -> list[int]:
    """Every descendant of ``root`` once the tree has its four processes (bash, sleep, subshell, sleep);
    what there is after ``limit`` seconds otherwise."""
    deadline = time.monotonic() + limit
    found: list[int] = []
    while time.monotonic() < deadline:
        found = []
        frontier = [root]
        while frontier:
            pid = frontier.pop()
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except FileNotFoundError:
                kids = []
            found += kids
            frontier += kids
        if len(found) >= 4:  # bash, its sleep, the subshell, the subshell's sleep
            return found
        time.sleep(0.05)
    return found
