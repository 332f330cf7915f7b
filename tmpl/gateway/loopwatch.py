"""Pauses of the event loop: a periodic task that measures how late it wakes.

A gateway answers every call on one event loop. Anything that holds the loop (a full garbage
collection, a large JSON body parsed, a commit of the durable store, a long render) delays every
other session's call by as long. :class:`LoopWatch` sleeps ``every`` seconds at a time and, on each
wake, measures its lateness (the time since it should have woken): a pause of the loop shows as one
late wake of about its length. Cost: one timer per ``every`` seconds (at 5 ms, about 1% of a core).

``tmpl serve`` runs one and ``GET /metrics`` reports it (``loop``: the longest pause seen, how many were
over ``threshold``, and wakes measured).

>>> import asyncio, time
>>> async def demo():
...     watch = LoopWatch(every=0.002, threshold=0.02)
...     watch.start()
...     await asyncio.sleep(0.01)
...     time.sleep(0.05)              # the loop held for 50 ms
...     await asyncio.sleep(0.01)
...     watch.stop()
...     return watch
>>> watch = asyncio.run(demo())
>>> watch.over >= 1 and watch.longest >= 0.04
True
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

__all__ = ["LoopWatch"]


class LoopWatch:
    """Measures the event loop's pauses (see the module docstring): ``every`` seconds between wakes,
    pauses over ``threshold`` seconds counted (each kept in :attr:`pauses`, the last ``keep`` of them)."""

    def __init__(self, every: float = 0.005, threshold: float = 0.010, keep: int = 1000) -> None:
        if not every > 0:
            raise ValueError(f"every must be positive seconds, not {every!r}")
        self.every = every
        self.threshold = threshold
        self.keep = keep
        #: the longest lateness seen (seconds), wakes measured, and pauses over ``threshold``
        self.longest = 0.0
        self.wakes = 0
        self.over = 0
        #: the last ``keep`` pauses over ``threshold``: (monotonic time it ended, seconds)
        self.pauses: list[tuple[float, float]] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start watching the running loop (a no-op when already watching)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="tmpl-loopwatch")

    def stop(self) -> None:
        """Stop watching (what was measured stays)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def reset(self) -> None:
        """Forget what was measured (a benchmark's next run)."""
        self.longest, self.wakes, self.over = 0.0, 0, 0
        self.pauses.clear()

    async def _run(self) -> None:
        every, clock = self.every, time.perf_counter
        due = clock() + every
        while True:
            await asyncio.sleep(every)
            now = clock()
            late = now - due
            self.wakes += 1
            if late > self.longest:
                self.longest = late
            if late > self.threshold:
                self.over += 1
                self.pauses.append((time.monotonic(), late))
                if len(self.pauses) > self.keep:
                    del self.pauses[: len(self.pauses) - self.keep]
            due = now + every

    def report(self) -> dict[str, Any]:
        """What ``GET /metrics`` shows: the longest pause and the count over the threshold (milliseconds).

        >>> LoopWatch().report()
        {'longest_ms': 0.0, 'over': 0, 'threshold_ms': 10.0, 'wakes': 0}
        """
        return {
            "longest_ms": round(self.longest * 1e3, 3),
            "over": self.over,
            "threshold_ms": round(self.threshold * 1e3, 3),
            "wakes": self.wakes,
        }
