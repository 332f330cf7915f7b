"""Feeding a backend from many concurrent samples without a barrier per turn.

Each sample of a rollout runs as its own coroutine and asks for one generation at a time.

- A batching backend (torch, the offline vLLM engine) gets a batch as soon as every sample
  that *can* generate now has asked (samples busy running tools are not waited for), or when
  ``max_batch`` requests are waiting. The decision is taken one pass of the event loop after a
  request arrives, so requests made in the same pass (the first turn of every sample) go together. One batch runs at a time, in a worker thread, so tools
  of other samples keep running meanwhile.
- A non-batching backend (vLLM servers) gets each request as soon as it is made, with at
  most ``max_concurrency`` in flight.

While the rollout updates the weights (:meth:`Scheduler.hold`), no new batch starts and the one
running is waited for: every token of a batch is sampled by the weights it started with.

When a sample is aborted, or its task cancelled (the run was cancelled), the backend is told with
:meth:`Backend.cancel` (a request still queued for a batch is just dropped).

Engine time (the union of intervals during which the backend works) is measured here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ..backends.base import Backend, GenerationRequest, GenerationResult


class Scheduler:
    #: seconds a request may wait for the rest of its batch before the batch goes anyway
    max_wait = 0.25
    #: seconds ``Backend.cancel`` may take before the scheduler stops waiting for it
    cancel_timeout = 10.0

    def __init__(self, backend: Backend, *, max_batch: int = 256, max_concurrency: int = 256) -> None:
        self.backend = backend
        self.max_batch = max_batch
        self.active = 0  # samples not finished yet
        self.busy = 0  # samples doing something other than waiting for a generation
        self.engine_time = 0.0
        self.batches = 0
        self._pending: list[tuple[GenerationRequest, asyncio.Future[GenerationResult]]] = []
        self._running = False
        self._sem = asyncio.Semaphore(max_concurrency)
        self._inflight = 0
        self._since = 0.0
        self._timer: asyncio.TimerHandle | None = None  # the max_wait deadline of the waiting requests
        self.cancelled: list[str] = []  # request ids the backend was told to cancel
        self.cancel_failures = 0  # cancels that raised or timed out
        self._held = 0  # weight updates under way: no batch starts
        self._flush_due = False  # a _maybe_flush is scheduled for the next pass of the loop

    # -- sample bookkeeping -------------------------------------------------------------
    def start_sample(self) -> None:
        self.active += 1
        self.busy += 1

    def end_sample(self) -> None:
        self.active -= 1
        self.busy -= 1
        self._flush_soon()

    def working(self) -> _Working:
        """Mark the current sample busy (tools, parsing) for the duration of the block.

        A small object with ``__enter__``/``__exit__``, not a generator-based context manager: it
        runs once per tool round of every sample (measured: 0.3 us against 0.8 us per use).

        >>> with scheduler.working():   # doctest: +SKIP
        ...     done = await rounds.run(parsed, completion, before)
        """
        return _Working(self)

    def _flush_soon(self) -> None:
        # on the next pass, like a new request: samples that a batched tool round (or a batch of
        # generations) wakes together all ask before the batch goes, instead of the first alone
        if self._pending:
            self._look_next_pass()

    def _look_next_pass(self) -> None:
        """Schedule :meth:`_maybe_flush` for the next pass of the loop, once however many ask (it
        was two callbacks per sample and turn: one per request, one per sample done working)."""
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._maybe_flush)

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Start no batch inside the block, and enter it only once the running batch has returned.

        A weight update runs inside: a batching engine never has its weights changed under a batch.
        """
        self._held += 1
        try:
            while self._running:
                await asyncio.sleep(0.005)
            yield
        finally:
            self._held -= 1
            if not self._held and self._pending:
                self._look_next_pass()

    # -- generation -----------------------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.busy -= 1  # this sample now only waits for its generation
        try:
            if not self.backend.batching:
                async with self._sem:
                    self._enter()
                    try:
                        # its own task: when this sample is cancelled, Backend.cancel reaches the request
                        # while the backend still holds it, and only then is the request's task cancelled
                        task = asyncio.ensure_future(self.backend.agenerate(request))
                        try:
                            return await asyncio.shield(task)
                        except asyncio.CancelledError:
                            await self._cancel_inflight(request.request_id, task)
                            raise
                    finally:
                        self._leave()
            loop = asyncio.get_running_loop()
            future: asyncio.Future[GenerationResult] = loop.create_future()
            entry = (request, future)
            self._pending.append(entry)
            # decide on the next pass of the loop: samples that are ready in this pass (all of them, on
            # the first turn, before they have even registered) join the same batch
            self._look_next_pass()
            if self._timer is None:  # never wait forever on a miscount (one timer, not one per request)
                self._timer = loop.call_later(self.max_wait, self._force)
            try:
                return await future
            except asyncio.CancelledError:
                if entry in self._pending:  # not sent yet: the backend never sees it
                    self._pending.remove(entry)
                else:
                    await self._cancel_inflight(request.request_id, None)
                raise
        finally:
            self.busy += 1

    async def cancel(self, request_id: str) -> None:
        """Tell the backend to drop ``request_id`` (a sample was aborted); never raises.

        ``cancelled`` lists every request id the backend was told to drop, in order.
        """
        self.cancelled.append(request_id)
        try:
            await asyncio.wait_for(self.backend.cancel(request_id), self.cancel_timeout)
        except Exception:  # noqa: BLE001 - best effort: a failing cancel must not fail the sample twice
            self.cancel_failures += 1

    async def _cancel_inflight(self, request_id: str, task: asyncio.Future[GenerationResult] | None) -> None:
        """The sample waiting for ``request_id`` was cancelled: cancel the request, then its task."""
        await self.cancel(request_id)
        if task is not None and not task.done():
            task.cancel()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    def _enter(self) -> None:
        if self._inflight == 0:
            self._since = time.perf_counter()
        self._inflight += 1

    def _leave(self) -> None:
        self._inflight -= 1
        if self._inflight == 0:
            self.engine_time += time.perf_counter() - self._since

    def _force(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        if self._pending and not self._running and not self._held:
            self._running = True
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            loop.create_task(self._run(batch))
        if self._pending:  # still waiting (behind a running batch): look again after max_wait
            self._timer = loop.call_later(self.max_wait, self._force)

    def _maybe_flush(self) -> None:
        self._flush_due = False
        if self._running or self._held or not self._pending:
            return
        ready = self.active - self.busy  # samples waiting for a generation right now
        if len(self._pending) >= min(ready, self.max_batch) or len(self._pending) >= self.max_batch:
            self._running = True
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            asyncio.get_running_loop().create_task(self._run(batch))

    async def _run(self, batch: list[tuple[GenerationRequest, asyncio.Future[GenerationResult]]]) -> None:
        requests = [r for r, _ in batch]
        self._enter()
        try:
            if self.backend.threaded:
                results = await asyncio.to_thread(self.backend.generate_batch, requests)
            else:
                results = self.backend.generate_batch(requests)
        except Exception as exc:  # noqa: BLE001 - the engine failed the whole batch: every request fails with why
            results = [GenerationResult.failed(r.request_id, f"{type(exc).__name__}: {exc}") for r in requests]
        finally:
            self._leave()
            self.batches += 1
        for (_, future), result in zip(batch, results):
            if not future.done():
                future.set_result(result)
        self._running = False
        self._maybe_flush()


class _Working:
    """:meth:`Scheduler.working`'s block."""

    __slots__ = ("scheduler",)

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def __enter__(self) -> None:
        self.scheduler.busy += 1

    def __exit__(self, *exc: object) -> None:
        self.scheduler.busy -= 1
        self.scheduler._flush_soon()
