"""Learning a template's tool-call syntax from its own renders, then verifying it.

The probe renders of :mod:`tmpl.toolcalls.detect` put known names, argument values and ids
into the assistant turn. Here the completion text of a two-call render is searched for the
JSON values holding those calls; the keys whose values are the known name, arguments and id
become the syntax's key paths, and the text around and between the calls gives the markers of
the block and of each call (a list of calls, or objects one after another). The learned syntax
is used only after it reads back renders it was not learned from: other tool names, one to
three calls, hard argument values (quotes, newlines, braces, unicode, nesting).

>>> syntax, why = learn_syntax(tpl.renderer, tpl.codec)     # doctest: +SKIP
>>> syntax.describe()                                       # doctest: +SKIP
'JSON list in <calls> ... </calls> (name at tool, arguments at params, id at id)'
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..errors import TmplError
from ..render import Renderer
from ..sentinels import (
    CONTENT_SENTINEL,
    DETECT_ID_SEED,
    DETECT_TOOLS,
    assistant_calling,
    assistant_reply,
    call_id,
    probe_calls,
    user_turn,
)
from ..tokenize import Codec
from .parsers.learned import CallSyntax, KeyPath, LearnedParser
from .probing import completion_ids

_DECODER = json.JSONDecoder()

#: Tools and calls of the verification renders (names and values the inference never saw).
VERIFY_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": n,
            "description": "Verification tool.",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    for n in ("get_weather", "search_docs_v2", "send-mail")
]
VERIFY_CALLS: list[list[dict[str, Any]]] = [
    [
        {
            "name": "get_weather",
            "arguments": {"city": 'Par"is\n{x}', "units": ["c", "f"], "deep": {"a": None, "b": True}},
        }
    ],
    [
        {"name": "search_docs_v2", "arguments": {"q": "naïve — 東京 \\ 'x'", "k": 3.5}},
        {"name": "send-mail", "arguments": {"to": "a@b.c", "body": "</end> ] } ,"}},
    ],
    [
        {"name": "send-mail", "arguments": {}},
        {"name": "get_weather", "arguments": {"city": "Oslo", "n": -2}},
        {"name": "search_docs_v2", "arguments": {"q": "[1, 2]", "flags": [False, 0, ""]}},
    ],
]


def _render_calls(
    renderer: Renderer, codec: Codec, calls: list[dict[str, Any]], tools: Any, as_text: bool, id_seed: int = 9
) -> str:
    """The completion text of an assistant turn making ``calls`` (call ids from ``id_seed``)."""
    assistant = assistant_calling(calls, id_seed=id_seed, as_text=as_text)
    return codec.decode(completion_ids(renderer, codec, [user_turn()], assistant, tools))


def _json_values(text: str, needles: list[str]) -> list[tuple[int, int, Any]]:
    """Outermost JSON values in ``text`` whose text contains one of ``needles``, in order."""
    out, i = [], 0
    while i < len(text):
        if text[i] in "{[":
            try:
                value, j = _DECODER.raw_decode(text, i)
            except ValueError:
                i += 1
                continue
            if any(n in text[i:j] for n in needles):
                out.append((i, j, value))
                i = j
                continue
        i += 1
    return out


def _find_key(obj: Any, want: Any, depth: int = 2) -> KeyPath | None:
    """Key path (at most ``depth`` deep) whose value is ``want`` (or ``want`` as JSON text)."""
    if not isinstance(obj, Mapping):
        return None
    for key, value in obj.items():
        if value == want and type(value) is type(want):
            return (key,)
        if isinstance(value, str) and not isinstance(want, str):
            try:
                if json.loads(value) == want:
                    return (key,)
            except ValueError:
                pass
    if depth > 1:
        for key, value in obj.items():
            sub = _find_key(value, want, depth - 1)
            if sub is not None:
                return (key, *sub)
    return None


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def infer_syntax(
    text: str,
    calls: list[dict[str, Any]],
    ids: list[str],
    turn_end: str,
    lead: str = "",
    specials: tuple[str, ...] = (),
) -> tuple[CallSyntax | None, str]:
    """The call syntax of a completion ``text`` rendering ``calls`` (1 or 2) with ``ids``; (None, why) if none.

    ``turn_end`` / ``lead`` are what the template writes after / before a plain message's
    content: they belong to the turn, not to the call syntax, and so do the ``specials`` (special
    token texts) that follow the calls.
    """
    end_mark = turn_end.strip()
    if end_mark and end_mark in text:
        text = text[: text.rfind(end_mark)]
    values = _json_values(text, [c["name"] for c in calls])
    objects: list[tuple[int, int, Any]] = []
    shape = "objects"
    if len(values) == 1 and isinstance(values[0][2], list):
        shape, objects = "list", [(values[0][0], values[0][1], v) for v in values[0][2]]
    elif len(values) == len(calls) and all(isinstance(v[2], Mapping) for v in values):
        objects = values
    else:
        return None, f"the calls are not {len(calls)} JSON objects or one JSON list ({len(values)} JSON values found)"
    if len(objects) != len(calls):
        return None, f"the JSON list holds {len(objects)} items for {len(calls)} calls"
    first = objects[0][2]
    name_key = _find_key(first, calls[0]["name"])
    args_key = _find_key(first, calls[0]["arguments"])
    id_key = _find_key(first, ids[0])
    if name_key is None or args_key is None:
        return None, "no key of the call object holds the rendered name and arguments"
    for (_, _, obj), call, cid in zip(objects[1:], calls[1:], ids[1:]):
        if _find_key(obj, call["name"]) != name_key or _find_key(obj, call["arguments"]) != args_key:
            return None, "the calls do not use the same keys"
        if id_key is not None and _find_key(obj, cid) != id_key:
            id_key = None
    before, after = text[: values[0][0]], text[values[-1][1] :].strip()
    before = before[len(_common_prefix(before, lead)) :].strip()
    call_open = call_close = ""
    if shape == "objects" and len(values) > 1:
        between = text[values[0][1] : values[1][0]].strip()
        if between.strip(",;"):
            call_close = _common_prefix(between, after)
            call_open = _common_prefix(between[::-1], before[::-1])[::-1]
            if len(call_close) + len(call_open) > len(between):
                return None, f"the text between two calls ({between!r}) does not split into a close and an open"
            middle = between[len(call_close) : len(between) - len(call_open)].strip()
            if middle.strip(",;"):
                return None, f"the text between two calls ({between!r}) is not a separator"
    # a block marker is one line: what precedes it on earlier lines is the turn's, not the syntax's
    block_open = before[: len(before) - len(call_open)].strip().rsplit("\n", 1)[-1].strip()
    block_close = after[len(call_close) :].strip().split("\n", 1)[0].strip()
    cut = min((block_close.find(t) for t in specials if t and t in block_close), default=-1)
    if cut >= 0:
        block_close = block_close[:cut].strip()
    syntax = CallSyntax(
        block_open, block_close, call_open.strip(), call_close.strip(), shape, name_key, args_key, id_key
    )
    return syntax, syntax.describe()


def _turn_frame(renderer: Renderer, codec: Codec) -> tuple[str, str]:
    """(lead, turn end): what the template writes before and after a plain assistant message's content."""

    try:
        text = codec.decode(completion_ids(renderer, codec, [user_turn()], assistant_reply(CONTENT_SENTINEL), None))
    except TmplError:
        return "", ""
    if CONTENT_SENTINEL not in text:
        return "", ""
    lead, end = text.split(CONTENT_SENTINEL, 1)
    return lead, end


def verify(parser: LearnedParser, renderer: Renderer, codec: Codec, as_text: bool) -> str | None:
    """None when ``parser`` reads back every verification render exactly; else why not.

    A render the template refuses (more calls than it accepts) or writes only in part (fewer
    calls than given) is skipped; the one-call render must be read back.
    """
    checked = 0
    for calls in VERIFY_CALLS:
        try:
            text = _render_calls(renderer, codec, calls, VERIFY_TOOLS, as_text)
        except TmplError as exc:
            if len(calls) == 1:
                return f"one call does not render ({exc})"
            continue
        if not all(c["name"] in text for c in calls):
            continue
        parsed = parser.parse(codec.encode(text))
        got = [(c.name, c.arguments) for c in parsed.tool_calls]
        want = [(c["name"], c["arguments"]) for c in calls]
        if parsed.errors or got != want:
            why = parsed.errors[0].message if parsed.errors else f"read {got!r}"
            return f"the render of {len(calls)} verification call(s) does not read back ({why})"
        checked += 1
    return None if checked else "no verification render could be made"


def learn_syntax(
    renderer: Renderer, codec: Codec, think: tuple[str, str] | None = None
) -> tuple[LearnedParser | None, str]:
    """(verified learned parser, description) for a template, or (None, why none was learned)."""

    lead, turn_end = _turn_frame(renderer, codec)
    specials = tuple(codec.decode([t]) for t in codec.special_ids)
    reasons = []
    for k, as_text in ((2, False), (2, True), (1, False), (1, True)):
        calls = probe_calls(k)
        ids = [call_id(DETECT_ID_SEED, i) for i in range(k)]
        try:
            text = _render_calls(renderer, codec, calls, DETECT_TOOLS, as_text, id_seed=DETECT_ID_SEED)
        except TmplError as exc:
            reasons.append(f"{k} probe call(s) do not render ({exc})")
            continue
        syntax, why = infer_syntax(text, calls, ids, turn_end, lead, specials)
        if syntax is None:
            reasons.append(why)
            continue
        parser = LearnedParser(codec, think, syntax=syntax)
        failed = verify(parser, renderer, codec, as_text)
        if failed is None:
            return parser, why
        reasons.append(f"learned {why}, but {failed}")
    return None, "; ".join(dict.fromkeys(reasons))
