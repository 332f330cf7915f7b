"""One rollout over many processes or machines: :class:`DistributedRollout` (see :mod:`.runner`).

:mod:`.runner` shards the conversations and drives the workers; :mod:`.pools` starts them (local
processes, or Ray actors); :mod:`.worker` is what runs inside one; :mod:`.merge` merges the
shards' metrics.

>>> from tmpl.rollout.scale import DistributedRollout, RolloutSettings
>>> DistributedRollout.__name__, RolloutSettings.__name__
('DistributedRollout', 'RolloutSettings')
"""

from __future__ import annotations

from .merge import merge_metrics
from .runner import DistributedRollout, RolloutSettings

__all__ = ["DistributedRollout", "RolloutSettings", "merge_metrics"]
