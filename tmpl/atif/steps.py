"""A tmpl record's messages and model calls as ATIF steps (system/user steps, agent steps with their calls,
metrics and observations), and steps back to messages; the token arrays a step appends."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..trajectory.types import APPENDED_VERSION, COMPLETION, SUFFIX
from .model import EXTRA_KEY


def _version() -> str:
    from .. import __version__

    return __version__


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
