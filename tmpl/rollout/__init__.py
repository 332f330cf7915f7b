"""The generation loop: samples turn after turn, tools run, exact suffixes appended.

:mod:`.loop` holds :class:`Rollout` (its turns; :mod:`.stream` streams, :mod:`.weights` updates weights,
:mod:`.sample` holds one sample's state, :mod:`.result` :class:`RolloutResult`); :mod:`.scheduler` batches
requests for the backend; :mod:`.metrics` counts what happened;
:mod:`.codes` says how a sample ended; :mod:`.drift` explains drift; :mod:`.timing` times phases;
:mod:`.scale` runs one rollout over worker processes or Ray actors (:class:`DistributedRollout`);
:mod:`.subagent` makes a rollout a tool of another (:class:`SubAgent`), its calls in the parent's episode.
"""

from __future__ import annotations

from .codes import EndCode
from .drift import DriftCause, DriftDetail, explain_drift
from .loop import Rollout, RolloutResult
from .metrics import RolloutMetrics, SampleTimes
from .scale import DistributedRollout, RolloutSettings
from .subagent import SubAgent

__all__ = [
    "DistributedRollout",
    "DriftCause",
    "DriftDetail",
    "EndCode",
    "explain_drift",
    "Rollout",
    "RolloutMetrics",
    "RolloutResult",
    "RolloutSettings",
    "SampleTimes",
    "SubAgent",
]
