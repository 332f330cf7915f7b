"""Per-call outcomes and per-batch tool metrics.

Every call of a batch is accounted for exactly once: it either succeeded or failed with one
of :data:`FAILURE_KINDS`.

>>> m = ToolMetrics.from_outcomes([[CallOutcome("a1", "f", None, "42", 0.5)],
...                                [CallOutcome("b1", "g", "timeout", "Error: ...", 0.2)]], wall_time=0.6)
>>> m.calls, m.ok, m.failures["timeout"], m.timeouts, round(m.mean_latency, 2)
(2, 1, 1, 1, 0.35)
>>> m.as_dict()["tools/failures/timeout"]
1
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: Why a call failed. ``malformed_call``: the model's call could not be read (nothing ran);
#: ``unknown_tool``: no tool has that name; ``bad_arguments``: the arguments do not fit the
#: tool's signature; ``exception``: the tool raised; ``timeout``: the tool did not return in time;
#: ``crashed``: its worker process died (exit, signal, memory or CPU limit; ``isolation="process"``);
#: ``refused``: not run, because earlier calls of the tool still hang in their threads (``max_hung``).
FAILURE_KINDS = ("malformed_call", "unknown_tool", "bad_arguments", "exception", "timeout", "crashed", "refused")


@dataclass(frozen=True)
class CallOutcome:
    """What became of one call: the tool message content, and why it failed (``error`` None if it ran fine).

    ``latency`` is the seconds the tool ran (the timeout for a timeout; None when it never ran);
    ``output`` is the tool's return value (None on failure, or when the output was cut in a worker
    process). ``chars``: the content's length before it was cut (None: not cut; the content then
    ends with a marker, see :mod:`tmpl.tools.outputs`).
    """

    call_id: str
    name: str
    error: str | None
    content: str
    latency: float | None
    output: Any = None
    chars: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def message(self) -> dict[str, Any]:
        """The tool message: ``{"role": "tool", "tool_call_id", "name", "content"}``."""
        return {"role": "tool", "tool_call_id": self.call_id, "name": self.name, "content": self.content}


@dataclass(frozen=True)
class ToolMetrics:
    """Counts and latencies of one batch of tool calls (see :meth:`as_dict` for logging)."""

    calls: int = 0
    ok: int = 0
    failed: int = 0
    failures: dict[str, int] = field(default_factory=lambda: {k: 0 for k in FAILURE_KINDS})
    timeouts: int = 0
    mean_latency: float = 0.0
    max_latency: float = 0.0
    wall_time: float = 0.0
    samples: int = 0
    samples_with_calls: int = 0
    samples_stopped: int = 0
    hung_threads: int = 0
    outputs_cut: int = 0
    per_tool: dict[str, dict[str, float]] = field(default_factory=dict)

    @classmethod
    def from_outcomes(
        cls,
        outcomes: Sequence[Sequence[CallOutcome]],
        *,
        wall_time: float = 0.0,
        stopped: int = 0,
        hung_threads: int = 0,
    ) -> ToolMetrics:
        failures = {k: 0 for k in FAILURE_KINDS}
        latencies: list[float] = []
        per_tool: dict[str, dict[str, float]] = {}
        flat = [o for sample in outcomes for o in sample]
        for o in flat:
            if o.error is not None:
                failures[o.error] = failures.get(o.error, 0) + 1
            if o.latency is not None:
                latencies.append(o.latency)
            row = per_tool.setdefault(o.name, {"calls": 0, "failed": 0, "latency_sum": 0.0, "ran": 0})
            row["calls"] += 1
            row["failed"] += o.error is not None
            if o.latency is not None:
                row["latency_sum"] += o.latency
                row["ran"] += 1
        for row in per_tool.values():
            total = row.pop("latency_sum")
            row["mean_latency"] = total / row["ran"] if row["ran"] else 0.0
            del row["ran"]
        ok = sum(1 for o in flat if o.error is None)
        return cls(
            calls=len(flat),
            ok=ok,
            failed=len(flat) - ok,
            failures=failures,
            timeouts=failures.get("timeout", 0),
            mean_latency=sum(latencies) / len(latencies) if latencies else 0.0,
            max_latency=max(latencies, default=0.0),
            wall_time=wall_time,
            samples=len(outcomes),
            samples_with_calls=sum(1 for s in outcomes if s),
            samples_stopped=stopped,
            hung_threads=hung_threads,
            outputs_cut=sum(1 for o in flat if o.chars is not None),
            per_tool=per_tool,
        )

    def as_dict(self, prefix: str = "tools/") -> dict[str, float]:
        """Flat numbers for a logger (``tools/calls``, ``tools/failures/timeout``, ...)."""
        out: dict[str, float] = {
            f"{prefix}calls": self.calls,
            f"{prefix}ok": self.ok,
            f"{prefix}failed": self.failed,
            f"{prefix}timeouts": self.timeouts,
            f"{prefix}mean_latency": self.mean_latency,
            f"{prefix}max_latency": self.max_latency,
            f"{prefix}wall_time": self.wall_time,
            f"{prefix}samples": self.samples,
            f"{prefix}samples_with_calls": self.samples_with_calls,
            f"{prefix}samples_stopped": self.samples_stopped,
            f"{prefix}hung_threads": self.hung_threads,
            f"{prefix}outputs_cut": self.outputs_cut,
        }
        for kind, n in self.failures.items():
            out[f"{prefix}failures/{kind}"] = n
        return out
