"""ATIF, the Agent Trajectory Interchange Format (``atif`` on PyPI, v1.8), to tmpl records and back.

``tmpl.export.to_atif`` and ``tmpl.export.from_atif`` are the public names; this module converts
between ATIF documents and tmpl's export records (:func:`tmpl.export.to_records`), so it needs nothing
above the episode layer. Every document written or read is validated by the ``atif`` package's own
pydantic models (``atif.Trajectory``); ``atif`` is imported only when a document is built or checked.

>>> docs = records_to_documents(tmpl.export.to_records(results))       # doctest: +SKIP
>>> records = documents_to_records(docs, source="run.atif.jsonl")      # doctest: +SKIP

The mapping (docs/atif.md has it in full):

- one tmpl sample (a ``RolloutResult``) is one ATIF ``Trajectory``; its messages are the steps
  (``system``/``user`` messages a step each, an assistant message an ``agent`` step with its
  ``reasoning_content`` and ``tool_calls``, the tool messages after it that step's ``observation``);
- each model call of the sample is an agent step's ``metrics``: ``prompt_token_ids`` (the whole
  prompt the engine was sent), ``completion_token_ids`` and ``logprobs`` (what it sampled);
- a sub-agent's calls (a lineage ``(agent, parent)`` other than the root's) are an embedded trajectory
  (``subagent_trajectories``), referenced from the observation of the step whose call ran it;
- a branch (each training sequence after the first: compaction, a template that drops reasoning, an
  ``edit_history`` hook) is an embedded trajectory too, marked ``extra["tmpl"]["branch"]`` (so it is read
  back as a branch of the same agent, not a sub-agent), held by its lineage's trajectory and referenced
  from the step where it diverged; the root keeps the whole conversation, its steps' tokens the first
  sequence's calls (files written before, and other programs' files with branches as plain steps,
  read as well, and are written back as they were);
- what ATIF has no field for is kept under the key ``"tmpl"`` of ``extra``: per step the call's id,
  policy versions, ``trained`` (the mask: a step's completion tokens are in the loss mask exactly when
  it is trained), turn, reward and lineage; per trajectory the tmpl record less the arrays the steps
  carry (status, reason, spans, budgets, drift, staleness, times, tokens appended after the last call).

Read back, ATIF written by anyone gives tmpl records: a trajectory whose calls extend one another is
one sequence (an append-mode sample, which ``tmpl replay`` re-renders); otherwise its calls are merged
into an episode's sequences by tmpl's rule, as the gateway's are.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, Any, cast

from .episode.records import from_record as episode_from_record
from .errors import AtifError, TmplError
from .rollout.result import RolloutResult
from .trajectory.types import APPENDED_VERSION, COMPLETION, SUFFIX

__all__ = [
    "AtifResult",
    "EXTRA_KEY",
    "SCHEMA_VERSION",
    "document_tools",
    "documents_to_records",
    "looks_like_atif",
    "read_documents",
    "records_to_documents",
    "validate",
    "with_source",
    "write_documents",
]

#: The ATIF version written (``atif`` 1.8's models).
SCHEMA_VERSION = "ATIF-v1.8"
#: The key, in ATIF ``extra`` fields, of what tmpl keeps that ATIF has no field for.
EXTRA_KEY = "tmpl"
#: The tmpl record format the records read from ATIF carry (tmpl.export.FORMAT).
_FORMAT = "tmpl.rollout.v1"
_SCHEMA = re.compile(r'"schema_version"\s*:\s*"ATIF-', re.IGNORECASE)
#: Record fields the ATIF steps carry (not repeated in the trajectory's extra).
_CARRIED = ("format", "prompt_ids", "completion_ids", "mask", "logprobs", "versions", "messages")


def _models() -> Any:
    """The ``atif`` package, or an ImportError that says how to get it."""
    try:
        import atif
    except ImportError as exc:
        raise ImportError(
            "ATIF import and export need the atif package (its models validate every document): "
            "pip install 'tmpl[atif]'"
        ) from exc
    return atif


# -- tmpl records -> ATIF ----------------------------------------------------------------------------


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
    return doc


def _version() -> str:
    from . import __version__

    return __version__


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


def _same(built: Mapping[str, list[Any]], arrays: Mapping[str, list[Any]], end: int) -> bool:
    n = len(arrays["prompt_ids"])
    return built["prompt_ids"] == arrays["prompt_ids"][:n] and all(
        built[key] == arrays[key][:end] for key in ("completion_ids", "mask", "logprobs", "versions")
    )


def _appended(calls: Sequence[Mapping[str, Any]], prompt_length: int | None = None) -> dict[str, list[Any]] | None:
    """The trajectory arrays of calls that each extend the context before them (append mode); None when
    one does not. ``prompt_length``: where the trajectory's prompt ends (default: the first call's prompt)."""
    if not calls:
        return None
    first = list(calls[0]["prompt_ids"])
    p = len(first) if prompt_length is None else prompt_length
    if p > len(first):
        return None
    context = list(first)
    completion: list[int] = context[p:]
    mask = [0] * len(completion)
    logprobs = [0.0] * len(completion)
    versions = [APPENDED_VERSION] * len(completion)
    spans = []
    for k, call in enumerate(calls):
        prompt = list(call["prompt_ids"])
        if prompt[: len(context)] != context:
            return None
        suffix = prompt[len(context) :]
        turn = call["turn"] if call.get("turn") is not None else k
        if suffix:
            spans.append(
                {
                    "kind": SUFFIX,
                    "turn": turn,
                    "message": None,
                    "start": len(completion),
                    "end": len(completion) + len(suffix),
                }
            )
        completion += suffix
        mask += [0] * len(suffix)
        logprobs += [0.0] * len(suffix)
        versions += [APPENDED_VERSION] * len(suffix)
        sampled = list(call["completion_ids"])
        start = len(completion)
        completion += sampled
        trained = bool(call.get("trained", True))
        mask += [1 if trained else 0] * len(sampled)
        logprobs += [float(x) for x in call["logprobs"]] if trained else [0.0] * len(sampled)
        v = list(call.get("versions") or [])
        versions += (
            (v if len(v) == len(sampled) else [APPENDED_VERSION] * len(sampled))
            if trained
            else [APPENDED_VERSION] * len(sampled)
        )
        spans.append({"kind": COMPLETION, "turn": turn, "message": None, "start": start, "end": len(completion)})
        context = first[:p] + completion
    return {
        "prompt_ids": first[:p],
        "completion_ids": completion,
        "mask": mask,
        "logprobs": logprobs,
        "versions": versions,
        "spans": spans,
    }


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


def _steps(
    messages: Sequence[Mapping[str, Any]],
    calls: Sequence[Mapping[str, Any]],
    elsewhere: Mapping[Any, str] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """ATIF steps of the root's messages, the root's calls on its agent steps: a call of turn ``t`` on the
    ``t``-th assistant message (counted from 0), a call without one (or a second of the same turn) on an
    agent step of its own, in call order. A call in ``elsewhere`` (call id -> the embedded trajectory
    that holds its step: a branch) leaves its message a step without metrics (``extra.tmpl``: ``call``,
    and ``in`` that trajectory's id), and no step where it has no message. Returns the steps and each
    call's step index (the message's, for a call held elsewhere)."""
    away = elsewhere or {}
    steps: list[dict[str, Any]] = []
    by_call: dict[str, int] = {}
    n_assistant = sum(1 for m in messages if m.get("role") == "assistant")
    placed: dict[int, int] = {}  # assistant ordinal -> index in calls
    for j, c in enumerate(calls):
        t = c.get("turn")
        if isinstance(t, int) and 0 <= t < n_assistant and t not in placed:
            placed[t] = j
    taken = set(placed.values())
    next_call = 0

    def flush(upto: int) -> None:  # calls before ``upto`` (in call order) that no message holds
        nonlocal next_call
        while next_call < upto:
            if next_call not in taken and calls[next_call]["id"] not in away:
                steps.append(_agent_step(len(steps) + 1, None, calls[next_call]))
            next_call += 1

    ordinal = 0
    for m in messages:
        role = m.get("role")
        if role == "assistant":
            held = placed.get(ordinal)
            if held is not None:
                flush(held)
            call = calls[held] if held is not None else None
            if call is not None and call["id"] in away:  # its model call is a branch's step
                step = _agent_step(len(steps) + 1, m, None)
                step.setdefault("extra", {}).setdefault(EXTRA_KEY, {}).update(
                    call=call["id"], **{"in": away[call["id"]]}
                )
                steps.append(step)
            else:
                steps.append(_agent_step(len(steps) + 1, m, call))
            ordinal += 1
        elif role == "tool":
            owner = steps[-1] if steps and steps[-1]["source"] == "agent" else None
            if owner is None:
                owner = {"step_id": len(steps) + 1, "source": "system", "message": ""}
                steps.append(owner)
            owner.setdefault("observation", {"results": []})["results"].append(_result(m, owner))
        else:
            steps.append(_plain_step(len(steps) + 1, m))
    flush(len(calls))
    for k, step in enumerate(steps):
        cid = ((step.get("extra") or {}).get(EXTRA_KEY) or {}).get("call")
        if cid is not None:
            by_call[cid] = k
    return steps, by_call


def _text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, Mapping) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    return None


def _plain_step(step_id: int, m: Mapping[str, Any]) -> dict[str, Any]:
    role = m.get("role")
    source = role if role in ("system", "user") else "user"
    text = _text(m.get("content"))
    step: dict[str, Any] = {"step_id": step_id, "source": source, "message": text or ""}
    rest = {k: v for k, v in m.items() if k not in ("role", "content")}
    if role != source:
        rest["role"] = role
    if not isinstance(m.get("content"), str):
        rest["content"] = m.get("content")
    if rest:
        step["extra"] = {EXTRA_KEY: {"message": rest}}
    return step


def _agent_step(step_id: int, m: Mapping[str, Any] | None, call: Mapping[str, Any] | None) -> dict[str, Any]:
    step: dict[str, Any] = {"step_id": step_id, "source": "agent", "message": ""}
    keep: dict[str, Any] = {}
    if m is None:
        keep["no_message"] = True
    else:
        content = m.get("content")
        text = _text(content)
        step["message"] = text or ""
        if not isinstance(content, str):
            keep.setdefault("message", {})["content"] = content
        if isinstance(m.get("reasoning_content"), str):
            step["reasoning_content"] = m["reasoning_content"]
        calls = m.get("tool_calls")
        if calls:
            step["tool_calls"] = [_tool_call(tc, step_id, j) for j, tc in enumerate(calls)]
        rest = {k: v for k, v in m.items() if k not in ("role", "content", "reasoning_content", "tool_calls")}
        if rest:
            keep.setdefault("message", {}).update(rest)
    if call is not None:
        step["metrics"] = {
            "prompt_tokens": len(call["prompt_ids"]),
            "completion_tokens": len(call["completion_ids"]),
            "prompt_token_ids": [int(t) for t in call["prompt_ids"]],
            "completion_token_ids": [int(t) for t in call["completion_ids"]],
            "logprobs": [float(x) for x in call["logprobs"]],
        }
        keep.update(_call_extra(call))
    if keep:
        step["extra"] = {EXTRA_KEY: keep}
    return step


def _call_extra(call: Mapping[str, Any]) -> dict[str, Any]:
    versions = [int(v) for v in call.get("versions") or []]
    out: dict[str, Any] = {"call": call["id"]}
    if versions and all(v == versions[0] for v in versions):
        out["versions"] = None if versions[0] == APPENDED_VERSION else versions[0]
    elif versions:
        out["versions"] = versions
    for key in ("trained", "parent", "agent", "turn", "reward", "edit"):
        value = call.get(key)
        if key == "trained" and value is not False:
            continue
        if value is not None:
            out[key] = value
    return out


def _tool_call(tc: Mapping[str, Any], step_id: int, j: int) -> dict[str, Any]:
    fn = tc.get("function") or {}
    args = fn.get("arguments", {})
    out: dict[str, Any] = {
        "tool_call_id": str(tc.get("id") or f"call-{step_id}-{j}"),
        "function_name": str(fn.get("name") or ""),
        "arguments": args if isinstance(args, Mapping) else {},
    }
    keep = {k: v for k, v in tc.items() if k not in ("id", "type", "function")}
    if tc.get("id") is None:
        keep["no_id"] = True
    if tc.get("type", "function") != "function":
        keep["type"] = tc.get("type")
    if not isinstance(args, Mapping):
        keep["arguments"] = args
    extra_fn = {k: v for k, v in fn.items() if k not in ("name", "arguments")}
    if extra_fn:
        keep["function"] = extra_fn
    if keep:
        out["extra"] = {EXTRA_KEY: keep}
    return out


def _result(m: Mapping[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
    ids = {tc["tool_call_id"] for tc in owner.get("tool_calls") or []}
    cid = m.get("tool_call_id")
    out: dict[str, Any] = {"content": _text(m.get("content")) or ""}
    if cid is not None and str(cid) in ids and isinstance(cid, str):
        out["source_call_id"] = cid
    keep = {k: v for k, v in m.items() if k not in ("role", "content", "tool_call_id")}
    if "source_call_id" not in out and "tool_call_id" in m:
        keep["tool_call_id"] = cid
    if not isinstance(m.get("content"), str):
        keep["content"] = m.get("content")
    if keep:
        out["extra"] = {EXTRA_KEY: {"message": keep}}
    return out


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


def _in_place(source: Mapping[str, Any]) -> set[Any] | None:
    """The ids of the calls a document holds on its trajectories' own steps (every call outside a branch
    trajectory), as :func:`documents_to_records` names them; None for a document it cannot read."""
    try:
        return {c["id"] for c in _document_calls(source) if not c["in_branch"]}
    except (KeyError, TypeError, AttributeError):
        return None


def _restore(ours: dict[str, Any], source: Mapping[str, Any]) -> dict[str, Any]:
    """``ours`` (a document tmpl built) with what its source document held that tmpl does not model: the
    root's ids, agent, notes, final metrics and extras; per step (when the steps line up: the same count and
    sources) timestamps, model names, reasoning effort, call counts, copied-context flags, the metrics tmpl
    does not keep (costs, cached tokens, their extras), the extras of steps, tool calls and results; and
    the source's logprob values where they are tmpl's float32 ones (a writer's float64 values come back
    as written). Embedded trajectories are matched by ``trajectory_id``."""
    out = dict(ours)
    for key, value in source.items():
        if key in ("steps", "subagent_trajectories", "extra", "schema_version"):
            continue
        if key == "agent":
            out["agent"] = {**value, **{k: v for k, v in ours["agent"].items() if k == "tool_definitions"}}
        else:
            out[key] = value
    for key in ("session_id", "trajectory_id"):  # the source's (none where it had none)
        if key not in source and "subagent_trajectories" not in key:
            out.pop(key, None)
    extra = {k: v for k, v in (source.get("extra") or {}).items() if k != EXTRA_KEY}
    if extra:
        out["extra"] = {**extra, **(ours.get("extra") or {})}
    steps, theirs = ours["steps"], source.get("steps") or []
    if len(steps) == len(theirs) and all(a["source"] == b.get("source") for a, b in zip(steps, theirs)):
        out["steps"] = [_restore_step(a, b) for a, b in zip(steps, theirs)]
    subs = {s.get("trajectory_id"): s for s in source.get("subagent_trajectories") or []}
    if ours.get("subagent_trajectories"):
        out["subagent_trajectories"] = [
            _restore(sub, subs[sub["trajectory_id"]]) if sub["trajectory_id"] in subs else sub
            for sub in ours["subagent_trajectories"]
        ]
    return out


def _restore_step(ours: dict[str, Any], source: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(ours)
    for key, value in source.items():
        if key not in out and key not in ("metrics", "observation", "tool_calls", "extra"):
            out[key] = value
    out["extra"] = _merged_extra(ours.get("extra"), source.get("extra"))
    if out["extra"] is None:
        del out["extra"]
    m, sm = ours.get("metrics"), source.get("metrics")
    if m is not None and sm is not None:
        m = dict(m)
        for key, value in sm.items():
            if key not in m:
                m[key] = value
        if m.get("logprobs") is not None and _same_float32(sm.get("logprobs"), m["logprobs"]):
            m["logprobs"] = list(sm["logprobs"])
        for key in ("prompt_tokens", "completion_tokens"):  # as written (or not) by the source
            if key in sm:
                m[key] = sm[key]
            else:
                m.pop(key, None)
        out["metrics"] = m
    calls, scalls = ours.get("tool_calls"), source.get("tool_calls")
    if calls and scalls and len(calls) == len(scalls):
        out["tool_calls"] = [
            {**a, **({"extra": _merged_extra(a.get("extra"), b.get("extra"))} if b.get("extra") else {})}
            for a, b in zip(calls, scalls)
        ]
    obs, sobs = ours.get("observation"), source.get("observation")
    if sobs:  # references to trajectories in other files are no message: tmpl keeps them only here
        refs = [r for r in sobs["results"] if r.get("content") is None and _file_refs(r)]
        if refs and not obs:
            obs = out["observation"] = {"results": []}
        if refs and obs is not None and len(obs["results"]) < len(sobs["results"]):
            obs = out["observation"] = {"results": [*obs["results"], *refs]}
    if obs and sobs and len(obs["results"]) == len(sobs["results"]):
        out["observation"] = {
            "results": [
                {**a, **({"extra": _merged_extra(a.get("extra"), b.get("extra"))} if b.get("extra") else {})}
                for a, b in zip(obs["results"], sobs["results"])
            ]
        }
    if isinstance(source.get("message"), list):  # content parts: as written (tmpl's text is their text)
        out["message"] = source["message"]
    return out


def _file_refs(result: Mapping[str, Any]) -> bool:
    """Whether an observation result references trajectories in other files only (no embedded one)."""
    refs = result.get("subagent_trajectory_ref") or []
    return bool(refs) and all(r.get("trajectory_id") is None for r in refs)


def _merged_extra(ours: Mapping[str, Any] | None, source: Mapping[str, Any] | None) -> dict[str, Any] | None:
    merged = {**{k: v for k, v in (source or {}).items() if k != EXTRA_KEY}, **(ours or {})}
    return merged or None


def _same_float32(a: Any, b: Sequence[float]) -> bool:
    """Whether ``a`` is a list of numbers equal to ``b``'s at float32 (what tmpl keeps)."""
    if not isinstance(a, list) or len(a) != len(b):
        return False
    try:
        pack = struct.Struct(f"{len(a)}f")
        return pack.pack(*a) == pack.pack(*b)
    except (struct.error, TypeError, OverflowError):
        return False


@dataclass(kw_only=True)
class AtifResult(RolloutResult):
    """A :class:`tmpl.RolloutResult` read from ATIF (:func:`tmpl.export.from_atif`), with ``atif``: the
    document it was read from (a JSON dict), so that :func:`tmpl.export.to_atif` writes back what tmpl does
    not model (timestamps, model names, costs, notes, extras) and the document's own logprob values."""

    atif: dict[str, Any] | None = field(default=None, repr=False)


def with_source(result: RolloutResult, source: Mapping[str, Any] | None) -> AtifResult:
    """``result`` as an :class:`AtifResult` holding ``source`` (the same arrays, not copied)."""
    values = {f.name: getattr(result, f.name) for f in fields(RolloutResult) if f.init}
    return AtifResult(**values, atif=None if source is None else dict(source))


# -- ATIF -> tmpl records ----------------------------------------------------------------------------


def documents_to_records(
    documents: Iterable[Any], *, source: str = "ATIF", wheres: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """tmpl records (read by :func:`tmpl.export.from_records`) of ATIF documents: dicts or
    ``atif.Trajectory`` objects, each validated first.

    Raises AtifError naming the document, the step and the field at fault.
    """
    out = []
    for k, doc in enumerate(documents):
        where = wheres[k] if wheres is not None else f"{source} (trajectory {k + 1})"
        model = validate(doc, where)
        record = _record(model, k, where)
        record["atif_source"] = model.to_json_dict()  # for AtifResult.atif (tmpl.export.from_atif)
        out.append(record)
    return out


def validate(doc: Any, where: str = "ATIF") -> Any:
    """``doc`` (a dict, a JSON string or an ``atif.Trajectory``) as a validated ``atif.Trajectory``, with
    tmpl's own checks on its token arrays (every embedded trajectory's too). AtifError names the step
    and the field."""
    atif = _models()
    if isinstance(doc, atif.Trajectory):
        model = atif.Trajectory.model_validate(doc.model_dump())
    else:
        if isinstance(doc, (str, bytes)):
            try:
                doc = json.loads(doc)
            except ValueError as exc:
                raise AtifError(where, f"not JSON: {exc}") from None
        if not isinstance(doc, Mapping):
            raise AtifError(where, f"an ATIF trajectory is a JSON object, not a {type(doc).__name__}")
        try:
            model = atif.Trajectory.model_validate(doc)
        except ValueError as exc:  # pydantic's ValidationError is one
            raise AtifError(where, f"not an ATIF trajectory: {_pydantic(exc)}") from None
    _check_arrays(model, where, "")
    return model


def _pydantic(exc: Exception) -> str:
    """A pydantic ValidationError in one line: each error's location (``steps[2].metrics.logprobs``,
    named as its step) and message."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc).splitlines()[0]
    parts = []
    for e in errors()[:3]:
        loc = list(e.get("loc", ()))
        parts.append(f"{_loc(loc)}: {e.get('msg', '')}")
    more = len(errors()) - 3
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _loc(loc: Sequence[Any]) -> str:
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
            if i > 0 and loc[i - 1] == "steps":
                out += f" (step {part + 1})"
        else:
            out += ("." if out else "") + str(part)
    return out or "(document)"


def _check_arrays(model: Any, where: str, path: str) -> None:
    for i, step in enumerate(model.steps):
        at = f"{path}steps[{i}] (step {step.step_id})"
        m = step.metrics
        if m is None:
            continue
        n = None if m.completion_token_ids is None else len(m.completion_token_ids)
        if m.logprobs is not None and n is not None and len(m.logprobs) != n:
            raise AtifError(
                where,
                f"{at}: metrics.logprobs has {len(m.logprobs)} entries but metrics.completion_token_ids has {n}",
                step=step.step_id,
                field="metrics.logprobs",
            )
        if m.logprobs is not None and n is None:
            raise AtifError(
                where, f"{at}: metrics.logprobs without metrics.completion_token_ids", step.step_id, "metrics.logprobs"
            )
        if (m.prompt_token_ids is None) != (n is None):
            field = "metrics.prompt_token_ids" if m.prompt_token_ids is None else "metrics.completion_token_ids"
            raise AtifError(
                where,
                f"{at}: {field} is missing (a step's token IDs are its whole prompt and what it sampled: "
                "tmpl needs both)",
                step.step_id,
                field,
            )
        if n == 0:
            raise AtifError(
                where, f"{at}: metrics.completion_token_ids is empty", step.step_id, "metrics.completion_token_ids"
            )
    for k, sub in enumerate(model.subagent_trajectories or []):
        _check_arrays(sub, where, f"{path}subagent_trajectories[{k}] ({sub.trajectory_id}).")


def _record(model: Any, k: int, where: str) -> dict[str, Any]:
    doc = model.model_dump(mode="json")
    keep = dict(((doc.get("extra") or {}).get(EXTRA_KEY)) or {})
    ours = keep.get("format") is None and "trajectory" in keep and "calls" in keep
    calls = _document_calls(doc)
    if not calls and not ours:
        raise AtifError(
            where,
            "no step carries token IDs (metrics.prompt_token_ids and completion_token_ids): "
            "a tmpl sample is its token IDs",
            None,
            "metrics.prompt_token_ids",
        )
    if ours and sorted(keep["calls"], key=str) == sorted((c["id"] for c in calls), key=str):
        order = {cid: j for j, cid in enumerate(keep["calls"])}
        calls.sort(key=lambda c: order[c["id"]])
    messages = keep.pop("messages", None)
    if messages is None:
        messages = _messages([s for s in doc["steps"]])
    if ours:
        return _our_record(keep, calls, messages, where)
    return _their_record(doc, calls, messages, k, where)


def _document_calls(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The model calls of a document and its embedded trajectories, in the order they ran: a step's,
    then those of the trajectories its observation references, then the next step's. An embedded
    trajectory marked as a branch (:func:`_is_branch`) goes on its holder's lineage (``in_branch``
    true on its calls); any other is a sub-agent run by the call of the step that references it."""
    out: list[dict[str, Any]] = []
    subs = {s["trajectory_id"]: s for s in doc.get("subagent_trajectories") or []}
    seen: set[str] = set()

    def walk(
        d: Mapping[str, Any],
        lineage: tuple[Any, Any],
        prefix: str,
        inner: Mapping[str, Any],
        in_branch: bool,
        base: int = 0,
    ) -> None:
        last = None
        ordinal = -1

        def enter(name: str, sub: Mapping[str, Any], ref: Mapping[str, Any] | None, parent: Any, at: int) -> None:
            seen.add(name)
            branch = _is_branch(sub, ref)
            walk(
                sub,
                lineage if branch else (name, parent),
                f"{prefix}{name}/",
                {s["trajectory_id"]: s for s in sub.get("subagent_trajectories") or []},
                branch or in_branch,
                at if branch else 0,
            )

        for step in d["steps"]:
            m = step.get("metrics") or {}
            keep = ((step.get("extra") or {}).get(EXTRA_KEY)) or {}
            if step["source"] == "agent" and not keep.get("no_message"):
                ordinal += 1
            if m.get("completion_token_ids") is not None:
                cid = keep.get("call") or f"{prefix}step-{step['step_id']}"
                trained = keep.get("trained", m.get("logprobs") is not None and not step.get("is_copied_context"))
                out.append(
                    {
                        "id": cid,
                        "prompt_ids": m["prompt_token_ids"],
                        "completion_ids": m["completion_token_ids"],
                        "logprobs": m.get("logprobs") if trained else (m.get("logprobs") or None),
                        "versions": keep.get("versions"),
                        "trained": bool(trained),
                        "parent": keep.get("parent", lineage[1]),
                        "agent": keep.get("agent", lineage[0]),
                        # a foreign step's turn: its assistant message's ordinal (what tmpl's turns are)
                        "turn": keep.get("turn") if "call" in keep else base + ordinal,
                        "reward": keep.get("reward"),
                        "edit": keep.get("edit"),
                        "where": f"{prefix}step {step['step_id']}",
                        "in_branch": in_branch,
                    }
                )
                last = cid
            # a branch referenced from an agent message without tokens holds that message's call: its
            # calls' turns count on from it
            at = ordinal if step["source"] == "agent" and m.get("completion_token_ids") is None else 0
            for result in (step.get("observation") or {}).get("results") or []:
                for ref in result.get("subagent_trajectory_ref") or []:
                    name = ref.get("trajectory_id")
                    if name is None or name not in inner or name in seen:
                        continue
                    enter(name, inner[name], ref, last, base + at)
        for name, sub in inner.items():  # embedded but never referenced: after the rest, no parent
            if name not in seen:
                enter(name, sub, None, None, 0)

    walk(doc, _ROOT, "", subs, False)
    return out


def _is_branch(sub: Mapping[str, Any], ref: Mapping[str, Any] | None) -> bool:
    """Whether an embedded trajectory is a branch of its holder's agent (``extra.tmpl.branch`` on the
    trajectory or on the reference to it), not a sub-agent."""
    for where in (sub, ref or {}):
        keep = (where.get("extra") or {}).get(EXTRA_KEY)
        if isinstance(keep, Mapping) and keep.get("branch"):
            return True
    return False


def _calls_record(calls: Sequence[Mapping[str, Any]], where: str) -> list[dict[str, Any]]:
    """The calls as an episode record's ``calls`` (checked by tmpl's Call: AtifError names the step)."""
    from .episode.types import Call

    out = []
    for c in calls:
        n = len(c["completion_ids"])
        versions = c.get("versions")
        if isinstance(versions, int) or versions is None:
            versions = [APPENDED_VERSION if versions is None else versions] * n
        try:  # tmpl's own checks: IDs in int32, logprobs finite and <= 0, one version per token
            Call(
                c["prompt_ids"],
                c["completion_ids"],
                c["logprobs"],
                versions=None if all(v == APPENDED_VERSION for v in versions) else versions,
                trained=c["trained"],
                id=c["id"],
            )
        except TmplError as exc:
            raise AtifError(where, f"{c['where']}: {exc}", step=c["where"], field=getattr(exc, "field", None)) from None
        out.append(
            {
                "id": c["id"],
                "prompt_ids": list(c["prompt_ids"]),
                "completion_ids": list(c["completion_ids"]),
                "logprobs": list(c["logprobs"]) if c["logprobs"] is not None else [0.0] * n,
                # None: unknown (a list of -1 is no version a Call takes)
                "versions": None if all(v == APPENDED_VERSION for v in versions) else versions,
                "trained": c["trained"],
                "parent": c["parent"],
                "agent": c["agent"],
                "turn": c["turn"],
                "reward": c["reward"],
            }
        )
    return out


def _our_record(
    keep: dict[str, Any], calls: list[dict[str, Any]], messages: list[dict[str, Any]], where: str
) -> dict[str, Any]:
    """A record tmpl wrote: its kept fields, the arrays rebuilt from the steps' calls."""
    ref = keep.pop("trajectory")
    keep.pop("calls")
    record = dict(keep)
    record["format"] = _FORMAT
    record["messages"] = messages
    call_records = _calls_record(calls, where)
    if record.get("episode") is not None:
        record["episode"] = {**record["episode"], "calls": call_records}
    if "arrays" in ref:
        record.update(ref["arrays"])
    elif ref.get("appended"):
        root = [c for c in call_records if c["parent"] is None and c["agent"] is None]
        built = _appended(root, ref["prompt_length"])
        if built is None:
            raise AtifError(where, "the agent steps' prompts do not extend one another, as this sample's did")
        trailing = list(ref.get("trailing_ids") or [])
        record["prompt_ids"] = built["prompt_ids"]
        record["completion_ids"] = built["completion_ids"] + trailing
        record["mask"] = built["mask"] + [0] * len(trailing)
        record["logprobs"] = built["logprobs"] + [0.0] * len(trailing)
        record["versions"] = built["versions"] + [APPENDED_VERSION] * len(trailing)
    else:
        try:
            episode = episode_from_record(record["episode"])
            seq = episode.sequence(int(ref["sequence"]))
        except (TmplError, IndexError, KeyError) as exc:
            raise AtifError(where, f"cannot rebuild the sample's episode: {exc}") from None
        p = int(ref["prompt_length"])
        record["prompt_ids"] = seq.ids[:p].tolist()
        record["completion_ids"] = seq.ids[p:].tolist()
        record["mask"] = seq.mask[p:].tolist()
        record["logprobs"] = seq.logprobs[p:].tolist()
        record["versions"] = seq.versions[p:].tolist()
    if record.get("loss_mask") is None:
        record["loss_mask"] = record["mask"]
    return record


def _their_record(
    doc: Mapping[str, Any], calls: list[dict[str, Any]], messages: list[dict[str, Any]], k: int, where: str
) -> dict[str, Any]:
    """A record of an ATIF trajectory another program wrote: one sequence when its calls extend one
    another (append mode), else an episode of them."""
    call_records = _calls_record(calls, where)
    root = [c for c in call_records if c["parent"] is None and c["agent"] is None]
    # one appended sequence: every call the root's and trained (append mode trains every sampled token)
    appendable = len(root) == len(call_records) and all(c["trained"] for c in call_records)
    built = _appended(call_records) if appendable else None
    episode = None
    if built is None:
        episode = {
            "max_length": None,
            "reward": None,
            "finished": True,
            "status": "DONE",
            "reason": "",
            "calls": call_records,
        }
        try:
            ep = episode_from_record(episode)
        except TmplError as exc:
            raise AtifError(where, f"its calls do not make an episode: {exc}") from None
        seqs = [s for s in ep.sequences if s.agent is None and s.parent is None] or ep.sequences
        seq = seqs[-1]
        p = seq.prompt_length
        built = {
            "prompt_ids": seq.ids[:p].tolist(),
            "completion_ids": seq.ids[p:].tolist(),
            "mask": seq.mask[p:].tolist(),
            "logprobs": seq.logprobs[p:].tolist(),
            "versions": seq.versions[p:].tolist(),
            "spans": _sequence_spans(seq),
        }
    agent_steps = [s for s in doc["steps"] if s["source"] == "agent"]
    n_tool_calls = sum(len(s.get("tool_calls") or []) for s in agent_steps)
    length = len(built["prompt_ids"]) + len(built["completion_ids"])
    return {
        "format": _FORMAT,
        "index": k,
        "sample": 0,
        "sample_id": doc.get("trajectory_id") or doc.get("session_id"),
        **{key: built[key] for key in ("prompt_ids", "completion_ids", "mask", "logprobs", "versions")},
        "spans": built["spans"],
        "status": "DONE",
        "reason": "",
        "finish_reason": "stop",
        "turns": len(root),
        "tool_calls": n_tool_calls,
        "tool_failures": 0,
        "drift": None,
        "messages": messages,
        "max_length": max(length, 1),
        "max_completion_length": None,
        "vocab_size": None,
        "tokens_cut": 0,
        "num_turns": sum(1 for s in built["spans"] if s["kind"] == COMPLETION),
        "episode": episode,
        "version": 0,
        "stale_action": None,
        "resumed": 0,
    }


def _sequence_spans(seq: Any) -> list[dict[str, Any]]:
    p = seq.prompt_length
    spans = []
    pos = p
    for turn, span in enumerate(seq.spans):
        if span.start > pos:
            spans.append({"kind": SUFFIX, "turn": turn, "message": None, "start": pos - p, "end": span.start - p})
        spans.append({"kind": COMPLETION, "turn": turn, "message": None, "start": span.start - p, "end": span.end - p})
        pos = max(pos, span.end)
    if len(seq.ids) > pos:
        spans.append(
            {"kind": SUFFIX, "turn": len(seq.spans), "message": None, "start": pos - p, "end": len(seq.ids) - p}
        )
    return spans


def _messages(steps: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages of ATIF steps (dicts): what tmpl's templates render."""
    out: list[dict[str, Any]] = []
    for step in steps:
        keep = ((step.get("extra") or {}).get(EXTRA_KEY)) or {}
        source = step["source"]
        if source in ("system", "user") and not (
            source == "system" and step.get("message") == "" and step.get("observation") and not keep
        ):
            m: dict[str, Any] = {"role": source, "content": _content(step.get("message"))}
            m.update(keep.get("message") or {})
            out.append(m)
        elif source == "agent" and not keep.get("no_message"):
            m = {"role": "assistant", "content": _content(step.get("message"))}
            if step.get("reasoning_content") is not None:
                m["reasoning_content"] = step["reasoning_content"]
            if step.get("tool_calls"):
                m["tool_calls"] = [_message_call(tc) for tc in step["tool_calls"]]
            m.update(keep.get("message") or {})
            out.append(m)
        for result in (step.get("observation") or {}).get("results") or []:
            if result.get("content") is None and result.get("subagent_trajectory_ref"):
                continue
            rkeep = ((result.get("extra") or {}).get(EXTRA_KEY)) or {}
            t: dict[str, Any] = {"role": "tool"}
            if result.get("source_call_id") is not None:
                t["tool_call_id"] = result["source_call_id"]
            t["content"] = _content(result.get("content"))
            t.update(rkeep.get("message") or {})
            out.append(t)
    return out


def _content(value: Any) -> Any:
    """ATIF message content as chat content: text as is, content parts as ``{"type": "text"|"image"...}``."""
    if value is None or isinstance(value, str):
        return value
    parts = []
    for part in value:
        if part.get("type") == "text":
            parts.append({"type": "text", "text": part.get("text")})
        else:
            source = part.get("source") or {}
            parts.append(
                {"type": part.get("type"), part.get("type"): source.get("path"), "media_type": source.get("media_type")}
            )
    return parts


def _message_call(tc: Mapping[str, Any]) -> dict[str, Any]:
    keep = ((tc.get("extra") or {}).get(EXTRA_KEY)) or {}
    fn: dict[str, Any] = {"name": tc["function_name"], "arguments": keep.get("arguments", tc.get("arguments"))}
    fn.update(keep.get("function") or {})
    out: dict[str, Any] = {"id": tc["tool_call_id"], "type": keep.get("type", "function"), "function": fn}
    if keep.get("no_id"):
        out["id"] = None
    out.update({k: v for k, v in keep.items() if k not in ("no_id", "type", "arguments", "function")})
    return out


# -- files -------------------------------------------------------------------------------------------


def write_documents(documents: Sequence[Any], path: str | os.PathLike[str]) -> Path:
    """Write ATIF documents: a ``.json`` file holds one (indented, as Harbor writes ``trajectory.json``),
    a ``.jsonl`` (or ``.jsonl.gz``) file one per line."""
    path = Path(path)
    dicts = [d.to_json_dict() if hasattr(d, "to_json_dict") else dict(d) for d in documents]
    lines = path.name.endswith((".jsonl", ".jsonl.gz"))
    if not lines and len(dicts) != 1:
        raise AtifError(
            str(path), f"an ATIF .json file holds one trajectory, not {len(dicts)}: write them to a .jsonl file"
        )
    with _open(path, "w") as f:
        if lines:
            for d in dicts:
                f.write(json.dumps(d, ensure_ascii=False, allow_nan=False))
                f.write("\n")
        else:
            json.dump(dicts[0], f, ensure_ascii=False, allow_nan=False, indent=2)
            f.write("\n")
    return path


def read_documents(path: str | os.PathLike[str]) -> Iterator[tuple[Any, str]]:
    """Each JSON document of an ATIF file with where it is (``path``, ``path[k]`` or ``path:line``): one
    document (indented or not), a JSON array of them, or JSON lines. Detected by content, not name."""
    path = Path(path)
    if not path.is_file():
        raise AtifError(str(path), "is a folder" if path.is_dir() else "does not exist")
    try:
        with _open(path, "r") as f:
            text = f.read()
    except (UnicodeDecodeError, EOFError, OSError) as exc:
        raise AtifError(str(path), f"cannot be read as text ({exc})") from None
    if not text.strip():
        raise AtifError(str(path), "the file is empty")
    try:
        value = json.loads(text)
    except ValueError as whole:
        first = text.lstrip().split("\n", 1)[0]
        try:  # JSON lines: the first line is a document of its own
            json.loads(first)
        except ValueError:
            raise AtifError(str(path), f"not JSON: {whole}") from None
        yield from _json_lines(path, text)
        return
    if isinstance(value, list):
        for k, doc in enumerate(value):
            yield doc, f"{path}[{k}]"
    else:
        yield value, str(path)


def _json_lines(path: Path, text: str) -> Iterator[tuple[Any, str]]:
    lines = text.split("\n")
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line), f"{path}:{line_no}"
        except ValueError as exc:
            cut = " (the last line, cut short: a truncated file?)" if line_no == len(lines) else ""
            raise AtifError(f"{path}:{line_no}", f"not JSON: {exc}{cut}") from None


def document_tools(path: str | os.PathLike[str]) -> list[list[dict[str, Any]] | None]:
    """The tool schemas of each document of an ATIF file (``agent.tool_definitions``; None where absent),
    in the order :func:`read_documents` gives the documents."""
    out = []
    for doc, _ in read_documents(path):
        agent = doc.get("agent") if isinstance(doc, Mapping) else None
        tools = agent.get("tool_definitions") if isinstance(agent, Mapping) else None
        out.append(list(tools) if isinstance(tools, list) else None)
    return out


def looks_like_atif(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds ATIF (its first document has ``schema_version`` ``ATIF-...``), by content.

    >>> looks_like_atif("rollouts.jsonl")        # doctest: +SKIP
    False
    """
    try:
        with _open(Path(path), "r") as f:
            head = f.read(1 << 16)
            if _SCHEMA.search(head) is not None:
                return True
            if not head.lstrip().startswith(("{", "[")) or '"steps"' not in head or '"tmpl.rollout.' in head:
                return False
            # schema_version after 64 KiB of steps: read the first document whole
            first = head.lstrip()
            rest = f.read()
    except (UnicodeDecodeError, EOFError, OSError):
        return False
    try:
        value = json.loads(first + rest)
    except ValueError:
        try:
            value = json.loads((first + rest).split("\n", 1)[0])
        except ValueError:
            return False
    value = value[0] if isinstance(value, list) and value else value
    return isinstance(value, Mapping) and str(value.get("schema_version", "")).upper().startswith("ATIF-")


def _open(path: Path, mode: str) -> IO[str]:
    """A text file, gzip-compressed when its name ends with ``.gz`` or (read) its bytes say so."""
    gz = path.name.endswith(".gz")
    if not gz and mode == "r":
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
    if gz:
        return cast(IO[str], gzip.open(path, mode + "t", encoding="utf-8"))
    return open(path, mode, encoding="utf-8")
