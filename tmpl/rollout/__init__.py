"""The generation loop: samples turn after turn, tools run, exact suffixes appended.

:mod:`.loop` holds :class:`Rollout` and :class:`RolloutResult`; :mod:`.scheduler` batches
requests for the backend; :mod:`.metrics` counts what happened.
"""

from __future__ import annotations

from .loop import Rollout, RolloutResult
from .metrics import RolloutMetrics, SampleTimes

__all__ = ["Rollout", "RolloutMetrics", "RolloutResult", "SampleTimes"]
