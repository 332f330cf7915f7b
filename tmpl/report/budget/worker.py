"""The forked worker a job runs in (:class:`Worker`), what it sends back (:class:`Outcome`, :func:`progress`),
and the parent's wait on several of them, with their deadlines."""

from __future__ import annotations

import gc
import math
import os
import pickle
import select
import signal
import struct
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ...errors import BudgetExceededError, TemplateError
from . import hooks
from .hooks import _Exceeded, _import_hooked_modules, _install_hooks, _set_limits, _vm_kb
from .limits import Budget

T = TypeVar("T")


I = TypeVar("I")  # noqa: E741 - an item of imap_budgeted


P = TypeVar("P")


_IN_WORKER = False


def in_worker() -> bool:
    """Whether this process is a budgeted worker (jobs started inside one run inline: the limits hold)."""
    return _IN_WORKER


def _encode_error(exc: BaseException) -> tuple[Any, ...]:
    """An exception as its class, args and attributes (exceptions with their own ``__init__`` do not
    survive plain pickling), or a description when those cannot be pickled."""
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    try:
        payload = (type(exc), exc.args, dict(vars(exc)))
        pickle.loads(pickle.dumps(payload))
        return ("error", payload, text)
    except Exception:  # noqa: BLE001 - whatever does not pickle is sent as text
        return ("error", None, text)


def _decode_error(payload: Any, text: str) -> BaseException:
    if payload is not None:
        cls, args, attrs = payload
        try:
            exc = cls.__new__(cls, *args)
            exc.args = args
            exc.__dict__.update(attrs)
            return exc  # type: ignore[no-any-return]
        except Exception:  # noqa: BLE001 - fall back to the text
            pass
    return RuntimeError(f"in the budgeted worker: {text}")


_FRAME = struct.Struct("<Q")


_STEAL_MIN = 4  # a worker takes items of a group another worker has loaded when this many wait


_STUCK_S = 1.0  # ... or when that worker has been on one job this long (a check takes 0.2 s, median)


_RESPONSE_FD = -1


def progress(value: Any) -> None:
    """In a worker, send ``value`` to the parent at once (``Outcome.info``: what is known about the job
    so far, e.g. the template's name and fingerprint once loaded); elsewhere, do nothing."""
    if _IN_WORKER and _RESPONSE_FD >= 0:
        _send(_RESPONSE_FD, ("info", value))


def _send(fd: int, message: Any) -> None:
    try:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - a value that does not pickle
        data = pickle.dumps(("done", ("error", None, f"the job's result cannot be sent back: {exc!r}"), {}))
    view = memoryview(_FRAME.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _run_one(task: Callable[[int], Any], index: int, budget: Budget) -> tuple[Any, dict[str, float]]:
    limits = hooks._LIMITS  # set by _install_hooks when the worker started
    assert limits is not None
    start = time.perf_counter()
    start_kb = _set_limits(budget)
    limits.max_render = 0
    try:
        message: tuple[Any, ...] = ("ok", task(index))
    except _Exceeded as exc:
        message = ("exceeded", exc.what, exc.detail)
    except MemoryError:
        message = ("exceeded", "memory_mb", "an allocation failed")
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        message = _encode_error(exc)
    stats = {
        "seconds": time.perf_counter() - start,
        "memory_mb": max(0, _vm_kb("VmPeak") - start_kb) / 1024,
        "max_render_chars": limits.max_render,
    }
    return message, stats


def _serve(requests: int, responses: int, task: Callable[[int], Any], budget: Budget) -> None:
    """A worker's life: run ``task(index)`` for each index read from ``requests``, one at a time."""
    global _IN_WORKER, _RESPONSE_FD
    status = 1
    try:
        gc.freeze()  # the collector leaves inherited objects alone: no copy-on-write of the whole heap
        _IN_WORKER, _RESPONSE_FD = True, responses
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        _install_hooks(budget)
        while True:
            raw = os.read(requests, 4)
            if len(raw) < 4:
                break
            message, stats = _run_one(task, struct.unpack("<I", raw)[0], budget)
            try:
                _send(responses, ("done", message, stats))
            except MemoryError:
                _send(responses, ("done", ("exceeded", "memory_mb", "the result ran out of memory"), stats))
            if message[0] == "exceeded":
                break  # a fresh worker for the next job: this one may have run out of memory half-way
        status = 0
    except BaseException:  # noqa: BLE001 - never run the parent's code after this point
        status = 1
    finally:
        os._exit(status)


@dataclass
class Outcome(Generic[T]):
    """How a job ended: ``value`` or ``error`` (a :class:`~tmpl.errors.BudgetExceededError` among
    others), what the job sent with :func:`progress` (``info``), and what the worker measured
    (``seconds``, ``memory_mb`` of address space added, ``max_render_chars``; empty when killed)."""

    value: T | None = None
    error: BaseException | None = None
    stats: dict[str, float] = field(default_factory=dict)
    info: Any = None

    def get(self) -> T:
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


class Worker:
    """A forked worker process running ``task(index)`` for the indexes it is given, one at a time, each
    under ``budget``; the parent keeps the deadline and kills the worker when it passes."""

    def __init__(self, task: Callable[[int], Any], budget: Budget) -> None:
        _import_hooked_modules()
        self.budget = budget
        for stream in (sys.stdout, sys.stderr):  # or the child would print the parent's buffered text again
            try:
                stream.flush()
            except (AttributeError, ValueError, OSError):
                pass
        req_read, req_write = os.pipe()
        resp_read, resp_write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the worker (coverage does not follow it)
            os.close(req_write)
            os.close(resp_read)
            _serve(req_read, resp_write, task, budget)
        os.close(req_read)
        os.close(resp_write)
        self.pid, self.requests, self.responses = pid, req_write, resp_read
        self.alive = True
        self.groups: set[Any] = set()
        self.index: int | None = None
        self.name = ""
        self.started = self.deadline = math.inf
        self._buffer = bytearray()
        self._info: Any = None

    def fileno(self) -> int:
        return self.responses

    def submit(self, index: int, name: str) -> None:
        """Start job ``index`` (named ``name`` in errors); its deadline starts now."""
        self.index, self.name, self._info = index, name, None
        self.started = time.monotonic()
        self.deadline = self.started + self.budget.seconds
        os.write(self.requests, struct.pack("<I", index))

    def read(self) -> Outcome[Any] | None:
        """Read what the worker sent; the job's outcome once it is done (or the worker died), else None."""
        chunk = os.read(self.responses, 1 << 16)
        if not chunk:
            return self._end(self._died(self._reap()))
        self._buffer += chunk
        while len(self._buffer) >= _FRAME.size:
            (size,) = _FRAME.unpack_from(self._buffer)
            if len(self._buffer) < _FRAME.size + size:
                break
            message = pickle.loads(bytes(self._buffer[_FRAME.size : _FRAME.size + size]))
            del self._buffer[: _FRAME.size + size]
            if message[0] == "info":
                self._info = message[1]
                continue
            return self._end(self._decode(message[1], message[2]))
        return None

    def expire(self) -> Outcome[Any]:
        """The job's deadline passed: kill the worker; the wall-time outcome."""
        self.close()
        error = BudgetExceededError(
            self.name, "seconds", self.budget.describe("seconds"), "the check did not finish in time"
        )
        return self._end(Outcome(error=error))

    def close(self) -> None:
        """End the worker (at once: it holds nothing worth a clean exit)."""
        if self.alive:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:  # pragma: no cover - it just ended
                pass
            self._reap()

    def _reap(self) -> int:
        status = 0
        if self.alive:
            self.alive = False
            _, status = os.waitpid(self.pid, 0)
            os.close(self.requests)
            os.close(self.responses)
        return status

    def _end(self, outcome: Outcome[Any]) -> Outcome[Any]:
        outcome.info = self._info
        self.index, self.deadline = None, math.inf
        if isinstance(outcome.error, BudgetExceededError) or worker_crashed(outcome.error):
            self.close()  # the worker ends itself after a budget runs out; make sure
        return outcome

    def _decode(self, message: tuple[Any, ...], stats: dict[str, float]) -> Outcome[Any]:
        kind = message[0]
        if kind == "ok":
            return Outcome(value=message[1], stats=stats)
        if kind == "exceeded":
            error = BudgetExceededError(self.name, message[1], self.budget.describe(message[1]), message[2])
            return Outcome(error=error, stats=stats)
        return Outcome(error=_decode_error(message[1], message[2]), stats=stats)

    def _died(self, status: int) -> Outcome[Any]:
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            if sig == signal.SIGXCPU:
                return Outcome(
                    error=BudgetExceededError(self.name, "seconds", self.budget.describe("seconds"), "CPU time ran out")
                )
            if sig in (signal.SIGABRT, signal.SIGKILL):  # a native allocation failing under RLIMIT_AS aborts
                detail = f"the worker was ended by {name} (a native library out of memory)"
                return Outcome(
                    error=BudgetExceededError(self.name, "memory_mb", self.budget.describe("memory_mb"), detail)
                )
            return Outcome(
                error=_crashed(self.name, f"the worker checking it was ended by {name} (a crash in native code)")
            )
        return Outcome(error=_crashed(self.name, f"the worker checking it exited with status {os.WEXITSTATUS(status)}"))


def _crashed(name: str, reason: str) -> TemplateError:
    error = TemplateError(name, reason)
    error.worker_crashed = True  # type: ignore[attr-defined]
    return error


def worker_crashed(error: BaseException | None) -> bool:
    """Whether ``error`` says that a budgeted worker died without an answer (a crash in native code)."""
    return bool(getattr(error, "worker_crashed", False))


def _wait(busy: list[Worker], wake: float = math.inf) -> list[tuple[int, Outcome[Any]]]:
    """Block until some jobs are done or past their deadline, or until ``wake`` (``time.monotonic()``);
    return the indexes and outcomes of the jobs done."""
    done: list[tuple[int, Outcome[Any]]] = []
    while not done:
        now = time.monotonic()
        if now >= wake:
            break
        for worker in busy:
            if worker.deadline <= now and worker.index is not None:
                index = worker.index
                done.append((index, worker.expire()))
        if done:
            break
        timeout = max(0.0, min(min(w.deadline for w in busy), wake) - now)
        ready, _, _ = select.select(busy, [], [], timeout)
        for worker in ready:
            started = worker.index
            outcome = worker.read()
            if outcome is not None and started is not None:
                done.append((started, outcome))
    return done
