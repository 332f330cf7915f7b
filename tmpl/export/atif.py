"""ATIF files (:func:`to_atif`, :func:`from_atif`): the records through :mod:`tmpl.atif`'s mapping."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..harness.result import HarnessResult
from ..rollout.loop import RolloutResult
from ..rollout.metrics import RolloutMetrics

if TYPE_CHECKING:  # pragma: no cover
    pass
from .records import _result, to_records


def to_atif(
    results: Iterable[RolloutResult | HarnessResult],
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
    ``tmpl replay`` re-renders with); ``agent``: the agent's name (a harness run's is its harness's name,
    its reason the trajectory's ``notes``: :mod:`tmpl.export.harness`). Needs the ``atif`` extra (``pip install 'tmpl[atif]'``).

    >>> [doc] = tmpl.export.to_atif([result], "run.atif.json")                  # doctest: +SKIP
    >>> doc.steps[1].metrics.logprobs[:2]                                       # doctest: +SKIP
    [-0.0123, -1.25]
    """
    from .. import atif

    results = list(results)
    sources = [getattr(r, "atif", None) for r in results]  # read from ATIF: its document's other fields
    documents = atif.records_to_documents(to_records(results, metrics), agent=agent, tools=tools, sources=sources)
    if path is not None:
        atif.write_documents(documents, path)
    return documents


def from_atif(source: str | os.PathLike[str] | Any) -> list[Any]:
    """Results of ATIF trajectories: a file (one document, a JSON array of them, or JSON lines; detected
    by content), or documents (dicts or ``atif.Trajectory`` objects). Each is validated by the ``atif``
    package's model first; AtifError names the file, the step and the field at fault.

    A harness run's trajectory (written from a :class:`tmpl.harness.HarnessResult`) comes back a
    HarnessResult with the same episode, status, exit code, reward and tails. Every other result is a
    :class:`tmpl.atif.AtifResult` holding its document (``.atif``), so that :func:`to_atif`
    writes back what tmpl does not model. A trajectory tmpl wrote comes back with its arrays identical; one
    written by another program gives
    a sample whose sequence is its calls appended (when each step's prompt extends the one before, as
    an append-mode rollout's) or its calls merged into an episode (branches, sub-agents).

    >>> results = tmpl.export.from_atif("trajectory.json")                      # doctest: +SKIP
    >>> results[0].prompt_ids[:4], results[0].sequences[0].mask.sum()           # doctest: +SKIP
    """
    from .. import atif

    if isinstance(source, (str, os.PathLike)):
        found = list(atif.read_documents(source))
        documents, wheres = [d for d, _ in found], [w for _, w in found]
    else:
        documents = list(source) if isinstance(source, (list, tuple)) else [source]
        wheres = [f"documents[{k}]" for k in range(len(documents))]
    records = atif.documents_to_records(documents, wheres=wheres)
    out: list[Any] = []
    for r, w in zip(records, wheres):
        source = r.pop("atif_source", None)
        result = _result(r, w)
        # a harness run comes back a HarnessResult (its episode and how it ended), not a sample
        out.append(result if isinstance(result, HarnessResult) else atif.with_source(result, source))
    return out
