"""Anthropic Messages (``POST /v1/messages``, ``POST /v1/messages/count_tokens``): requests in, messages and SSE events out.

The request as Claude Code and the ``anthropic`` SDKs send it (docs/gateway.md, "Anthropic Messages",
lists every field as read, mapped, ignored or refused):

- ``system`` (a string, or text blocks joined as written) is the leading system turn; a ``system`` turn
  inside ``messages`` (Claude Code sends one at ``messages[1]``) stays a system turn, placed by
  :func:`tmpl.gateway.roles.place_roles` where the template renders it (or folded into a user turn);
- a user turn's ``tool_result`` blocks become tool messages, in order, and its text blocks (joined as
  written: Claude Code's blocks carry their own separators) a user message after them;
- ``image`` blocks (a ``base64`` source, or a ``url`` source holding a ``data:`` URL) in a user turn or
  a ``tool_result``'s content are image parts (:func:`tmpl.gateway.vision.image_part`) of that message,
  in order among its text: served on a :class:`tmpl.vision.VisionTemplate`; a text template answers 400
  naming the block (the gateway fetches no URLs: any other source is a 400 too);
- an assistant turn's ``text`` blocks are its content, ``thinking`` blocks its ``reasoning_content``,
  ``tool_use`` blocks its calls; ``redacted_thinking`` blocks are left out (their text is encrypted);
- ``cache_control`` and ``citations`` on any block are ignored;
- ``tools``: custom tools (no ``type``, or ``"custom"``) as functions (``name``, ``description``,
  ``input_schema`` as ``parameters``); server tools (``web_search_20250305``, ``bash_20250124``,
  ``text_editor_...``, any other ``type``) are left out of the prompt and named in the request's
  ``notes`` (the reply's ``tmpl.left_out``; the session keeps them);
- ``max_tokens`` (required, not for count_tokens), ``temperature``, ``top_p``, ``top_k``,
  ``stop_sequences``, ``stream`` are mapped; every other field the API defines is accepted and ignored
  (:data:`FIELDS`).

Refused with a 400 naming the block: ``image`` blocks on a text template (it renders no images) or
anywhere but a user turn or a tool result, ``document`` blocks, and server-tool result blocks in the history.

>>> body = {"model": "m", "max_tokens": 8, "system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]}
>>> parse(body).messages
[{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi'}]
>>> parse({**body, "messages": [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Skills: none."}]}).messages[-1]
{'role': 'system', 'content': 'Skills: none.'}
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import GatewayError, GatewayRequestError
from ..canonical import tool_call
from ..service import CallParams
from ..session import Plan, Reply
from ..vision import data_url, image_part

__all__ = ["FIELDS", "MessagesRequest", "count_body", "error_body", "events", "parse", "response"]

STOP = {"stop": "end_turn", "length": "max_tokens", "abort": "end_turn"}

#: every request field of the Messages API (the reference, and the ``anthropic`` SDK's
#: ``MessageCreateParams`` and beta params), and what the gateway does with it
FIELDS: dict[str, str] = {
    "model": "read: echoed in the reply (the gateway serves its one model)",
    "messages": "mapped: canonical messages (see the module docstring)",
    "max_tokens": "mapped: the call's sampled tokens at most (capped by the gateway's max_tokens and context)",
    "system": "mapped: the leading system turn",
    "stop_sequences": "mapped: stop strings",
    "stream": "mapped: an SSE stream of message events",
    "temperature": "mapped: sampling temperature",
    "top_p": "mapped: nucleus sampling",
    "top_k": "mapped: top-k sampling",
    "tools": "mapped: custom tools as functions; server tools left out and noted",
    "tool_choice": "ignored: the gateway does not constrain decoding (auto, any, tool, none accepted)",
    "thinking": "ignored: the template's own setting decides whether the model thinks",
    "metadata": "ignored",
    "service_tier": "ignored",
    "speed": "ignored",
    "inference_geo": "ignored",
    "container": "ignored: the gateway runs no code-execution containers",
    "mcp_servers": "ignored: the gateway calls no MCP servers (their tools are not in the prompt); noted",
    "context_management": "ignored: the gateway edits no context (the client's messages are the prompt)",
    "compaction": "ignored: the gateway compacts nothing",
    "output_config": "ignored: effort and output format do not change the prompt; decoding is not constrained",
    "output_format": "ignored: decoding is not constrained",
    "cache_control": "ignored: the gateway's prefix reuse needs no marks",
    "diagnostics": "ignored",
    "billing_policy": "ignored",
    "fallbacks": "ignored",
    "fallback_credit_token": "ignored",
    "thread": "ignored",
    "betas": "ignored (the SDK sends it as the anthropic-beta header)",
    "user_profile_id": "ignored",
    "workspace_id": "ignored",
}
#: tool types that are custom (client-run) tools; any other type is a server tool
CUSTOM_TOOLS = (None, "custom")
TOOL_CHOICES = ("auto", "any", "tool", "none")


@dataclass(frozen=True)
class MessagesRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    params: CallParams
    stream: bool
    model: str | None
    #: what the gateway left out of this request (server tools, MCP servers), kept in the session's notes
    notes: tuple[str, ...] = ()


def _blocks(content: Any, where: str) -> list[Mapping[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, Sequence) or isinstance(content, bytes):
        raise GatewayRequestError(None, f"{where}.content must be a string or a list of blocks", param=where)
    for k, block in enumerate(content):
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            raise GatewayRequestError(None, f"{where}.content[{k}] must be a block with a type", param=where)
    return list(content)


def _refused(kind: str, where: str) -> GatewayRequestError:
    """The 400 of a block the gateway does not serve, naming it and why."""
    if kind == "image":
        why = "images are read in user turns and tool results only"
    elif kind in ("document", "search_result", "container_upload"):
        why = f"{kind} blocks are not served: send their text as text blocks"
    elif kind.endswith("tool_use") or kind.endswith("tool_result"):
        why = f"{kind} blocks are server-tool blocks: the gateway runs no server tools"
    else:
        why = f"{kind!r} blocks are not served"
    return GatewayRequestError(None, f"{where} ({kind} block): {why}", param=where)


def _text_of(content: Any, where: str) -> str:
    """A system prompt's or tool result's text: a string, or text blocks joined as written."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for k, block in enumerate(_blocks(content, where)):
        if block["type"] != "text":
            raise _refused(block["type"], f"{where}.content[{k}]")
        parts.append(str(block.get("text", "")))
    return "".join(parts)


def _image(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    """An image block as a canonical image part: its ``base64`` source, or a ``url`` source's data: URL."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, Mapping) else None
    if kind == "base64":
        assert isinstance(source, Mapping)
        return image_part(data_url(source.get("media_type"), source.get("data"), where), where)
    if kind == "url":
        assert isinstance(source, Mapping)
        return image_part(source.get("url"), where)
    raise GatewayRequestError(
        None, f"{where} (image block): source type {kind!r} is not served (base64, or a data: URL)", param=where
    )


def _turn_content(
    blocks: Sequence[Mapping[str, Any]], where: str, skip: str | None = None
) -> str | list[dict[str, Any]]:
    """Text and image blocks (``skip``: a type gathered elsewhere) as a message's content: the text joined as
    written where there is no image, else the parts in order."""
    parts: list[dict[str, Any]] = []
    for k, b in enumerate(blocks):
        if b["type"] == "text":
            parts.append({"type": "text", "text": str(b.get("text", ""))})
        elif b["type"] == "image":
            parts.append(_image(b, f"{where}.content[{k}]"))
        elif b["type"] != skip:
            raise _refused(b["type"], f"{where}.content[{k}]")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _message(message: Any, i: int) -> list[dict[str, Any]]:
    where = f"messages[{i}]"
    if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant", "system"):
        raise GatewayRequestError(None, f"{where}.role must be 'user', 'assistant' or 'system'", param=where)
    if message["role"] == "system":
        return [{"role": "system", "content": _text_of(message.get("content"), where)}]
    blocks = _blocks(message.get("content"), where)
    if message["role"] == "assistant":
        text, reasoning, calls = [], [], []
        for k, b in enumerate(blocks):
            kind = b["type"]
            if kind == "text":
                text.append(str(b.get("text", "")))
            elif kind == "thinking":
                reasoning.append(str(b.get("thinking", "")))
            elif kind == "tool_use":
                if not isinstance(b.get("name"), str) or not isinstance(b.get("id"), str):
                    raise GatewayRequestError(
                        None, f"{where}.content[{k}]: tool_use needs an id and a name", param=where
                    )
                calls.append(tool_call(b["id"], b["name"], b.get("input") or {}))
            elif kind != "redacted_thinking":
                raise _refused(kind, f"{where}.content[{k}]")
        out: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
        if reasoning and any(reasoning):
            out["reasoning_content"] = "".join(reasoning)
        if calls:
            out["tool_calls"] = calls
        return [out]
    results = []
    for k, b in enumerate(blocks):
        if b["type"] == "tool_result":
            if not isinstance(b.get("tool_use_id"), str):
                raise GatewayRequestError(None, f"{where}.content[{k}]: tool_result needs a tool_use_id", param=where)
            inner = b.get("content")
            pw = f"{where}.content[{k}]"
            body = _turn_content(_blocks(inner, pw), pw) if inner is not None else ""
            if b.get("is_error") and not body:
                body = "error"
            results.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": body})
    user = _turn_content(blocks, where, skip="tool_result")
    if isinstance(user, list) or user.strip():
        results.append({"role": "user", "content": user})
    if not results:
        results.append({"role": "user", "content": ""})
    return results


def _tools(raw: Any, notes: list[str]) -> list[dict[str, Any]] | None:
    """Custom tools as functions; server tools left out, each noted."""
    if not raw:
        return None
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)):
        raise GatewayRequestError(None, "tools must be a list", param="tools")
    tools = []
    for k, t in enumerate(raw):
        if not isinstance(t, Mapping):
            raise GatewayRequestError(None, f"tools[{k}] must be an object", param="tools")
        if t.get("type") not in CUSTOM_TOOLS:
            name = t.get("name") if isinstance(t.get("name"), str) else "?"
            notes.append(
                f"tools[{k}]: the server tool {t.get('type')!r} ({name}) is left out of the prompt "
                "(the gateway runs no server tools)"
            )
            continue
        if not isinstance(t.get("name"), str):
            raise GatewayRequestError(None, f"tools[{k}] needs a name", param="tools")
        fn: dict[str, Any] = {"name": t["name"]}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        fn["parameters"] = t.get("input_schema") or {"type": "object", "properties": {}}
        tools.append({"type": "function", "function": fn})
    return tools or None


def _number(body: Mapping[str, Any], key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GatewayRequestError(None, f"{key} must be a number", param=key)
    return float(value)


def parse(body: Any, *, count: bool = False) -> MessagesRequest:
    """A Messages request body as canonical messages, tools and call parameters (``count``: a
    count_tokens body, which has no ``max_tokens``)."""
    if not isinstance(body, Mapping):
        raise GatewayRequestError(None, "the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise GatewayRequestError(None, "messages must be a non-empty list", param="messages")
    max_tokens = body.get("max_tokens")
    if count and max_tokens is None:
        max_tokens = 1
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise GatewayRequestError(None, "max_tokens is required: a positive integer", param="max_tokens")
    stops = body.get("stop_sequences") or []
    if (
        not isinstance(stops, list)
        or len(stops) > 8
        or not all(isinstance(x, str) and 0 < len(x) <= 256 for x in stops)
    ):
        raise GatewayRequestError(
            None, "stop_sequences must be up to 8 strings of 1-256 characters", param="stop_sequences"
        )
    choice = body.get("tool_choice")
    if choice is not None and not (isinstance(choice, Mapping) and choice.get("type") in TOOL_CHOICES):
        raise GatewayRequestError(
            None, f"tool_choice must be an object whose type is one of {', '.join(TOOL_CHOICES)}", param="tool_choice"
        )
    top_k = body.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise GatewayRequestError(None, "top_k must be a non-negative integer", param="top_k")
    notes: list[str] = []
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        out.append({"role": "system", "content": _text_of(system, "system")})
    for i, m in enumerate(messages):
        out.extend(_message(m, i))
    tools = _tools(body.get("tools"), notes)
    servers = body.get("mcp_servers")
    if servers:
        names = [s.get("name") for s in servers if isinstance(s, Mapping)] if isinstance(servers, list) else []
        notes.append(
            f"mcp_servers {names}: left out (the gateway calls no MCP servers; their tools are not in the prompt)"
        )
    return MessagesRequest(
        out,
        tools,
        CallParams(
            max_tokens=max_tokens,
            temperature=_number(body, "temperature"),
            top_p=_number(body, "top_p"),
            top_k=top_k or None,
            stop=tuple(stops),
        ),
        bool(body.get("stream")) and not count,
        body.get("model") if isinstance(body.get("model"), str) else None,
        tuple(notes),
    )


def count_body(input_tokens: int) -> dict[str, Any]:
    """What ``POST /v1/messages/count_tokens`` answers.

    >>> count_body(12)
    {'input_tokens': 12}
    """
    return {"input_tokens": input_tokens}


def _content(reply: Reply) -> list[dict[str, Any]]:
    m = reply.message
    out: list[dict[str, Any]] = []
    if m.get("reasoning_content"):
        out.append({"type": "thinking", "thinking": m["reasoning_content"], "signature": ""})
    if m.get("content"):
        out.append({"type": "text", "text": m["content"]})
    for c in m.get("tool_calls", ()):
        out.append(
            {"type": "tool_use", "id": c["id"], "name": c["function"]["name"], "input": c["function"]["arguments"]}
        )
    return out


def _stop(reply: Reply) -> str:
    if reply.message.get("tool_calls"):
        return "tool_use"
    if reply.stop is not None:
        return "stop_sequence"
    return STOP.get(reply.result.finish_reason, "end_turn")


def response(session: str, plan: Plan, reply: Reply, *, model: str, notes: Sequence[str] = ()) -> dict[str, Any]:
    """The ``message`` object of a call's reply (``notes``: what the request had left out)."""
    return {
        "id": f"msg_{reply.call}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _content(reply),
        "stop_reason": _stop(reply),
        "stop_sequence": reply.stop,
        "usage": {"input_tokens": len(plan.prompt_ids), "output_tokens": len(reply.result.token_ids)},
        "tmpl": _tmpl(session, plan, reply, notes),
    }


def _tmpl(session: str, plan: Plan, reply: Reply, notes: Sequence[str]) -> dict[str, Any]:
    """The reply's ``tmpl`` object: the call, how its prompt was made, how its instruction turns were
    placed (``roles``) and what of the request was left out (``left_out``)."""
    out: dict[str, Any] = {"session": session, "call": reply.call, "sequence": reply.sequence, "prompt": plan.mode}
    if plan.roles:
        out["roles"] = dict(plan.roles)
    if notes:
        out["left_out"] = list(notes)
    return out


def events(
    session: str, plan: Plan, reply: Reply, *, model: str, notes: Sequence[str] = ()
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(event, data)`` pairs of a streamed message, in the order the Messages API sends them."""
    head = response(session, plan, reply, model=model, notes=notes)
    start = {**head, "content": [], "stop_reason": None, "usage": {**head["usage"], "output_tokens": 0}}
    yield "message_start", {"type": "message_start", "message": start}
    for k, block in enumerate(head["content"]):
        if block["type"] == "text":
            yield (
                "content_block_start",
                {"type": "content_block_start", "index": k, "content_block": {"type": "text", "text": ""}},
            )
            yield (
                "content_block_delta",
                {"type": "content_block_delta", "index": k, "delta": {"type": "text_delta", "text": block["text"]}},
            )
        elif block["type"] == "thinking":
            yield (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": k,
                    "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                },
            )
            yield (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": k,
                    "delta": {"type": "thinking_delta", "thinking": block["thinking"]},
                },
            )
        else:
            empty = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            yield "content_block_start", {"type": "content_block_start", "index": k, "content_block": empty}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            yield "content_block_delta", {"type": "content_block_delta", "index": k, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": k}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": head["stop_reason"], "stop_sequence": head["stop_sequence"]},
            "usage": {"output_tokens": head["usage"]["output_tokens"]},
        },
    )
    yield "message_stop", {"type": "message_stop"}


ERROR_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    503: "overloaded_error",
    504: "timeout_error",
}


def error_body(exc: GatewayError) -> dict[str, Any]:
    """Anthropic's error object: ``{"type": "error", "error": {"type", "message"}}``."""
    return {"type": "error", "error": {"type": ERROR_TYPES.get(exc.status, "api_error"), "message": str(exc)}}
