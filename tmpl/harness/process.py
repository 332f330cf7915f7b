"""One command run to its end or its timeout, its whole process tree killed either way.

:func:`run_kept` starts ``argv`` under a keeper (:mod:`.keeper`, the subreaper of everything the command
starts), its stdout and stderr to files (never a pipe a daemon could hold open), its stdin
``/dev/null``; it waits up to ``timeout`` seconds, then sends the keeper ``SIGTERM``: the keeper kills
the command and every process left below it, reaps them and exits. The keeper also holds the read end
of a *lifeline*: if this process dies, the pipe's EOF makes the keeper do the same, so a trainer that
crashes leaves no harness behind.

>>> import asyncio, tempfile
>>> d = Path(tempfile.mkdtemp())
>>> ran = asyncio.run(run_kept(["sh", "-c", "echo hi; exit 3"], cwd=d, env=None, timeout=30, out=d / "o", err=d / "e"))
>>> ran.exit_code, ran.timed_out, (d / "o").read_text()
(3, False, 'hi\\n')
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .keeper import keeper_argv

__all__ = ["Ran", "run_kept", "tail"]

#: seconds the keeper may take to kill and reap the tree after SIGTERM before it is killed itself
KILL_WAIT = 15.0


@dataclass(frozen=True)
class Ran:
    """How a command ended: its exit code (``-N``: killed by signal N), whether its timeout ended it,
    its wall seconds, and the keeper's PID."""

    exit_code: int
    timed_out: bool
    seconds: float
    pid: int


async def run_kept(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None,
    timeout: float,
    out: Path,
    err: Path,
    wrap: Sequence[str] | None = None,
) -> Ran:
    """Run ``argv`` in ``cwd`` with ``env`` (None: this process's) under a keeper, up to ``timeout``
    seconds; its output to the files ``out`` and ``err``. ``wrap``: an argv put before the keeper's (a
    sandbox launcher: the keeper then runs inside it). Raises OSError if the keeper cannot start."""
    read, write = os.pipe()
    began = time.perf_counter()
    try:
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            proc = await asyncio.create_subprocess_exec(
                *(list(wrap or ()) + keeper_argv(argv, read)),
                cwd=str(cwd),
                env=None if env is None else dict(env),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                pass_fds=(read,),
            )
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    timed_out = False
    try:
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            timed_out = True
            await _stop(proc)
    except BaseException:  # cancelled: the tree goes too
        await asyncio.shield(_stop(proc))
        raise
    finally:
        os.close(write)
    code = proc.returncode
    return Ran(code if code is not None else -signal.SIGKILL, timed_out, time.perf_counter() - began, proc.pid)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM to the keeper (it kills and reaps the tree), SIGKILL if it does not end."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), KILL_WAIT)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


def tail(path: Path, chars: int) -> str:
    """The last ``chars`` characters of a file (UTF-8, undecodable bytes replaced); '' if it is missing.

    >>> import tempfile; p = Path(tempfile.mkdtemp()) / "log"; _ = p.write_text("abcdef")
    >>> tail(p, 3)
    'def'
    """
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4 * chars))
            data = f.read()
    except OSError:
        return ""
    return data.decode("utf-8", "replace")[-chars:] if chars > 0 else ""
