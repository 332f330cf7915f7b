"""One export record to what the page carries: a summary row (for the table) and a compact detail blob.

The detail holds the token arrays as base64 typed arrays (``ids`` int32 of prompt + completion, ``mask`` and
``loss`` uint8, ``lp`` float32, ``ver`` int32: little-endian, decoded by the page only when the sample is
opened), the spans, the messages, the drift and the episode's sequences. Fields that are missing or do not
fit (arrays of unequal lengths, a wrong type) become :class:`~tmpl.view.read.Problem` entries naming the
field; the rest of the record is still shown.

>>> row, detail, problems = compact(record, "rollouts.jsonl:3", 2)   # doctest: +SKIP
>>> row["status"], detail["np"], [str(p) for p in problems]          # doctest: +SKIP
('DONE', 41, [])
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import numpy as np

from .read import Problem

__all__ = ["ROW_FIELDS", "b64", "compact"]

#: the summary columns, in the order the page's table shows them
ROW_FIELDS = (
    "index",
    "sample",
    "status",
    "end",
    "turns",
    "tool_calls",
    "reward",
    "drift",
    "cause",
    "drift_at",
    "staleness",
    "length",
    "sampled",
    "version",
    "sequences",
    "problems",
)
_FORMAT = "tmpl.rollout.v1"


def b64(array: np.ndarray) -> str:
    """A little-endian array's bytes as base64 (what the page decodes into a typed array)."""
    return base64.b64encode(np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()).decode()


def _array(record: Mapping[str, Any], key: str, dtype: Any, where: str, problems: list[Problem]) -> np.ndarray | None:
    value = record.get(key)
    if value is None:
        return None
    try:
        out = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        problems.append(Problem(where, key, f"not an array of {np.dtype(dtype).name}: {exc}"))
        return None
    if out.ndim != 1:
        problems.append(Problem(where, key, f"not a flat array (shape {out.shape})"))
        return None
    return out


def _int(value: Any) -> int | None:
    try:
        return None if value is None or isinstance(value, bool) else int(value)
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> float | None:
    try:
        out = None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None
    return out if out is None or np.isfinite(out) else None


def compact(record: Mapping[str, Any], where: str, row: int) -> tuple[dict[str, Any], dict[str, Any], list[Problem]]:
    """``(summary row, detail, problems)`` of one record; ``row`` is its number on the page."""
    problems: list[Problem] = []
    if "format" not in record and "record" in record and "session" in record:
        return _episode_line(record, where, row)
    if record.get("format") != _FORMAT:
        problems.append(
            Problem(where, "format", f"{record.get('format')!r} is not {_FORMAT!r}; shown as far as it reads")
        )
    prompt = _array(record, "prompt_ids", np.int64, where, problems)
    completion = _array(record, "completion_ids", np.int64, where, problems)
    for key, value in (("prompt_ids", prompt), ("completion_ids", completion)):
        if value is None and not any(p.field == key for p in problems):
            problems.append(Problem(where, key, "missing"))
    prompt = prompt if prompt is not None else np.zeros(0, np.int64)
    completion = completion if completion is not None else np.zeros(0, np.int64)
    n = len(completion)
    per_token = {}
    for key, dtype in (("mask", np.uint8), ("logprobs", np.float32), ("versions", np.int32), ("loss_mask", np.uint8)):
        value = _array(record, key, dtype, where, problems)
        if value is not None and len(value) != n:
            problems.append(Problem(where, key, f"has {len(value)} entries but completion_ids has {n}; not shown"))
            value = None
        per_token[key] = value
    if per_token["mask"] is None and not any(p.field == "mask" for p in problems):
        problems.append(Problem(where, "mask", "missing"))
    ids = np.concatenate([prompt, completion])
    if ids.size and (ids.min() < 0 or ids.max() >= 2**31):
        problems.append(Problem(where, "prompt_ids", "token IDs outside 0..2**31-1"))
        ids = np.clip(ids, 0, 2**31 - 1)
    messages = record.get("messages")
    if messages is not None and not isinstance(messages, list):
        problems.append(Problem(where, "messages", f"a {type(messages).__name__}, not a list of messages"))
        messages = None
    spans = _spans(record.get("spans"), where, problems, n)
    drift = _drift(record, where, problems)
    episode = _episode(record.get("episode"), record, where, problems)
    reward = _float(record.get("reward"))
    if reward is None and isinstance(record.get("episode"), Mapping):
        reward = _float(record["episode"].get("reward"))
    mask = per_token["mask"]
    loss = per_token["loss_mask"]
    if loss is not None and mask is not None and np.array_equal(loss, mask):
        loss = None  # the same as the mask: not carried twice
    versions = per_token["versions"]
    summary = {
        "index": _int(record.get("index")),
        "sample": _int(record.get("sample")),
        "status": str(record.get("status") or ""),
        "end": str(record.get("reason") or ""),
        "turns": _int(record.get("turns")),
        "tool_calls": _int(record.get("tool_calls")),
        "reward": reward,
        "drift": None if record.get("drift") is None else bool(record.get("drift")),
        "cause": drift["cause"] if drift else "",
        "drift_at": drift["position"] if drift else None,
        "staleness": _int(record.get("staleness")),
        "length": int(ids.size),
        "sampled": int(mask.sum()) if mask is not None else None,
        "version": _int(record.get("version")),
        "sequences": len(episode["sequences"]) if episode else 1,
        "problems": len(problems),
    }
    detail: dict[str, Any] = {
        "row": row,
        "where": where,
        "ids": b64(ids.astype(np.int32)),
        "np": int(prompt.size),
        "mask": None if mask is None else b64(mask),
        "loss": None if loss is None else b64(loss),
        "lp": None if per_token["logprobs"] is None else b64(per_token["logprobs"]),
        "ver": None if versions is None or not (versions >= 0).any() else b64(versions),
        "spans": spans,
        "messages": messages,
        "drift": drift,
        "episode": episode,
        "info": {
            k: record.get(k)
            for k in (
                "sample_id",
                "finish_reason",
                "stale_action",
                "resumed",
                "tokens_cut",
                "max_length",
                "tool_failures",
            )
            if record.get(k) is not None
        }
        | _harness_info(record.get("harness")),
        "problems": [p.to_dict() for p in problems],
    }
    return summary, detail, problems


#: a harness run's fields the sample's head shows (``record["harness"]``: tmpl.export.harness), as named there
_HARNESS_INFO = {
    "name": "harness",
    "task_id": "task",
    "exit_code": "exit_code",
    "seconds": "seconds",
    "calls": "calls",
    "error": "error",
    "stdout_tail": "stdout_tail",
    "stderr_tail": "stderr_tail",
}


def _harness_info(run: Any) -> dict[str, Any]:
    """What the page's sample head shows of a harness run (empty for a record that is none)."""
    if not isinstance(run, Mapping):
        return {}
    return {label: run[key] for key, label in _HARNESS_INFO.items() if run.get(key) not in (None, "")}


def version_tokens(detail_versions: np.ndarray | None) -> dict[int, int]:
    """Sampled tokens per policy version (appended tokens, -1, left out)."""
    if detail_versions is None:
        return {}
    values, counts = np.unique(detail_versions[detail_versions >= 0], return_counts=True)
    return {int(v): int(c) for v, c in zip(values, counts)}


def _spans(value: Any, where: str, problems: list[Problem], n: int) -> list[list[Any]]:
    if value is None:
        return []
    out = []
    try:
        for s in value:
            start, end = int(s["start"]), int(s["end"])
            if not 0 <= start <= end <= n:
                raise ValueError(f"span {start}..{end} outside the {n} completion tokens")
            message = s.get("message")
            out.append([str(s["kind"]), _int(s.get("turn")), None if message is None else int(message), start, end])
    except (TypeError, ValueError, KeyError) as exc:
        problems.append(Problem(where, "spans", f"unreadable: {exc!r}"))
        return []
    return out


def _drift(record: Mapping[str, Any], where: str, problems: list[Problem]) -> dict[str, Any] | None:
    cause = record.get("drift_cause")
    if cause is None:
        return None
    position = _int(record.get("drift_position"))
    if position is None:
        problems.append(Problem(where, "drift_position", f"{record.get('drift_position')!r} is not a token position"))
        return None
    return {
        "cause": str(cause),
        "position": position,
        "ours": str(record.get("drift_ours") or ""),
        "rendered": str(record.get("drift_rendered") or ""),
        "rendered_ids": None,
    }


def _episode(value: Any, record: Mapping[str, Any], where: str, problems: list[Problem]) -> dict[str, Any] | None:
    """The episode's calls (a tree by ``parent``) and its training sequences (ids, mask, branch), rebuilt."""
    if value is None:
        return None
    from ..episode.records import from_record
    from ..errors import TmplError

    try:
        episode = from_record(value, sample_id=(record.get("index"), record.get("sample")))
    except (TmplError, TypeError, ValueError, KeyError) as exc:
        problems.append(Problem(where, "episode", f"cannot be rebuilt: {exc}"))
        return None
    calls = [
        {
            "id": None if c.id is None else str(c.id),
            "parent": None if c.parent is None else str(c.parent),
            "agent": c.agent,
            "turn": c.turn,
            "prompt": int(len(c.prompt_ids)),
            "sampled": int(len(c.completion_ids)),
            "trained": bool(c.trained),
        }
        for c in episode.calls
    ]
    sequences = []
    for s in episode.sequences:
        br = s.branch
        sequences.append(
            {
                "ids": b64(np.asarray(s.ids, dtype=np.int32)),
                "mask": b64(np.asarray(s.mask, dtype=np.uint8)),
                "sampled": b64(np.asarray(s.sampled, dtype=np.uint8)),
                "lp": b64(np.asarray(s.logprobs, dtype=np.float32)),
                "ver": b64(np.asarray(s.versions, dtype=np.int32)),
                "calls": [str(c) for c in s.calls],
                "agent": s.agent,
                "parent": None if s.parent is None else str(s.parent),
                "branch": {"kind": br.kind, "against": br.against, "token": br.token, "edit": br.edit, "text": str(br)},
                "status": s.status.name,
            }
        )
    return {"calls": calls, "sequences": sequences, "reward": _float(episode.reward)}


def _episode_line(
    record: Mapping[str, Any], where: str, row: int
) -> tuple[dict[str, Any], dict[str, Any], list[Problem]]:
    """A gateway episode line (``{"session", "reason", "record"}``): its last sequence is the sample's tokens."""
    problems: list[Problem] = []
    episode = _episode(record.get("record"), {"index": row, "sample": 0}, where, problems)
    last = episode["sequences"][-1] if episode and episode["sequences"] else None
    ids = np.frombuffer(base64.b64decode(last["ids"]), "<i4") if last else np.zeros(0, np.int32)
    mask = np.frombuffer(base64.b64decode(last["mask"]), "<u1") if last else np.zeros(0, np.uint8)
    found = record.get("harness")  # a harness run's line (tmpl.export.episode_entry)
    run: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    summary: dict[str, Any] = {key: None for key in ROW_FIELDS}
    summary.update(
        index=row,
        sample=_int(run.get("sample")) or 0,
        status=str(run.get("status") or (record.get("record") or {}).get("status") or ""),
        end=str(record.get("reason") or ""),
        reward=_float(run["reward"]) if run.get("reward") is not None else (episode["reward"] if episode else None),
        turns=_int(run.get("calls")),
        length=int(ids.size),
        sampled=int(mask.sum()),
        sequences=len(episode["sequences"]) if episode else 0,
        problems=len(problems),
        cause="",
    )
    detail = {
        "row": row,
        "where": where,
        "ids": last["ids"] if last else "",
        "np": 0,
        "mask": None,
        "loss": None,
        "lp": None,
        "ver": None,
        "spans": [],
        "messages": None,
        "drift": None,
        "episode": episode,
        "info": {"session": record.get("session")} | _harness_info(run),
        "problems": [p.to_dict() for p in problems],
        "episode_only": True,
    }
    return summary, detail, problems
