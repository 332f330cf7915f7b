"""One :class:`~tmpl.rollout.RolloutMetrics` from the metrics of many shards of one rollout.

Each worker of :class:`tmpl.DistributedRollout` runs its shards with its own ``tmpl.Rollout``, whose
metrics count that shard only. They merge field by field, by what a field is (so a field added to
``RolloutMetrics`` later merges without a change here): counts and seconds add up (``outside`` and
the other dicts key by key), ``*_max`` takes the largest, ``*_mean`` is weighted by the shards'
samples, and ``wall_time`` is the caller's (the whole run, not a sum). ``engine_time`` adds up too:
it is then the seconds the engines were busy summed over the workers, which can exceed
``wall_time`` when workers generate at the same time.

>>> from tmpl.rollout import RolloutMetrics
>>> a = RolloutMetrics(samples=2, done=2, turns_mean=3.0, turns_max=4, outside={"parse": 0.5})
>>> b = RolloutMetrics(samples=6, done=5, aborted=1, turns_mean=1.0, turns_max=2, outside={"parse": 0.25})
>>> m = merge_metrics([a, b], wall_time=1.5)
>>> (m.samples, m.done, m.aborted, m.turns_mean, m.turns_max, m.outside, m.wall_time)
(8, 7, 1, 1.5, 4, {'parse': 0.75}, 1.5)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..metrics import RolloutMetrics


def merge_metrics(parts: Sequence[RolloutMetrics], *, wall_time: float) -> RolloutMetrics:
    """The metrics of a rollout whose samples were split into ``parts`` (see the module doc)."""
    merged = RolloutMetrics()
    samples = sum(p.samples for p in parts)
    for f in dataclasses.fields(RolloutMetrics):
        name = f.name
        values = [getattr(p, name) for p in parts]
        value: Any
        if name == "wall_time":
            value = wall_time
        elif name.endswith("_mean"):
            value = sum(v * p.samples for v, p in zip(values, parts)) / samples if samples else 0.0
        elif name.endswith("_max"):
            value = max(values, default=getattr(merged, name))
        elif isinstance(getattr(merged, name), dict):
            value = {}
            for v in values:
                for key, n in v.items():
                    value[key] = value.get(key, 0) + n
        elif isinstance(getattr(merged, name), (int, float)):
            value = sum(values, type(getattr(merged, name))())
        else:  # pragma: no cover - every field of RolloutMetrics is a number or a dict today
            value = values[0] if values else getattr(merged, name)
        setattr(merged, name, value)
    return merged
