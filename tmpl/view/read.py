"""Stream the records of an export, one at a time, with where each came from (``file:line`` or ``file:row``).

Reads tmpl's JSON Lines (``.jsonl``, ``.jsonl.gz``: :func:`tmpl.export.to_jsonl`, and the gateway's episode
lines of :func:`tmpl.export.episodes_to_jsonl`), Parquet files of the same records
(:func:`tmpl.export.to_dataset` ``.to_parquet``, read batch by batch through ``datasets``, memory-mapped) and ATIF trajectories
(through :mod:`tmpl.atif`, as ``tmpl.export.from_atif`` reads them). Nothing is read whole: a 1 GB export is streamed.

A line that is not JSON, or a record that is not a mapping, is yielded as a :class:`Problem` and reading
goes on; a file of another format altogether raises :class:`~tmpl.errors.ViewError` at its first line.

>>> for item in iter_items("rollouts.jsonl"):                   # doctest: +SKIP
...     print(item.where, "problem" if item.record is None else item.record["status"])
rollouts.jsonl:1 DONE
"""

from __future__ import annotations

import atexit
import functools
import gzip
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ViewError

__all__ = ["FORMATS", "Item", "Problem", "count_items", "detect_format", "iter_items"]

#: the formats :func:`iter_items` reads
FORMATS = ("jsonl", "parquet", "atif")
EXPECTED = "a tmpl export (.jsonl, .jsonl.gz or .parquet written by tmpl.export) or an ATIF .json file"
_PARQUET_MAGIC = b"PAR1"
_GZIP_MAGIC = b"\x1f\x8b"
#: record fields held as JSON strings in a Parquet file
_JSON_COLUMNS = ("messages", "episode", "images")


@dataclass(frozen=True)
class Problem:
    """What is wrong with one record: ``where`` (``file:line``), ``field`` (None: the whole line), why."""

    where: str
    field: str | None
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.field is None else f"{self.where}: {self.field}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"where": self.where, "field": self.field, "message": self.message}


@dataclass(frozen=True)
class Item:
    """One record read (``record``), or the :class:`Problem` that kept it from being read."""

    where: str
    record: Mapping[str, Any] | None
    problem: Problem | None = None


def detect_format(path: str | os.PathLike[str]) -> str:
    """``"jsonl"``, ``"parquet"`` or ``"atif"``, from the file's first bytes; ViewError for anything else.

    >>> detect_format("rollouts.parquet")                        # doctest: +SKIP
    'parquet'
    """
    p = Path(path)
    if not p.exists():
        raise ViewError(str(p), f"does not exist; expected {EXPECTED}")
    if p.is_dir():
        raise ViewError(str(p), f"is a folder; expected {EXPECTED}")
    with open(p, "rb") as f:
        head = f.read(4096)
    if head.startswith(_PARQUET_MAGIC):
        return "parquet"
    from ..atif import looks_like_atif

    if looks_like_atif(p):  # by content: one document, an array of them, or lines; gzip too
        return "atif"
    if head.startswith(_GZIP_MAGIC):
        return "jsonl"
    text = head.lstrip()
    if not text:
        raise ViewError(f"{p}:1", f"the file is empty; expected {EXPECTED}")
    if text.startswith(b"{"):
        return "jsonl"
    if text.startswith(b"["):
        raise ViewError(f"{p}:1", f"a JSON array, not JSON lines (one record per line); expected {EXPECTED}")
    kind = "binary data" if b"\x00" in head else f"text starting {head[:24].decode('utf-8', 'replace')!r}"
    raise ViewError(f"{p}:1", f"{kind}, not a JSON record; expected {EXPECTED}")


def iter_items(path: str | os.PathLike[str], fmt: str | None = None) -> Iterator[Item]:
    """Every record of ``path`` in order (problems included, as :class:`Item` with ``record`` None)."""
    fmt = fmt or detect_format(path)
    if fmt == "parquet":
        yield from _parquet(Path(path))
    elif fmt == "atif":
        yield from _atif(Path(path))
    else:
        yield from _jsonl(Path(path))


def count_items(path: str | os.PathLike[str], fmt: str | None = None) -> int:
    """How many records ``path`` holds (lines that are not blank; Parquet rows from the footer), streamed."""
    fmt = fmt or detect_format(path)
    p = Path(path)
    if fmt == "parquet":
        return len(_parquet_file(p))
    if fmt == "atif":
        from ..atif import read_documents

        return sum(1 for _ in read_documents(p))
    n = 0
    with _open_binary(p) as f:
        for line in f:
            if line.strip():
                n += 1
    return n


def _open_binary(path: Path) -> io.BufferedIOBase:
    with open(path, "rb") as f:
        gz = f.read(2) == _GZIP_MAGIC
    return gzip.open(path, "rb") if gz else open(path, "rb")


def _jsonl(path: Path) -> Iterator[Item]:
    with _open_binary(path) as f:
        try:
            for line_no, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                where = f"{path.name}:{line_no}"
                try:
                    record = json.loads(raw.rstrip(b"\r\n"))
                except UnicodeDecodeError as exc:
                    yield Item(where, None, Problem(where, None, f"not UTF-8 text ({exc.reason} at byte {exc.start})"))
                    continue
                except ValueError as exc:
                    cut = "" if raw.endswith(b"\n") else " (the last line, cut short: a truncated file?)"
                    yield Item(where, None, Problem(where, None, f"not JSON: {exc}{cut}"))
                    continue
                if not isinstance(record, Mapping):
                    yield Item(where, None, Problem(where, None, f"a JSON {type(record).__name__}, not a record"))
                    continue
                yield Item(where, record)
        except (EOFError, OSError) as exc:  # a .gz cut short or corrupt
            where = f"{path.name}:end"
            yield Item(where, None, Problem(where, None, f"the compressed file cannot be read on: {exc}"))


@functools.lru_cache(maxsize=2)
def _parquet_dataset(path: str, mtime: float) -> Any:  # noqa: ARG001 - mtime: part of the cache key
    """The Parquet file as a ``datasets.Dataset`` (the ``datasets`` extra): an Arrow cache file in a temporary
    folder (removed at exit), memory-mapped, so rows are read in batches, never the file whole into memory.
    Cached per file and modification time: the count and the rows convert once."""
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - the datasets extra
        raise ViewError(path, "reading Parquet needs the datasets library: pip install datasets") from exc
    cache = tempfile.mkdtemp(prefix="tmpl-view-parquet-")
    atexit.register(shutil.rmtree, cache, True)
    quiet = datasets.utils.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        return datasets.Dataset.from_parquet(path, cache_dir=cache, keep_in_memory=False)
    except Exception as exc:  # noqa: BLE001 - pyarrow and datasets raise their own kinds for a broken file
        raise ViewError(path, f"not a readable Parquet file: {_first_line(exc)}") from exc
    finally:
        if not quiet:
            datasets.enable_progress_bars()


def _parquet_file(path: Path) -> Any:
    return _parquet_dataset(str(path), path.stat().st_mtime)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _parquet(path: Path, batch_size: int = 256) -> Iterator[Item]:
    dataset = _parquet_file(path)
    row = 0
    for batch in dataset.iter(batch_size=batch_size):
        keys = list(batch)
        for values in zip(*(batch[k] for k in keys)):
            record = dict(zip(keys, values))
            row += 1
            where = f"{path.name}:row {row}"
            bad = None
            for key in _JSON_COLUMNS:
                if isinstance(record.get(key), str):
                    try:
                        record[key] = json.loads(record[key])
                    except ValueError as exc:
                        bad = Problem(where, key, f"not JSON: {exc}")
                        break
            yield Item(where, None, bad) if bad is not None else Item(where, record)


def _atif(path: Path) -> Iterator[Item]:
    """ATIF trajectories as tmpl records (:mod:`tmpl.atif`, validated by the ``atif`` package's models); a
    document that does not validate is a :class:`Problem` naming its step and field, and the rest are read.
    (The ATIF reader reads the file's text whole: ATIF files are one document, an array or lines.)"""
    from .. import atif
    from ..errors import ExportError

    try:
        documents = atif.read_documents(path)
        for doc, where in documents:
            where = where.replace(str(path), path.name, 1)
            try:
                [record] = atif.documents_to_records([doc], wheres=[where])
            except ExportError as exc:
                yield Item(where, None, Problem(exc.where.replace(str(path), path.name, 1), None, exc.reason))
                continue
            except ImportError as exc:
                raise ViewError(
                    str(path), f"reading ATIF needs the atif extra: pip install 'tmpl[atif]' ({exc})"
                ) from exc
            yield Item(where, record)
    except ExportError as exc:
        if isinstance(exc, ViewError):
            raise
        yield Item(exc.where, None, Problem(exc.where.replace(str(path), path.name, 1), None, exc.reason))
