"""Anthropic Messages (``POST /v1/messages``): requests in, messages and SSE events out.

Read: ``system`` (text or text blocks), ``messages`` with ``text``, ``tool_use``, ``tool_result`` and
``thinking`` blocks, ``tools`` (``name``, ``description``, ``input_schema``), ``tool_choice`` (``auto``
only), ``max_tokens`` (required), ``temperature``, ``top_p``, ``stop_sequences`` (as the chat dialect's
``stop``), ``stream``. A user turn's ``tool_result`` blocks become tool messages, in order, and its text
a user message after them. Refused with a 400: image and document blocks.

>>> body = {"model": "m", "max_tokens": 8, "system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]}
>>> parse(body).messages
[{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi'}]
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

__all__ = ["MessagesRequest", "error_body", "events", "parse", "response"]

STOP = {"stop": "end_turn", "length": "max_tokens", "abort": "end_turn"}


@dataclass(frozen=True)
class MessagesRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    params: CallParams
    stream: bool
    model: str | None


def _blocks(content: Any, where: str) -> list[Mapping[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, Sequence) or isinstance(content, bytes):
        raise GatewayRequestError(None, f"{where}.content must be a string or a list of blocks", param=where)
    for k, block in enumerate(content):
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            raise GatewayRequestError(None, f"{where}.content[{k}] must be a block with a type", param=where)
    return list(content)


def _result_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for k, block in enumerate(_blocks(content, where)):
        if block["type"] != "text":
            raise GatewayRequestError(
                None, f"{where}.content[{k}]: {block['type']!r} blocks are not served (text only)", param=where
            )
        parts.append(str(block.get("text", "")))
    return "".join(parts)


def _message(message: Any, i: int) -> list[dict[str, Any]]:
    where = f"messages[{i}]"
    if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant"):
        raise GatewayRequestError(None, f"{where}.role must be 'user' or 'assistant'", param=where)
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
                raise GatewayRequestError(None, f"{where}.content[{k}]: {kind!r} blocks are not served", param=where)
        out: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
        if reasoning and any(reasoning):
            out["reasoning_content"] = "".join(reasoning)
        if calls:
            out["tool_calls"] = calls
        return [out]
    results, text = [], []
    for k, b in enumerate(blocks):
        kind = b["type"]
        if kind == "tool_result":
            if not isinstance(b.get("tool_use_id"), str):
                raise GatewayRequestError(None, f"{where}.content[{k}]: tool_result needs a tool_use_id", param=where)
            body = _result_text(b.get("content"), f"{where}.content[{k}]")
            if b.get("is_error") and not body:
                body = "error"
            results.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": body})
        elif kind == "text":
            text.append(str(b.get("text", "")))
        else:
            raise GatewayRequestError(
                None, f"{where}.content[{k}]: {kind!r} blocks are not served (text only)", param=where
            )
    if text and any(t.strip() for t in text):
        results.append({"role": "user", "content": "".join(text)})
    if not results:
        results.append({"role": "user", "content": ""})
    return results


def parse(body: Any) -> MessagesRequest:
    """A Messages request body as canonical messages, tools and call parameters."""
    if not isinstance(body, Mapping):
        raise GatewayRequestError(None, "the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise GatewayRequestError(None, "messages must be a non-empty list", param="messages")
    max_tokens = body.get("max_tokens")
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
    if choice is not None and not (isinstance(choice, Mapping) and choice.get("type") == "auto"):
        raise GatewayRequestError(
            None,
            "tool_choice other than auto is not served: the gateway does not constrain decoding",
            param="tool_choice",
        )
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        out.append({"role": "system", "content": _result_text(system, "system")})
    for i, m in enumerate(messages):
        out.extend(_message(m, i))
    tools = None
    if body.get("tools"):
        if not isinstance(body["tools"], Sequence):
            raise GatewayRequestError(None, "tools must be a list", param="tools")
        tools = []
        for k, t in enumerate(body["tools"]):
            if not isinstance(t, Mapping) or not isinstance(t.get("name"), str):
                raise GatewayRequestError(None, f"tools[{k}] needs a name", param="tools")
            fn: dict[str, Any] = {"name": t["name"]}
            if isinstance(t.get("description"), str):
                fn["description"] = t["description"]
            fn["parameters"] = t.get("input_schema") or {"type": "object", "properties": {}}
            tools.append({"type": "function", "function": fn})
    temperature, top_p = body.get("temperature"), body.get("top_p")
    return MessagesRequest(
        out,
        tools,
        CallParams(
            max_tokens=max_tokens,
            temperature=float(temperature) if isinstance(temperature, (int, float)) else None,
            top_p=float(top_p) if isinstance(top_p, (int, float)) else None,
            stop=tuple(stops),
        ),
        bool(body.get("stream")),
        body.get("model") if isinstance(body.get("model"), str) else None,
    )


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


def response(session: str, plan: Plan, reply: Reply, *, model: str) -> dict[str, Any]:
    """The ``message`` object of a call's reply."""
    return {
        "id": f"msg_{reply.call}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _content(reply),
        "stop_reason": _stop(reply),
        "stop_sequence": reply.stop,
        "usage": {"input_tokens": len(plan.prompt_ids), "output_tokens": len(reply.result.token_ids)},
        "tmpl": {"session": session, "call": reply.call, "sequence": reply.sequence, "prompt": plan.mode},
    }


def events(session: str, plan: Plan, reply: Reply, *, model: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(event, data)`` pairs of a streamed message, in the order the Messages API sends them."""
    head = response(session, plan, reply, model=model)
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
