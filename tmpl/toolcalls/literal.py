"""A small, safe reader for JSON and Python-literal values (what models write as arguments).

It accepts strict JSON and the usual deviations: single-quoted strings, ``True``/``False``/
``None``, tuples, trailing commas, bare (identifier) keys, comments-free whitespace anywhere.
It never evaluates anything: it is a recursive-descent reader with a depth limit, so deep or
huge inputs give a :class:`LiteralError`, never a ``RecursionError``. :class:`LiteralReader` is
the one reader of the package: formats with their own string delimiters or keys (Gemma 4's
``<|"|>``) subclass it; :data:`WORDS` is the keyword table every reader uses (the pythonic
parser's syntax-tree reader included).

>>> read_literal("{'city': 'Paris', 'days': 3, 'metric': True,}")
({'city': 'Paris', 'days': 3, 'metric': True}, 45)
>>> try:
...     read_literal("[1, 2")
... except LiteralError as exc:
...     print(exc)
at 5: expected ',' or ']' in a list, found end of text
"""

from __future__ import annotations

import re
from typing import Any

MAX_DEPTH = 100

_NUMBER = re.compile(r"-?(?:\d+)(?:\.\d*)?(?:[eE][+-]?\d+)?|-?\.\d+(?:[eE][+-]?\d+)?")
_WORD = re.compile(r"[A-Za-z_$][\w$\-]*")
_WS = " \t\r\n"
#: the keyword values models write, JSON and Python spellings
WORDS: dict[str, Any] = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}
_ESCAPES = {'"': '"', "'": "'", "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "0": "\0"}


class LiteralError(ValueError):
    """The text is not a JSON / Python literal; ``pos`` is where reading stopped."""

    def __init__(self, pos: int, reason: str) -> None:
        self.pos = pos
        self.reason = reason
        super().__init__(f"at {pos}: {reason}")


def read_literal(text: str, pos: int = 0) -> tuple[Any, int]:
    """Read one value starting at ``pos`` (leading whitespace skipped); returns (value, end)."""
    return LiteralReader(text).value(pos, 0)


class LiteralReader:
    """Recursive descent over ``text``: :meth:`value` reads one value at a position.

    Subclasses change what opens a string (:meth:`starts_string`, :meth:`string`), what a key
    may be (:meth:`key`), and by class attribute: ``openers`` (the brackets read as containers),
    ``key_separators`` and whether a comma may trail the last item (``trailing_comma``).
    """

    openers = "{[("
    key_separators = ":="
    trailing_comma = True

    def __init__(self, text: str) -> None:
        self.s = text
        self.n = len(text)

    def starts_string(self, i: int) -> bool:
        """Does a string start at ``i`` (``i`` inside the text)?"""
        return self.s[i] in "\"'"

    def ws(self, i: int) -> int:
        s, n = self.s, self.n
        while i < n and s[i] in _WS:
            i += 1
        return i

    def found(self, i: int) -> str:
        return repr(self.s[i]) if i < self.n else "end of text"

    def value(self, i: int, depth: int) -> tuple[Any, int]:
        if depth > MAX_DEPTH:
            raise LiteralError(i, f"nested deeper than {MAX_DEPTH}")
        i = self.ws(i)
        if i >= self.n:
            raise LiteralError(i, "expected a value, found end of text")
        if self.starts_string(i):
            return self.string(i)
        c = self.s[i]
        if c in self.openers:
            if c == "{":
                return self.obj(i + 1, depth + 1)
            return self.seq(i + 1, depth + 1, "]" if c == "[" else ")")
        m = _NUMBER.match(self.s, i)
        if m:
            return self.number(m.group(), i), m.end()
        m = _WORD.match(self.s, i)
        if m and m.group() in WORDS:
            return WORDS[m.group()], m.end()
        raise LiteralError(i, f"expected a value, found {self.found(i)}")

    def number(self, text: str, i: int) -> int | float:
        if any(ch in text for ch in ".eE"):
            return float(text)
        try:
            return int(text)
        except ValueError:  # more digits than int() accepts from text
            raise LiteralError(i, "integer too long") from None

    def string(self, i: int) -> tuple[str, int]:
        s, n = self.s, self.n
        quote = s[i]
        i += 1
        out: list[str] = []
        start = i
        while True:
            j = i
            while j < n and s[j] != quote and s[j] != "\\":
                j += 1
            out.append(s[i:j])
            if j >= n:
                raise LiteralError(start - 1, "unterminated string")
            if s[j] == quote:
                return "".join(out), j + 1
            # backslash escape
            if j + 1 >= n:
                raise LiteralError(j, "unterminated string")
            e = s[j + 1]
            if e in _ESCAPES:
                out.append(_ESCAPES[e])
                i = j + 2
            elif e == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", s[j + 2 : j + 6]):
                code = int(s[j + 2 : j + 6], 16)
                i = j + 6
                if (
                    0xD800 <= code < 0xDC00
                    and s[i : i + 2] == "\\u"
                    and re.fullmatch(r"[0-9a-fA-F]{4}", s[i + 2 : i + 6])
                ):
                    low = int(s[i + 2 : i + 6], 16)
                    if 0xDC00 <= low < 0xE000:
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                        i += 6
                out.append(chr(code))
            elif e == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", s[j + 2 : j + 4]):
                out.append(chr(int(s[j + 2 : j + 4], 16)))
                i = j + 4
            else:  # unknown escape: kept as written, like Python does
                out.append("\\" + e)
                i = j + 2

    def key(self, i: int) -> tuple[str, int]:
        if i < self.n and self.starts_string(i):
            return self.string(i)
        m = _WORD.match(self.s, i)
        if m:
            return m.group(), m.end()
        m = _NUMBER.match(self.s, i)
        if m:
            return m.group(), m.end()
        raise LiteralError(i, f"expected a key, found {self.found(i)}")

    def obj(self, i: int, depth: int) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}
        i = self.ws(i)
        if i < self.n and self.s[i] == "}":
            return out, i + 1
        while True:
            k, i = self.key(self.ws(i))
            i = self.ws(i)
            if i >= self.n or self.s[i] not in self.key_separators:
                raise LiteralError(i, f"expected ':' after a key, found {self.found(i)}")
            v, i = self.value(i + 1, depth)
            out[k] = v
            i = self.ws(i)
            if i < self.n and self.s[i] == ",":
                i = self.ws(i + 1)
                if self.trailing_comma and i < self.n and self.s[i] == "}":
                    return out, i + 1
                continue
            if i < self.n and self.s[i] == "}":
                return out, i + 1
            raise LiteralError(i, f"expected ',' or '}}' in an object, found {self.found(i)}")

    def seq(self, i: int, depth: int, close: str) -> tuple[list[Any], int]:
        out: list[Any] = []
        i = self.ws(i)
        if i < self.n and self.s[i] == close:
            return out, i + 1
        while True:
            v, i = self.value(i, depth)
            out.append(v)
            i = self.ws(i)
            if i < self.n and self.s[i] == ",":
                i = self.ws(i + 1)
                if self.trailing_comma and i < self.n and self.s[i] == close:
                    return out, i + 1
                continue
            if i < self.n and self.s[i] == close:
                return out, i + 1
            raise LiteralError(i, f"expected ',' or '{close}' in a list, found {self.found(i)}")
