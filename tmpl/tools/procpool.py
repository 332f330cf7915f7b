"""A fixed pool of tool worker processes: each call under its timeout, a worker that fails is replaced.

``size`` slots, each one dispatcher thread and at most one worker process (so never more than
``size`` of either). A slot takes the next queued call, sends it to its worker and waits for
the answer until the call's deadline (its timeout counted from :meth:`ProcessPool.submit`, so
time spent waiting for a free worker counts; a call still queued at its deadline is answered as
timed out without running; starting a replacement worker, milliseconds from the forkserver,
may add to it); then

- answer in time: the call's :class:`Answer` is ``"ok"`` / ``"raised"`` (the worker lives on);
- timeout: the worker is killed (``SIGKILL``: a loop in C stops too), with every process it
  started (:mod:`.proctree`; in a sandbox its PID namespace), and the answer says so;
- the worker died (``os._exit``, a segfault, ``SIGXCPU`` at its CPU limit, the kernel killing
  it, ``MemoryError`` at its memory limit): the answer says how;

and a fresh worker is started for the slot's next call. Workers start clean, from the
``forkserver`` (nothing of the caller is inherited: not its threads, locks, tokenizers or
memory), so tools reach them pickled: see :class:`tmpl.errors.ToolIsolationError`. With a
``launcher`` (:class:`.sandbox.Launcher`) the same worker starts in a bubblewrap sandbox instead.

>>> pool = ProcessPool(pack_tools({"pow": pow}), size=1)
>>> pool.submit("pow", {"base": 2, "exp": 10}, timeout=30).result().content
'1024'
>>> pool.close()
"""

from __future__ import annotations

import collections
import concurrent.futures
import multiprocessing
import pickle
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ToolIsolationError
from .procworker import Reply
from .sandbox import Launcher

#: seconds a new worker may take to load its tools before its call is answered as failed
START_TIMEOUT = 60.0
_CONTEXT_LOCK = threading.Lock()
#: why a worker may die while it starts: the forkserver runs the main script again in each worker
_MAIN_HINT = (
    " before loading its tools (its stderr says why; a script that builds a process Toolbox needs"
    " `if __name__ == '__main__':` around it, since each worker imports the main module)"
)
_SANDBOX_HINT = " before loading its tools (bwrap's or the worker's stderr says why)"


@dataclass(frozen=True)
class Answer:
    """How a call ended in a worker: ``kind`` is ``"ok"``, ``"raised"``, ``"timeout"`` or ``"crashed"``.

    ``content``: the result (``"ok"``), ``"Type: message"`` (``"raised"``) or what became of the
    worker (``"crashed"``). ``chars``: the result's length before the worker cut it.
    """

    kind: str
    content: str
    latency: float | None
    chars: int = 0
    value: Any = None


def _context() -> Any:
    """The forkserver context, with this package preloaded there (workers fork from it warm)."""
    ctx = multiprocessing.get_context("forkserver")
    with _CONTEXT_LOCK:
        ctx.set_forkserver_preload(["tmpl.tools.procworker"])
    return ctx


def _death(exitcode: int | None, memory_mb: int | None, cpu_seconds: float | None) -> str:
    """What became of a worker, in words, from its exit code."""
    if exitcode is None:
        return "its worker process stopped answering"
    if exitcode >= 0:
        return f"its worker process exited with code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        name = f"signal {-exitcode}"
    why = {
        "SIGXCPU": f" (its CPU time limit of {cpu_seconds:g} s)" if cpu_seconds else " (its CPU time limit)",
        "SIGKILL": f" (perhaps for memory: its limit is {memory_mb} MB)" if memory_mb else "",
        "SIGSEGV": " (a crash in native code)",
        "SIGABRT": f" (native code aborted, perhaps out of memory: its limit is {memory_mb} MB)"
        if memory_mb
        else " (native code aborted)",
    }.get(name, "")
    return f"its worker process was killed by {name}{why}"


def pack_tools(tools: Mapping[str, Any], factory: Callable[[], Sequence[Any]] | None = None) -> bytes:
    """What a worker loads its tools from: ``pickle.dumps(factory)``, or ``{name: tool}`` pickled.

    Raises :class:`~tmpl.errors.ToolIsolationError` naming the first tool (or the factory) that
    does not pickle.

    >>> len(pack_tools({"pow": pow})) > 0
    True
    """
    if factory is not None:
        try:
            return pickle.dumps(factory)
        except Exception as exc:  # noqa: BLE001 - any pickling failure: the same advice
            raise ToolIsolationError(
                getattr(factory, "__qualname__", repr(factory)),
                f"worker_tools does not pickle ({type(exc).__name__}: {exc}); "
                "make it a function at module level of an importable module",
            ) from None
    for name, fn in tools.items():
        try:
            pickle.dumps(fn)
        except Exception as exc:  # noqa: BLE001 - any pickling failure: the same advice
            raise ToolIsolationError(
                name,
                f"it does not pickle ({type(exc).__name__}: {exc}); define it at module level of an importable "
                "module, or pass worker_tools=<a module-level function that returns the tools>",
            ) from None
    return pickle.dumps(dict(tools))


class _Job:
    __slots__ = ("name", "args", "timeout", "max_chars", "future", "deadline")

    def __init__(self, name: str, args: dict[str, Any], timeout: float, max_chars: int | None) -> None:
        self.name, self.args, self.timeout, self.max_chars = name, args, timeout, max_chars
        self.deadline = time.monotonic() + timeout  # from submission: waiting for a worker counts
        self.future: concurrent.futures.Future[Answer] = concurrent.futures.Future()


class ProcessPool:
    """``size`` worker processes running pickled tools; :meth:`submit` returns a future of an :class:`Answer`.

    ``blob``: ``pickle.dumps({name: tool})`` or ``pickle.dumps(factory)`` (a module-level callable
    returning the tools, called once in each worker). ``memory_mb``: address space a worker may
    add to what it holds after loading its tools (None: no limit). ``cpu_seconds``: CPU time one
    call may use (None: as many seconds as its timeout). ``launcher``: start each worker in a
    sandbox (:meth:`.sandbox.Sandbox.launcher`) instead of from the forkserver.
    """

    def __init__(
        self,
        blob: bytes,
        *,
        size: int = 2,
        memory_mb: int | None = 1024,
        cpu_seconds: float | None = None,
        name: str = "tmpl-tool-process",
        launcher: Launcher | None = None,
    ) -> None:
        self.blob = blob
        self.launcher = launcher
        self.size = size
        self.memory_mb = memory_mb
        self.cpu_seconds = cpu_seconds
        self.name = name
        self.started = 0  # worker processes started so far (replacements included)
        self._queue: collections.deque[_Job] = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._slots: list[_Slot] = []
        self._closed = False

    @property
    def processes(self) -> int:
        """Worker processes alive now."""
        with self._cond:
            return sum(1 for s in self._slots if s.proc is not None and s.proc.is_alive())

    @property
    def threads(self) -> int:
        """Dispatcher threads alive now."""
        with self._cond:
            return sum(1 for s in self._slots if s.thread.is_alive())

    def submit(
        self, name: str, args: dict[str, Any], timeout: float, max_chars: int | None = None
    ) -> concurrent.futures.Future[Answer]:
        """Queue a call of tool ``name``; its :class:`Answer` lands in the future (never an exception)."""
        job = _Job(name, args, timeout, max_chars)
        with self._cond:
            self._closed = False
            self._queue.append(job)
            self._slots = [s for s in self._slots if s.thread.is_alive()]
            idle = len(self._slots) - self._busy()
            if len(self._slots) < self.size and len(self._queue) > idle:
                slot = _Slot(self)
                self._slots.append(slot)
                slot.thread.start()
            self._cond.notify()
        return job.future

    def check(self, names: list[str]) -> None:
        """Start one worker now; raise :class:`~tmpl.errors.ToolIsolationError` if it cannot load
        the tools or lacks one of ``names`` (rather than answering every call with the failure)."""
        slot = _Slot(self)
        failed = slot.start()
        missing: list[str] = []
        if failed is None and slot.loaded is not None:
            missing = [n for n in names if n not in slot.loaded]
            if missing:
                failed = f"the worker's tools lack {', '.join(missing)} (loaded: {', '.join(slot.loaded) or 'none'})"
        if failed is not None:
            slot.stop()
            raise ToolIsolationError(missing[0] if missing else ", ".join(names), failed)
        with self._cond:
            self._slots.append(slot)
            slot.thread.start()

    def close(self) -> None:
        """Stop every worker and dispatcher (queued calls are answered as cancelled first)."""
        with self._cond:
            self._closed = True
            slots, self._slots = self._slots, []
            queued = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for job in queued:
            job.future.set_result(Answer("crashed", "the tool pool was closed before the call ran", None))
        for slot in slots:
            if slot.thread is not threading.current_thread():  # closed from a finalizer run by the slot itself
                slot.thread.join(5)
            slot.stop()

    def _busy(self) -> int:
        return sum(1 for s in self._slots if s.busy)


class _Slot:
    """One dispatcher thread and its worker process."""

    def __init__(self, pool: ProcessPool) -> None:
        self.pool = pool
        self.proc: Any = None
        self.conn: Any = None
        self.life: Any = None  # the write end of the worker's lifeline (see .proctree.keep)
        self.busy = False
        self.loaded: list[str] | None = None  # the tool names its worker loaded
        self.thread = threading.Thread(target=self.serve, name=pool.name, daemon=True)

    def serve(self) -> None:
        pool = self.pool
        while True:
            with pool._cond:
                while not pool._queue:
                    if pool._closed:
                        return
                    pool._cond.wait()
                job = pool._queue.popleft()
                self.busy = True
            try:
                if job.future.set_running_or_notify_cancel():
                    job.future.set_result(self.run(job))
            finally:
                self.busy = False
                del job  # while idle, hold nothing of the caller's (its callbacks hold its batch)

    def run(self, job: _Job) -> Answer:
        if job.deadline <= time.monotonic():  # it waited for a free worker until its time was up: not run
            return Answer("timeout", "", job.timeout)
        if self.proc is None or not self.proc.is_alive():
            failed = self.start()
            if failed is not None:
                return Answer("crashed", f"its worker process could not start: {failed}", None)
        left = max(job.deadline - time.monotonic(), 0.0)
        began = time.perf_counter()
        try:
            cpu = self.pool.cpu_seconds if self.pool.cpu_seconds is not None else job.timeout
            self.conn.send((job.name, job.args, job.max_chars, cpu))
        except (OSError, ValueError) as exc:
            self.stop()
            return Answer("crashed", f"its worker process could not take the call: {exc}", None)
        try:
            answered = self.conn.poll(left)
            reply: Reply | None = self.conn.recv() if answered else None
        except (EOFError, OSError):
            reply = None
            answered = True
        if not answered:
            self.stop(wait=0.0)
            return Answer("timeout", "", job.timeout)
        if reply is None or reply.kind == "memory":
            code = self.stop()
            if reply is not None:
                return Answer("crashed", f"it ran out of its memory limit of {self.pool.memory_mb} MB", reply.latency)
            latency = time.perf_counter() - began
            return Answer("crashed", _death(code, self.pool.memory_mb, self.pool.cpu_seconds), latency)
        return Answer(reply.kind, reply.content, reply.latency, reply.chars, reply.value)

    def start(self) -> str | None:
        """Start a worker and wait until it loaded its tools; why it failed, or None."""
        pool = self.pool
        from .procworker import kept

        hint = _MAIN_HINT
        if pool.launcher is not None:
            proc, parent, life = pool.launcher.start(pool.blob, pool.memory_mb)
            hint = _SANDBOX_HINT
        else:
            ctx = _context()
            parent, child = ctx.Pipe()
            lifeline, life = ctx.Pipe(duplex=False)  # its EOF tells the keeper the trainer died
            proc = ctx.Process(
                target=kept, args=(child, pool.blob, pool.memory_mb, lifeline), name=pool.name, daemon=True
            )
            proc.start()
            child.close()
            lifeline.close()
        pool.started += 1
        self.proc, self.conn, self.life = proc, parent, life
        try:
            if not parent.poll(START_TIMEOUT):
                self.stop()
                return f"it did not load its tools within {START_TIMEOUT:g} s"
            kind, detail = parent.recv()
        except (EOFError, OSError):
            return _death(self.stop(), pool.memory_mb, pool.cpu_seconds) + hint
        if kind != "ready":
            self.stop()
            return str(detail)
        self.loaded = list(detail)
        return None

    def stop(self, wait: float = 0.05) -> int | None:
        """Kill the worker (if any; after ``wait`` s for one already dying) with every process it
        started, and reap it; its exit code.

        ``terminate`` kills the whole tree: a worker's keeper kills the worker, then everything
        below it, then exits (:mod:`.proctree`); a sandbox's init dies, and its PID namespace
        with it. ``kill`` is the last resort, for a keeper that does not end.
        """
        proc, conn, self.proc, self.conn = self.proc, self.conn, None, None
        life, self.life = self.life, None
        if conn is not None:
            conn.close()
        if proc is None:
            return None
        if wait and proc.is_alive():
            proc.join(wait)  # one that is dying already (a crash) keeps its own exit code
        if proc.is_alive():
            proc.terminate()
            proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        if life is not None:
            life.close()
        code: int | None = proc.exitcode
        if code is not None:
            proc.close()
        return code
