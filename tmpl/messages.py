"""Validation of chat messages, with errors that name the message at fault.

>>> validate_messages([{"role": "user", "content": "hi"}])
>>> validate_messages([{"role": "robot", "content": "hi"}])
Traceback (most recent call last):
...
tmpl.errors.UnknownRoleError: messages[0]: unknown role 'robot' (expected one of: assistant, developer, function, ipython, system, tool, user)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .errors import MessageError, MissingContentError, ToolMessageCountError, UnknownRoleError

Message = Mapping[str, Any]

#: Roles tmpl accepts. ``ipython`` (Llama) and ``function`` (legacy OpenAI) are tool-result roles.
KNOWN_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "ipython", "function"})
TOOL_ROLES = frozenset({"tool", "ipython", "function"})


def _check_one(index: int, message: Any, where: str) -> None:
    if not isinstance(message, Mapping):
        raise MessageError(index, f"a message must be a dict, got {type(message).__name__}", where=where)
    role = message.get("role")
    if not isinstance(role, str):
        raise UnknownRoleError(index, f"missing or non-string 'role' ({role!r})", where=where)
    if role not in KNOWN_ROLES:
        raise UnknownRoleError(
            index, f"unknown role {role!r} (expected one of: {', '.join(sorted(KNOWN_ROLES))})", where=where
        )
    has_calls = bool(message.get("tool_calls"))
    if "content" not in message or (message["content"] is None and not has_calls):
        if role == "assistant" and has_calls:
            return
        raise MissingContentError(index, f"{role} message has no 'content'", where=where)
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            raise MessageError(index, f"only assistant messages carry 'tool_calls', not {role}", where=where)
        if not isinstance(calls, Sequence) or isinstance(calls, (str, bytes)):
            raise MessageError(index, "'tool_calls' must be a list", where=where)
        for j, call in enumerate(calls):
            fn = call.get("function", call) if isinstance(call, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                raise MessageError(index, f"tool_calls[{j}] has no function name", where=where)


def validate_messages(messages: Sequence[Message], *, where: str = "messages") -> None:
    """Check roles, contents and that each assistant turn with N tool calls is answered by N tool messages.

    Tool messages may be missing at the end (the conversation stops right after the calls);
    fewer or more tool messages than calls before the next non-tool message is an error.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise MessageError(0, f"{where} must be a list of dicts, got {type(messages).__name__}", where=where)
    if not messages:
        raise MessageError(0, "the conversation is empty", where=where)
    for i, message in enumerate(messages):
        _check_one(i, message, where)
    i, n = 0, len(messages)
    while i < n:
        calls = messages[i].get("tool_calls") if messages[i]["role"] == "assistant" else None
        if calls:
            j = i + 1
            while j < n and messages[j]["role"] in TOOL_ROLES:
                j += 1
            answered = j - i - 1
            if j < n or answered:  # complete turns must answer every call
                if answered != len(calls):
                    raise ToolMessageCountError(
                        i,
                        f"assistant message makes {len(calls)} tool call(s) but {answered} tool message(s) follow it",
                        where=where,
                    )
            i = j
        else:
            i += 1


def validate_tool_messages(tool_messages: Sequence[Message], *, where: str = "tool_messages") -> None:
    """Check a list of tool-result messages (the input of ``suffix_ids``)."""
    if isinstance(tool_messages, (str, bytes)) or not isinstance(tool_messages, Sequence):
        raise MessageError(0, f"{where} must be a list of dicts", where=where)
    if not tool_messages:
        raise MessageError(0, "no tool messages: a suffix needs at least one tool result", where=where)
    for i, message in enumerate(tool_messages):
        _check_one(i, message, where)
        if message["role"] not in TOOL_ROLES:
            raise MessageError(i, f"expected a tool-result message, got role {message['role']!r}", where=where)
