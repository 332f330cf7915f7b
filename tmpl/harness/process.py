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
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .keeper import KEEPER, keeper_argv

__all__ = ["KeeperPool", "KeeperServer", "Ran", "run_kept", "tail"]

#: seconds the keeper may take to kill and reap the tree after SIGTERM before it is killed itself
KILL_WAIT = 15.0


@dataclass(frozen=True)
class Ran:
    """How a command ended: its exit code (``-N``: killed by signal N), whether its timeout ended it,
    its wall seconds, and the keeper's PID. Of ``seconds``, ``start``: until the keeper was running
    (forked, or started); ``kill``: from the command's end (its exit, or its timeout's ``SIGTERM``) to
    its whole tree reaped and the keeper's end seen here (a keeper of its own, not forked from a
    :class:`KeeperServer`, cannot say when its command ended: 0.0 unless it timed out)."""

    exit_code: int
    timed_out: bool
    seconds: float
    pid: int
    start: float = 0.0
    kill: float = 0.0


async def run_kept(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None,
    timeout: float,
    out: Path,
    err: Path,
    wrap: Sequence[str] | None = None,
    server: KeeperServer | KeeperPool | None = None,
) -> Ran:
    """Run ``argv`` in ``cwd`` with ``env`` (None: this process's) under a keeper, up to ``timeout``
    seconds; its output to the files ``out`` and ``err``. ``wrap``: an argv put before the keeper's (a
    sandbox launcher: the keeper then runs inside it). ``server``: fork the keeper from this
    :class:`KeeperServer` (or :class:`KeeperPool`) instead of starting one. Raises OSError if the keeper
    cannot start."""
    if server is not None and server.sock is not None and not wrap:
        ran = await _run_served(server, argv, cwd, env, timeout, out, err)
        if ran is not None:
            return ran
        # None: nothing was started (the request too large for its socket, the server gone): a keeper of its own
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
    start = time.perf_counter() - began
    timed_out, stopped = False, 0.0
    try:
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            timed_out, stopped = True, time.perf_counter()
            await _stop(proc)
    except BaseException:  # cancelled: the tree goes too
        await asyncio.shield(_stop(proc))
        raise
    finally:
        os.close(write)
    code, now = proc.returncode, time.perf_counter()
    kill = now - stopped if timed_out else 0.0
    return Ran(code if code is not None else -signal.SIGKILL, timed_out, now - began, proc.pid, start, kill)


class KeeperServer:
    """One warm keeper server (``keeper.py --serve``) per batch: each run's keeper is forked from it, so a
    run costs no interpreter start (tens of ms of CPU each, the better part of tmpl's overhead per run). It
    dies with this process (its parent-death signal, and its socket's EOF), and its keepers with it.

    >>> import tempfile
    >>> async def main():
    ...     async with KeeperServer() as server:
    ...         d = Path(tempfile.mkdtemp())
    ...         return await run_kept(["sh", "-c", "exit 4"], cwd=d, env=None, timeout=30, out=d / "o", err=d / "e", server=server)
    >>> asyncio.run(main()).exit_code
    4
    """

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self._ids = 0
        self._started: dict[int, asyncio.Future[int]] = {}
        self._ended: dict[int, asyncio.Future[int]] = {}

    async def __aenter__(self) -> KeeperServer:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-S", KEEPER, "--serve", str(theirs.fileno()),
                stdin=asyncio.subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
            )  # fmt: skip
        finally:
            theirs.close()
        ours.setblocking(False)
        self.sock = ours
        asyncio.get_running_loop().add_reader(ours.fileno(), self._read)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.sock is not None:
            asyncio.get_running_loop().remove_reader(self.sock.fileno())
            self.sock.close()  # its EOF ends the server
            self.sock = None
        if self.proc is not None:
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        for future in (*self._started.values(), *self._ended.values()):
            if not future.done():
                future.set_exception(OSError("the keeper server stopped"))

    def _read(self) -> None:
        assert self.sock is not None
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:  # the server died: every run waiting on it fails
                asyncio.get_running_loop().remove_reader(self.sock.fileno())
                for future in (*self._started.values(), *self._ended.values()):
                    if not future.done():
                        future.set_exception(OSError("the keeper server exited"))
                return
            message = json.loads(data)
            ended = self._ending(message["pid"])  # made here: its status may come before start() resumes
            if "id" in message:
                started = self._started.pop(message["id"], None)
                if started is not None and not started.done():
                    started.set_result(message["pid"])
            elif not ended.done():
                ended.set_result(os.waitstatus_to_exitcode(message["status"]))

    def _ending(self, pid: int) -> asyncio.Future[int]:
        future = self._ended.get(pid)
        if future is None:
            future = self._ended[pid] = asyncio.get_running_loop().create_future()
        return future

    async def start(
        self, argv: Sequence[str], cwd: Path, env: Mapping[str, str] | None, out: int, err: int, ended: int = -1
    ) -> int:
        """Fork a keeper of ``argv`` (its output to the descriptors ``out``, ``err``; ``ended``: a pipe's
        write end it tells the ``time.monotonic()`` its command ended, or -1); its PID."""
        if self.sock is None:
            raise OSError("the keeper server is not running")
        loop = asyncio.get_running_loop()
        self._ids += 1
        key = self._ids
        started: asyncio.Future[int] = loop.create_future()
        self._started[key] = started
        body = json.dumps({"id": key, "argv": list(argv), "cwd": str(cwd), "env": dict(env or os.environ)}).encode()
        until = time.monotonic() + 30
        while True:
            try:
                socket.send_fds(self.sock, [body], [out, err] if ended < 0 else [out, err, ended])
                break
            except BlockingIOError:  # its queue is full: let the loop read its answers meanwhile
                if time.monotonic() > until:
                    self._started.pop(key, None)
                    raise
                await asyncio.sleep(0.002)
            except OSError:
                self._started.pop(key, None)
                raise
        return await started

    async def wait(self, pid: int) -> int:
        """The exit code of the keeper ``pid`` (``-N``: killed by signal N) once it ended."""
        future = self._ending(pid)
        code = await asyncio.shield(future)
        if self._ended.get(pid) is future:
            del self._ended[pid]  # PIDs are reused: the next keeper with this one gets a fresh future
        return code


class KeeperPool:
    """``size`` :class:`KeeperServer` s, each keeper forked by the one with the fewest keepers running.
    One server forks its keepers one after another, and on a machine busier than its cores it gets one
    process's share of them: at concurrency 32 on 2 busy cores, runs queued seconds for their start.
    Several fork side by side, each with its share. Servers that could not start are left out (OSError
    when none could).

    >>> import tempfile
    >>> async def main():
    ...     async with KeeperPool(2) as pool:
    ...         d = Path(tempfile.mkdtemp())
    ...         runs = [run_kept(["sh", "-c", f"exit {k}"], cwd=d, env=None, timeout=30, out=d / f"o{k}", err=d / f"e{k}", server=pool) for k in range(3)]
    ...         codes = [r.exit_code for r in await asyncio.gather(*runs)]
    ...         return codes, len(pool.servers), sorted(pool._running.values())
    >>> asyncio.run(main())
    ([0, 1, 2], 2, [0, 0])
    """

    def __init__(self, size: int) -> None:
        self.servers = [KeeperServer() for _ in range(max(1, size))]
        self._owner: dict[int, KeeperServer] = {}
        self._running: dict[int, int] = {id(s): 0 for s in self.servers}

    @property
    def sock(self) -> socket.socket | None:
        """A live server's socket, or None when none is running (what :func:`run_kept` asks)."""
        return next((s.sock for s in self.servers if s.sock is not None), None)

    async def __aenter__(self) -> KeeperPool:
        started: list[KeeperServer] = []
        for server in self.servers:
            try:
                started.append(await server.__aenter__())
            except OSError:
                continue
        if not started:
            raise OSError("no keeper server could start")
        self.servers = started
        return self

    async def __aexit__(self, *exc: object) -> None:
        for server in self.servers:
            await server.__aexit__(*exc)

    async def start(
        self, argv: Sequence[str], cwd: Path, env: Mapping[str, str] | None, out: int, err: int, ended: int = -1
    ) -> int:
        """:meth:`KeeperServer.start` on the live server with the fewest keepers running."""
        live = [s for s in self.servers if s.sock is not None]
        if not live:
            raise OSError("no keeper server is running")
        server = min(live, key=lambda s: self._running[id(s)])
        self._running[id(server)] += 1
        try:
            pid = await server.start(argv, cwd, env, out, err, ended)
        except BaseException:
            self._running[id(server)] -= 1
            raise
        self._owner[pid] = server
        return pid

    async def wait(self, pid: int) -> int:
        """:meth:`KeeperServer.wait` on the server that forked ``pid``."""
        server = self._owner[pid]
        code = await server.wait(pid)
        if self._owner.pop(pid, None) is server:
            self._running[id(server)] -= 1
        return code


async def _run_served(
    server: KeeperServer | KeeperPool,
    argv: Sequence[str],
    cwd: Path,
    env: Mapping[str, str] | None,
    timeout: float,
    out: Path,
    err: Path,
) -> Ran | None:
    began = time.perf_counter()
    told, tell = os.pipe()  # the keeper writes when its command ended: the kill is timed from there
    try:
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            try:
                pid = await server.start(argv, cwd, env, stdout.fileno(), stderr.fileno(), tell)
            except OSError:
                os.close(told)
                return None
    finally:
        os.close(tell)
    start = time.perf_counter() - began
    timed_out, stopped = False, 0.0

    async def stop() -> int:
        with contextlib.suppress(ProcessLookupError):  # not reaped yet (its status not in): the PID is its own
            os.kill(pid, signal.SIGTERM)
        try:
            return await asyncio.wait_for(server.wait(pid), KILL_WAIT)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            return await server.wait(pid)

    try:
        try:
            code = await asyncio.wait_for(server.wait(pid), timeout)
        except TimeoutError:
            timed_out, stopped = True, time.monotonic()
            code = await stop()
    except BaseException:
        os.close(told)
        await asyncio.shield(stop())
        raise
    now = time.perf_counter()
    ended = _ended(told)  # the keeper exited: its write end is closed, the read cannot block
    kill = max(0.0, time.monotonic() - (stopped or ended or time.monotonic()))
    kill = min(kill, now - began - start)  # it ended before its start was seen here (a starved loop): no harness time
    return Ran(code, timed_out, now - began, pid, start, kill)


def _ended(fd: int) -> float:
    """The ``time.monotonic()`` a keeper wrote on the pipe ``fd`` (which it closes), or 0.0."""
    try:
        os.set_blocking(fd, False)  # nothing written (killed outright): no wait on a writer that is gone
        return float(os.read(fd, 64) or 0.0)
    except (OSError, ValueError):
        return 0.0
    finally:
        os.close(fd)


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
