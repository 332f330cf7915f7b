"""Messages as the gateway holds and compares them: one shape, whatever dialect a client speaks.

Every dialect (:mod:`tmpl.gateway.dialects`) turns a request into canonical messages, the shape
tmpl's templates render: ``{"role", "content": str, ...}``; an assistant turn's calls as
``tool_calls=[{"id", "type": "function", "function": {"name", "arguments": dict}}]`` and its
reasoning as ``reasoning_content``; a tool result as ``{"role": "tool", "tool_call_id", "content"}``.

:func:`reply_difference` says whether a client's copy of an assistant turn is the reply the gateway
returned, forgiving what clients rewrite on the way back: white space around the content, ``None``
for ``""``, JSON arguments re-serialized, call ids renamed.

>>> ours = {"role": "assistant", "content": "", "tool_calls": [tool_call("a1", "f", {"x": 1})]}
>>> theirs = {"role": "assistant", "content": None,
...           "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}}]}
>>> reply_difference(canonical_message(theirs, 0), ours) is None
True
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import GatewayRequestError
from .vision import BLOCK, image_part

__all__ = [
    "REASONING_KEYS",
    "ROLES",
    "canonical_message",
    "canonical_tools",
    "reply_difference",
    "tool_call",
]

#: The roles a request may hold (``developer`` is rendered as the templates render it, most as ``system``).
ROLES = ("system", "developer", "user", "assistant", "tool")
#: Fields clients use for an assistant turn's reasoning; the gateway keeps ``reasoning_content``.
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


def tool_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """One call in the canonical shape (arguments as a dict where they are a JSON object).

    >>> tool_call("a1", "f", '{"x": 1}')["function"]["arguments"]
    {'x': 1}
    """
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": _arguments(arguments)}}


def _arguments(value: Any) -> Any:
    """Arguments as a dict when they are (or spell) a JSON object; any other string is kept as written."""
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        return parsed if isinstance(parsed, dict) else value
    if value is None:
        return {}
    return value


def _text(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A message content as text: a string, or a list of text parts joined; a list holding images
    (``image_url`` parts with a data: URL, or parts already canonical) as its parts in order instead."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        out: list[dict[str, Any]] = []
        for k, part in enumerate(content):
            if isinstance(part, str):
                out.append({"type": "text", "text": part})
                continue
            if not isinstance(part, Mapping):
                raise GatewayRequestError(None, f"{where}.content[{k}] must be an object", param=f"{where}.content")
            kind = part.get("type")
            if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
                out.append({"type": "text", "text": part["text"]})
            elif kind == "image_url":
                url = part.get("image_url")
                out.append(image_part(url.get("url") if isinstance(url, Mapping) else url, f"{where}.content[{k}]"))
            elif kind == "image" and BLOCK in part:  # mapped by a dialect already
                out.append(dict(part))
            else:
                raise GatewayRequestError(
                    None,
                    f"{where}.content[{k}]: content parts of type {kind!r} are not served by the gateway "
                    "(text, and images on a vision template)",
                    param=f"{where}.content",
                )
        if all(p["type"] == "text" for p in out):
            return "".join(p["text"] for p in out)
        return out
    raise GatewayRequestError(None, f"{where}.content must be a string or a list of parts", param=f"{where}.content")


def canonical_message(message: Any, index: int) -> dict[str, Any]:
    """One request message (OpenAI chat shape) in the canonical shape; GatewayRequestError names the field.

    >>> canonical_message({"role": "user", "content": [{"type": "text", "text": "hi"}]}, 0)
    {'role': 'user', 'content': 'hi'}
    """
    where = f"messages[{index}]"
    if not isinstance(message, Mapping):
        raise GatewayRequestError(None, f"{where} must be an object", param="messages")
    role = message.get("role")
    if role not in ROLES:
        raise GatewayRequestError(None, f"{where}.role must be one of {', '.join(ROLES)}; got {role!r}", param=where)
    out: dict[str, Any] = {"role": role, "content": _text(message.get("content"), where)}
    if isinstance(out["content"], list) and role not in ("user", "tool"):
        raise GatewayRequestError(
            None, f"{where}: images are read in user and tool messages only, not in a {role} message", param=where
        )
    if role == "assistant":
        for key in REASONING_KEYS:
            value = message.get(key)
            if isinstance(value, str) and value:
                out["reasoning_content"] = value
                break
        calls = message.get("tool_calls")
        if calls:
            if not isinstance(calls, Sequence) or isinstance(calls, (str, bytes)):
                raise GatewayRequestError(None, f"{where}.tool_calls must be a list", param=f"{where}.tool_calls")
            out["tool_calls"] = [_canonical_call(c, f"{where}.tool_calls[{k}]") for k, c in enumerate(calls)]
    elif role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise GatewayRequestError(None, f"{where}.tool_call_id is required for a tool message", param=where)
        out["tool_call_id"] = call_id
        if isinstance(message.get("name"), str):
            out["name"] = message["name"]
    return out


def _canonical_call(call: Any, where: str) -> dict[str, Any]:
    if not isinstance(call, Mapping):
        raise GatewayRequestError(None, f"{where} must be an object", param=where)
    fn = call.get("function")
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise GatewayRequestError(None, f"{where}.function.name is required", param=where)
    return tool_call(str(call.get("id") or ""), fn["name"], fn.get("arguments"))


def canonical_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Tools in the OpenAI function shape the templates render (each function object as the client sent
    it: a template renders its every field, ``strict`` included), or None for none.

    >>> canonical_tools([{"type": "function", "function": {"name": "f", "parameters": {}}}])[0]["function"]["name"]
    'f'
    """
    if tools is None or tools == []:
        return None
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
        raise GatewayRequestError(None, "tools must be a list", param="tools")
    out = []
    for k, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise GatewayRequestError(None, f"tools[{k}]: a function tool with a name is required", param="tools")
        out.append({"type": "function", "function": dict(fn)})  # as sent: the template renders every field
    return out


def _same_calls(theirs: Any, ours: Any) -> bool:
    """The same calls in order: names equal, arguments equal as JSON values (ids not compared)."""
    theirs, ours = theirs or (), ours or ()
    if len(theirs) != len(ours):
        return False
    for a, b in zip(theirs, ours):
        fa, fb = a.get("function", {}), b.get("function", {})
        if fa.get("name") != fb.get("name") or fa.get("arguments") != fb.get("arguments"):
            return False
    return True


def reply_difference(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> str | None:
    """The first field in which a client's assistant message differs from the reply the gateway returned,
    or None when it is that reply (content compared without surrounding white space, arguments as JSON
    values, call ids not compared).

    >>> reply_difference({"role": "assistant", "content": "Hi "}, {"role": "assistant", "content": "Hi"}) is None
    True
    >>> reply_difference({"role": "assistant", "content": "Hi"}, {"role": "assistant", "content": "Hi",
    ...                   "reasoning_content": "r"})
    'reasoning_content'
    """
    if theirs == ours:  # the common case: the client sent the reply back as it came (one comparison)
        return None
    if theirs.get("role") != "assistant" or ours.get("role") != "assistant":
        return "role"
    if (theirs.get("content") or "").strip() != (ours.get("content") or "").strip():
        return "content"
    if (theirs.get("reasoning_content") or "").strip() != (ours.get("reasoning_content") or "").strip():
        return "reasoning_content"
    if not _same_calls(theirs.get("tool_calls"), ours.get("tool_calls")):
        return "tool_calls"
    return None


def message_difference(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> str | None:
    """:func:`reply_difference` for assistant turns; the first differing field for any other message."""
    if theirs == ours:
        return None
    if ours.get("role") == "assistant":
        return reply_difference(theirs, ours)
    for key in ("role", "content", "tool_call_id"):
        if theirs.get(key) != ours.get(key):
            return key
    return None
