"""The probe's vocabulary: sentinel strings, dummy tools and calls, and the sentinel conversation.

tmpl learns a template by rendering conversations made of sentinels (strings that appear nowhere
else in a render) and finding them again in the text: where a turn closes (:mod:`tmpl.suffix`),
how calls are written (:mod:`tmpl.toolcalls.detect`, :mod:`tmpl.toolcalls.learn`), whether a
template is prefix-stable (:mod:`tmpl.report`). Every such string and conversation is built here.

The values are part of the behaviour: renders are searched for them and probed frames are cached
by them, so they never change. The builders keep the key order of every message and call they
have always produced (a template that writes a message with ``tojson`` renders keys in order).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

# -- sentinel strings -----------------------------------------------------------------------------

#: Content of the probe conversation's user message (the suffix probe reads everything after it).
USER_SENTINEL = "TmPlUsErQuEsTiOn"
#: Content of the user message that follows a plain assistant turn.
NEXT_USER_SENTINEL = "TmPlUsErFoLlOwUp"
#: Content of a plain (text-only) assistant turn.
TEXT_SENTINEL = "TmPlAsSiStAnTtExT"
#: Reasoning of an assistant message (detects the message key the template renders reasoning from).
REASONING_SENTINEL = "TmPlReAsOnInG"
#: Visible content of an assistant message next to its reasoning, or of a plain turn in learning.
CONTENT_SENTINEL = "TmPlViSiBlEtExT"
#: Message keys a template may read an assistant's reasoning from, tried in this order.
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")

#: Histories a frame is re-rendered after, to find templates whose tool results depend on history.
SYSTEM_SENTINEL = "TmPlSyStEmPrOmPt"
EARLIER_USER_SENTINEL = "TmPlEaRlIeRqUeStIoN"
EARLIER_REPLY_SENTINEL = "TmPlEaRlIeRrEpLy"
PRIOR_ARG_SENTINEL = "TmPlPrIoRaRg"
PRIOR_RESULT_SENTINEL = "TmPlPrIoRrEsUlT"


def arg_sentinel(i: int) -> str:
    """Value of the dummy argument of the i-th dummy call (locates the call in a render)."""
    return f"TmPlArGvAlUe{i}q"


def arg_sentinels(k: int) -> list[str]:
    """The argument sentinels of ``k`` dummy calls: the anchors of an assistant turn with calls."""
    return [arg_sentinel(i) for i in range(k)]


def content_sentinel(i: int) -> str:
    """Content of the i-th dummy tool message."""
    return f"TmPlToOlReSuLt{i}q"


def content_sentinels(k: int) -> list[str]:
    """The contents of ``k`` dummy tool messages."""
    return [content_sentinel(i) for i in range(k)]


def call_id(variant: int, i: int) -> str:
    """A call id valid for every template seen (9 alphanumerics, as Mistral requires)."""
    return f"T{variant % 1000:03d}{i % 100:02d}Zq7"


def call_ids(variant: int, slots: int | Sequence[bool]) -> list[str | None]:
    """Call ids of one turn: ``slots`` calls that all have one, or one per True slot (None for False)."""
    if isinstance(slots, int):
        slots = [True] * slots
    return [call_id(variant, i) if has else None for i, has in enumerate(slots)]


# -- dummy tools ----------------------------------------------------------------------------------

#: Name of the suffix probe's tool (and of a dummy call whose tool message gives no name).
PROBE_TOOL_NAME = "tmpl_probe_tool"
#: The one argument of a suffix probe call; its value is a sentinel.
PROBE_ARG = "tmpl_probe"

#: Tools of the suffix probe: one tool with one optional string argument.
PROBE_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": PROBE_TOOL_NAME,
            "description": "A tool used by tmpl to probe the template.",
            "parameters": {"type": "object", "properties": {PROBE_ARG: {"type": "string"}}, "required": []},
        },
    }
]

#: Tools of the detection probe: a string and an integer argument, then a string one.
DETECT_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "tmpl_probe_lookup",
            "description": "A tool used by tmpl to recognise the call format.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query", "limit"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "tmpl_probe_note",
            "description": "A second tool used by tmpl to recognise the call format.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        },
    },
]
#: Call-id variant of the detection probe's calls (learning reads these ids back).
DETECT_ID_SEED = 7


def probe_calls(k: int) -> list[dict[str, Any]]:
    """The ``k`` (1 or 2) dummy calls the detection probe renders: what a parser must give back."""
    calls = [
        {"name": "tmpl_probe_lookup", "arguments": {"query": arg_sentinel(0), "limit": 7}},
        {"name": "tmpl_probe_note", "arguments": {"text": arg_sentinel(1)}},
    ]
    return calls[:k]


# -- the stability report's conversations ---------------------------------------------------------

#: Reasoning of the stability report's assistant turns.
REASONING = "TmPlReAsOnInG about the weather"
#: The stability report's system prompt.
SYSTEM = "TmPlSyStEm: you are a careful assistant."
#: The stability report's call argument value.
ARG_VALUE = "TmPlCiTy"

#: Tools of the stability report's conversations.
PROBE_TOOLSET: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_web",
            "description": "Search the web.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "Query"}},
                "required": ["query"],
            },
        },
    },
]

#: Tool results of the stability report's conversations (spaces, JSON, unicode, newlines).
CONTENT_POOL = (
    "Paris is sunny, 21 C.",
    'Result: {"temp": 21.5, "ok": true}',
    "  spaced out  \n",
    "Zürich — 雨 🌧",
    "line one\nline two",
)

# -- the sentinel conversation --------------------------------------------------------------------


def user_turn(content: str = USER_SENTINEL) -> dict[str, Any]:
    """A user message (by default the probe's: the sentinel that starts every probe conversation)."""
    return {"role": "user", "content": content}


def assistant_reply(content: str = TEXT_SENTINEL, reasoning_key: str | None = None) -> dict[str, Any]:
    """A plain assistant message; with ``reasoning_key``, :data:`REASONING_SENTINEL` under that key."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning_key is not None:
        message[reasoning_key] = REASONING_SENTINEL
    return message


def probe_call(value: str, name: str | None = None, call_id: str | None = None) -> dict[str, Any]:
    """A suffix probe call: ``name`` (the probe tool when empty) with :data:`PROBE_ARG` = ``value``.

    The id, when given, comes last (the key order the suffix probe has always rendered).
    """
    call: dict[str, Any] = {
        "type": "function",
        "function": {"name": name or PROBE_TOOL_NAME, "arguments": {PROBE_ARG: value}},
    }
    if call_id is not None:
        call["id"] = call_id
    return call


def wire_call(name: str, arguments: Mapping[str, Any], call_id: str, *, as_text: bool = False) -> dict[str, Any]:
    """A call in OpenAI's wire order (id, type, function); ``as_text`` gives the arguments as JSON text
    (some templates want them so)."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments) if as_text else arguments},
    }


def assistant_with_calls(calls: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """An assistant message with no content that makes ``calls``."""
    return {"role": "assistant", "content": "", "tool_calls": list(calls)}


def assistant_calling(
    calls: Sequence[Mapping[str, Any]], *, id_seed: int = DETECT_ID_SEED, as_text: bool = False
) -> dict[str, Any]:
    """An assistant message making ``calls`` (``{"name", "arguments"}``, as :func:`probe_calls` gives),
    with ids ``call_id(id_seed, i)`` (see :func:`wire_call`)."""
    return assistant_with_calls(
        [wire_call(c["name"], c["arguments"], call_id(id_seed, i), as_text=as_text) for i, c in enumerate(calls)]
    )


def tool_result(shape: Mapping[str, Any], content: Any, call_id: str | None = None) -> dict[str, Any]:
    """A tool message: ``shape``'s fields other than its content and call id, then ``call_id``
    (when given) and ``content``."""
    message = {k: v for k, v in shape.items() if k not in ("content", "tool_call_id")}
    if call_id is not None:
        message["tool_call_id"] = call_id
    message["content"] = content
    return message


def dummy_tool_turn(
    shapes: Sequence[Mapping[str, Any]],
    contents: Sequence[Any],
    ids: Sequence[str | None],
) -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    """(history, assistant, tool messages) of a sentinel tool turn.

    The history is :func:`user_turn`; ``shapes`` are the caller's tool messages (their non-slot
    fields are copied); the assistant makes one :func:`probe_call` per tool message, with the
    message's name, :func:`arg_sentinel` as its argument and the same id.
    """
    calls, results = [], []
    for i, (shape, content, cid) in enumerate(zip(shapes, contents, ids)):
        calls.append(probe_call(arg_sentinel(i), shape.get("name"), cid))
        results.append(tool_result(shape, content, cid))
    return [user_turn()], assistant_with_calls(calls), results


def sentinel_tool_turn(k: int) -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    """:func:`dummy_tool_turn` of ``k`` calls of the probe tool, with ids, answered by the content sentinels."""
    shapes = [{"role": "tool", "name": PROBE_TOOL_NAME, "tool_call_id": "x"}] * k
    return dummy_tool_turn(shapes, content_sentinels(k), call_ids(0, k))
