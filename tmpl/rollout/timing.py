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

from dataclasses import dataclass
from time import perf_counter

from .metrics import SampleTimes


@dataclass
class SetupTimes:
    """Seconds a run spends before any sample starts."""

    tokenize: float = 0.0


#: what a clock adds seconds to: an attribute per phase
Times = SampleTimes | SetupTimes


class PhaseClock:
    """Adds the seconds spent inside ``with clock("phase"):`` to the attribute ``phase`` of ``times``.

    One small object per phase, made on first use and reused (a sample's phases never nest in
    themselves), instead of a generator-based context manager: it runs several times per sample
    and turn.
    """

    __slots__ = ("times", "_phases")

    def __init__(self, times: Times) -> None:
        self.times = times
        self._phases: dict[str, _Phase] = {}

    def __call__(self, phase: str) -> _Phase:
        clock = self._phases.get(phase)
        if clock is None:
            clock = self._phases[phase] = _Phase(self.times, phase)
        return clock


class _Phase:
    __slots__ = ("times", "phase", "start")

    def __init__(self, times: Times, phase: str) -> None:
        self.times, self.phase = times, phase
        self.start = 0.0

    def __enter__(self) -> None:
        self.start = perf_counter()

    def __exit__(self, *exc: object) -> None:
        setattr(self.times, self.phase, getattr(self.times, self.phase) + perf_counter() - self.start)
