"""Calls written as JSON objects ``{"name": ..., "arguments": ...}`` (alone, glued, or in a list).

Shared by the formats whose call bodies are JSON: Hermes/Qwen ``<tool_call>``, Mistral's list,
Llama's bare JSON, the ``<tool_calls>[...]`` family.

>>> text = '{"name": "a", "arguments": {"x": 1}}; {"name": "b"}'
>>> [(c.name, c.arguments) for c in calls_in_json(text, 0, len(text))]
[('a', {'x': 1}), ('b', None)]
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..tokentext import _PRIVATE
from .base import RawCall, json_objects

_DECODER = json.JSONDecoder()
ARGUMENT_KEYS = ("arguments", "parameters", "args", "input")


def call_fields(obj: Any) -> tuple[str | None, Any, str | None, str | None]:
    """(name, arguments, id, error) of one JSON call object.

    Accepts ``{"name", "arguments"|"parameters"|"args"|"input", "id"?}`` and the OpenAI shape
    ``{"id"?, "type": "function", "function": {"name", "arguments"}}``.
    """
    if not isinstance(obj, Mapping):
        kind = "a list" if isinstance(obj, list) else type(obj).__name__
        return None, None, None, f"expected a call object with a name and arguments, got {kind}"
    fn = obj.get("function")
    src = fn if isinstance(fn, Mapping) else obj
    name = src.get("name")
    if name is None and isinstance(fn, str):
        name = fn
    args = None
    for key in ARGUMENT_KEYS:
        if key in src:
            args = src[key]
            break
    cid = obj.get("id") if isinstance(obj.get("id"), str) else None
    if not isinstance(name, str) or not name.strip():
        return None, args, cid, "the call object has no 'name'"
    return name, args, cid, None


def _array_items(text: str, i: int, end: int) -> list[tuple[int, int, Any]] | None:
    """Items of the JSON array at ``text[i]`` with their spans, or None when it is not one."""
    if i >= end or text[i] != "[":
        return None
    items: list[tuple[int, int, Any]] = []
    j = i + 1
    while True:
        while j < end and text[j] in " \t\r\n":
            j += 1
        if j < end and text[j] == "]" and not items:
            return items
        found = json_objects(text, j, end)
        if not found or found[0].error is not None:
            return None
        s, e, value = found[0].start, found[0].end, found[0].value
        items.append((s, e, value))
        j = e
        while j < end and text[j] in " \t\r\n":
            j += 1
        if j < end and text[j] == ",":
            j += 1
            continue
        if j < end and text[j] == "]":
            return items
        return None


def _only_markers(text: str) -> bool:
    return not _PRIVATE.sub("", text).strip()


def calls_in_json(text: str, start: int, end: int, *, at_end: bool = False) -> list[RawCall]:
    """Calls written as JSON in ``text[start:end]``: objects, lists of objects, glued together.

    What follows the last readable value is ignored when it is only whitespace and markers,
    reported as a repair (``trailing text``) after a readable call, and an error otherwise.
    ``at_end`` says the span runs to the end of the completion (an unreadable tail is then
    ``truncated``).
    """
    out: list[RawCall] = []
    for s, e, value, error, lenient in json_objects(text, start, end):
        if error is not None:
            tail = text[s:e]
            if _only_markers(tail):
                break
            if out and not tail.lstrip().startswith(("{", "[")):
                out[-1].repairs.append("trailing text")
                out[-1].end = max(out[-1].end, s)
                break
            out.append(
                RawCall(s, e, error=f"not a JSON call ({error})", error_kind="truncated" if at_end else "bad_json")
            )
            break
        items = _array_items(text, s, e) if isinstance(value, list) else None
        if isinstance(value, list) and items is None:
            items = [(s, e, v) for v in value]
        if items:  # the list's brackets belong to its first and last calls
            items[0] = (s, *items[0][1:])
            items[-1] = (items[-1][0], e, items[-1][2])
        for a, b, obj in items if items is not None else [(s, e, value)]:
            name, args, cid, err = call_fields(obj)
            if err is not None:
                kind = "missing_name" if isinstance(obj, Mapping) else "malformed"
                out.append(RawCall(a, b, name=name, error=err, error_kind=kind))
            else:
                repairs = ["python literal"] if lenient else []
                if isinstance(args, str):
                    repairs.append("json in a string")
                out.append(RawCall(a, b, name=name, arguments=args, id=cid, repairs=repairs))
    for k in range(1, len(out)):  # separators (", ", ";", newlines) belong to the next call
        if out[k - 1].end <= out[k].start:
            out[k].start = out[k - 1].end
    return out
