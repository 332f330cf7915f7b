"""Seconds by phase: one context manager instead of repeated ``perf_counter`` pairs.

>>> from tmpl.rollout.metrics import SampleTimes
>>> times = SampleTimes()
>>> clock = PhaseClock(times)
>>> with clock("parse"):
...     pass
>>> times.parse >= 0.0
True
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from time import perf_counter
from typing import Any


class PhaseClock:
    """Adds the seconds spent inside ``with clock("phase"):`` to the attribute ``phase`` of ``times``."""

    __slots__ = ("times",)

    def __init__(self, times: Any) -> None:
        self.times = times

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = perf_counter()
        try:
            yield
        finally:
            setattr(self.times, phase, getattr(self.times, phase) + perf_counter() - start)
