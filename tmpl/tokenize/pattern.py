r"""Which split regexes tiktoken's engine (fancy-regex) reads as the tokenizer's (Oniguruma) does.

:func:`check` accepts a whitelist of constructs and refuses the rest, naming what it refused:
literals; the escapes ``\r \n \t \s \S`` and escaped ASCII punctuation; ``\p{X}`` / ``\P{X}`` for
the general categories in :data:`PROPERTIES`; classes of those (with ranges of literals);
``(?:...)``; ``(?i:...)`` holding only ASCII literals and ``|``, where no character's case fold
spans two letters (``ß`` folds to ``ss`` in Oniguruma, never in fancy-regex); lookahead
``(?=...)`` ``(?!...)``; the greedy quantifiers ``? * + {n} {n,} {n,m}`` (counts up to
:data:`MAX_REPEAT`). A pattern, or an alternative, that can match the empty string is refused.

>>> check(r"(?i:'s|'t)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|\s+(?!\S)|\s+")
>>> check(r"\d+")
Traceback (most recent call last):
...
tmpl.tokenize.pipeline.Unsupported: the escape \d in '\\d+'
"""

from __future__ import annotations

import string

from .pipeline import Unsupported

#: the general categories both engines take as ``\p{X}``
PROPERTIES = frozenset({"L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "Mn", "N", "Nd", "P", "S"})
#: the largest repeat count accepted in ``{n,m}``
MAX_REPEAT = 1000
#: ASCII spellings that one character case-folds to in Oniguruma (ß ẞ: ss; ﬅ ﬆ: st; ﬀ ﬃ ﬄ: ff; ﬁ; ﬂ)
MULTI_FOLDS = ("ss", "st", "ff", "fi", "fl")
_META = set("\\[](){}|?*+.^$")
_PUNCT = set(string.punctuation)


def check(pattern: str) -> None:
    """Raise :class:`Unsupported` unless ``pattern`` is made only of the constructs above."""
    _Parser(pattern).run()


class _Parser:
    """A recursive-descent reader of the whitelist; each method returns whether what it read can
    match the empty string."""

    def __init__(self, pattern: str) -> None:
        self.p = pattern
        self.i = 0

    def fail(self, what: str) -> Unsupported:
        return Unsupported(f"{what} in {self.p!r}")

    def peek(self) -> str:
        return self.p[self.i : self.i + 1]

    def run(self) -> None:
        if self.alternation():
            raise self.fail("a pattern that matches the empty string")
        if self.i != len(self.p):
            raise self.fail(f"an unmatched {self.peek()!r}")

    def alternation(self) -> bool:
        nullable = False
        while True:
            nullable |= self.sequence()
            if self.peek() != "|":
                return nullable
            self.i += 1

    def sequence(self) -> bool:
        """One alternative: refused when empty or made of lookaheads alone."""
        nullable, items, looks = True, 0, 0
        while self.i < len(self.p) and self.peek() not in "|)":
            atom_nullable, look = self.atom()
            items += 1
            if look:
                looks += 1
                if self.peek() and self.peek() in "?*+{":
                    raise self.fail("a quantified lookahead")
                continue
            least = self.quantifier()
            nullable &= atom_nullable or least == 0
        if items == 0:
            raise self.fail("an empty alternative")
        if looks == items:
            raise self.fail("an alternative of lookahead only")
        return nullable

    def quantifier(self) -> int:
        """The least count of the quantifier here (1 when there is none)."""
        c = self.peek()
        if c in ("?", "*"):
            self.i += 1
            least = 0
        elif c == "+":
            self.i += 1
            least = 1
        elif c == "{":
            end = self.p.find("}", self.i)
            body = self.p[self.i + 1 : end] if end > 0 else ""
            lo, _, hi = body.partition(",")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise self.fail(f"the repeat {self.p[self.i : self.i + 8]!r}")
            counts = [int(lo), int(hi)] if hi else [int(lo)]
            if max(counts) > MAX_REPEAT or counts != sorted(counts):
                raise self.fail(f"the repeat {{{body}}}")
            self.i = end + 1
            least = int(lo)
        else:
            return 1
        if self.peek() and self.peek() in "?+*{":
            raise self.fail("a lazy, possessive or doubled quantifier")
        return least

    def atom(self) -> tuple[bool, bool]:
        """(can match empty, is a lookahead)."""
        c = self.peek()
        if c == "(":
            return self.group()
        if c == "[":
            self.char_class()
            return False, False
        if c == "\\":
            self.escape()
            return False, False
        if c in _META:
            raise self.fail(f"the construct {c!r}")
        self.i += 1
        return False, False

    def group(self) -> tuple[bool, bool]:
        head = self.p[self.i : self.i + 4]
        if head.startswith("(?:"):
            self.i += 3
            nullable, look = self.alternation(), False
        elif head.startswith(("(?=", "(?!")):
            self.i += 3
            self.alternation()
            nullable, look = True, True
        elif head == "(?i:":
            self.i += 4
            nullable, look = self.fold_group(), False
        else:
            raise self.fail(f"the group {head!r}")
        if self.peek() != ")":
            raise self.fail("an unclosed group")
        self.i += 1
        return nullable, look

    def fold_group(self) -> bool:
        """The body of ``(?i:...)``: ASCII literals and ``|`` only, no multi-letter case fold."""
        end = self.p.find(")", self.i)
        body = self.p[self.i : end] if end > 0 else ""
        for alt in body.split("|"):
            if not alt:
                raise self.fail("an empty alternative in (?i:...)")
            if not alt.isascii() or any(ch in _META or not ch.isprintable() for ch in alt):
                raise self.fail(f"(?i:...) holding {alt!r} (only ASCII literals are taken)")
            if any(fold in alt.lower() for fold in MULTI_FOLDS):
                raise self.fail(f"(?i:...) holding {alt!r}, which one character case-folds to")
        self.i = end
        return False

    def escape(self) -> None:
        esc = self.p[self.i + 1 : self.i + 2]
        if esc in ("p", "P"):
            close = self.p.find("}", self.i)
            name = self.p[self.i + 3 : close] if self.p[self.i + 2 : self.i + 3] == "{" and close > 0 else ""
            if name not in PROPERTIES:
                raise self.fail(f"the class {self.p[self.i : self.i + 8]!r}")
            self.i = close + 1
            return
        if esc in ("r", "n", "t", "s", "S") or esc in _PUNCT:
            self.i += 2
            return
        raise self.fail(f"the escape \\{esc}")

    def char_class(self) -> None:
        self.i += 1
        if self.peek() == "^":
            self.i += 1
        if self.peek() == "]":
            raise self.fail("an empty class or one starting with ']'")
        while True:
            c = self.peek()
            if not c:
                raise self.fail("an unclosed class")
            if c == "]":
                self.i += 1
                return
            if c == "[" or self.p.startswith("&&", self.i):
                raise self.fail("a nested class or class intersection")
            if c == "\\":
                single = self.p[self.i + 1 : self.i + 2] in set("rnt") | _PUNCT
                self.escape()
            elif c == "-":
                raise self.fail("a '-' that is not a range")
            else:
                self.i += 1
                single = True
            if self.peek() == "-" and self.p[self.i + 1 : self.i + 2] not in ("]", ""):
                if not single:
                    raise self.fail("a range from a class")
                lo = self.p[self.i - 1]
                self.i += 1
                hi = self.peek()
                if hi in ("\\", "[", "]") or hi < lo:
                    raise self.fail(f"the range {lo}-{hi}")
                self.i += 1
