"""What a document read back keeps of its source, so that written again it comes back as it was:
:class:`AtifResult` and :func:`with_source`."""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from ..rollout.result import RolloutResult
from .model import EXTRA_KEY
from .read import _document_calls


def _in_place(source: Mapping[str, Any]) -> set[Any] | None:
    """The ids of the calls a document holds on its trajectories' own steps (every call outside a branch
    trajectory), as :func:`documents_to_records` names them; None for a document it cannot read."""
    try:
        return {c["id"] for c in _document_calls(source) if not c["in_branch"]}
    except (KeyError, TypeError, AttributeError):
        return None


def _restore(ours: dict[str, Any], source: Mapping[str, Any]) -> dict[str, Any]:
    """``ours`` (a document tmpl built) with what its source document held that tmpl does not model: the
    root's ids, agent, notes, final metrics and extras; per step (when the steps line up: the same count and
    sources) timestamps, model names, reasoning effort, call counts, copied-context flags, the metrics tmpl
    does not keep (costs, cached tokens, their extras), the extras of steps, tool calls and results; and
    the source's logprob values where they are tmpl's float32 ones (a writer's float64 values come back
    as written). Embedded trajectories are matched by ``trajectory_id``."""
    out = dict(ours)
    for key, value in source.items():
        if key in ("steps", "subagent_trajectories", "extra", "schema_version"):
            continue
        if key == "agent":
            out["agent"] = {**value, **{k: v for k, v in ours["agent"].items() if k == "tool_definitions"}}
        else:
            out[key] = value
    for key in ("session_id", "trajectory_id"):  # the source's (none where it had none)
        if key not in source and "subagent_trajectories" not in key:
            out.pop(key, None)
    extra = {k: v for k, v in (source.get("extra") or {}).items() if k != EXTRA_KEY}
    if extra:
        out["extra"] = {**extra, **(ours.get("extra") or {})}
    steps, theirs = ours["steps"], source.get("steps") or []
    if len(steps) == len(theirs) and all(a["source"] == b.get("source") for a, b in zip(steps, theirs)):
        out["steps"] = [_restore_step(a, b) for a, b in zip(steps, theirs)]
    subs = {s.get("trajectory_id"): s for s in source.get("subagent_trajectories") or []}
    if ours.get("subagent_trajectories"):
        out["subagent_trajectories"] = [
            _restore(sub, subs[sub["trajectory_id"]]) if sub["trajectory_id"] in subs else sub
            for sub in ours["subagent_trajectories"]
        ]
    return out


def _restore_step(ours: dict[str, Any], source: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(ours)
    for key, value in source.items():
        if key not in out and key not in ("metrics", "observation", "tool_calls", "extra"):
            out[key] = value
    out["extra"] = _merged_extra(ours.get("extra"), source.get("extra"))
    if out["extra"] is None:
        del out["extra"]
    m, sm = ours.get("metrics"), source.get("metrics")
    if m is not None and sm is not None:
        m = dict(m)
        for key, value in sm.items():
            if key not in m:
                m[key] = value
        if m.get("logprobs") is not None and _same_float32(sm.get("logprobs"), m["logprobs"]):
            m["logprobs"] = list(sm["logprobs"])
        for key in ("prompt_tokens", "completion_tokens"):  # as written (or not) by the source
            if key in sm:
                m[key] = sm[key]
            else:
                m.pop(key, None)
        out["metrics"] = m
    calls, scalls = ours.get("tool_calls"), source.get("tool_calls")
    if calls and scalls and len(calls) == len(scalls):
        out["tool_calls"] = [
            {**a, **({"extra": _merged_extra(a.get("extra"), b.get("extra"))} if b.get("extra") else {})}
            for a, b in zip(calls, scalls)
        ]
    obs, sobs = ours.get("observation"), source.get("observation")
    if sobs:  # references to trajectories in other files are no message: tmpl keeps them only here
        refs = [r for r in sobs["results"] if r.get("content") is None and _file_refs(r)]
        if refs and not obs:
            obs = out["observation"] = {"results": []}
        if refs and obs is not None and len(obs["results"]) < len(sobs["results"]):
            obs = out["observation"] = {"results": [*obs["results"], *refs]}
    if obs and sobs and len(obs["results"]) == len(sobs["results"]):
        out["observation"] = {
            "results": [
                {**a, **({"extra": _merged_extra(a.get("extra"), b.get("extra"))} if b.get("extra") else {})}
                for a, b in zip(obs["results"], sobs["results"])
            ]
        }
    if isinstance(source.get("message"), list):  # content parts: as written (tmpl's text is their text)
        out["message"] = source["message"]
    return out


def _file_refs(result: Mapping[str, Any]) -> bool:
    """Whether an observation result references trajectories in other files only (no embedded one)."""
    refs = result.get("subagent_trajectory_ref") or []
    return bool(refs) and all(r.get("trajectory_id") is None for r in refs)


def _merged_extra(ours: Mapping[str, Any] | None, source: Mapping[str, Any] | None) -> dict[str, Any] | None:
    merged = {**{k: v for k, v in (source or {}).items() if k != EXTRA_KEY}, **(ours or {})}
    return merged or None


def _same_float32(a: Any, b: Sequence[float]) -> bool:
    """Whether ``a`` is a list of numbers equal to ``b``'s at float32 (what tmpl keeps)."""
    if not isinstance(a, list) or len(a) != len(b):
        return False
    try:
        pack = struct.Struct(f"{len(a)}f")
        return pack.pack(*a) == pack.pack(*b)
    except (struct.error, TypeError, OverflowError):
        return False


@dataclass(kw_only=True)
class AtifResult(RolloutResult):
    """A :class:`tmpl.RolloutResult` read from ATIF (:func:`tmpl.export.from_atif`), with ``atif``: the
    document it was read from (a JSON dict), so that :func:`tmpl.export.to_atif` writes back what tmpl does
    not model (timestamps, model names, costs, notes, extras) and the document's own logprob values."""

    atif: dict[str, Any] | None = field(default=None, repr=False)


def with_source(result: RolloutResult, source: Mapping[str, Any] | None) -> AtifResult:
    """``result`` as an :class:`AtifResult` holding ``source`` (the same arrays, not copied)."""
    values = {f.name: getattr(result, f.name) for f in fields(RolloutResult) if f.init}
    return AtifResult(**values, atif=None if source is None else dict(source))
