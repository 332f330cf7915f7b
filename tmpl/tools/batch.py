"""One batch of tool calls running (:class:`_Batch`): started at most ``max_concurrency`` at a time, sync tools on
the worker threads, async ones as tasks, isolated ones in the process pool, each under its timeout, each
sample's answers gathered in call order (:class:`_Gather`)."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from ..toolcalls.types import CallProblem, ToolCall
from .metrics import CallOutcome
from .outcomes import _from_worker, _ok, _raised, _refused, _timed_out, _Tool
from .procpool import Answer, ProcessPool
from .workers import WorkerPool


class BatchOwner(Protocol):
    """What a batch uses of the :class:`~tmpl.tools.Toolbox` that runs it (which imports this module)."""

    max_concurrency: int
    max_hung: int
    max_output_chars: int | None
    _workers: WorkerPool
    _processes: ProcessPool | None
    _hung: dict[str, set[concurrent.futures.Future[Any]]]

    def _check(self, item: ToolCall | CallProblem) -> CallOutcome | tuple[_Tool, ToolCall, dict[str, Any]]: ...

    def _hung_calls(self, name: str) -> int: ...

    async def _execute_async(self, tool: _Tool, call: ToolCall, args: dict[str, Any]) -> CallOutcome: ...

    async def _returned(
        self, tool: _Tool, call: ToolCall, value: Any, began: float, latency: float | None
    ) -> CallOutcome: ...


#: the tool call an async tool was started for, readable inside it (a sub-agent names its run by it)
CURRENT_CALL: contextvars.ContextVar[ToolCall] = contextvars.ContextVar("tmpl_current_tool_call")


class _Batch:
    """The calls of one :meth:`Toolbox.run_batch`: started at most ``max_concurrency`` at a time.

    Sync calls go to the Toolbox's :class:`WorkerPool` with a timer at their timeout, those
    started inside :meth:`together` as one lot (:meth:`WorkerPool.put`: one lock, one wake-up).
    Their answers come back to the event loop through an inbox: a worker that finds it empty
    wakes the loop once (``call_soon_threadsafe``), and the calls answered until the loop runs
    are handled in that one callback, in the order they were answered (no task, no waiter, no
    wake-up per call). Async calls run as tasks. While sync calls are in flight a ticker asks
    the pool to add workers when every worker is stuck (see :mod:`.workers`).
    """

    def __init__(self, box: BatchOwner, loop: asyncio.AbstractEventLoop) -> None:
        self.box, self.loop = box, loop
        self.free = box.max_concurrency
        self.waiting: collections.deque[Any] = collections.deque()  # launches waiting for a free slot
        self.sync_in_flight = 0
        self.ticking = False
        #: sync calls started inside :meth:`together`, handed to the pool when it ends
        self.lot: list[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] | None = None
        self.inbox: list[_SyncCall] = []  # answered by a worker, not yet handled on the loop
        self.inbox_lock = threading.Lock()
        self.gathers: dict[int, _Gather] = {}  # id of a call's future -> its sample's group (start_batch)

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """Hand the sync calls started inside the block to the worker pool as one lot, at its end
        (inside another such block: with that block's lot)."""
        if self.lot is not None:
            yield
            return
        self.lot = []
        try:
            yield
        finally:
            lot, self.lot = self.lot, None
            if lot:
                self.box._workers.put(lot)

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """``fn`` for the worker pool: now, or with the lot of :meth:`together`."""
        if self.lot is None:
            return self.box._workers.submit(fn)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.lot.append((fn, future))
        return future

    def answered(self, call: _SyncCall) -> None:
        """In a worker's thread: ``call`` has its answer; wake the loop unless a wake-up is pending."""
        with self.inbox_lock:
            self.inbox.append(call)
            if len(self.inbox) > 1:
                return  # the loop was woken for the first one and has not drained yet
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is gone (the call hung past its batch): nothing waits for it
            pass

    def _drain(self) -> None:
        with self.inbox_lock:
            calls, self.inbox = self.inbox, []
        with self.together():  # calls waiting for a free slot, launched as these finish: one lot too
            for call in calls:
                try:
                    call.on_result()
                except Exception as exc:  # noqa: BLE001 - one call's failure must not keep the others unanswered
                    self.loop.call_exception_handler({"message": "tool call answer failed", "exception": exc})
                    call.settle(_raised(call.call, exc, None))  # nor itself (e.g. a result whose str() raises)

    def start(self, item: ToolCall | CallProblem) -> asyncio.Future[CallOutcome]:
        out: asyncio.Future[CallOutcome] = self.loop.create_future()
        checked = self.box._check(item)
        if isinstance(checked, CallOutcome):
            out.set_result(checked)
            return out
        tool, call, args = checked
        box = self.box
        if box._processes is not None:
            how = self._launch_process
        elif tool.is_async:
            how = self._launch_async
        elif box._hung_calls(tool.name) >= box.max_hung:
            out.set_result(_refused(call, box.max_hung))
            return out
        else:
            how = self._launch_sync
        launch = functools.partial(how, tool, call, args, out)
        if self.free > 0:
            self.free -= 1
            launch()
        else:
            self.waiting.append(launch)
        return out

    def gather(self, group: _Gather) -> None:
        """Complete the group's sample future with the outcomes of its calls (in order) once every
        one is answered: counted in :meth:`_finish` as each is set, not by a done-callback per call
        (one callback scheduled on the loop per call and per sample, 2 of the 7 per sample and turn)."""
        for f in group.calls:
            if f.done():
                group.left -= 1
            else:
                self.gathers[id(f)] = group
        if not group.left:
            group.complete()

    def _finish(self, out: asyncio.Future[CallOutcome], outcome: CallOutcome | BaseException) -> None:
        if not out.done():
            if isinstance(outcome, BaseException):
                out.set_exception(outcome)
            else:
                out.set_result(outcome)
        group = self.gathers.pop(id(out), None)
        if group is not None:
            group.left -= 1
            if not group.left:
                group.complete()
        if self.waiting:
            self.waiting.popleft()()
        else:
            self.free += 1

    # -- async tools ------------------------------------------------------------------
    def _launch_async(
        self, tool: _Tool, call: ToolCall, args: dict[str, Any], out: asyncio.Future[CallOutcome]
    ) -> None:
        def start() -> asyncio.Task[CallOutcome]:  # in a context of its own, where the tool reads its call
            CURRENT_CALL.set(call)
            return self.loop.create_task(self.box._execute_async(tool, call, args))

        task = contextvars.copy_context().run(start)

        def done(t: asyncio.Future[CallOutcome]) -> None:
            self._finish(out, t.exception() or t.result())

        task.add_done_callback(done)

    # -- worker processes -------------------------------------------------------------
    def _launch_process(
        self, tool: _Tool, call: ToolCall, args: dict[str, Any], out: asyncio.Future[CallOutcome]
    ) -> None:
        box, loop = self.box, self.loop
        assert box._processes is not None
        future = box._processes.submit(tool.name, args, tool.timeout, box.max_output_chars)

        def answered(f: concurrent.futures.Future[Answer]) -> None:  # in the pool's thread
            try:
                loop.call_soon_threadsafe(self._finish, out, _from_worker(call, tool, f.result()))
            except RuntimeError:  # the loop is gone: nothing waits for the call
                pass

        future.add_done_callback(answered)

    # -- sync tools -------------------------------------------------------------------
    def _launch_sync(self, tool: _Tool, call: ToolCall, args: dict[str, Any], out: asyncio.Future[CallOutcome]) -> None:
        _SyncCall(self, tool, call, out).start(args)
        if not self.ticking:
            self.ticking = True
            self.loop.call_later(self.box._workers.stuck_after, self._tick)

    def _tick(self) -> None:
        if not self.sync_in_flight:
            self.ticking = False
            return
        self.box._workers.unstick()
        self.loop.call_later(self.box._workers.stuck_after, self._tick)


#: ``on_done(i, future)`` of :meth:`Toolbox.start_batch`: sample ``i``'s future is done
OnDone = Callable[[int, "asyncio.Future[list[CallOutcome]]"], None]


#: return types that are never awaitable (no ``inspect.isawaitable`` for the common results)
_PLAIN = frozenset({str, dict, list, tuple, int, float, bool, type(None), bytes})


class _SyncCall:
    """One sync call in flight: the worker's future, the timer at the tool's timeout, the answer.

    Settled once, by whichever comes first (the worker's answer or the timer); settling drops the
    references to the future and the timer. Closures sharing cells did the same job but left every
    call in a reference cycle (future -> done callback -> closure -> future): ~30 objects a call
    that only the garbage collector could free, 15-18% of a 4096-sample rollout's time outside
    the engine (benchmarks/rollout_scale.py).
    """

    __slots__ = ("batch", "tool", "call", "out", "began", "future", "timer")

    def __init__(self, batch: _Batch, tool: _Tool, call: ToolCall, out: asyncio.Future[CallOutcome]) -> None:
        self.batch, self.tool, self.call = batch, tool, call
        self.out: asyncio.Future[CallOutcome] | None = out
        self.began = 0.0
        self.future: concurrent.futures.Future[Any] | None = None
        self.timer: asyncio.TimerHandle | None = None

    def start(self, args: dict[str, Any]) -> None:
        batch = self.batch
        self.began = time.perf_counter()
        future = batch.submit(functools.partial(self.tool.fn, **args))
        batch.sync_in_flight += 1
        self.future = future
        self.timer = batch.loop.call_later(self.tool.timeout, self.on_timeout)
        future.add_done_callback(self.from_worker)

    def from_worker(self, _: concurrent.futures.Future[Any]) -> None:
        """In the worker's thread: hand the answer to the loop (through the batch's inbox)."""
        self.batch.answered(self)

    def on_timeout(self) -> None:
        future = self.future
        if future is None:
            return
        if not future.cancel() and not future.done():  # running: its thread hangs on
            self.batch.box._hung.setdefault(self.tool.name, set()).add(future)
        self.settle(_timed_out(self.call, self.tool))

    def on_result(self) -> None:
        future, call = self.future, self.call
        if future is None:
            return
        try:  # one read of the finished future (each read takes its lock)
            value = future.result(0)
        except BaseException as exc:  # noqa: BLE001 - the tool's own exception, answered as its outcome
            if isinstance(exc, concurrent.futures.CancelledError) and future.cancelled():
                return  # cancelled before it ran (its timeout came first): already answered
            self.timer_off()
            latency = getattr(future, "ran_for", None)
            self.settle(exc if isinstance(exc, KeyboardInterrupt) else _raised(call, exc, latency))
            return
        self.timer_off()
        latency = getattr(future, "ran_for", None)
        if type(value) in _PLAIN or not inspect.isawaitable(value):
            self.settle(_ok(call, value, latency, self.batch.box.max_output_chars))
            return
        box, loop = self.batch.box, self.batch.loop
        task = asyncio.ensure_future(box._returned(self.tool, call, value, self.began, latency), loop=loop)
        task.add_done_callback(self.awaited)

    def awaited(self, task: asyncio.Future[CallOutcome]) -> None:
        self.settle(task.exception() or task.result())

    def timer_off(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def settle(self, outcome: CallOutcome | BaseException) -> None:
        if self.out is None:
            return
        self.timer_off()
        self.future = None
        out, self.out = self.out, None
        self.batch.sync_in_flight -= 1
        self.batch._finish(out, outcome)


class _Gather:
    """One sample's calls in :meth:`Toolbox.start_batch`: how many are still unanswered, and what
    to complete when none is."""

    __slots__ = ("calls", "done", "on_done", "index", "left")

    def __init__(
        self,
        calls: list[asyncio.Future[CallOutcome]],
        done: asyncio.Future[list[CallOutcome]],
        on_done: OnDone | None,
        index: int,
    ) -> None:
        self.calls, self.done, self.on_done, self.index = calls, done, on_done, index
        self.left = len(calls)

    def complete(self) -> None:
        done = self.done
        if done.done():
            return
        for f in self.calls:
            if f.cancelled():
                done.cancel()
                break
            exc = f.exception()
            if exc is not None:
                done.set_exception(exc)
                break
        else:
            done.set_result([f.result() for f in self.calls])
        if self.on_done is not None:
            self.on_done(self.index, done)
