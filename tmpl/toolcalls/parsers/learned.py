"""A parser built from a :class:`CallSyntax` learned from a template's own renders.

The syntax says where a block of calls opens and closes, where each call opens and closes,
whether the block holds a JSON list or JSON objects one after another, and the key paths of the
name, the arguments and the id inside a call object (``("function", "name")`` for the OpenAI
shape, ``("tool",)`` for a template of its own). :mod:`tmpl.toolcalls.learn` infers it.

>>> syntax = CallSyntax("<calls>", "</calls>", "", "", "list", ("tool",), ("params",), ("id",))
>>> LearnedParser(codec, syntax=syntax).parse(ids).tool_calls[0].name   # doctest: +SKIP
'get_weather'
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...tokenize import Codec
from ..tokentext import TokenText
from .base import TRUNCATED, RawCall, ToolParser, blocks, json_objects

KeyPath = tuple[str, ...]


@dataclass(frozen=True)
class CallSyntax:
    """How one template writes tool calls (markers are stripped texts; empty means none)."""

    block_open: str
    block_close: str
    call_open: str
    call_close: str
    shape: str  # "list": one JSON list of call objects; "objects": call objects one after another
    name_key: KeyPath
    arguments_key: KeyPath
    id_key: KeyPath | None = None

    def describe(self) -> str:
        """The syntax in words (shown by reports)."""
        keys = f"name at {'.'.join(self.name_key)}, arguments at {'.'.join(self.arguments_key)}"
        if self.id_key:
            keys += f", id at {'.'.join(self.id_key)}"
        wrap = " ... ".join(x for x in (self.block_open + self.call_open, self.call_close + self.block_close) if x)
        return f"JSON {'list' if self.shape == 'list' else 'objects'} in {wrap or 'no markers'} ({keys})"


def get_path(obj: Any, path: KeyPath) -> Any:
    """The value at ``path`` inside nested mappings, or None."""
    for key in path:
        if not isinstance(obj, Mapping) or key not in obj:
            return None
        obj = obj[key]
    return obj


class LearnedParser(ToolParser):
    """Tool calls in a syntax learned from the template (see :class:`CallSyntax`)."""

    name = "learned"
    description = "call syntax learned from the template's own renders"

    def __init__(self, codec: Codec, think: tuple[str, str] | None = None, *, syntax: CallSyntax) -> None:
        self.syntax = syntax
        self._added = sorted(codec.added_by_text, key=len, reverse=True)
        self.delimiters = tuple(
            t
            for m in (syntax.block_open, syntax.block_close, syntax.call_open, syntax.call_close)
            for t in self._added
            if t and t in m
        )
        super().__init__(codec, think)

    def marker(self, text: str) -> re.Pattern | None:
        """Regex of a learned marker: its added tokens as markers, whitespace flexible; None if empty."""
        if not text:
            return None
        parts: list[str] = []
        i = 0
        while i < len(text):
            tok = next((t for t in self._added if t and text.startswith(t, i)), None)
            if tok is not None:
                parts.append(self.p(tok))
                i += len(tok)
            elif text[i].isspace():
                while i < len(text) and text[i].isspace():
                    i += 1
                parts.append(r"\s*")
            else:
                parts.append(re.escape(text[i]))
                i += 1
        return re.compile("".join(parts))

    def compile(self) -> None:
        s = self.syntax
        self._bo, self._bc = self.marker(s.block_open), self.marker(s.block_close)
        self._co, self._cc = self.marker(s.call_open), self.marker(s.call_close)

    # -- locating ----------------------------------------------------------------------
    def _spans(
        self, text: str, open_re: re.Pattern | None, close_re: re.Pattern | None, start: int, end: int
    ) -> list[tuple[int, int, int, int, str | None]]:
        """(start, body_start, body_end, end, error) of each marked span in ``text[start:end]``."""
        if open_re is None:
            return [(start, start, end, end, None)]
        if close_re is None:  # no close marker: the body runs to the turn end or the next open
            out = []
            for m in open_re.finditer(text, start, end):
                nxt = open_re.search(text, m.end(), end)
                limit = nxt.start() if nxt else end
                stop = next((i for i in range(m.end(), limit) if text[i] in self.stops), limit)
                out.append((m.start(), m.end(), stop, stop, None))
            return out
        return [
            (b.start, b.body_start, b.body_end, b.end, TRUNCATED if b.truncated else None)
            for b in blocks(text, open_re, close_re, start, end, self.stops)
        ]

    def find_calls(self, view: TokenText, start: int, end: int) -> list[RawCall]:
        text = view.text
        if self._bo is None and self._co is None:  # bare JSON: only when the region starts with it
            i = start
            while i < end and (text[i].isspace() or text[i] in self.stops):
                i += 1
            if i >= end or text[i] not in "[{":
                return []
            start = i
        out: list[RawCall] = []
        for a, bs, be, b, err in self._spans(text, self._bo, self._bc, start, end):
            if err is not None:
                out.append(RawCall(a, b, error=err, error_kind="truncated"))
                continue
            found = self._calls_in_block(text, bs, be)
            if found and self._bo is not None:  # a block's markers belong to its first and last calls
                found[0].start, found[-1].end = a, b
            elif self._bo is not None:
                out.append(RawCall(a, b, error="a call block with no readable call", error_kind="malformed"))
            out.extend(found)
        for k in range(1, len(out)):
            if out[k - 1].end <= out[k].start:
                out[k].start = out[k - 1].end
        return out

    def _calls_in_block(self, text: str, start: int, end: int) -> list[RawCall]:
        if self._co is not None:
            out = []
            for a, bs, be, b, err in self._spans(text, self._co, self._cc, start, end):
                calls = [RawCall(a, b, error=err, error_kind="truncated")] if err else self._json_calls(text, bs, be)
                if calls:
                    calls[0].start, calls[-1].end = a, b
                out.extend(calls)
            return out
        return self._json_calls(text, start, end)

    def _json_calls(self, text: str, start: int, end: int) -> list[RawCall]:
        out: list[RawCall] = []
        for v in json_objects(text, start, end):
            if v.error is not None:
                if text[v.start : v.end].strip() and not all(c in self.stops for c in text[v.start : v.end].strip()):
                    out.append(RawCall(v.start, v.end, error=f"not a JSON call ({v.error})", error_kind="bad_json"))
                break
            items = v.value if isinstance(v.value, list) else [v.value]
            for obj in items:
                out.append(self._call(obj, v.start, v.end, v.lenient))
        return out

    def _call(self, obj: Any, start: int, end: int, lenient: bool) -> RawCall:
        s = self.syntax
        if not isinstance(obj, Mapping):
            return RawCall(start, end, error=f"expected a call object, got {type(obj).__name__}")
        name = get_path(obj, s.name_key)
        args = get_path(obj, s.arguments_key)
        cid = get_path(obj, s.id_key) if s.id_key else None
        if not isinstance(name, str) or not name.strip():
            return RawCall(
                start, end, error=f"the call object has no {'.'.join(s.name_key)!r}", error_kind="missing_name"
            )
        repairs = ["python literal"] if lenient else []
        return RawCall(start, end, name=name, arguments=args, id=cid if isinstance(cid, str) else None, repairs=repairs)
