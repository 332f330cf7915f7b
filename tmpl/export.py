"""Rollouts to files and tables any trainer can read: JSON Lines, and ``datasets.Dataset`` (Parquet).

>>> results = rollout.run(conversations)                                      # doctest: +SKIP
>>> tmpl.export.to_jsonl(results, "rollouts.jsonl", metrics=rollout.metrics)  # doctest: +SKIP
>>> again = tmpl.export.from_jsonl("rollouts.jsonl")   # RolloutResults, identical arrays  # doctest: +SKIP
>>> tmpl.export.to_dataset(results).to_parquet("rollouts.parquet")            # doctest: +SKIP

One record per sample (``to_records``), in the order given:

- ``prompt_ids``, ``completion_ids``: token IDs; ``mask``: 1 on model tokens, 0 on appended
  tokens (tool results, generation prompts); ``logprobs``: the rollout logprobs (0.0 where
  ``mask`` is 0). The four arrays of a sample are read back exactly (int32, uint8, float32).
- ``status`` (``DONE`` / ``TRUNCATED`` / ``ABORTED``), ``reason``, ``finish_reason``;
  ``turns``, ``tool_calls``, ``tool_failures``, ``tool_failure_kinds`` (failed calls by kind,
  every kind present), ``drift``; ``drift_cause``, ``drift_position``, ``drift_ours``,
  ``drift_rendered`` (where and why a drifted sample would change if re-rendered: see
  :mod:`tmpl.rollout.drift`; None when it did not drift or was not measured); ``messages`` (the parsed
  conversation, for rewards and logs); ``spans`` (``kind``, ``turn``, ``message``, ``start``,
  ``end``); budgets (``max_length``, ``max_completion_length``, ``vocab_size``), ``tokens_cut``,
  ``num_turns``, ``sample_id``; ``times`` (seconds per phase outside the engine);
- ``versions``: the policy version that sampled each completion token (-1 on appended tokens),
  ``version`` (the rollout's version when the sample ended), ``staleness``, ``stale_action``
  (what ``max_staleness`` did: None, ``withhold``, ``drop``, ``mask``), ``loss_mask`` (``mask``
  after that policy), ``resumed`` (partial rollouts continued after an abort-mode weight update).
  Records written before versions existed read back with -1 everywhere.
- ``episode``: None for a sample whose one sequence is its trajectory (append mode); else (template mode,
  an ``edit_history`` hook, sub-agents) its episode's calls (:mod:`tmpl.episode.records`), so that
  ``result.sequences`` and ``result.rows()`` read back the same (a JSON string in a ``Dataset``).
- ``run_metrics``: the rollout's :class:`tmpl.RolloutMetrics` as flat numbers, when given.
- ``images``: None for a text-only sample; for a trajectory with images
  (:class:`tmpl.trajectory.images.ImageTrajectory`) its image inputs: ``image_token_id``,
  ``spans`` (sequence positions: ``prompt_ids + completion_ids``), ``parts``, ``token_type_keys``
  and ``arrays`` (per key ``dtype``, ``shape`` and either ``b64``, the bytes inline, or ``file``: a
  ``.npy`` file relative to the JSONL's folder, for arrays over ``inline_bytes``, 64 KiB by
  default, written by :func:`to_jsonl` to ``<name>.images/``). Read back, the trajectory holds
  them again and ``result.trajectory.model_inputs()`` rebuilds the model inputs. A sample of template
  mode (or an ``edit_history`` hook) with a ``VisionTemplate`` also has ``sequences``: per sequence of
  its episode, its own images in the same form (None for a sequence without), read back as
  ``result.sequence_images`` (each checked against its sequence's placeholders).
- ``routes``: None without routing replay; for a sample of ``Rollout(routes=True)`` its mixture-of-experts
  routes (:mod:`tmpl.trajectory.routes`): ``dtype``, ``shape`` (``[positions, layers, top_k]``), ``data``
  (base64 of the array bytes) and ``known`` (base64 of the packed known flags), read back exactly into the
  trajectory; ``sequence_routes``: in template mode, the same per training sequence (by index), read back as
  ``result.sequence_routes``. JSON strings in a ``Dataset``.

In a ``Dataset``, ``messages`` is a JSON string (tool-call arguments differ in shape from call to
call, which a columnar schema cannot hold); :func:`from_dataset` parses it back. ``datasets``
is imported only by the two dataset functions.

ATIF (the Agent Trajectory Interchange Format, ``atif`` on PyPI): :func:`to_atif` writes one ATIF
trajectory per result, :func:`from_atif` reads ATIF written by tmpl or anyone else (docs/atif.md; the
mapping is in :mod:`tmpl.atif`, the ``atif`` package is imported only by these two).
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .episode import Episode
from .episode.records import from_record as episode_from_record
from .episode.records import to_record as episode_to_record
from .errors import ExportError, TmplError
from .rollout.drift import DriftCause, DriftDetail
from .rollout.loop import RolloutResult
from .rollout.metrics import RolloutMetrics, SampleTimes
from .tools.metrics import FAILURE_KINDS
from .trajectory.images import INLINE_BYTES, from_record, has_images, restore_image_trajectory, to_record
from .trajectory.routes import routes_from_record, routes_record
from .trajectory.types import Status, restore_trajectory, state_of

if TYPE_CHECKING:  # pragma: no cover
    import datasets

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

__all__ = [
    "FORMAT",
    "episode_entry",
    "episode_from_entry",
    "episodes_from_jsonl",
    "episodes_to_jsonl",
    "from_dataset",
    "from_jsonl",
    "from_atif",
    "from_records",
    "to_atif",
    "to_dataset",
    "to_jsonl",
    "to_records",
]


# -- records ------------------------------------------------------------------------------------


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
        if not isinstance(r, RolloutResult):
            raise ExportError(f"results[{k}]", f"expected a tmpl.RolloutResult, got {type(r).__name__}")
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


def _result(record: Mapping[str, Any], where: str, images_from: str | os.PathLike[str] | None = None) -> RolloutResult:
    if record.get("format") != FORMAT:
        raise ExportError(where, f"format {record.get('format')!r} is not {FORMAT!r}")
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


# -- JSON Lines ---------------------------------------------------------------------------------


def to_jsonl(
    results: Iterable[RolloutResult],
    path: str | os.PathLike,
    metrics: RolloutMetrics | Mapping[str, float] | None = None,
    *,
    inline_bytes: int = INLINE_BYTES,
) -> Path:
    """Write one JSON record per result to ``path`` (gzip-compressed when it ends with ``.gz``).

    Image arrays over ``inline_bytes`` go to ``.npy`` files in ``<path>.images/``, named in the
    records (move that folder along with the file).

    >>> tmpl.export.to_jsonl(results, "rollouts.jsonl.gz", metrics=rollout.metrics)  # doctest: +SKIP
    PosixPath('rollouts.jsonl.gz')
    """
    path = Path(path)
    records = to_records(
        results,
        metrics,
        images_to=path.parent / f"{path.name}.images",
        images_base=path.parent,
        inline_bytes=inline_bytes,
    )
    with _open(path, "w") as f:
        for k, record in enumerate(records):
            try:
                f.write(json.dumps(record, ensure_ascii=False, allow_nan=False, default=_jsonable))
            except (TypeError, ValueError) as exc:
                raise ExportError(f"{path} (result {k})", f"cannot be written as JSON: {exc}") from exc
            f.write("\n")
    return path


def from_jsonl(path: str | os.PathLike) -> list[RolloutResult]:
    """Read results written by :func:`to_jsonl` (token arrays identical to the ones written)."""
    path = Path(path)
    return [_result(record, where, path.parent) for record, where in _lines(path)]


# -- episodes (the gateway's sessions, or any tmpl.episode.Episode) ---------------------------------


def episode_entry(item: Any) -> dict[str, Any]:
    """One episode as the line :func:`episodes_to_jsonl` writes and the gateway's ``/episodes/drain`` and
    ``/episodes/stream`` give: ``{"session", "reason", "record"}`` (``record``:
    :func:`tmpl.episode.records.to_record`). ``item``: a finished gateway session (``.key``, ``.episode``,
    ``.reason``: what ``Gateway.drain`` returns) or an :class:`~tmpl.episode.Episode` (its ``sample_id``).

    >>> from tmpl.episode import Call, Episode
    >>> ep = Episode(sample_id="s1"); _ = ep.add_call(Call([1, 2], [3], [-0.5]))
    >>> sorted(episode_entry(ep)), episode_entry(ep)["session"]
    (['reason', 'record', 'session'], 's1')
    """
    episode = getattr(item, "episode", item)
    if not isinstance(episode, Episode):
        raise ExportError(repr(item)[:80], f"not an episode nor a finished session: {type(item).__name__}")
    key = getattr(item, "key", None)
    if key is None:
        key = episode.sample_id
    return {"session": _plain_id(key), "reason": getattr(item, "reason", ""), "record": episode_to_record(episode)}


def episode_from_entry(entry: Mapping[str, Any], where: str = "entry") -> Episode:
    """The :class:`~tmpl.episode.Episode` of one line :func:`episode_entry` made (its ``sample_id`` the
    session key); ExportError naming ``where`` for a line that is none."""
    if not isinstance(entry, Mapping) or not isinstance(entry.get("record"), Mapping):
        raise ExportError(where, 'an episode line is {"session": ..., "reason": ..., "record": {...}}')
    try:
        return episode_from_record(entry["record"], sample_id=entry.get("session"))
    except TmplError as exc:
        raise ExportError(where, f"{type(exc).__name__}: {exc}") from exc


def episodes_to_jsonl(items: Iterable[Any], path: str | os.PathLike) -> Path:
    """Write one line per episode (:func:`episode_entry`) to ``path`` (gzip when it ends with ``.gz``):
    the gateway's drained sessions, or episodes.

    >>> tmpl.export.episodes_to_jsonl(gateway.drain(), "episodes.jsonl")       # doctest: +SKIP
    >>> rows = [row for ep in tmpl.export.episodes_from_jsonl("episodes.jsonl") for row in ep.rows()]  # doctest: +SKIP
    >>> batch = tmpl.collate(rows, pad_id=0)                                   # doctest: +SKIP
    """
    path = Path(path)
    with _open(path, "w") as f:
        for k, item in enumerate(items):
            try:
                f.write(json.dumps(episode_entry(item), ensure_ascii=False, allow_nan=False, default=_jsonable))
            except (TypeError, ValueError) as exc:
                raise ExportError(f"{path} (episode {k})", f"cannot be written as JSON: {exc}") from exc
            f.write("\n")
    return path


def episodes_from_jsonl(path: str | os.PathLike) -> list[Episode]:
    """Read the episodes :func:`episodes_to_jsonl` wrote (or lines saved from ``/episodes/stream``): their
    sequences are the same (IDs, masks, logprobs, versions, branches), their rewards too."""
    return [episode_from_entry(entry, where) for entry, where in _lines(Path(path))]


def _lines(path: Path) -> Iterator[tuple[Any, str]]:
    """Each JSON line of ``path`` (blank lines skipped) with where it is (``path:line``); ExportError at
    a line that is not JSON."""
    with _open(path, "r") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise ExportError(where, f"not JSON: {exc}") from exc
            yield record, where


def _open(path: Path, mode: str) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, mode + "b"), encoding="utf-8")
    return open(path, mode, encoding="utf-8")


# -- datasets ----------------------------------------------------------------------------------


def to_dataset(
    results: Iterable[RolloutResult], metrics: RolloutMetrics | Mapping[str, float] | None = None
) -> datasets.Dataset:
    """A ``datasets.Dataset`` with one row per result (``.to_parquet(path)`` saves it).

    Columns are the record fields; ``messages`` holds the conversation as a JSON string.

    >>> ds = tmpl.export.to_dataset(results); ds.to_parquet("rollouts.parquet")  # doctest: +SKIP
    """
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - datasets comes with the trl extra
        raise ImportError("tmpl.export.to_dataset needs the datasets library: pip install datasets") from exc
    rows = []
    for record in to_records(results, metrics):
        record["messages"] = json.dumps(record["messages"], ensure_ascii=False, default=_jsonable)
        record["sample_id"] = None if record["sample_id"] is None else str(record["sample_id"])
        record["images"] = None if record["images"] is None else json.dumps(record["images"])
        record["episode"] = None if record["episode"] is None else json.dumps(record["episode"])
        for key in ("routes", "sequence_routes"):
            record[key] = None if record[key] is None else json.dumps(record[key])
        rows.append(record)
    if not rows:
        return datasets.Dataset.from_dict({})
    return datasets.Dataset.from_list(rows, features=_features(datasets, rows[0]))


def from_dataset(dataset: Sequence[Mapping[str, Any]] | Any) -> list[RolloutResult]:
    """Rebuild results from a dataset made by :func:`to_dataset` (or read back from its Parquet file)."""
    return from_records((dataset[i] for i in range(len(dataset))), source="dataset")


def _features(datasets: Any, first: Mapping[str, Any]) -> Any:
    """Explicit column types: token arrays keep their widths, nullable columns do not depend on row 0."""
    V, S = datasets.Value, datasets.Sequence
    features = {
        "format": V("string"),
        "index": V("int64"),
        "sample": V("int64"),
        "sample_id": V("string"),
        "prompt_ids": S(V("int32")),
        "completion_ids": S(V("int32")),
        "mask": S(V("uint8")),
        "logprobs": S(V("float32")),
        "status": V("string"),
        "reason": V("string"),
        "finish_reason": V("string"),
        "turns": V("int64"),
        "tool_calls": V("int64"),
        "tool_failures": V("int64"),
        "drift": V("bool"),
        "tool_failure_kinds": {k: V("int64") for k in FAILURE_KINDS},
        "drift_cause": V("string"),
        "drift_position": V("int64"),
        "drift_ours": V("string"),
        "drift_rendered": V("string"),
        "messages": V("string"),
        "spans": [
            {"kind": V("string"), "turn": V("int64"), "message": V("int64"), "start": V("int64"), "end": V("int64")}
        ],
        "max_length": V("int64"),
        "max_completion_length": V("int64"),
        "vocab_size": V("int64"),
        "tokens_cut": V("int64"),
        "num_turns": V("int64"),
        "times": {k: V("float64") for k in first["times"]},
        "versions": S(V("int32")),
        "version": V("int64"),
        "staleness": V("int64"),
        "stale_action": V("string"),
        "loss_mask": S(V("uint8")),
        "resumed": V("int64"),
        "images": V("string"),
        "episode": V("string"),
        "routes": V("string"),
        "sequence_routes": V("string"),
    }
    if "run_metrics" in first:
        features["run_metrics"] = {k: V("float64") for k in first["run_metrics"]}
    return datasets.Features(features)


# -- ATIF --------------------------------------------------------------------------------------


def to_atif(
    results: Iterable[RolloutResult],
    path: str | os.PathLike[str] | None = None,
    metrics: RolloutMetrics | Mapping[str, float] | None = None,
    *,
    agent: str = "tmpl",
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[Any]:
    """One ATIF trajectory (``atif.Trajectory``, validated by the ``atif`` package's model) per result;
    written to ``path`` when given (``.json``: one trajectory; ``.jsonl``/``.jsonl.gz``: one per line).

    Each model call is an agent step with its ``prompt_token_ids``, ``completion_token_ids`` and
    ``logprobs``; sub-agents and branches (marked ``extra["tmpl"]["branch"]``) are embedded trajectories;
    what ATIF has no field for (versions, the mask, status, spans...) is under ``extra["tmpl"]``, so
    :func:`from_atif` gives the same arrays back.
    ``tools``: the tool schemas the rollout rendered with (written as the agent's ``tool_definitions``, which
    ``tmpl replay`` re-renders with); ``agent``: the agent's name. Needs the ``atif`` extra (``pip install 'tmpl[atif]'``).

    >>> [doc] = tmpl.export.to_atif([result], "run.atif.json")                  # doctest: +SKIP
    >>> doc.steps[1].metrics.logprobs[:2]                                       # doctest: +SKIP
    [-0.0123, -1.25]
    """
    from . import atif

    results = list(results)
    sources = [getattr(r, "atif", None) for r in results]  # read from ATIF: its document's other fields
    documents = atif.records_to_documents(to_records(results, metrics), agent=agent, tools=tools, sources=sources)
    if path is not None:
        atif.write_documents(documents, path)
    return documents


def from_atif(source: str | os.PathLike[str] | Any) -> list[RolloutResult]:
    """Results of ATIF trajectories: a file (one document, a JSON array of them, or JSON lines; detected
    by content), or documents (dicts or ``atif.Trajectory`` objects). Each is validated by the ``atif``
    package's model first; AtifError names the file, the step and the field at fault.

    Each result is a :class:`tmpl.atif.AtifResult` holding its document (``.atif``), so that :func:`to_atif`
    writes back what tmpl does not model. A trajectory tmpl wrote comes back with its arrays identical; one
    written by another program gives
    a sample whose sequence is its calls appended (when each step's prompt extends the one before, as
    an append-mode rollout's) or its calls merged into an episode (branches, sub-agents).

    >>> results = tmpl.export.from_atif("trajectory.json")                      # doctest: +SKIP
    >>> results[0].prompt_ids[:4], results[0].sequences[0].mask.sum()           # doctest: +SKIP
    """
    from . import atif

    if isinstance(source, (str, os.PathLike)):
        found = list(atif.read_documents(source))
        documents, wheres = [d for d, _ in found], [w for _, w in found]
    else:
        documents = list(source) if isinstance(source, (list, tuple)) else [source]
        wheres = [f"documents[{k}]" for k in range(len(documents))]
    records = atif.documents_to_records(documents, wheres=wheres)
    return [atif.with_source(_result(r, w), r.pop("atif_source", None)) for r, w in zip(records, wheres)]


# -- helpers -----------------------------------------------------------------------------------


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
