"""A completion's token IDs as text in which delimiter tokens are single private characters.

Parsers search this text with regular expressions. A delimiter that is one added token of the
tokenizer (``<tool_call>`` in Qwen, ``[TOOL_CALLS]`` in Mistral) appears as one private-use
character, so it is found only where the model generated that token: the same characters
written as ordinary text (in content, inside an argument) never match. A delimiter that is
ordinary text for this tokenizer (a template on a foreign host tokenizer) is matched as text.

Special tokens are always markers (so they can be dropped from content); other added tokens
only when a parser names them as delimiters.

>>> view = TokenText(codec, ids, markers=frozenset({tool_call_id}))  # doctest: +SKIP
>>> view.text        # doctest: +SKIP
'Let me look.\\n\\U000f0001\\n{"name": ...'
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence

from .. import _compat
from ..tokenize import Codec
from .bytedecode import ByteTable, byte_table, decode_run

#: First private-use code point used for markers (plane 15; models practically never write it).
MARK_BASE = 0xF0000
_PRIVATE = re.compile("[\U000f0000-\U0010ffff]")


class MarkerTable:
    """Which token IDs are markers for one codec and parser, and their private characters."""

    def __init__(self, codec: Codec, delimiters: Iterable[str] = ()) -> None:
        self.codec = codec
        delimiter_ids = {codec.added_by_text[t] for t in delimiters if t in codec.added_by_text}
        #: the format's delimiters that are single tokens of this tokenizer
        self.delimiter_ids: frozenset[int] = frozenset(delimiter_ids)
        self.ids: frozenset[int] = frozenset(codec.special_ids) | self.delimiter_ids
        self.char: dict[int, str] = {tid: chr(MARK_BASE + k) for k, tid in enumerate(sorted(self.ids))}
        self.id_of: dict[str, int] = {c: tid for tid, c in self.char.items()}
        self.text_of: dict[int, str] = {tid: codec.decode([tid]) for tid in self.ids}
        #: byte-level tokenizers: runs of ordinary tokens decoded from a table (:mod:`.bytedecode`)
        self.bytes: ByteTable | None = byte_table(codec)

    def pattern(self, text: str) -> str:
        """Regex for the delimiter ``text``: its marker when it is one token here, else the text."""
        tid = self.codec.added_by_text.get(text)
        if tid is not None and tid in self.char:
            return re.escape(self.char[tid])
        return re.escape(text)

    def is_token(self, text: str) -> bool:
        """True when ``text`` is a marker token for this codec."""
        tid = self.codec.added_by_text.get(text)
        return tid is not None and tid in self.char


class TokenText:
    """Decoded completion with markers; maps character positions back to token positions.

    ``text`` is the whole completion; each marker token is one private-use character, all
    other tokens are decoded as the tokenizer decodes them. Private-use characters the model
    wrote itself become U+FFFD, so they can never pass for markers.
    """

    def __init__(self, table: MarkerTable, ids: Sequence[int]) -> None:
        self.table = table
        self.ids = ids = list(map(int, ids))  # numpy / torch integers too
        char = table.char
        pieces: list[str] = []
        #: (char start, token start, token end, is_marker) for each piece, in order
        spans: list[tuple[int, int, int, bool]] = []
        pos = prev = 0
        guard: int | None = None
        for p in [*_compat.ids.positions_of(ids, table.ids), len(ids)]:
            if p > prev:  # a run of ordinary tokens, decoded after the marker before it (its guard)
                text = self._decode_run(prev, p, guard)
                spans.append((pos, prev, p, False))
                pieces.append(text)
                pos += len(text)
            if p < len(ids):
                guard = ids[p]
                spans.append((pos, p, p + 1, True))
                pieces.append(char[guard])
                pos += 1
            prev = p + 1
        self._spans = spans
        self.text = "".join(pieces)
        self._starts = [s[0] for s in spans]
        self._prefix_cache: dict[tuple[int, int], int] = {}

    def _decode_run(self, start: int, end: int, guard: int | None) -> str:
        """The text of the ordinary tokens ``ids[start:end]``, in context after the marker ``guard``.

        A byte-level tokenizer decodes every token alike wherever it stands (its bytes, read as
        UTF-8 after a marker's complete text), so its runs come from the table
        (:mod:`.bytedecode`); other tokenizers decode the run after its marker (a SentencePiece
        decoder drops the leading space of a run's first token) and the marker's text is cut off.
        One decode per run: the backend's decode_batch hands a few short runs to its thread pool,
        which costs more than it saves (measured: 2 runs of a tool call, 18 us vs 8 us).
        """
        table = self.table
        run = self.ids[start:end]
        text = decode_run(table.bytes, run) if table.bytes is not None else None
        if text is None:
            codec = table.codec
            if guard is None:
                text = codec.backend.decode(run, skip_special_tokens=False)
            else:
                head = table.text_of[guard]
                text = codec.backend.decode([guard, *run], skip_special_tokens=False)
                text = text[len(head) :] if text.startswith(head) else codec.decode(run)
        return _PRIVATE.sub("\ufffd", text)

    # -- positions ----------------------------------------------------------------------
    def token_at(self, char_pos: int) -> int:
        """Index of the first token whose text starts at or after ``char_pos`` (len(ids) at the end).

        Exact at marker boundaries; inside a run of ordinary tokens it decodes prefixes of the
        run (bisection), which is exact wherever a token boundary falls on a character boundary.
        """
        if char_pos <= 0:
            return 0
        if char_pos >= len(self.text):
            return len(self.ids)
        k = bisect.bisect_right(self._starts, char_pos) - 1
        c0, t0, t1, marker = self._spans[k]
        if char_pos == c0 or marker:
            return t0 if char_pos == c0 else t1
        lo, hi = t0, t1  # find the smallest t in (t0, t1] whose prefix length >= offset
        offset = char_pos - c0
        while lo < hi:
            mid = (lo + hi) // 2
            if self._prefix_len(k, mid) >= offset:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _prefix_len(self, k: int, t: int) -> int:
        key = (k, t)
        got = self._prefix_cache.get(key)
        if got is None:
            c0, t0, _, _ = self._spans[k]
            guard = self.ids[t0 - 1] if t0 > 0 and self.ids[t0 - 1] in self.table.ids else None
            codec = self.table.codec
            if guard is None:
                got = len(codec.decode(self.ids[t0:t]))
            else:
                head = self.table.text_of[guard]
                got = len(codec.decode([guard, *self.ids[t0:t]])) - len(head)
            self._prefix_cache[key] = got
        return got

    def token_span(self, start: int, end: int) -> tuple[int, int]:
        """Token ``[start, end)`` covering the characters ``[start, end)``."""
        t0 = self.token_at(start)
        t1 = self.token_at(end)
        return t0, max(t0, t1)

    # -- text ---------------------------------------------------------------------------
    def raw(self, start: int = 0, end: int | None = None) -> str:
        """The characters ``[start, end)`` with markers written out as their token text."""
        part = self.text[start:end]
        return _PRIVATE.sub(lambda m: self.table.text_of.get(self.table.id_of.get(m.group(), -1), ""), part)

    def clean(self, start: int = 0, end: int | None = None) -> str:
        """The characters ``[start, end)`` as content: markers (special tokens, delimiters) dropped."""
        return _PRIVATE.sub("", self.text[start:end])
