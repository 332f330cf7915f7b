"""Daemon worker threads for sync tool calls: reused across calls, grown when every worker is stuck.

Starting a thread per call costs far more than a fast tool itself (measured: about 1 ms per
call on a busy 2-core machine, against a few microseconds for the call), and handing each call
to a pool thread separately still costs a GIL hand-off per call. A :class:`WorkerPool` queues
calls; one worker drains the queue call after call, so a batch of fast calls costs one
hand-off. Slow calls still run concurrently: whoever waits on a call asks :meth:`WorkerPool.unstick`
every ``stuck_after`` seconds, and when every live worker has been inside one call for that
long, as many new workers start as there are (calls queued, capped at the live workers),
doubling until the queue drains. A worker whose call never returns keeps its daemon thread
(it cannot be killed from Python) and simply stops counting; it does not block the queue.

>>> pool = WorkerPool()
>>> pool.submit(lambda: 6 * 7).result(timeout=5)
42
>>> pool.close()
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

#: seconds a worker may spend in one call before waiting calls get another worker
STUCK_AFTER = 0.002
#: seconds an idle worker waits for work before its thread ends
IDLE_EXIT = 2.0


class _Worker:
    __slots__ = ("started",)

    def __init__(self) -> None:
        self.started: float | None = None  # perf_counter() when its current call began; None when idle


class WorkerPool:
    """A queue of sync calls served by daemon threads that are reused and added only when stuck.

    :meth:`submit` returns a :class:`concurrent.futures.Future`; after the call ran, the future's
    ``ran_for`` attribute holds the seconds the call itself took (queueing excluded).
    """

    def __init__(self, *, stuck_after: float = STUCK_AFTER, idle_exit: float = IDLE_EXIT, name: str = "tmpl-tool"):
        self.stuck_after = stuck_after
        self.idle_exit = idle_exit
        self.name = name
        self._queue: collections.deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._workers: set[_Worker] = set()
        self._idle = 0
        self._closed = False

    @property
    def threads(self) -> int:
        """Worker threads alive now (stuck ones included)."""
        with self._cond:
            return len(self._workers)

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Queue ``fn()``; its outcome lands in the returned future."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.put([(fn, future)])
        return future

    def put(self, calls: Sequence[tuple[Callable[[], Any], concurrent.futures.Future[Any]]]) -> None:
        """Queue several calls at once, each with the future its outcome lands in: one lock and one
        wake-up for the lot (a tick's calls), waking as many idle workers as :meth:`submit` one by
        one would (one per call, while any is idle).

        >>> pool = WorkerPool()
        >>> futures = [concurrent.futures.Future() for _ in range(3)]
        >>> pool.put([(lambda k=k: k * k, f) for k, f in enumerate(futures)])
        >>> [f.result(timeout=5) for f in futures]
        [0, 1, 4]
        >>> pool.close()
        """
        if not calls:
            return
        with self._cond:
            self._queue.extend(calls)
            if self._idle:
                self._cond.notify(len(calls))
            elif not self._workers:
                self._spawn(1)

    def unstick(self) -> None:
        """Start more workers when calls are queued and every worker is busy with one call for too long."""
        now = time.perf_counter()
        with self._cond:
            if not self._queue or self._idle:
                return
            busy = 0
            for w in self._workers:
                if w.started is None or now - w.started < self.stuck_after:
                    return  # a worker will be free soon (or is about to take the next call)
                busy += 1
            self._spawn(max(1, min(len(self._queue), busy)))

    def close(self) -> None:
        """Let idle workers end now (queued calls still run; a later submit starts a new worker)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- inside the lock ------------------------------------------------------------------
    def _spawn(self, n: int) -> None:
        self._closed = False
        for _ in range(n):
            worker = _Worker()
            self._workers.add(worker)
            threading.Thread(target=self._serve, args=(worker,), name=self.name, daemon=True).start()

    # -- a worker thread ------------------------------------------------------------------
    def _serve(self, worker: _Worker) -> None:
        cond, queue = self._cond, self._queue
        while True:
            with cond:
                while not queue:
                    if self._closed:
                        self._workers.discard(worker)
                        return
                    self._idle += 1
                    woke = cond.wait(self.idle_exit)
                    self._idle -= 1
                    if not woke and not queue:
                        self._workers.discard(worker)
                        return
                fn, future = queue.popleft()
                worker.started = time.perf_counter()
            if future.set_running_or_notify_cancel():
                try:
                    value = fn()
                except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the call
                    future.ran_for = time.perf_counter() - worker.started  # type: ignore[attr-defined]
                    future.set_exception(exc)
                else:
                    future.ran_for = time.perf_counter() - worker.started  # type: ignore[attr-defined]
                    future.set_result(value)
            worker.started = None
