"""JSON Lines files of records (:func:`to_jsonl`, :func:`from_jsonl`), gzipped when the name ends ``.gz``; large
image arrays as ``.npy`` files beside them."""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ExportError
from ..rollout.loop import RolloutResult
from ..rollout.metrics import RolloutMetrics
from ..trajectory.images import INLINE_BYTES

if TYPE_CHECKING:  # pragma: no cover
    pass
from .records import _jsonable, _result, to_records


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
