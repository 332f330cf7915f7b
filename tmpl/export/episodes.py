"""The gateway's finished episodes as JSON lines (:func:`episode_entry`, :func:`episode_from_entry`) and files of
them (:func:`episodes_to_jsonl`, :func:`episodes_from_jsonl`)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..episode import Episode
from ..episode.records import from_record as episode_from_record
from ..episode.records import to_record as episode_to_record
from ..errors import ExportError, TmplError
from ..harness.result import HarnessResult

if TYPE_CHECKING:  # pragma: no cover
    pass
from .harness import harness_record
from .jsonl import _lines, _open
from .records import _jsonable, _plain_id


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
    entry = {"session": _plain_id(key), "reason": getattr(item, "reason", ""), "record": episode_to_record(episode)}
    if isinstance(item, HarnessResult):  # a harness run: how it ended too (``tmpl view`` shows it)
        entry["harness"] = harness_record(item, 0)["harness"]
    return entry


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
