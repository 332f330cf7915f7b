"""One record per sample and back (:func:`to_records`, :func:`from_records`): the arrays, status, spans,
versions, episode, images and routes of each :class:`~tmpl.RolloutResult`, checked field by field when read."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..episode import Episode
from ..episode.records import from_record as episode_from_record
from ..episode.records import to_record as episode_to_record
from ..errors import ExportError, TmplError
from ..harness.result import HarnessResult
from ..rollout.drift import DriftCause, DriftDetail
from ..rollout.loop import RolloutResult
from ..rollout.metrics import RolloutMetrics, SampleTimes
from ..tools.metrics import FAILURE_KINDS
from ..trajectory.images import INLINE_BYTES, from_record, has_images, restore_image_trajectory, to_record
from ..trajectory.routes import routes_from_record, routes_record
from ..trajectory.types import Status, restore_trajectory, state_of
from .harness import harness_record, harness_result, is_harness_record

if TYPE_CHECKING:  # pragma: no cover
    pass


#: Written in every record; records of another format are refused.
FORMAT = "tmpl.rollout.v1"


_ARRAYS = {"prompt_ids": np.int32, "completion_ids": np.int32, "mask": np.uint8, "logprobs": np.float32}


_REQUIRED = (
    "prompt_ids",
    "completion_ids",
    "mask",
    "logprobs",
    "status",
    "reason",
    "messages",
    "spans",
    "max_length",
    "max_completion_length",
)


def to_records(
    results: Iterable[RolloutResult],
    metrics: RolloutMetrics | Mapping[str, float] | None = None,
    *,
    images_to: str | os.PathLike[str] | None = None,
    images_base: str | os.PathLike[str] | None = None,
    inline_bytes: int = INLINE_BYTES,
) -> list[dict[str, Any]]:
    """One plain dict per result (JSON-ready: lists, numbers, strings, None).

    Image arrays are inline unless ``images_to`` is a folder: arrays over ``inline_bytes`` are then
    written there as ``.npy`` files, named in the record relative to ``images_base`` (default: the
    folder's parent).

    >>> records = to_records(results, metrics=rollout.metrics)  # doctest: +SKIP
    >>> records[0]["status"], records[0]["mask"][:3]             # doctest: +SKIP
    ('DONE', [1, 1, 1])
    """
    run = _run_metrics(metrics)
    records = []
    saver = _ArraySaver(images_to, images_base) if images_to is not None else None
    for k, r in enumerate(results):
        if isinstance(r, HarnessResult):  # a harness run: its episode and how it ended (export/harness.py)
            records.append(harness_record(r, k) if run is None else {**harness_record(r, k), "run_metrics": run})
            continue
        if not isinstance(r, RolloutResult):
            raise ExportError(
                f"results[{k}]", f"expected a tmpl.RolloutResult or tmpl.harness.HarnessResult, got {type(r).__name__}"
            )
        state = state_of(r.trajectory)
        record: dict[str, Any] = {
            "format": FORMAT,
            "index": r.index,
            "sample": r.sample,
            "sample_id": _plain_id(state["sample_id"]),
            "prompt_ids": state["prompt_ids"].tolist(),
            "completion_ids": state["completion_ids"].tolist(),
            "mask": state["mask"].tolist(),
            "logprobs": state["logprobs"].tolist(),
            "status": Status(state["status"]).name,
            "reason": state["reason"],
            "finish_reason": r.finish_reason,
            "turns": r.turns,
            "tool_calls": r.tool_calls,
            "tool_failures": r.tool_failures,
            "tool_failure_kinds": {k: int(r.tool_failure_kinds.get(k, 0)) for k in FAILURE_KINDS},
            "drift": r.drift,
            **_drift_fields(r.drift_detail),
            "messages": r.messages,
            "spans": [
                {"kind": s[0], "turn": s[1], "message": s[2], "start": s[3], "end": s[4]} for s in state["spans"]
            ],
            "max_length": state["max_length"],
            "max_completion_length": state["max_completion_length"],
            "vocab_size": state["vocab_size"],
            "tokens_cut": state["tokens_cut"],
            "num_turns": state["num_turns"],
            "times": asdict(r.times),
            "versions": r.versions.tolist(),
            "version": r.version,
            "staleness": r.staleness,
            "stale_action": r.stale_action,
            "loss_mask": r.loss_mask.tolist(),
            "resumed": r.resumed,
            "images": _images_field(r, k, saver, inline_bytes),
            # the sample's calls when its sequences are not the trajectory alone (template mode, a hook,
            # sub-agents): read back, result.sequences are the same
            "episode": episode_to_record(r.episode) if r.from_calls else None,
            **_routes_fields(r),
        }
        if run is not None:
            record["run_metrics"] = run
        records.append(record)
    return records


def from_records(
    records: Iterable[Mapping[str, Any]], *, source: str = "records", images_from: str | os.PathLike[str] | None = None
) -> list[RolloutResult]:
    """Rebuild :class:`tmpl.RolloutResult` objects (with their trajectories) from records.

    ``source`` names where the records came from, for errors (``"rollouts.jsonl"``);
    ``images_from``: the folder the records' image files are relative to.
    """
    out = []
    for k, record in enumerate(records):
        where = f"{source}[{k}]"
        out.append(_result(record, where, images_from))
    return out


def _result(record: Mapping[str, Any], where: str, images_from: str | os.PathLike[str] | None = None) -> Any:
    """The :class:`~tmpl.RolloutResult` of a record, or the :class:`~tmpl.harness.HarnessResult` of a
    harness run's (:func:`tmpl.export.harness.harness_record`)."""
    if record.get("format") != FORMAT:
        raise ExportError(where, f"format {record.get('format')!r} is not {FORMAT!r}")
    if is_harness_record(record):
        return harness_result(record, where)
    missing = [key for key in _REQUIRED if key not in record]
    if missing:
        raise ExportError(where, f"missing field(s) {', '.join(repr(m) for m in missing)}")
    arrays = {key: np.asarray(record[key], dtype=dtype) for key, dtype in _ARRAYS.items()}
    n = len(arrays["completion_ids"])
    for key in ("mask", "logprobs"):
        if len(arrays[key]) != n:
            raise ExportError(where, f"{key} has {len(arrays[key])} entries but completion_ids has {n}")
    try:
        status = Status[record["status"]]
    except KeyError:
        raise ExportError(where, f"unknown status {record['status']!r}") from None
    spans = record["spans"] or []
    state = {
        **arrays,
        "max_length": int(record["max_length"]),
        "max_completion_length": record["max_completion_length"],
        "vocab_size": record.get("vocab_size"),
        "sample_id": record.get("sample_id"),
        "spans": [(s["kind"], s["turn"], s["message"], s["start"], s["end"]) for s in spans],
        "status": int(status),
        "reason": record["reason"],
        "tokens_cut": int(record.get("tokens_cut", 0)),
        "num_turns": int(record.get("num_turns", 0)),
    }
    if record.get("routes") is not None:
        state["routes"] = _routes_state(record["routes"], len(arrays["prompt_ids"]) + n, where)
    images = record.get("images")
    try:
        if images is None:
            traj = restore_trajectory(state)
        else:
            carried = _read_images(json.loads(images) if isinstance(images, str) else images, images_from)
            traj = restore_image_trajectory(state, carried)
    except Exception as exc:
        raise ExportError(where, f"cannot rebuild the trajectory: {exc}") from exc
    versions = None
    if record.get("versions") is not None:
        versions = np.asarray(record["versions"], dtype=np.int32)
        if len(versions) != n:
            raise ExportError(where, f"versions has {len(versions)} entries but completion_ids has {n}")
    loss_mask = None
    if record.get("loss_mask") is not None and record.get("stale_action") is not None:
        loss_mask = np.asarray(record["loss_mask"], dtype=np.uint8)
        if len(loss_mask) != n:
            raise ExportError(where, f"loss_mask has {len(loss_mask)} entries but completion_ids has {n}")
    messages = record["messages"]
    if isinstance(messages, str):
        messages = json.loads(messages)
    episode = None
    if record.get("episode") is not None:
        carried = record["episode"]
        try:
            episode = episode_from_record(
                json.loads(carried) if isinstance(carried, str) else carried,
                sample_id=(int(record.get("index", 0)), int(record.get("sample", 0))),
            )
        except TmplError as exc:
            raise ExportError(where, f"cannot rebuild the episode: {exc}") from exc
    times = SampleTimes(**(record.get("times") or {}))
    return RolloutResult(
        index=int(record.get("index", 0)),
        sample=int(record.get("sample", 0)),
        trajectory=traj,
        messages=messages,
        turns=int(record.get("turns", 0)),
        tool_calls=int(record.get("tool_calls", 0)),
        tool_failures=int(record.get("tool_failures", 0)),
        finish_reason=record.get("finish_reason", "stop"),
        drift=record.get("drift"),
        times=times,
        drift_detail=_drift_detail(record, where),
        tool_failure_kinds={k: int(v) for k, v in (record.get("tool_failure_kinds") or {}).items() if v},
        _versions=versions,
        version=int(record.get("version", 0)),
        stale_action=record.get("stale_action"),
        resumed=int(record.get("resumed", 0)),
        _loss_mask=loss_mask,
        _episode=episode,
        _sequence_images=_sequence_images(images, episode, where, images_from),
        _sequence_routes=_sequence_routes(record.get("sequence_routes"), where),
    )


def _drift_fields(detail: DriftDetail | None) -> dict[str, Any]:
    if detail is None:
        return {"drift_cause": None, "drift_position": None, "drift_ours": None, "drift_rendered": None}
    return {
        "drift_cause": detail.cause.value,
        "drift_position": detail.position,
        "drift_ours": detail.ours,
        "drift_rendered": detail.rendered,
    }


def _drift_detail(record: Mapping[str, Any], where: str) -> DriftDetail | None:
    cause = record.get("drift_cause")
    if cause is None:
        return None
    try:
        return DriftDetail(
            DriftCause(cause), int(record["drift_position"]), record["drift_ours"], record["drift_rendered"]
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ExportError(where, f"unreadable drift detail (cause {cause!r}): {exc}") from None


class _ArraySaver:
    """Writes the image arrays of records to ``.npy`` files in ``folder`` (made on the first one)."""

    def __init__(self, folder: str | os.PathLike[str], base: str | os.PathLike[str] | None) -> None:
        self.folder = Path(folder)
        self.base = Path(base) if base is not None else self.folder.parent

    def saver(self, k: int, tag: str = "") -> Any:
        def save(key: str, array: np.ndarray) -> str:
            self.folder.mkdir(parents=True, exist_ok=True)
            target = self.folder / f"{k:06d}.{tag}{key}.npy"
            np.save(target, array, allow_pickle=False)
            return os.path.relpath(target, self.base)

        return save


def _routes_fields(r: RolloutResult) -> dict[str, Any]:
    """``routes`` (the trajectory's, with known flags) and, in template mode, ``sequence_routes`` (per
    sequence of the episode, None for one without): compact records (``routes.routes_record``)."""
    routes = r.routes
    record = None if routes is None else routes_record(routes, r.routes_known)
    per_sequence = None
    if r._sequence_routes:
        per_sequence = {str(k): routes_record(*held) for k, held in sorted(r._sequence_routes.items())}
    return {"routes": record, "sequence_routes": per_sequence}


def _routes_state(carried: Any, length: int, where: str) -> dict[str, Any]:
    """A record's routes as a trajectory state holds them (checked against the sample's ``length``)."""
    try:
        routes, known = routes_from_record(json.loads(carried) if isinstance(carried, str) else carried)
    except TmplError as exc:
        raise ExportError(where, f"routes: {exc}") from exc
    if len(routes) != length:
        raise ExportError(where, f"routes cover {len(routes)} positions, the sample has {length}")
    return {"routes": routes, "known": known}


def _sequence_routes(carried: Any, where: str) -> dict[int, tuple[Any, Any]] | None:
    if carried is None:
        return None
    try:
        plain = json.loads(carried) if isinstance(carried, str) else carried
        return {int(k): routes_from_record(v) for k, v in plain.items()}
    except (TmplError, AttributeError, ValueError) as exc:
        raise ExportError(where, f"sequence_routes: {exc}") from exc


def _images_field(r: RolloutResult, k: int, saver: _ArraySaver | None, inline_bytes: int) -> dict[str, Any] | None:
    if not has_images(r.trajectory):
        return None
    traj: Any = r.trajectory
    record = to_record(traj.images, saver.saver(k) if saver is not None else None, inline_bytes)
    if r._sequence_images is not None:  # template mode: each sequence's own images (the trajectory is the last's)
        record["sequences"] = [
            None if im is None else to_record(im, saver.saver(k, f"s{i}.") if saver is not None else None, inline_bytes)
            for i, im in enumerate(r.sequence_images)
        ]
    return record


def _sequence_images(
    record: Any, episode: Episode | None, where: str, images_from: str | os.PathLike[str] | None
) -> dict[int, Any] | None:
    """The per-sequence images of an images record (template mode), each checked against its sequence."""
    if record is None:
        return None
    carried = json.loads(record) if isinstance(record, str) else record
    sequences = carried.get("sequences")
    if sequences is None:
        return None
    if episode is None or len(sequences) != episode.num_sequences:
        held = "no episode" if episode is None else f"{episode.num_sequences} sequence(s)"
        raise ExportError(where, f"images of {len(sequences)} sequence(s), but the record holds {held}")
    out: dict[int, Any] = {}
    for i, rec in enumerate(sequences):
        if rec is None:
            continue
        try:
            images = _read_images(rec, images_from)
            images.check_aligned(episode.sequence(i).ids.tolist())
        except Exception as exc:
            raise ExportError(where, f"cannot rebuild the images of sequence {i}: {exc}") from exc
        out[i] = images
    return out


def _read_images(record: Mapping[str, Any], images_from: str | os.PathLike[str] | None) -> Any:
    def load(name: str) -> np.ndarray:
        array: np.ndarray = np.load(Path(str(images_from)) / name, allow_pickle=False)
        return array

    return from_record(record, load if images_from is not None else None)


def _run_metrics(metrics: RolloutMetrics | Mapping[str, float] | None) -> dict[str, float] | None:
    if metrics is None:
        return None
    if isinstance(metrics, RolloutMetrics):
        return metrics.to_dict()
    return {str(k): float(v) for k, v in metrics.items()}


def _plain_id(sample_id: Any) -> Any:
    return sample_id if sample_id is None or isinstance(sample_id, (str, int)) else str(sample_id)


def _jsonable(value: Any) -> Any:
    """numpy scalars and arrays become numbers and lists; anything else is written as its text."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)
