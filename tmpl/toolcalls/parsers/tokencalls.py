"""The clean case of ``OPEN {json} CLOSE`` formats, read straight from the token IDs.

Most completions a tool-calling model writes have one shape: some content, then calls each
written as ``<tool_call>`` + one JSON object ``{"name": ..., "arguments": {...}}`` +
``</tool_call>``, then the turn's end token. Where the open and close tags are single added
tokens and the tokenizer decodes from a byte table (:mod:`..bytedecode`), such a completion
is read here from its IDs: the tag tokens are found in the IDs, only the runs between them are
decoded, each body is read by one strict JSON decode. No marker text is built and no regular
expression runs (measured on benchmarks/rollout_scale.py: see CHANGELOG.md).

The result is exactly what :meth:`ToolParser.parse` returns for the same IDs (content, calls,
their raw text and token spans, coerced arguments, repairs). Anything outside the clean shape
returns None and the general parser reads the completion: a tag inside a body, an unclosed
call, a special token that is not the turn's end, reasoning tags, private-use characters,
a body that is not exactly one JSON object with a tool name, arguments that are not an object
(or absent). tests/test_toolcalls_tokencalls.py checks the two
agree on generated completions of every tokenizer that has such a parser.

>>> reader = TokenDelimitedCalls.for_parser(parser, "<tool_call>", "</tool_call>")  # doctest: +SKIP
>>> reader.parse(codec.encode('<tool_call>{"name": "f", "arguments": {}}</tool_call>'), None)  # doctest: +SKIP
ParsedCompletion(content='', reasoning=None, tool_calls=(ToolCall(id=..., name='f', ...),), ...)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ... import _compat
from ..arguments import coerce_arguments
from ..bytedecode import decode_run
from ..tokentext import _PRIVATE
from ..types import ParsedCompletion, ToolCall, new_call_id
from .base import NAME_RE, ToolParser, _params
from .jsoncalls import ARGUMENT_KEYS

_DECODER = json.JSONDecoder()
_WS = " \t\r\n"


class TokenDelimitedCalls:
    """Reads clean completions of one parser whose open and close tags are single tokens."""

    __slots__ = ("parser", "table", "open_id", "close_id", "stop_ids", "think_texts", "open_text", "close_text")

    def __init__(self, parser: ToolParser, open_id: int, close_id: int) -> None:
        table = parser.table
        self.parser = parser
        self.table = table
        self.open_id, self.close_id = open_id, close_id
        #: special tokens that are not the format's delimiters (turn ends): dropped from content
        self.stop_ids = frozenset(table.id_of[c] for c in parser.stops)
        #: reasoning tags that are text for this tokenizer: a completion holding one is not clean
        self.think_texts = tuple(t for t in (parser.think or ()) if t and not table.is_token(t))
        self.open_text, self.close_text = table.text_of[open_id], table.text_of[close_id]

    @classmethod
    def for_parser(cls, parser: ToolParser, open_tag: str, close_tag: str) -> TokenDelimitedCalls | None:
        """A reader for ``parser``, or None where its tags are not single tokens or no byte table."""
        table = parser.table
        open_id, close_id = table.codec.added_by_text.get(open_tag), table.codec.added_by_text.get(close_tag)
        if table.bytes is None or open_id is None or close_id is None or open_id == close_id:
            return None
        if open_id not in table.delimiter_ids or close_id not in table.delimiter_ids:
            return None
        return cls(parser, open_id, close_id)

    def parse(self, completion_ids: Sequence[int], tools: Any) -> ParsedCompletion | None:
        """The parsed completion, or None when it is not of the clean shape."""
        ids = list(map(int, completion_ids))
        table, opener, closer, stops = self.table, self.open_id, self.close_id, self.stop_ids
        content: list[str] = []
        bodies: list[tuple[int, int, str]] = []  # (open position, close position, body text)
        prev, open_at = 0, -1
        for p in _compat.ids.positions_of(ids, table.ids):
            tid = ids[p]
            if tid == closer:
                if open_at < 0:
                    return None
                body = self._text(ids, open_at + 1, p)
                if body is None:
                    return None
                bodies.append((open_at, p, body))
                open_at = -1
            elif open_at >= 0 or (tid != opener and tid not in stops):
                return None  # a marker inside a call, or a special / delimiter this reader leaves alone
            else:
                text = self._text(ids, prev, p)
                if text is None:
                    return None
                content.append(text)
                if tid == opener:
                    open_at = p
            prev = p + 1
        if open_at >= 0:
            return None
        text = self._text(ids, prev, len(ids))
        if text is None:
            return None
        content.append(text)
        params = _params(tools)
        calls = []
        for start, end, body in bodies:
            call = self._call(body, params, (start, end + 1))
            if call is None:
                return None
            calls.append(call)
        parser = self.parser
        found = tuple(calls)
        return ParsedCompletion(
            content="".join(content).strip(),
            reasoning=None,
            tool_calls=found,
            errors=(),
            parser=parser.name,
            reasoning_key=parser.reasoning_key,
            items=found,
        )

    def _text(self, ids: list[int], start: int, end: int) -> str | None:
        """The decoded run ``ids[start:end]``; None when it is not clean (see the module docstring)."""
        if start >= end:
            return ""
        text = decode_run(self.table.bytes, ids[start:end])  # type: ignore[arg-type]
        if text is None or _PRIVATE.search(text) is not None:
            return None
        for tag in self.think_texts:
            if tag in text:
                return None
        return text

    def _call(
        self, body: str, params: Mapping[str, Mapping[str, Any]] | None, span: tuple[int, int]
    ) -> ToolCall | None:
        """One clean call's ToolCall, built as :meth:`ToolParser.build` builds it; else None."""
        i = len(body) - len(body.lstrip(_WS))
        if not body.startswith("{", i):
            return None
        try:
            value, j = _DECODER.raw_decode(body, i)
        except (ValueError, RecursionError):
            return None
        if body[j:].strip(_WS) or not isinstance(value, dict) or "function" in value:
            return None
        name = value.get("name")
        if not isinstance(name, str):
            return None
        name = name.strip()
        if not name or not NAME_RE.match(name):
            return None
        args = None
        for key in ARGUMENT_KEYS:
            if key in value:
                args = value[key]
                break
        if args is None:
            arguments, repairs = {}, ["no arguments"]
        elif isinstance(args, dict):
            arguments, repairs = dict(args), []
        else:
            return None
        schema = params.get(name) if params else None
        if schema is not None:
            arguments, coerced = coerce_arguments(arguments, schema, text_values=False)
            repairs += coerced
        cid = value.get("id")
        cid = cid.strip() if isinstance(cid, str) else None  # the model's own id, when it wrote one
        return ToolCall(
            id=cid or new_call_id(),
            name=name,
            arguments=arguments,
            raw=self.open_text + body + self.close_text,
            token_span=span,
            repairs=tuple(repairs),
            id_generated=not cid,
        )
