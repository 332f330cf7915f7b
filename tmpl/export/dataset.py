"""Records as a ``datasets.Dataset`` (Parquet and the hub) and back (:func:`to_dataset`, :func:`from_dataset`);
``datasets`` is imported only here."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..rollout.loop import RolloutResult
from ..rollout.metrics import RolloutMetrics
from ..tools.metrics import FAILURE_KINDS

if TYPE_CHECKING:  # pragma: no cover
    import datasets
from .records import _jsonable, from_records, to_records


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
