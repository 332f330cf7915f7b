"""Per-sample times and per-batch metrics of a rollout.

>>> rollout.metrics.as_dict()["rollout/drift_rate"]   # doctest: +SKIP
0.375
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np


@dataclass
class SampleTimes:
    """Seconds one sample spent outside the engine, by phase."""

    parse: float = 0.0
    tools: float = 0.0
    suffix: float = 0.0
    bookkeeping: float = 0.0
    drift: float = 0.0

    @property
    def total(self) -> float:
        return self.parse + self.tools + self.suffix + self.bookkeeping + self.drift


#: the phases of :class:`SampleTimes`, read per sample by :meth:`RolloutMetrics.from_results`
_PHASES = tuple(f.name for f in fields(SampleTimes))


def _counts(values: np.ndarray) -> list[tuple[int, int]]:
    """(value, count) of each distinct value, ascending; one comparison where all are the same
    (every token of most samples has one version: np.unique sorts them)."""
    if not values.size:
        return []
    first = values[0]
    if (values == first).all():
        return [(int(first), int(values.size))]
    return [(int(v), int(c)) for v, c in zip(*np.unique(values, return_counts=True))]


@dataclass
class RolloutMetrics:
    """What a rollout did, for logging: counts, tokens, time in and outside the engine, drift.

    ``engine_time`` is the wall time during which the backend was generating;
    ``outside`` sums, over samples, the time spent tokenizing prompts, parsing completions,
    running tools, building suffixes, bookkeeping and measuring drift. ``drift_rate`` is the
    share of measured samples whose token IDs would have changed had the decoded text been
    re-rendered with the template (what token-in/token-out protects from).
    """

    samples: int = 0
    done: int = 0
    truncated: int = 0
    aborted: int = 0
    turns_mean: float = 0.0
    turns_max: int = 0
    tool_calls: int = 0
    tool_failures: int = 0
    tokens_generated: int = 0
    tokens_appended: int = 0
    batches: int = 0
    wall_time: float = 0.0
    engine_time: float = 0.0
    outside: dict[str, float] = field(default_factory=dict)
    drift_measured: int = 0
    drift_samples: int = 0
    abort_reasons: dict[str, int] = field(default_factory=dict)  # by EndCode value
    drift_causes: dict[str, int] = field(default_factory=dict)  # drifted samples by DriftCause value
    tool_failure_kinds: dict[str, int] = field(default_factory=dict)  # failed calls by kind
    end_codes: dict[str, int] = field(default_factory=dict)  # samples by EndCode value (all statuses)
    tokens_by_version: dict[int, int] = field(default_factory=dict)  # sampled tokens by policy version
    stale: dict[str, int] = field(default_factory=dict)  # samples by what max_staleness did: withhold/drop/mask
    stale_tokens_off: int = 0  # sampled tokens the staleness policy took out of the loss
    staleness_max: int = 0  # versions between a sample's oldest token and the version it ended under
    staleness_mean: float = 0.0
    resumed: int = 0  # generations continued after an abort-mode weight update (partial rollouts)
    unverified: int = 0  # suffix checks due under verify_every that could not run (the full render raised)
    prefix_cache_queries: float = 0.0  # prompt tokens the engines looked up in their prefix caches during the run
    prefix_cache_hits: float = 0.0  # of which found (vLLM /metrics; the engines' whole traffic)

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Share of looked-up prompt tokens found in the engines' prefix caches (0.0 when not measured)."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @property
    def drift_rate(self) -> float:
        return self.drift_samples / self.drift_measured if self.drift_measured else 0.0

    @classmethod
    def from_results(
        cls, results: Sequence[Any], *, wall_time: float, engine_time: float, batches: int, tokenize_time: float = 0.0
    ) -> RolloutMetrics:
        m = cls(samples=len(results), wall_time=wall_time, engine_time=engine_time, batches=batches)
        outside = {
            "tokenize": tokenize_time,
            "parse": 0.0,
            "tools": 0.0,
            "suffix": 0.0,
            "bookkeeping": 0.0,
            "drift": 0.0,
        }
        for r in results:
            status = r.status.name
            if status == "DONE":
                m.done += 1
            elif status == "TRUNCATED":
                m.truncated += 1
            elif status == "ABORTED":
                m.aborted += 1
                code = getattr(r, "code", None)
                key = code.value if code is not None else r.reason.split(":")[0][:80]
                m.abort_reasons[key] = m.abort_reasons.get(key, 0) + 1
            code = getattr(r, "code", None)
            if code is not None:
                m.end_codes[code.value] = m.end_codes.get(code.value, 0) + 1
            for kind, n in (getattr(r, "tool_failure_kinds", None) or {}).items():
                m.tool_failure_kinds[kind] = m.tool_failure_kinds.get(kind, 0) + n
            m.turns_max = max(m.turns_max, r.turns)
            m.turns_mean += r.turns
            m.tool_calls += r.tool_calls
            m.tool_failures += r.tool_failures
            episode = getattr(r, "_episode", None)
            if episode is None and getattr(r, "_subagents", None):  # append mode with sub-agents: theirs too
                episode = r.episode
            if episode is not None:  # history="template" / edit_history: every branch, not only the last
                sequences = episode.sequences
                generated = sum(int(seq.mask.sum()) for seq in sequences)
                m.tokens_generated += generated
                m.tokens_appended += sum(len(seq.ids) - seq.prompt_length for seq in sequences) - generated
                versions = np.concatenate([seq.versions for seq in sequences]) if sequences else None
                loss_on = sum(int(seq.mask.sum()) for seq in r.sequences)
            else:
                mask = r.mask
                generated = int(mask.sum())
                m.tokens_generated += generated
                m.tokens_appended += len(mask) - generated
                versions = getattr(r, "versions", None)
                loss_on = None
            times = r.times
            for k in _PHASES:
                outside[k] += getattr(times, k)
            if versions is not None:
                for v, count in _counts(versions[versions >= 0]):
                    m.tokens_by_version[v] = m.tokens_by_version.get(v, 0) + count
                staleness = int(getattr(r, "staleness", 0))
                m.staleness_max = max(m.staleness_max, staleness)
                m.staleness_mean += staleness
                action = getattr(r, "stale_action", None)
                if action is not None:
                    m.stale[action] = m.stale.get(action, 0) + 1
                    if action != "drop":
                        m.stale_tokens_off += generated - (int(r.loss_mask.sum()) if loss_on is None else loss_on)
                m.resumed += int(getattr(r, "resumed", 0))
            m.unverified += int(getattr(r, "unverified", 0))
            if r.drift is not None:
                m.drift_measured += 1
                m.drift_samples += int(r.drift)
                detail = getattr(r, "drift_detail", None)
                if detail is not None:
                    m.drift_causes[detail.cause.value] = m.drift_causes.get(detail.cause.value, 0) + 1
        m.turns_mean = m.turns_mean / len(results) if results else 0.0
        m.staleness_mean = m.staleness_mean / len(results) if results else 0.0
        m.outside = outside
        return m

    def as_dict(self, prefix: str = "rollout/") -> dict[str, float]:
        """Flat numbers for a logger (wandb, tensorboard)."""
        out: dict[str, float] = {}
        for k in (*_COUNTS, "wall_time", "engine_time", "drift_measured", "drift_samples"):
            out[prefix + k] = float(getattr(self, k))
        out[prefix + "drift_rate"] = self.drift_rate
        for k, v in self.outside.items():
            out[f"{prefix}outside/{k}"] = v
        for version, n in sorted(self.tokens_by_version.items()):
            out[f"{prefix}tokens_by_version/{version}"] = float(n)
        return out

    def to_dict(self, prefix: str = "rollout/") -> dict[str, float]:
        """Flat numbers for a trainer's logger, with the same keys in every batch.

        Keys (after ``prefix``): the counts of :meth:`as_dict`; ``drift/measured``,
        ``drift/rate`` and ``drift/rate/<cause>`` for every :class:`DriftCause` (drifted samples
        of that cause / measured samples); ``tool_failures/<kind>`` for every failure kind of
        ``tmpl.tools.metrics.FAILURE_KINDS``; ``tool_outputs_cut`` (tool results cut to their
        sample's budget, docs/tools.md); ``truncated/<code>`` and ``aborted/<code>``
        for every :class:`EndCode` of that status; ``time/<phase>`` (seconds summed over
        samples: tokenize, parse, tools, suffix, bookkeeping, drift) plus ``time/engine`` and
        ``time/wall``; ``stale/<action>`` (samples withheld, dropped or masked by ``max_staleness``),
        ``stale/tokens_off``, ``staleness/max``, ``staleness/mean`` and ``resumed`` (partial
        rollouts continued after an abort-mode weight update); ``prefix_cache/queries`` and
        ``prefix_cache/hit_rate`` (from the servers' ``/metrics`` over the run). A key is present (0.0) even when
        nothing happened, so logged series never start late (tokens per version, whose keys are
        the versions, are in :meth:`as_dict`).

        >>> sorted(RolloutMetrics().to_dict())[:3]
        ['rollout/aborted', 'rollout/aborted/backend_aborted', 'rollout/aborted/crashed']
        """
        from ..tools.metrics import FAILURE_KINDS
        from ..trajectory.types import Status
        from .codes import EndCode
        from .drift import DriftCause

        out: dict[str, float] = {}
        for k in _COUNTS:
            out[prefix + k] = float(getattr(self, k))
        out[prefix + "drift/measured"] = float(self.drift_measured)
        out[prefix + "drift/rate"] = self.drift_rate
        for cause in DriftCause:
            n = self.drift_causes.get(cause.value, 0)
            out[f"{prefix}drift/rate/{cause.value}"] = n / self.drift_measured if self.drift_measured else 0.0
        for kind in FAILURE_KINDS:
            out[f"{prefix}tool_failures/{kind}"] = float(self.tool_failure_kinds.get(kind, 0))
        out[prefix + "tool_outputs_cut"] = float(self.tool_failure_kinds.get("output_cut", 0))  # not failures
        for code in EndCode:
            if code.status in (Status.TRUNCATED, Status.ABORTED):
                out[f"{prefix}{code.status.name.lower()}/{code.value}"] = float(self.end_codes.get(code.value, 0))
        for phase in ("tokenize", *SampleTimes.__dataclass_fields__):
            out[f"{prefix}time/{phase}"] = float(self.outside.get(phase, 0.0))
        out[prefix + "time/engine"] = float(self.engine_time)
        out[prefix + "time/wall"] = float(self.wall_time)
        for action in ("withhold", "drop", "mask"):
            out[f"{prefix}stale/{action}"] = float(self.stale.get(action, 0))
        out[prefix + "stale/tokens_off"] = float(self.stale_tokens_off)
        out[prefix + "staleness/max"] = float(self.staleness_max)
        out[prefix + "staleness/mean"] = float(self.staleness_mean)
        out[prefix + "resumed"] = float(self.resumed)
        out[prefix + "prefix_cache/queries"] = float(self.prefix_cache_queries)
        out[prefix + "prefix_cache/hit_rate"] = self.prefix_cache_hit_rate
        return out

    def summary(self) -> str:
        """One paragraph for a terminal."""
        outside = sum(self.outside.values())
        return (
            f"{self.samples} samples: {self.done} done, {self.truncated} truncated, {self.aborted} aborted; "
            f"{self.turns_mean:.1f} turns on average (max {self.turns_max}); {self.tool_calls} tool calls, "
            f"{self.tool_failures} failed; {self.tokens_generated} tokens generated, {self.tokens_appended} appended; "
            f"{self.wall_time:.2f} s wall, {self.engine_time:.2f} s in the engine, {outside:.2f} s outside it "
            f"(summed over samples); drift: {self.drift_samples}/{self.drift_measured} samples would have changed "
            "IDs if re-rendered"
            + (
                " (" + ", ".join(f"{k}: {v}" for k, v in sorted(self.drift_causes.items())) + ")"
                if self.drift_causes
                else ""
            )
        )


#: The counts both flat views report, as floats.
_COUNTS = (
    "samples",
    "done",
    "truncated",
    "aborted",
    "turns_mean",
    "turns_max",
    "tool_calls",
    "tool_failures",
    "tokens_generated",
    "tokens_appended",
    "batches",
    "unverified",
)
