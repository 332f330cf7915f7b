"""Where each call goes in a document: the root's steps, a sub-agent's embedded trajectory, a branch's
embedded trajectory (marked ``extra.tmpl.branch``) and the step each is referenced from."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..episode.records import from_record as episode_from_record
from ..errors import TmplError
from ..trajectory.types import APPENDED_VERSION
from .model import EXTRA_KEY, SCHEMA_VERSION
from .steps import _steps, _version

#: The lineage ``(agent, parent)`` of the root agent's calls.
_ROOT = (None, None)


def _lineage(call: Mapping[str, Any]) -> tuple[Any, Any]:
    return (call["agent"], call["parent"])


def _layout(
    record: Mapping[str, Any],
    calls: Sequence[Mapping[str, Any]],
    messages: Sequence[Mapping[str, Any]],
    agent: str,
    in_place: set[Any] | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The root's steps and its embedded trajectories.

    - The root's steps are the sample's messages, with the calls of its first sequence on them.
    - Each other lineage (a sub-agent) is an embedded trajectory of its first sequence's calls, nested
      under the trajectory of the call that ran it and referenced from that call's step.
    - Each branch (a sequence after a lineage's first: compaction, a template that drops reasoning, an
      ``edit_history`` hook, a resample) is an embedded trajectory of its calls, marked
      ``extra.tmpl.branch``, held by its lineage's trajectory and referenced (the reference's
      ``extra.tmpl.branch`` true) from the step where it diverged: the step of its first call's message
      (the root's), else of the lineage's last call before it. Sub-agents its calls ran nest under it.

    ``in_place``: the ids of calls to keep on their lineage's own steps even when they are a branch's
    (what a source document read from ATIF had there); None: every branch embedded."""
    branches = _branches(record, in_place)
    by_lineage: dict[tuple[Any, Any], list[Mapping[str, Any]]] = {}
    for c in calls:
        by_lineage.setdefault(_lineage(c), []).append(c)
    by_id = {c["id"]: c for c in calls}
    branches = [b for b in branches if all(cid in by_id for cid in b["calls"])]
    # the trajectory ids: the agent's label names a sub-agent's (with the call that ran it when it ran
    # more than once), ``branch-<sequence index>`` a branch's; unique in the document
    names: set[str] = set()
    name_of: dict[tuple[str, Any], str] = {}
    agents = [lineage[0] for lineage in by_lineage if lineage != _ROOT]

    def unique(name: str) -> str:
        while name in names:
            name += "'"
        names.add(name)
        return name

    for lineage in by_lineage:
        if lineage != _ROOT:
            sub_agent, parent = lineage
            name = (
                str(sub_agent)
                if sub_agent is not None and agents.count(sub_agent) == 1
                else f"{sub_agent or 'agent'}@{parent}"
            )
            name_of[("lineage", lineage)] = unique(name)
    for b in branches:
        name_of[("branch", b["index"])] = unique(f"branch-{b['index']}")
    home: dict[Any, tuple[str, Any]] = {c["id"]: ("lineage", _lineage(c)) for c in calls}
    for b in branches:
        for cid in b["calls"]:
            home[cid] = ("branch", b["index"])
    elsewhere = {cid: name_of[key] for cid, key in home.items() if key[0] == "branch"}

    root_key = ("lineage", _ROOT)
    containers: dict[tuple[str, Any], dict[str, Any]] = {}
    steps, by_call = _steps(messages, by_lineage.get(_ROOT, []), elsewhere)
    containers[root_key] = {"steps": steps, "_by_call": by_call}
    first: dict[tuple[str, Any], int] = {}  # each embedded trajectory's first call, in the episode's order
    position = {c["id"]: k for k, c in enumerate(calls)}
    for lineage, members in by_lineage.items():
        if lineage == _ROOT:
            continue
        key = ("lineage", lineage)
        sub_steps, sub_by_call = _steps([], members, elsewhere)
        containers[key] = {
            "schema_version": SCHEMA_VERSION,
            "trajectory_id": name_of[key],
            "agent": {"name": str(lineage[0] or "agent"), "version": _version()},
            "steps": sub_steps,
            "_by_call": sub_by_call,
        }
        first[key] = position[members[0]["id"]]
    for b in branches:
        key = ("branch", b["index"])
        lineage = b["lineage"]
        sub_steps, sub_by_call = _steps([], [by_id[cid] for cid in b["calls"]])
        containers[key] = {
            "schema_version": SCHEMA_VERSION,
            "trajectory_id": name_of[key],
            "agent": {"name": agent if lineage == _ROOT else str(lineage[0] or "agent"), "version": _version()},
            "steps": sub_steps,
            "extra": {EXTRA_KEY: {"branch": b["info"]}},
            "_by_call": sub_by_call,
        }
        first[key] = position[b["calls"][0]]

    root: list[dict[str, Any]] = []
    for key in sorted(first, key=first.__getitem__):
        doc = containers[key]
        if key[0] == "lineage":
            parent = key[1][1]
            holder_key = home.get(parent, root_key) if parent is not None else root_key
            index = containers[holder_key]["_by_call"].get(parent) if parent is not None else None
            ref: dict[str, Any] = {"trajectory_id": doc["trajectory_id"]}
        else:
            holder_key = ("lineage", next(b["lineage"] for b in branches if b["index"] == key[1]))
            opened = next(b["calls"][0] for b in branches if b["index"] == key[1])
            index = _anchor(containers[holder_key]["_by_call"], by_lineage[holder_key[1]], opened)
            ref = {"trajectory_id": doc["trajectory_id"], "extra": {EXTRA_KEY: {"branch": True}}}
        if holder_key == root_key:
            root.append(doc)
        else:
            containers[holder_key].setdefault("subagent_trajectories", []).append(doc)
        if index is not None:
            step = containers[holder_key]["steps"][index]
            step.setdefault("observation", {"results": []})["results"].append({"subagent_trajectory_ref": [ref]})
    for doc in containers.values():
        doc.pop("_by_call")
    return steps, root


def _anchor(by_call: Mapping[Any, int], lineage_calls: Sequence[Mapping[str, Any]], opened: Any) -> int | None:
    """The step of the lineage's trajectory a branch is referenced from: the step of the call that
    opened it (the message step it left, in the root), else the step of the lineage's last call before
    it that has one; None: no such step."""
    ids = [c["id"] for c in lineage_calls]
    for cid in reversed(ids[: ids.index(opened) + 1]):
        if cid in by_call:
            return by_call[cid]
    return None


def _branches(record: Mapping[str, Any], in_place: set[Any] | None) -> list[dict[str, Any]]:
    """The record's branches: each episode sequence after the first of its lineage, with the ids of its
    calls (less those ``in_place`` keeps on their lineage's steps) and what started it."""
    episode = record.get("episode")
    if episode is None:
        return []
    try:
        episode = json.loads(episode) if isinstance(episode, str) else episode
        # unknown versions (a record of ATIF another program wrote: -1 throughout) as a Call takes them
        unknown = [
            {**c, "versions": None} if isinstance(c.get("versions"), list) and _unknown(c["versions"]) else c
            for c in episode["calls"]
        ]
        ep = episode_from_record({**episode, "calls": unknown})
    except (TmplError, ValueError, KeyError, TypeError):
        return []
    seen: set[tuple[Any, Any]] = set()
    out = []
    for seq in ep.sequences:
        lineage = (seq.agent, seq.parent)
        if lineage not in seen:
            seen.add(lineage)
            continue
        ids = [cid for cid in seq.calls if in_place is None or cid not in in_place]
        if not ids:
            continue
        info: dict[str, Any] = {"sequence": seq.index, "kind": seq.branch.kind}
        for name in ("against", "token", "edit"):
            value = getattr(seq.branch, name)
            if value is not None:
                info[name] = value
        out.append({"index": seq.index, "lineage": lineage, "calls": ids, "info": info})
    return out


def _unknown(versions: Sequence[Any]) -> bool:
    return bool(versions) and all(v == APPENDED_VERSION for v in versions)
