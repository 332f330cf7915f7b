"""Streaming rollouts: finished groups yielded while generation goes on.

:func:`stream_groups` is :meth:`tmpl.Rollout.stream` (an async generator of groups, prompts taken as room
frees up); :func:`stream_groups_in_thread` is :meth:`tmpl.Rollout.stream_sync` (the same on an event loop in a
thread of its own, for synchronous trainers). Each takes the rollout as its first argument.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue as _queue
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from .metrics import RolloutMetrics
from .result import RolloutResult
from .scheduler import Scheduler
from .timing import SetupTimes
from .toolround import ToolRounds


class Streamable(Protocol):
    """What streaming needs of a :class:`tmpl.Rollout` (typed here so that this module, which the loop
    imports, does not import the loop back)."""

    max_concurrency: int
    vision: Any
    metrics: RolloutMetrics | None
    _schedulers: set[Scheduler]
    _home: asyncio.AbstractEventLoop | None

    @property
    def sampling(self) -> Any: ...

    def _scheduler(self) -> Scheduler: ...

    def _tool_rounds(self) -> ToolRounds | None: ...

    def _prompts(
        self, conversations: Sequence[Sequence[Mapping[str, Any]]], setup: SetupTimes, where: str, first: int = 0
    ) -> list[Any]: ...

    async def _cache_counters(self) -> tuple[float, float] | None: ...

    async def _count_cache(self, before: tuple[float, float] | None) -> None: ...

    async def _one(
        self,
        i: int,
        s: int,
        conversation: Sequence[Mapping[str, Any]],
        prompt: list[int],
        scheduler: Scheduler,
        rounds: ToolRounds | None,
        bar: Any = None,
    ) -> RolloutResult: ...


async def stream_groups(
    rollout: Streamable,
    prompts: Iterable[Sequence[Mapping[str, Any]]] | Any,
    *,
    max_in_flight: int | None = None,
) -> AsyncGenerator[list[RolloutResult], None]:
    """Yield finished groups (the ``sampling.n`` samples of one prompt) in the order they finish.

    ``prompts``: an iterable (or async iterable) of conversations, or an ``asyncio.Queue`` of
    them ended by ``None``. Prompts are taken as room frees up: at most ``max_in_flight`` samples
    (default ``max_concurrency``) run at once. ``index`` of a result is its prompt's position in
    the stream. Generation goes on while the caller handles a group, and the caller may
    :meth:`update_weights` between groups. ``metrics`` covers everything yielded once the stream ends.

    >>> async for group in rollout.stream(prompts, max_in_flight=64):   # doctest: +SKIP
    ...     batch.append(group)
    ...     if len(batch) == 8:
    ...         train(batch); batch = []
    ...         await rollout.update_weights_async(step, apply="/ckpt/step")
    """
    bound = max_in_flight if max_in_flight is not None else rollout.max_concurrency
    n = rollout.sampling.n
    if bound < n:
        raise ValueError(f"max_in_flight={bound} cannot hold one group of n={n} samples")
    start = time.perf_counter()
    scheduler = rollout._scheduler()
    rounds = rollout._tool_rounds()  # with suffixes only where the history mode appends them
    setup = SetupTimes()
    done: asyncio.Queue[tuple[int, list[RolloutResult]] | BaseException] = asyncio.Queue()
    room = asyncio.Condition()
    in_flight = 0
    groups: set[asyncio.Task[None]] = set()
    finished: list[RolloutResult] = []
    cache_before = await rollout._cache_counters()
    rollout._schedulers.add(scheduler)

    async def group(i: int, conv: Sequence[Mapping[str, Any]], prompt: list[int]) -> None:
        nonlocal in_flight
        try:
            tasks = [asyncio.ensure_future(rollout._one(i, s, conv, prompt, scheduler, rounds)) for s in range(n)]
            try:
                results = list(await asyncio.gather(*tasks))
            except asyncio.CancelledError:
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
            done.put_nowait((i, results))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            done.put_nowait(exc)
        finally:
            async with room:
                in_flight -= n
                room.notify_all()

    async def feed() -> int:
        nonlocal in_flight
        count = 0
        async for conv in prompts_from(prompts):
            prompt = rollout._prompts([conv], setup, "prompts", count)[0]
            async with room:
                await room.wait_for(lambda: in_flight + n <= bound)  # noqa: B023 - read when woken
                in_flight += n
            kept = prompt if rollout.vision is not None or prompt is None else list(prompt)  # None: an env's task
            task = asyncio.ensure_future(group(count, conv, kept))
            groups.add(task)
            task.add_done_callback(groups.discard)
            count += 1
        return count

    feeder = asyncio.ensure_future(feed())
    yielded = 0
    try:
        while True:
            if feeder.done() and yielded == feeder.result() and done.empty():
                break
            getter = asyncio.ensure_future(done.get())
            waited = {getter} if feeder.done() else {getter, feeder}
            await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                await asyncio.gather(getter, return_exceptions=True)
                if feeder.exception() is not None:
                    raise feeder.exception()  # type: ignore[misc]
                continue
            item = getter.result()
            if isinstance(item, BaseException):
                raise item
            yielded += 1
            finished += item[1]
            yield item[1]
    finally:
        pending = [feeder, *groups]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        rollout._schedulers.discard(scheduler)
        rollout.metrics = RolloutMetrics.from_results(
            finished,
            wall_time=time.perf_counter() - start,
            engine_time=scheduler.engine_time,
            batches=scheduler.batches,
            tokenize_time=setup.tokenize,
        )
        await rollout._count_cache(cache_before)


def stream_groups_in_thread(
    rollout: Streamable, prompts: Iterable[Sequence[Mapping[str, Any]]], *, max_in_flight: int | None = None
) -> Iterator[list[RolloutResult]]:
    """:meth:`stream` for synchronous code: generation runs on an event loop in a thread of its own,
    so it goes on while the caller trains; :meth:`update_weights` from the caller's thread reaches it.

    >>> for group in rollout.stream_sync(prompts, max_in_flight=64):   # doctest: +SKIP
    ...     train([group]); rollout.update_weights(step, apply="/ckpt/step")
    """
    out: _queue.Queue[tuple[str, Any]] = _queue.Queue(maxsize=1)
    ready = threading.Event()
    stop = threading.Event()
    loop = asyncio.new_event_loop()

    async def put(item: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                out.put_nowait(item)
                return True
            except _queue.Full:
                await asyncio.sleep(0.005)  # the caller is training: generation goes on meanwhile
        return False

    async def pump() -> None:
        groups = stream_groups(rollout, prompts, max_in_flight=max_in_flight)
        try:
            async for group in groups:
                if not await put(("group", group)):
                    break
            else:
                await put(("end", None))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            await put(("error", exc))
        finally:
            await groups.aclose()
        while not stop.is_set():  # the loop stays up for update_weights until the caller is done
            await asyncio.sleep(0.005)

    def thread() -> None:
        asyncio.set_event_loop(loop)
        rollout._home = loop
        ready.set()
        try:
            loop.run_until_complete(pump())
        finally:
            rollout._home = None
            loop.close()

    worker = threading.Thread(target=thread, name="tmpl-stream", daemon=True)
    worker.start()
    ready.wait()
    try:
        while True:
            kind, value = out.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        stop.set()
        with contextlib.suppress(_queue.Empty):
            out.get_nowait()  # let a pump blocked on a full queue see ``stop``
        worker.join()


async def prompts_from(source: Any) -> AsyncIterator[Any]:
    """Conversations from an ``asyncio.Queue`` (ended by None), an async iterable or an iterable."""
    if isinstance(source, asyncio.Queue):
        while (item := await source.get()) is not None:
            yield item
    elif hasattr(source, "__aiter__"):
        async for item in source:
            yield item
    else:
        for item in source:
            yield item
            await asyncio.sleep(0)  # let samples start while a long iterable is read
