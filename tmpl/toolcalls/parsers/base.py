"""The parser base class: reasoning split, content assembly, arguments, ids, errors.

A format parser only says where calls are in a region of the completion
(:meth:`ToolParser.find_calls`, returning :class:`RawCall` records); the base class does the
rest the same way for every format:

1. the completion's IDs become a :class:`~tmpl.toolcalls.tokentext.TokenText` in which the
   format's delimiter tokens (and all special tokens) are single private characters;
2. reasoning (``<think>...</think>`` by default, also when the prompt opened the block) is cut
   out: calls written inside it are reasoning, never calls;
3. calls are found in what is left; everything else is content (special tokens dropped);
4. arguments are read (:mod:`~tmpl.toolcalls.arguments`), coerced to the tool's schema when the
   tools are known, and every call gets an id (the model's, or 9 generated alphanumerics).

Nothing in :meth:`ToolParser.parse` raises on model output: what cannot be read is a
:class:`~tmpl.toolcalls.types.CallProblem` in the result.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from ...tokenize import Codec
from ..arguments import coerce_arguments, read_arguments
from ..literal import LiteralError, read_literal
from ..schema import parameters_by_name
from ..tokentext import MarkerTable, TokenText
from ..types import CallProblem, ParsedCompletion, ToolCall, new_call_id

#: A tool name as models write it (``get_weather``, ``functions.lookup``, ``my-tool``).
NAME = r"[A-Za-z_][\w.\-:/]*"
NAME_RE = re.compile(NAME + r"\Z")


@dataclass
class RawCall:
    """One call located by a format parser, before its arguments are read.

    ``start``/``end`` are character positions in the TokenText (delimiters included).
    ``arguments`` is text to read, an already structured dict, or None (no arguments).
    ``text_values`` marks formats whose argument values are all text (XML parameters).
    ``error`` set means the call could not be read (``error_kind`` says how).
    """

    start: int
    end: int
    name: str | None = None
    arguments: Any = None
    id: str | None = None
    repairs: list[str] = field(default_factory=list)
    text_values: bool = False
    error: str | None = None
    error_kind: str = "malformed"


class ToolParser:
    """Base of all tool-call parsers. Subclasses set the class attributes and ``find_calls``.

    ``delimiters``: texts that delimit calls; where one is a single added token of the
    tokenizer it is matched only as that token. ``think``: the reasoning block's open and
    close (None for formats that mark reasoning otherwise); a template whose probe shows other
    delimiters passes them to the constructor (an empty open: reasoning starts the completion).
    ``signature``: added tokens that identify the format in a tokenizer's vocabulary (used when
    a template renders no call).

    >>> parser = get_parser("hermes", codec)          # doctest: +SKIP
    >>> parser.parse(completion_ids).tool_calls       # doctest: +SKIP
    (ToolCall(id='q3VxT0aZ1', name='get_weather', arguments={'city': 'Paris'}, ...),)
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    delimiters: ClassVar[tuple[str, ...]] = ()
    think: ClassVar[tuple[str, str] | None] = ("<think>", "</think>")
    signature: ClassVar[tuple[str, ...]] = ()
    reasoning_key: ClassVar[str] = "reasoning_content"

    def __init__(self, codec: Codec, think: tuple[str, str] | None = None) -> None:
        self.codec = codec
        if think is not None:  # the template's own reasoning delimiters, found by probing
            self.think = think
        self.table = MarkerTable(codec, self.delimiters + tuple(t for t in (self.think or ()) if t))
        self.p: Callable[[str], str] = self.table.pattern
        #: marker characters of special tokens that are not this format's delimiters (turn ends)
        self.stops: frozenset[str] = frozenset(
            self.table.char[t] for t in codec.special_ids if t in self.table.char and t not in self.table.delimiter_ids
        )
        if self.think is not None:
            # an empty open means the reasoning starts where the completion starts (the prompt opened it)
            self._think_open = re.compile(self.p(self.think[0]) if self.think[0] else "(?!)")
            self._think_close = re.compile(self.p(self.think[1]))
        self.compile()

    def compile(self) -> None:
        """Build the format's regular expressions with ``self.p(delimiter)`` (per tokenizer)."""

    # -- the format's job ---------------------------------------------------------------
    def find_calls(self, view: TokenText, start: int, end: int) -> list[RawCall]:
        """Calls written in ``view.text[start:end]`` (a region outside reasoning), in order."""
        raise NotImplementedError

    # -- shared machinery ---------------------------------------------------------------
    def calls_per_block(self, view: TokenText, start: int, end: int) -> list[RawCall]:
        """One call per ``self._open`` ... ``self._close`` block, read by ``self._call(text, a, b)``.

        For formats whose blocks each hold exactly one call (Qwen XML, GLM-4). A block cut off
        by the end of the completion is a ``truncated`` error; one closed by the turn end
        instead of its close tag is read, with the repair noted.
        """
        out: list[RawCall] = []
        for block in blocks(view.text, self._open, self._close, start, end, self.stops):
            if block.truncated:
                out.append(RawCall(block.start, block.end, error=TRUNCATED, error_kind="truncated"))
                continue
            call = self._call(view.text, block.body_start, block.body_end)
            call.start, call.end = block.start, block.end
            if not block.closed and call.error is None:
                call.repairs.append("missing close tag")
            out.append(call)
        return out

    def split_reasoning(self, view: TokenText) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """(reasoning spans, other regions) of the completion, as character ranges.

        A close before any open means the prompt opened the block (Qwen3.5, DeepSeek R1):
        everything before it is reasoning. An open that is never closed runs to the end.
        """
        text, n = view.text, len(view.text)
        if self.think is None:
            return [], [(0, n)]
        reasoning: list[tuple[int, int]] = []
        regions: list[tuple[int, int]] = []
        pos = 0
        first_close = self._think_close.search(text)
        first_open = self._think_open.search(text)
        if first_close and (first_open is None or first_close.start() < first_open.start()):
            reasoning.append((0, first_close.start()))
            pos = first_close.end()
        while True:
            m = self._think_open.search(text, pos)
            if m is None:
                regions.append((pos, n))
                break
            regions.append((pos, m.start()))
            c = self._think_close.search(text, m.end())
            if c is None:
                reasoning.append((m.end(), n))
                break
            reasoning.append((m.end(), c.start()))
            pos = c.end()
        return reasoning, regions

    def reasoning_text(self, view: TokenText, spans: Sequence[tuple[int, int]]) -> str | None:
        if not spans:
            return None
        return "\n".join(self.reasoning_part(view.clean(a, b)) for a, b in spans)

    def reasoning_part(self, text: str) -> str:
        """One reasoning block's text as reported (stripped)."""
        return text.strip()

    def parse(self, completion_ids: Sequence[int], *, tools: Any = None) -> ParsedCompletion:
        """Read one completion (token IDs). Never raises on what the model wrote.

        ``tools`` (schemas, callables or a Toolbox) lets arguments be coerced to the declared types.
        """
        view = TokenText(self.table, completion_ids)
        reasoning_spans, regions = self.split_reasoning(view)
        raws: list[RawCall] = []
        content_parts: list[str] = []
        for a, b in regions:
            found = self.find_calls(view, a, b)
            pos = a
            for raw in found:
                content_parts.append(view.clean(pos, raw.start))
                pos = raw.end
            content_parts.append(view.clean(pos, b))
            raws.extend(found)
        content = "".join(content_parts).strip()
        return self.finish(view, raws, content, self.reasoning_text(view, reasoning_spans), tools)

    def finish(
        self, view: TokenText, raws: Sequence[RawCall], content: str, reasoning: str | None, tools: Any
    ) -> ParsedCompletion:
        """Turn located calls into ToolCalls and CallProblems, in the order the model wrote them."""
        params = _params(tools)
        items: list[ToolCall | CallProblem] = []
        for raw in raws:
            items.append(self.build(view, raw, params))
        calls = tuple(x for x in items if isinstance(x, ToolCall))
        errors = tuple(x for x in items if isinstance(x, CallProblem))
        return ParsedCompletion(
            content=content,
            reasoning=reasoning,
            tool_calls=calls,
            errors=errors,
            parser=self.name,
            reasoning_key=self.reasoning_key,
            items=tuple(items),
        )

    def build(
        self, view: TokenText, raw: RawCall, params: Mapping[str, Mapping[str, Any]] | None
    ) -> ToolCall | CallProblem:
        span = view.token_span(raw.start, raw.end)
        text = view.raw(raw.start, raw.end)
        name = raw.name.strip() if isinstance(raw.name, str) else None
        if raw.error is not None:
            return CallProblem(raw.error_kind, raw.error, raw=text, name=name or None, token_span=span)
        if not name:
            return CallProblem("missing_name", "the call has no tool name", raw=text, token_span=span)
        if not NAME_RE.match(name):
            return CallProblem("malformed", f"{name[:40]!r} is not a tool name", raw=text, token_span=span)
        args = read_arguments(raw.arguments)
        if args.value is None:
            return CallProblem("bad_json", args.error or "unreadable arguments", raw=text, name=name, token_span=span)
        value, repairs = args.value, list(raw.repairs) + list(args.repairs)
        schema = params.get(name) if params else None
        if schema is not None or raw.text_values:
            value, coerced = coerce_arguments(value, schema, text_values=raw.text_values)
            repairs += coerced
        call_id = raw.id.strip() if isinstance(raw.id, str) and raw.id.strip() else None
        return ToolCall(
            id=call_id or new_call_id(),
            name=name,
            arguments=value,
            raw=text,
            token_span=span,
            repairs=tuple(repairs),
            id_generated=call_id is None,
        )


_PARAMS_MEMO: dict[int, tuple[Any, dict[str, dict[str, Any]]]] = {}


def _params(tools: Any) -> dict[str, dict[str, Any]] | None:
    """``{name: parameters}`` of a tools argument, memoized per tools object (callables' schemas
    are built once per list, not once per completion). Lists are treated as immutable."""
    if tools is None:
        return None
    if isinstance(tools, Mapping):  # already {name: parameters}
        return dict(tools)
    memo = _PARAMS_MEMO.get(id(tools))
    if memo is not None and memo[0] is tools:
        return memo[1]
    params = parameters_by_name(tools)
    if len(_PARAMS_MEMO) > 64:
        _PARAMS_MEMO.clear()
    _PARAMS_MEMO[id(tools)] = (tools, params)
    return params


# -- helpers shared by format parsers ---------------------------------------------------

_DECODER = json.JSONDecoder()


class Value(NamedTuple):
    """One value read by :func:`json_objects`: its span, the value (None on error), the error,
    and whether it needed the lenient reader (single quotes, Python literals, trailing commas)."""

    start: int
    end: int
    value: Any
    error: str | None
    lenient: bool = False


def json_objects(text: str, start: int = 0, end: int | None = None) -> list[Value]:
    """Consecutive JSON (or Python-literal) values in ``text[start:end]``.

    Values may be separated by whitespace, commas or semicolons (two calls glued together).
    Reading stops at the first thing that is not a value: it is returned with ``value`` None and
    an error, spanning the rest.
    """
    end = len(text) if end is None else end
    body = text[:end]
    out: list[Value] = []
    i = start
    while True:
        while i < end and body[i] in " \t\r\n,;":
            i += 1
        if i >= end:
            return out
        lenient = False
        try:
            value, j = _DECODER.raw_decode(body, i)
        except (ValueError, RecursionError):
            try:
                value, j = read_literal(body, i)
                lenient = True
            except LiteralError as exc:
                out.append(Value(i, end, None, exc.reason))
                return out
        out.append(Value(i, j, value, None, lenient))
        i = j


@dataclass(frozen=True)
class Block:
    """One ``OPEN body CLOSE`` block; an unclosed block's body runs to the next OPEN or the end."""

    start: int
    body_start: int
    body_end: int
    end: int
    closed: bool
    truncated: bool  # unclosed, and the completion ends inside it (no stop token after it)


def blocks(
    text: str, open_re: re.Pattern, close_re: re.Pattern, start: int, end: int, stops: frozenset[str] = frozenset()
) -> list[Block]:
    """Every block opened by ``open_re`` in ``text[start:end]``, in order.

    ``stops`` are the marker characters that end a turn (special tokens that are not the
    format's delimiters): an unclosed block followed by one was ended by the model, otherwise
    the completion was cut off inside it (``truncated``).
    """
    out: list[Block] = []
    m = open_re.search(text, start, end)
    while m is not None:
        nxt = open_re.search(text, max(m.end(), m.start() + 1), end)
        limit = nxt.start() if nxt else end
        c = close_re.search(text, m.end(), limit)
        if c is not None:
            out.append(Block(m.start(), m.end(), c.start(), c.end(), True, False))
        else:  # unclosed: a turn end (stop marker) ends it; no turn end at the very end: cut off
            stop = next((i for i in range(m.end(), limit) if text[i] in stops), -1)
            if stop >= 0:
                out.append(Block(m.start(), m.end(), stop, stop, False, False))
            else:
                cut = nxt is None and end == len(text)
                out.append(Block(m.start(), m.end(), limit, limit, False, cut))
        m = nxt
    return out


TRUNCATED = "the completion ends inside this call (it was cut off before the call was closed)"
