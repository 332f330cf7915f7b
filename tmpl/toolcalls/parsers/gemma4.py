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

from ..literal import LiteralError, LiteralReader
from ..tokentext import TokenText
from .base import NAME, TRUNCATED, RawCall, ToolParser, blocks

_BARE = re.compile(r"[^:,{}\[\]]+")


def read_gemma_value(text: str, pos: int, quote: str, end: int | None = None) -> tuple[Any, int]:
    """Read one Gemma 4 argument value at ``pos``; ``quote`` is the string delimiter as it
    appears in ``text``. Returns (value, end); raises :class:`LiteralError`."""
    return _GemmaReader(text[: len(text) if end is None else end], quote).value(pos, 0)


class _GemmaReader(LiteralReader):
    """The literal reader with Gemma's strings (between two ``quote``, no escapes), bare keys
    (any text up to ``:``), no tuples, ``:`` only between key and value, no trailing comma."""

    openers = "{["
    key_separators = ":"
    trailing_comma = False

    def __init__(self, text: str, quote: str) -> None:
        super().__init__(text)
        self.q = quote

    def starts_string(self, i: int) -> bool:
        return self.s.startswith(self.q, i)

    def string(self, i: int) -> tuple[str, int]:
        j = self.s.find(self.q, i + len(self.q))
        if j < 0:
            raise LiteralError(i, "unterminated string")
        return self.s[i + len(self.q) : j], j + len(self.q)

    def key(self, i: int) -> tuple[str, int]:
        if self.starts_string(i):
            return self.string(i)
        m = _BARE.match(self.s, i)
        if not m or not m.group().strip() or self.q in m.group():
            raise LiteralError(i, "expected a key")
        return m.group().strip(), m.end()


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
