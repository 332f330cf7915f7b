"""A harness run (:class:`tmpl.harness.HarnessResult`) as an export record and back: what lets
:func:`tmpl.export.to_jsonl`, :func:`tmpl.export.to_atif` and ``tmpl view`` show a harness run like any
episode.

The record is a ``tmpl.rollout.v1`` record whose arrays are the episode's first training sequence (the
root agent's: its first call's prompt, then every call's new context and sampled tokens), whose
``episode`` is the whole episode (:func:`tmpl.episode.records.to_record`: every sequence, lineage and
branch), whose ``status`` and ``reason`` are the run's (``HARNESS_DONE``, ``HARNESS_EXITED (exit 2)``...),
and whose ``harness`` field holds the rest of the run: the harness's name, the task, the exit code, the
reward, the seconds, the stdout/stderr tails (:data:`HARNESS_FIELDS`). In ATIF that field is under the
trajectory's ``extra["tmpl"]``; the harness's name is also the ATIF agent's name, the run's reason its
``notes``, the session key its ``session_id``.

>>> from tmpl.episode import Call, Episode
>>> from tmpl.harness import HarnessResult
>>> ep = Episode(sample_id="t1-0-ab"); _ = ep.add_call(Call([1, 2], [3, 4], [-0.5, -0.1], id="c1"))
>>> r = HarnessResult(status="HARNESS_DONE", exit_code=0, reward=1.0, episode=ep, session="t1-0-ab",
...                   task_id="t1", harness="aider", stdout_tail="done")
>>> record = harness_record(r, 0)
>>> record["status"], record["prompt_ids"], record["completion_ids"], record["mask"], record["harness"]["name"]
('HARNESS_DONE', [1, 2], [3, 4], [1, 1], 'aider')
>>> again = harness_result(record, "runs.jsonl:1")
>>> again.exit_code, again.stdout_tail, again.episode.sequences[0].ids.tolist()
(0, 'done', [1, 2, 3, 4])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..atif.read import sequence_arrays
from ..episode import Episode
from ..episode.records import from_record as episode_from_record
from ..episode.records import to_record as episode_to_record
from ..errors import ExportError, TmplError
from ..harness.result import STATUSES, HarnessResult

__all__ = ["HARNESS_FIELDS", "harness_record", "harness_result", "is_harness_record"]

#: the record field that marks a harness run, and holds what a rollout record has no field for
HARNESS_KEY = "harness"
#: the run's fields under ``record["harness"]`` (``name`` is :attr:`HarnessResult.harness`)
HARNESS_FIELDS = (
    "name",
    "status",
    "exit_code",
    "reward",
    "seconds",
    "calls",
    "session",
    "task_id",
    "sample",
    "error",
    "refused",
    "stdout_tail",
    "stderr_tail",
    "timings",
)
_FORMAT = "tmpl.rollout.v1"  # tmpl.export.FORMAT (records.py imports this module)


def is_harness_record(record: Mapping[str, Any]) -> bool:
    """Whether an export record is a harness run's (it has a ``harness`` mapping)."""
    return isinstance(record.get(HARNESS_KEY), Mapping)


def harness_record(result: HarnessResult, index: int) -> dict[str, Any]:
    """The export record of one harness run (see the module docstring); ``index``: its place in the file."""
    run = {name: (result.harness if name == "name" else getattr(result, name)) for name in HARNESS_FIELDS}
    run["refused"] = list(run["refused"])
    run["timings"] = dict(run["timings"])
    episode = result.episode
    seq = _root_sequence(episode)
    empty: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "mask": [], "logprobs": [], "versions": []}
    arrays = empty if seq is None else sequence_arrays(seq)
    spans = arrays.pop("spans", [])
    return {
        "format": _FORMAT,
        "index": index,
        "sample": result.sample,
        "sample_id": result.session or None,
        **arrays,
        "status": result.status,
        "reason": result.reason,
        "reward": result.reward,
        "turns": result.calls,
        "messages": [],
        "spans": spans,
        "max_length": (episode.max_length if episode is not None else None)
        or len(arrays["prompt_ids"]) + len(arrays["completion_ids"]),
        "max_completion_length": None,
        "episode": None if episode is None else episode_to_record(episode),
        HARNESS_KEY: run,
    }


def harness_result(record: Mapping[str, Any], where: str) -> HarnessResult:
    """The :class:`~tmpl.harness.HarnessResult` of a record :func:`harness_record` wrote (read back from
    JSON lines or ATIF): the same episode (sequences, lineages, branches) and run fields; ExportError
    naming ``where`` and the field when one does not read."""
    run = record[HARNESS_KEY]
    status = run.get("status", record.get("status"))
    if status not in STATUSES:
        raise ExportError(where, f"harness.status {status!r} is none of {', '.join(STATUSES)}")
    episode: Episode | None = None
    if record.get("episode") is not None:
        try:
            episode = episode_from_record(record["episode"], sample_id=run.get("session") or None)
        except TmplError as exc:
            raise ExportError(where, f"cannot rebuild the harness run's episode: {exc}") from exc
    try:
        return HarnessResult(
            status=status,
            exit_code=None if run.get("exit_code") is None else int(run["exit_code"]),
            reward=None if run.get("reward") is None else float(run["reward"]),
            episode=episode,
            stdout_tail=str(run.get("stdout_tail") or ""),
            stderr_tail=str(run.get("stderr_tail") or ""),
            seconds=float(run.get("seconds") or 0.0),
            calls=int(run.get("calls") or 0),
            session=str(run.get("session") or ""),
            task_id=str(run.get("task_id") or ""),
            sample=int(run.get("sample") or 0),
            error=str(run.get("error") or ""),
            refused=[str(x) for x in run.get("refused") or []],
            timings={str(k): float(v) for k, v in (run.get("timings") or {}).items()},
            harness=str(run.get("name") or ""),
        )
    except (TypeError, ValueError, AttributeError) as exc:
        raise ExportError(where, f"a harness field does not read: {exc}") from exc


def _root_sequence(episode: Episode | None) -> Any:
    """The root agent's first sequence (its lineage ``(None, None)``), else the episode's first; None
    without one."""
    if episode is None or not episode.sequences:
        return None
    return next((s for s in episode.sequences if s.agent is None and s.parent is None), episode.sequences[0])
