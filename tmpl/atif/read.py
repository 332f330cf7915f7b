"""ATIF documents to tmpl records (:func:`documents_to_records`): tmpl's own layout, files written before it
(branches as root steps) and other programs' (marked embedded trajectories as branches, unmarked as sub-agents)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..episode.records import from_record as episode_from_record
from ..errors import AtifError, TmplError
from ..trajectory.types import APPENDED_VERSION, COMPLETION, SUFFIX
from .layout import _ROOT
from .model import _FORMAT, EXTRA_KEY, validate
from .steps import _appended, _messages


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
    from ..episode.types import Call

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
        built = sequence_arrays(seqs[-1])
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


def sequence_arrays(seq: Any) -> dict[str, list[Any]]:
    """A training sequence as a record's arrays: ``prompt_ids`` up to its first sampled token, the rest
    as ``completion_ids`` with its ``mask``, ``logprobs`` and ``versions``, and ``spans`` (each call's
    sampled tokens a completion span, the context between them a suffix span)."""
    p = seq.prompt_length
    return {
        "prompt_ids": seq.ids[:p].tolist(),
        "completion_ids": seq.ids[p:].tolist(),
        "mask": seq.mask[p:].tolist(),
        "logprobs": seq.logprobs[p:].tolist(),
        "versions": seq.versions[p:].tolist(),
        "spans": _sequence_spans(seq),
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
