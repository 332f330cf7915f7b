"""A session's records and back: what one call writes, and the session rebuilt from them on a restart.

A call is written as the inputs :meth:`Session.record` took (its plan and each reply: IDs, logprobs,
versions, message, stop, problems), so a restarted gateway rebuilds a session by recording them again,
in order: the same heads, replies, issued call ids and episode, so the harness's next call continues
its sequence with the same IDs and the same reuse. Messages and tool lists are kept once per session
by digest; a prompt is kept as the head it extends (a call id and a length) plus the IDs after it.

>>> digest({"role": "user", "content": "Hi"}) == digest({"role": "user", "content": "Hi"})
True
>>> digest({"role": "user", "content": "Hi"}) == digest({"role": "user", "content": "Hi!"})
False
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ...backends.base import GenerationResult
from ..jsonio import dumps as _dumps
from ..jsonio import loads
from ..session import Plan, Reply, Session

if TYPE_CHECKING:
    from ..service import Completion, Gateway

__all__ = ["Rebuilt", "call_body", "digest", "dumps", "rebuild", "same_value"]


def dumps(value: Any) -> bytes:
    """``value`` as compact JSON bytes (msgspec where installed: :func:`tmpl.gateway.jsonio.dumps`)."""
    return _dumps(value)


def digest(value: Any) -> str:
    """A short digest of ``value`` (a message, a tool list, a request) by its ``repr``: several times
    cheaper than its JSON, and the same for the same JSON read the same way (a client's retry, a message
    sent back on each call); two equal values whose keys come in another order digest apart (then they
    are kept twice, or a retry is answered anew: never a wrong match)."""
    return hashlib.blake2b(repr(value).encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def same_value(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` have the same :func:`digest` without computing it: equal, with the same types
    and key order throughout (``1``, ``1.0`` and ``True`` are equal, ``0.0`` and ``-0.0`` too; their reprs
    differ). A message sent back call after call is compared, not hashed again: comparing a long tool
    result is a memcmp, its repr and hash copy and walk it (40 turns of a 16k-token history: 2 ms a call).

    >>> same_value({"role": "tool", "content": "21 C"}, {"role": "tool", "content": "21 C"})
    True
    >>> same_value({"n": 1}, {"n": 1.0}), same_value({"a": 1, "b": 2}, {"b": 2, "a": 1})
    (False, False)
    """
    if a is b:
        return True
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is str:
        return bool(a == b)
    if kind is dict:  # equal (compared in C, strings by memcmp), keys in the same order, then the types
        if a != b or list(a) != list(b):
            return False
        return all(type(v) is str or v is None or same_value(v, b[k]) for k, v in a.items())
    if kind is list or kind is tuple:
        return a == b and all(type(x) is str or same_value(x, y) for x, y in zip(a, b))
    return bool(a == b) and repr(a) == repr(b)  # 0.0 and -0.0, 1 and True (same type: equal reprs)


def base_of(session: Session, plan: Plan, fresh: set[str]) -> tuple[str | None, int]:
    """The head of ``plan``'s lineage whose IDs (prompt then sampled) begin the plan's prompt, longest
    first, leaving out the calls ``fresh`` (this call's own replies): its call id and length."""
    lineage = session.lineages.get(plan.lineage)
    if lineage is None:
        return None, 0
    prompt = plan.prompt_array()
    # longest first (the head the call continued, as a rule): one comparison of the history, not one per head
    for head in sorted(lineage.heads, key=lambda h: len(h.array), reverse=True):
        n = len(head.array)
        if head.call in fresh or not 0 < n <= len(prompt):
            continue
        if np.array_equal(prompt[:n], head.array):
            return head.call, n
    return None, 0


def call_body(
    session: Session,
    plan: Plan,
    replies: Iterable[Reply],
    version: int | None,
    *,
    messages: list[str],
    tools: str | None,
    request: str | None,
    idem: str | None,
) -> dict[str, Any]:
    """The ``call`` record of a call whose replies are recorded (``messages`` and ``tools``: digests)."""
    replies = list(replies)
    base, n = base_of(session, plan, {r.call for r in replies})
    return {
        "lineage": plan.lineage,
        "mode": plan.mode,
        "edit": plan.edit,
        "encoded": plan.encoded,
        "roles": dict(plan.roles),
        "messages": messages,
        "tools": tools,
        "base": base,
        "base_len": n,
        "tail": plan.prompt_ids[n:] if base is not None else list(plan.prompt_ids),
        "version": version,
        "request": request,
        "idem": idem,
        "replies": [reply_body(r) for r in replies],
    }


def reply_body(reply: Reply) -> dict[str, Any]:
    """One reply as its record holds it."""
    r = reply.result
    return {
        "id": reply.call,
        "sequence": reply.sequence,
        "tokens": list(r.token_ids),
        "logprobs": None if r.logprobs is None else list(r.logprobs),
        "versions": None if r.versions is None else list(r.versions),
        "finish": r.finish_reason,
        "error": r.error,
        "lpmode": r.logprobs_mode,
        "message": reply.message,
        "stop": reply.stop,
        "problems": list(reply.problems),
    }


def result_of(body: Mapping[str, Any]) -> GenerationResult:
    """The engine's result a reply (or an aborted call) record holds."""
    return GenerationResult(
        body["id"],
        list(body["tokens"]),
        None if body["logprobs"] is None else list(body["logprobs"]),
        body["finish"],
        body.get("lpmode", "raw"),
        body.get("error"),
        None if body.get("versions") is None else list(body["versions"]),
    )


@dataclass
class Rebuilt:
    """A session rebuilt from its records: its last call (as the gateway would answer it again) and the
    calls answered under an idempotency key."""

    session: Session
    last: tuple[str | None, Completion] | None = None
    idem: dict[str, Completion] = field(default_factory=dict)
    digests: set[str] = field(default_factory=set)
    finished: tuple[str, Any] | None = None


def rebuild(gateway: Gateway, key: str, events: Iterable[tuple[int, str, bytes]]) -> Rebuilt:
    """Session ``key`` made anew from its events ``(seq, kind, body)``, oldest first: each call recorded
    again with the very inputs it was recorded with the first time."""
    from ..service import Completion

    session = gateway.sessions.factory(key)
    out = Rebuilt(session)
    values: dict[str, Any] = {}
    ids: dict[str, np.ndarray] = {}  # call id -> prompt then sampled IDs
    for _, kind, raw in events:
        body = loads(raw)
        if kind == "m":
            if body["d"] not in values:
                values[body["d"]] = body["v"]
            out.digests.add(body["d"])
        elif kind == "call":
            head = ids[body["base"]][: body["base_len"]].tolist() if body["base"] is not None else []
            prompt = head + list(body["tail"])
            tools = None if body["tools"] is None else values[body["tools"]]
            plan = Plan(
                prompt,
                body["mode"],
                [values[d] for d in body["messages"]],
                tools,
                body["edit"],
                body["encoded"],
                None,
                body["lineage"],
                body["roles"],
            )
            replies = []
            for r in body["replies"]:
                result = result_of(r)
                reply = gateway._reply(r["id"], plan, result, tools, r["stop"])
                reply.message = r["message"]
                reply.problems = list(r["problems"])
                session.record(plan, reply, version=body["version"])
                ids[r["id"]] = np.asarray(prompt + list(result.token_ids), dtype=np.int32)
                replies.append(reply)
            done = Completion(key, plan, replies)
            out.last = (body["request"], done)
            if body["idem"]:
                out.idem[body["idem"]] = done
        elif kind == "abort":
            head = ids[body["base"]][: body["base_len"]].tolist() if body["base"] is not None else []
            plan = Plan(
                head + list(body["tail"]),
                "render",
                [values[d] for d in body["messages"]],
                None,
                body["edit"],
                0,
                None,
                body["lineage"],
            )
            session.record_aborted(plan, body["id"], result_of(body), version=body["version"])
            session.ended[body["id"]] = body["why"]
        elif kind == "ended":
            session.ended[body["id"]] = body["why"]
        elif kind == "reward":
            if body["call"] is None:
                session.episode.reward = body["value"]
            else:
                session.episode.set_call_reward(body["call"], body["value"])
        elif kind == "finish":
            out.finished = (body["reason"], body.get("env"))
    return out
