"""tmpl records to ATIF documents: :func:`records_to_documents`, one validated ``atif.Trajectory`` per record."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..episode.records import from_record as episode_from_record
from ..errors import AtifError, TmplError
from ..trajectory.types import APPENDED_VERSION, COMPLETION
from .layout import _layout
from .model import _CARRIED, EXTRA_KEY, SCHEMA_VERSION, _models, _pydantic
from .source import _in_place, _restore
from .steps import _appended, _messages, _same, _version


def records_to_documents(
    records: Iterable[Mapping[str, Any]],
    *,
    agent: str = "tmpl",
    tools: Sequence[Mapping[str, Any]] | None = None,
    sources: Sequence[Mapping[str, Any] | None] | None = None,
) -> list[Any]:
    """One ``atif.Trajectory`` per tmpl record (:func:`tmpl.export.to_records`), validated by its model;
    ``tools``: the tool schemas the rollout rendered with (the agent's ``tool_definitions``); ``sources``:
    per record, the ATIF document it was read from (:attr:`AtifResult.atif`), whose fields tmpl does not
    model are written back (:func:`_restore`).

    >>> [doc] = records_to_documents(tmpl.export.to_records([result]))      # doctest: +SKIP
    >>> doc.steps[1].metrics.completion_token_ids[:3]                      # doctest: +SKIP
    [151657, 198, 4913]
    """
    atif = _models()
    out = []
    for k, record in enumerate(records):
        source = sources[k] if sources is not None and k < len(sources) else None
        # read from ATIF: each branch call stays where the source had it (a root step in files written
        # before branches were embedded, and in other programs' files), so the document comes back as written
        doc = _document(record, agent, None if source is None else _in_place(source))
        if source is not None:
            doc = _restore(doc, source)
        if tools is not None:
            doc["agent"]["tool_definitions"] = [dict(t) for t in tools]
        try:
            out.append(atif.Trajectory.model_validate(doc))
        except ValueError as exc:  # pydantic's ValidationError: a record tmpl cannot say in ATIF
            raise AtifError(f"results[{k}]", f"the ATIF document does not validate: {_pydantic(exc)}") from exc
    return out


def _document(record: Mapping[str, Any], agent: str, in_place: set[Any] | None = None) -> dict[str, Any]:
    calls = _record_calls(record)
    messages = list(record.get("messages") or [])
    steps, embedded = _layout(record, calls, messages, agent, in_place)
    carried_messages = _messages(steps) == messages  # said exactly by the steps, or kept whole
    keep = {k: v for k, v in record.items() if k not in _CARRIED}
    if keep.get("stale_action") is None:
        keep.pop("loss_mask", None)  # read back only under a staleness policy: else it is the mask
    if record.get("episode") is not None:
        keep["episode"] = {k: v for k, v in record["episode"].items() if k != "calls"}
    keep["calls"] = [c["id"] for c in calls]  # the episode's order of calls, across trajectories
    keep["trajectory"] = _trajectory_ref(record, calls)
    if not carried_messages:
        keep["messages"] = messages
    sid = record.get("sample_id")
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "session_id": None if sid is None else str(sid),
        "trajectory_id": f"{record.get('index', 0)}-{record.get('sample', 0)}",
        "agent": {"name": agent, "version": _version()},
        "steps": steps,
        "extra": {EXTRA_KEY: keep},
    }
    if embedded:
        doc["subagent_trajectories"] = embedded
    run = record.get("harness")  # a harness run's (tmpl.export.harness): its harness is the agent
    if isinstance(run, Mapping):
        if run.get("name"):
            doc["agent"]["name"] = str(run["name"])
        doc["notes"] = f"harness run: {record.get('reason') or run.get('status')}"
    return doc


def _record_calls(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The sample's model calls, in the episode's order: the episode record's, or (append mode) one per
    completion span of the trajectory, as ``Episode.from_trajectory`` makes them."""
    episode = record.get("episode")
    if episode is not None:
        if isinstance(episode, str):
            episode = json.loads(episode)
        return [
            {
                "id": c.get("id"),
                "prompt_ids": list(c["prompt_ids"]),
                "completion_ids": list(c["completion_ids"]),
                "logprobs": list(c["logprobs"]),
                "versions": list(c.get("versions") or []),
                "trained": bool(c.get("trained", True)),
                "parent": c.get("parent"),
                "agent": c.get("agent"),
                "turn": c.get("turn"),
                "reward": c.get("reward"),
                "edit": (episode.get("edits") or {}).get(c.get("id")),
            }
            for c in episode["calls"]
        ]
    prompt = list(record["prompt_ids"])
    ids, lps = list(record["completion_ids"]), list(record["logprobs"])
    versions = list(record.get("versions") or [APPENDED_VERSION] * len(ids))
    out = []
    for s in record.get("spans") or []:
        if s["kind"] != COMPLETION or s["end"] <= s["start"]:
            continue
        a, b = s["start"], s["end"]
        out.append(
            {
                "id": f"turn-{s['turn']}",
                "prompt_ids": prompt + ids[:a],
                "completion_ids": ids[a:b],
                "logprobs": lps[a:b],
                "versions": versions[a:b],
                "trained": True,
                "parent": None,
                "agent": None,
                "turn": s["turn"],
                "reward": None,
                "edit": None,
            }
        )
    return out


def _trajectory_ref(record: Mapping[str, Any], calls: list[dict[str, Any]]) -> dict[str, Any]:
    """How to rebuild the record's trajectory arrays from the calls: appended (append mode, plus the
    tokens after the last call), one sequence of the episode, or (neither) the arrays themselves."""
    prompt, ids = list(record["prompt_ids"]), list(record["completion_ids"])
    arrays = {
        "prompt_ids": prompt,
        "completion_ids": ids,
        "mask": list(record["mask"]),
        "logprobs": list(record["logprobs"]),
        "versions": list(record.get("versions") or [APPENDED_VERSION] * len(ids)),
    }
    if record.get("episode") is None:
        root = [c for c in calls if c["parent"] is None and c["agent"] is None]
        built = _appended(root, len(prompt))
        if built is not None:
            end = len(built["completion_ids"])
            trailing = ids[end:]
            if _same(built, arrays, end) and all(m == 0 for m in arrays["mask"][end:]):
                return {"appended": True, "prompt_length": len(prompt), "trailing_ids": trailing}
    else:
        found = _episode_sequence(record, arrays)
        if found is not None:
            return {"sequence": found, "prompt_length": len(prompt)}
    return {"arrays": arrays}


def _episode_sequence(record: Mapping[str, Any], arrays: Mapping[str, Any]) -> int | None:
    """The index of the episode sequence whose arrays are the record's trajectory (template mode: the
    last branch's), or None."""
    try:
        episode = episode_from_record(record["episode"])
    except TmplError:
        return None
    ids = arrays["prompt_ids"] + arrays["completion_ids"]
    p = len(arrays["prompt_ids"])
    for seq in reversed(episode.sequences):
        if (
            seq.ids.tolist() == ids
            and seq.mask[p:].tolist() == arrays["mask"]
            and seq.logprobs[p:].tolist() == arrays["logprobs"]
            and seq.versions[p:].tolist() == arrays["versions"]
        ):
            return seq.index
    return None
