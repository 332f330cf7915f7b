"""Gemma 4 calls: ``<|tool_call>call:NAME{key:value,...}<tool_call|>``.

Values follow the template's ``format_argument`` macro: strings between ``<|"|>`` tokens (so a
string may hold quotes, commas and braces), numbers, ``true``/``false``, ``{...}`` with bare or
quoted keys, ``[...]``. Reasoning is the ``<|channel>thought ... <channel|>`` block. Forgiven:
a missing ``<tool_call|>``, several ``call:`` in one block, Python spellings (``None``, ``True``).

>>> read_gemma_value('{city:<|"|>Pa"ris<|"|>,days:3}', 0, '<|"|>')
({'city': 'Pa"ris', 'days': 3}, 30)
"""

from __future__ import annotations

import re
from typing import Any

from ..literal import MAX_DEPTH, LiteralError
from ..tokentext import TokenText
from .base import NAME, TRUNCATED, RawCall, ToolParser, blocks

_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_WORDS = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}
_BARE = re.compile(r"[^:,{}\[\]]+")


def read_gemma_value(text: str, pos: int, quote: str, end: int | None = None) -> tuple[Any, int]:
    """Read one Gemma 4 argument value at ``pos``; ``quote`` is the string delimiter as it
    appears in ``text``. Returns (value, end); raises :class:`LiteralError`."""
    return _GemmaReader(text[: len(text) if end is None else end], quote).value(pos, 0)


class _GemmaReader:
    def __init__(self, text: str, quote: str) -> None:
        self.s, self.q, self.n = text, quote, len(text)

    def ws(self, i: int) -> int:
        while i < self.n and self.s[i] in " \t\r\n":
            i += 1
        return i

    def string(self, i: int) -> tuple[str, int]:
        j = self.s.find(self.q, i + len(self.q))
        if j < 0:
            raise LiteralError(i, "unterminated string")
        return self.s[i + len(self.q) : j], j + len(self.q)

    def value(self, i: int, depth: int) -> tuple[Any, int]:
        if depth > MAX_DEPTH:
            raise LiteralError(i, f"nested deeper than {MAX_DEPTH}")
        i = self.ws(i)
        if i >= self.n:
            raise LiteralError(i, "expected a value, found end of text")
        if self.s.startswith(self.q, i):
            return self.string(i)
        c = self.s[i]
        if c == "{":
            return self.obj(i + 1, depth + 1)
        if c == "[":
            return self.seq(i + 1, depth + 1)
        m = _NUMBER.match(self.s, i)
        if m:
            t = m.group()
            try:
                return (float(t) if any(x in t for x in ".eE") else int(t)), m.end()
            except ValueError:
                raise LiteralError(i, "number too long") from None
        for word, value in _WORDS.items():
            if self.s.startswith(word, i):
                return value, i + len(word)
        raise LiteralError(i, f"expected a value, found {self.s[i]!r}")

    def key(self, i: int) -> tuple[str, int]:
        if self.s.startswith(self.q, i):
            return self.string(i)
        m = _BARE.match(self.s, i)
        if not m or not m.group().strip() or self.q in m.group():
            raise LiteralError(i, "expected a key")
        return m.group().strip(), m.end()

    def obj(self, i: int, depth: int) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}
        i = self.ws(i)
        if i < self.n and self.s[i] == "}":
            return out, i + 1
        while True:
            k, i = self.key(self.ws(i))
            i = self.ws(i)
            if i >= self.n or self.s[i] != ":":
                raise LiteralError(i, "expected ':' after a key")
            out[k], i = self.value(i + 1, depth)
            i = self.ws(i)
            if i < self.n and self.s[i] == ",":
                i += 1
                continue
            if i < self.n and self.s[i] == "}":
                return out, i + 1
            raise LiteralError(i, "expected ',' or '}' in an object")

    def seq(self, i: int, depth: int) -> tuple[list[Any], int]:
        out: list[Any] = []
        i = self.ws(i)
        if i < self.n and self.s[i] == "]":
            return out, i + 1
        while True:
            v, i = self.value(i, depth)
            out.append(v)
            i = self.ws(i)
            if i < self.n and self.s[i] == ",":
                i += 1
                continue
            if i < self.n and self.s[i] == "]":
                return out, i + 1
            raise LiteralError(i, "expected ',' or ']' in a list")


class Gemma4Parser(ToolParser):
    name = "gemma4"
    description = '<|tool_call>call:NAME{k:<|"|>v<|"|>}<tool_call|> (Gemma 4)'
    delimiters = ("<|tool_call>", "<tool_call|>", '<|"|>')
    think = ("<|channel>", "<channel|>")
    signature = ("<|tool_call>", "<tool_call|>")

    def compile(self) -> None:
        self._open = re.compile(self.p("<|tool_call>"))
        self._close = re.compile(self.p("<tool_call|>"))
        self._call = re.compile(r"\s*call\s*:\s*(" + NAME + r")\s*")
        tid = self.codec.added_by_text.get('<|"|>')
        self.quote = self.table.char[tid] if tid is not None and tid in self.table.char else '<|"|>'

    def reasoning_part(self, text: str) -> str:
        """Gemma names the channel first: ``<|channel>thought\n...<channel|>``."""
        text = text.strip()
        return text[len("thought") :].strip() if text.startswith("thought") else text

    def find_calls(self, view: TokenText, start: int, end: int) -> list[RawCall]:
        text = view.text
        out: list[RawCall] = []
        for block in blocks(text, self._open, self._close, start, end, self.stops):
            if block.truncated:
                out.append(RawCall(block.start, block.end, error=TRUNCATED, error_kind="truncated"))
                continue
            found = self._calls_in(text, block.body_start, block.body_end)
            found[0].start = block.start
            if block.closed:
                found[-1].end = block.end
            else:
                for call in found:
                    if call.error is None:
                        call.repairs.append("missing close tag")
            out.extend(found)
        return out

    def _calls_in(self, text: str, a: int, b: int) -> list[RawCall]:
        out: list[RawCall] = []
        pos = a
        while True:
            m = self._call.match(text, pos, b)
            if m is None:
                rest = text[pos:b]
                if not out:
                    return [RawCall(a, b, error="expected call:NAME{...}", error_kind="malformed")]
                if rest.strip() and not all(ch in self.stops for ch in rest.strip()):
                    out[-1].repairs.append("trailing text")
                return out
            if m.end() >= b or text[m.end()] != "{":
                out.append(
                    RawCall(
                        pos, b, name=m.group(1), error="expected {arguments} after the name", error_kind="malformed"
                    )
                )
                return out
            try:
                value, j = read_gemma_value(text, m.end(), self.quote, b)
            except LiteralError as exc:
                out.append(
                    RawCall(pos, b, name=m.group(1), error=f"unreadable arguments ({exc})", error_kind="bad_json")
                )
                return out
            out.append(RawCall(pos, j, name=m.group(1), arguments=value))
            pos = j
