"""A worker's whole process tree, killed with it: a keeper process that is the tree's subreaper.

``isolation="process"`` starts each worker under a *keeper*: a small process forked from the
forkserver that sets ``PR_SET_CHILD_SUBREAPER`` and then forks the worker. Every process the
worker starts stays in the keeper's tree, whatever it does: an orphan (a grandchild whose parent
exited, a daemon that double-forks, a child that called ``setsid``, which leaves its process
group and session) is re-parented to the keeper, not to init. When the worker ends, however it
ends (killed by the pool at a timeout, a crash, an exit, its pipe closed), the keeper sweeps:
it kills (``SIGKILL``) every process still below it, found through ``/proc``, and reaps them,
until it has no child left; then it exits with the worker's own status (so the pool reads the
worker's exit code or signal). The pool kills a worker with ``SIGTERM`` to its keeper, which
kills the worker with ``SIGKILL`` and sweeps; the keeper does the same when its *lifeline* (a pipe
whose write end only the pool holds) reaches EOF: the trainer died.

Why a subreaper and not a process group, a PID namespace or a cgroup: a process group is left
by ``setsid``; a PID namespace needs privileges (or a user namespace, often disabled) and is
what the sandbox uses (:mod:`.sandbox`); a cgroup needs a writable, delegated cgroup tree. A
subreaper needs nothing (Linux 3.4+, any user), and since the keeper reaps what it adopts, no
zombie is left to an init that may not reap (PID 1 in many containers does not).

>>> descendants(os.getpid()) == [] or True
True
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
import threading
import time

TYPE_CHECKING = False  # not typing's: importing typing costs a keeper ~10 ms

if TYPE_CHECKING:  # a keeper starts for every harness run: it imports only what it runs
    from collections.abc import Callable
    from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
#: seconds a sweep keeps killing before it gives up (a process stuck in the kernel, ``D`` state)
SWEEP_LIMIT = 10.0


def prctl(option: int, value: int) -> None:
    """``prctl(option, value)`` through libc; raises OSError when it fails."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def descendants(root: int) -> list[int]:
    """PIDs of every process below ``root`` (children, their children, ...), read from ``/proc``.

    >>> descendants(os.getpid())
    []
    """
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # it exited while we looked
            continue
        ppid = int(stat[stat.rfind(b")") + 2 :].split()[1])  # the name in () may hold spaces
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def sweep(limit: float = SWEEP_LIMIT) -> bool:
    """Kill every process below this one and reap them all; False if some outlived ``limit`` s.

    Done when this process has no child left: with it a subreaper, no process below it can be
    alive then (a live descendant's chain of parents ends at one of its children).
    """
    me, until = os.getpid(), time.monotonic() + limit
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return True
        if time.monotonic() > until:
            return False
        for pid in descendants(me):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.001)


def _exit_as(status: int, as_code: bool = False) -> None:
    """End this process the way a child with wait ``status`` ended (its signal, or its exit code;
    ``as_code``: a signal as the exit code 128 + its number, as a shell says it)."""
    if os.WIFSIGNALED(status) and as_code:
        os._exit(128 + os.WTERMSIG(status))
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL and SIGSTOP cannot be caught anyway
            pass
        os.kill(os.getpid(), sig)
        time.sleep(1)  # the signal is delivered before this ends; if not: the conventional code
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _watch(fd: int, then: Callable[[], None]) -> None:
    """Read ``fd`` until its EOF, then call ``then``."""
    try:
        while os.read(fd, 1):
            pass
    except OSError:
        pass
    then()


def keep(
    main: Callable[..., Any], conn: Any, *args: Any, as_code: bool = False, lifeline: Any = None, ended: int = -1
) -> None:
    """Become the subreaper of a new process running ``main(conn, *args)``; when it ends, kill and
    reap everything it left, then exit as it did. ``SIGTERM`` here kills it (``SIGKILL``) first.
    ``conn``: the worker's end of its pipe, closed here (so that the worker's death is an EOF).
    ``as_code``: exit with 128 + the signal that killed it (PID 1 of a namespace, as in a
    sandbox, cannot send itself a signal). ``lifeline``: the read end (a file descriptor, or an
    object with ``fileno()``) of a pipe whose write end only the trainer holds: at its EOF (the
    trainer died) the worker is killed and its tree swept. ``ended``: a pipe's write end (or -1) told
    ``time.monotonic()`` when the worker ended, before the sweep (what a caller times the kill by)."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # its parent gone (the forkserver, bwrap): sweep too
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    worker: dict[str, int | None] = {"pid": None}
    stop = {"asked": False}

    def on_term(*_: Any) -> None:
        stop["asked"] = True
        pid = worker["pid"]
        if pid is not None:  # None once reaped: its PID may belong to someone else by now
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:  # reaped a moment ago, its PID not yet cleared above
                pass

    signal.signal(signal.SIGTERM, on_term)
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        code = 1
        try:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the keeper killed outright: the worker too
            main(conn, *args)
            code = 0
        except BaseException:  # noqa: BLE001 - the worker's crash, on its stderr as a Process shows it
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(code)
    worker["pid"] = pid
    conn.close()
    if lifeline is not None:  # a thread only now: the fork above was made single-threaded
        fd = lifeline if isinstance(lifeline, int) else lifeline.fileno()
        threading.Thread(target=_watch, args=(fd, on_term), daemon=True).start()
    if stop["asked"]:
        os.kill(pid, signal.SIGKILL)
    while True:
        got, status = os.waitpid(-1, 0)  # reaps orphans adopted meanwhile, too
        if got == pid:
            worker["pid"] = None
            break
    if ended >= 0:
        try:
            os.write(ended, repr(time.monotonic()).encode())
            os.close(ended)
        except OSError:  # the caller gone: the sweep goes on
            pass
    sweep()
    _exit_as(status, as_code)
