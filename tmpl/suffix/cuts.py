"""Boundary cuts: encode a tool content without the frame text around it.

A dynamic run is the text between two atoms, e.g. for Qwen2.5
``<|im_start|>`` + ``user\\n<tool_response>\\n`` + CONTENT + ``\\n</tool_response>``.
Encoding the whole run on every call costs as much again as the content itself for a
short result. A *cut* splits the run at a fixed place next to the content: the frame
text on the far side of the cut is encoded once (its IDs cached), and only the text on
the content's side is encoded per call.

A cut is exact when the tokenizer never merges across it. For byte-level BPE behind a
regex split (Qwen, Llama 3, Mistral Tekken, DeepSeek V3, gpt-oss, Phi-4: see
:attr:`tmpl.codec.Codec.regex_byte_level`) BPE runs inside each pre-token, and whether a
pre-token spans the cut is decided by the characters next to it: the frame text (fixed)
and the first (or last) character of the content, with a few more characters of
look-around for contractions (``'re``) and digit groups. So each cut is verified once,
per character: every printable ASCII character (and tab, newline, return) and
representatives of each non-ASCII letter, number, punctuation and symbol category,
each with a set of neighbours (contractions, digit runs, case changes, whitespace,
punctuation, non-ASCII), against the encoding of the whole run. At call time a cut is
taken only when the content's edge character passed; any other content (whitespace,
combining marks, controls, an untested category) encodes the whole run as before.

Cuts are not tried at all on other pipelines (SentencePiece-style BPE merges across
spaces), under a normalizer other than NFC, when an added token strips whitespace or is
matched after normalization, or when an added token could straddle the cut.

>>> from tmpl.suffix.cuts import edge_ok  # doctest: +SKIP
>>> edge_ok(cut, "{")  # doctest: +SKIP
True
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..codec import Codec

#: Characters tested one by one at each cut.
ASCII_EDGES: tuple[str, ...] = tuple(chr(i) for i in range(32, 127)) + ("\t", "\n", "\r")

#: Non-ASCII characters stand for their Unicode category (combining marks, separators
#: and controls are never cut next to: they are not listed).
CATEGORY_EDGES: dict[str, str] = {
    "Lu": "ÉΩЖ",
    "Ll": "éßж",
    "Lt": "ǅ",
    "Lm": "ʰー",
    "Lo": "漢字あ한",
    "Nd": "٣५",
    "Nl": "Ⅻ",
    "No": "²½",
    "Pc": "‿",
    "Pd": "—",
    "Ps": "「",
    "Pe": "」",
    "Pi": "«",
    "Pf": "»",
    "Po": "¿、",
    "Sm": "∑×",
    "Sc": "€£",
    "Sk": "˜",
    "So": "🙂©",
}

#: Neighbours of the edge character inside the content: contractions, digit groups,
#: case changes, whitespace, punctuation runs and non-ASCII text.
HEAD_NEIGHBOURS: tuple[str, ...] = (
    "", "s", "re", "ll", "a", "A", "Ab", "aB", "1", "123", "12345", " x", "  ", "\n", "!!", ".\n", "é", "漢", "🙂",
    "'", "x\n", "\t",
)  # fmt: skip
TAIL_NEIGHBOURS: tuple[str, ...] = (
    "", "a", "A", "aB", "Ab", "1", "12", "1234", "x ", " ", "\n", "!!", "'", "é", "漢", "🙂", "{", ")", "x'",
)  # fmt: skip


@dataclass(frozen=True)
class Cut:
    """One verified cut of a run.

    ``pos`` is where the frame text is cut (characters into the literal before the content
    for a head cut, into the literal after it for a tail cut); ``ids`` are the cached IDs of
    the frame text on the far side; ``ascii`` and ``categories`` are the edge characters
    (first of the content for a head cut, last for a tail cut) it was verified for.
    """

    pos: int
    ids: list[int]
    ascii: frozenset[str]
    categories: frozenset[str]


def edge_ok(cut: Cut, char: str) -> bool:
    """Whether ``cut`` was verified for a content whose edge character is ``char``."""
    if char < "\x80":
        return char in cut.ascii
    return unicodedata.category(char) in cut.categories


def _straddle_free(codec: Codec, frame_text: str, at_end: bool) -> bool:
    """No added token can span the join between ``frame_text`` and a content on its far side."""
    for info in codec.added.values():
        text = info.content
        for k in range(1, len(text)):
            if (at_end and frame_text.endswith(text[:k])) or (not at_end and frame_text.startswith(text[k:])):
                return False
    return True


def _candidates(codec: Codec, text: str, head: bool) -> list[int]:
    """Cut positions to try in a frame literal: at its edge next to the content, then one
    pre-token further away (taken when the edge itself joins the content's first pre-token,
    e.g. Mistral's ``": "`` before a JSON object)."""
    edge = len(text) if head else 0
    out = [edge]
    pre = codec.backend.pre_tokenizer
    if text and pre is not None:
        spans = [span for _, span in pre.pre_tokenize_str(text)]
        if spans:
            other = spans[-1][0] if head else spans[0][1]
            if 0 < other < len(text) and other != edge:
                out.append(other)
    return out


def _edges() -> list[tuple[str, str | None]]:
    """(character, category or None for ASCII) of every edge character tried."""
    out: list[tuple[str, str | None]] = [(c, None) for c in ASCII_EDGES]
    for cat, chars in CATEGORY_EDGES.items():
        out += [(c, cat) for c in chars]
    return out


def _search(
    codec: Codec,
    positions: Sequence[int],
    cached_of: Callable[[int], list[int]],
    cases: Callable[[str], list[tuple[str, int]]],
    cut_text: Callable[[str, int], str],
    split_at: Callable[[str, int], tuple[str, int]],
    head: bool,
) -> tuple[Cut, ...]:
    """Verify ``positions`` in order; each later cut is tried only for the edges the earlier ones failed.

    ``cases(char)`` are the whole texts for edge ``char`` with how many leading IDs to drop
    (the anchor's); ``cut_text(text, pos)`` is what a call encodes when cut at ``pos``; the
    cached IDs go before it (head) or after it (tail). A case passes when the pre-tokenizer
    splits the text after the anchor (``split_at(text, pos)``: that text and the cut's offset
    in it) at the cut, and the cut's IDs equal the whole text's: equal IDs alone could be a
    coincidence of the vocabulary for one neighbour, a pre-token edge holds for all of them.
    """
    pre = codec.backend.pre_tokenizer

    def splits(text: str, pos: int) -> bool:
        segment, at = split_at(text, pos)
        return any(start == at for _, (start, _) in pre.pre_tokenize_str(segment)) or at in (0, len(segment))

    edges = _edges()
    per_edge = [cases(char) for char, _ in edges]
    full = codec.encode_batch([text for group in per_edge for text, _ in group])
    starts = [0]
    for group in per_edge:
        starts.append(starts[-1] + len(group))
    cuts = []
    todo = list(range(len(edges)))
    for pos in positions:
        if not todo:
            break
        cached = cached_of(pos)
        texts = [cut_text(text, pos) for e in todo for text, _ in per_edge[e]]
        cut = codec.encode_batch(texts)
        good_ascii, good_cats, bad_cats, failed = set(), set(), set(), []
        i = 0
        for e in todo:
            ok = True
            for k, (text, drop) in enumerate(per_edge[e]):
                got = cached + cut[i] if head else cut[i][drop:] + cached  # a head cut drops the anchor
                ok = ok and full[starts[e] + k][drop:] == got and splits(text, pos)
                i += 1
            char, cat = edges[e]
            if not ok:
                failed.append(e)
                if cat is not None:
                    bad_cats.add(cat)
            elif cat is None:
                good_ascii.add(char)
            else:
                good_cats.add(cat)
        good_cats -= bad_cats
        todo = failed
        if good_ascii or good_cats:
            cuts.append(Cut(pos, cached, frozenset(good_ascii), frozenset(good_cats)))
    return tuple(cuts)


def _after_anchor(text: str, anchor: str, at: int) -> tuple[str, int]:
    """The text the pre-tokenizer sees (the anchor atom is split off first) and ``at`` in it."""
    if anchor and text.startswith(anchor):
        return text[len(anchor) :], at - len(anchor)
    return text, at


def head_cuts(codec: Codec, anchor: str, anchor_len: int, lead: str, fill: Callable[[str], str]) -> tuple[Cut, ...]:
    """Verified cuts in ``lead`` (the literal between the run's anchor and the content).

    ``fill(x)`` is the rest of the run with ``x`` as the content (literal text and other
    slots filled with probe values after it). Best cut first.
    """
    if not codec.regex_byte_level or not lead or not _straddle_free(codec, lead, at_end=True):
        return ()
    start = len(anchor) + len(lead)

    def cases(char: str) -> list[tuple[str, int]]:
        return [(anchor + lead + fill(char + nb), anchor_len) for nb in HEAD_NEIGHBOURS]

    return _search(
        codec,
        _candidates(codec, lead, head=True),
        lambda pos: codec.encode(anchor + lead[:pos])[anchor_len:] if pos else [],
        cases,
        lambda text, pos: lead[pos:] + text[start:],
        lambda text, pos: (text[len(anchor) :], pos),
        head=True,
    )


def tail_cuts(
    codec: Codec, anchor: str, anchor_len: int, lead: str, tail: str, heads: Sequence[Cut]
) -> tuple[Cut, ...]:
    """Verified cuts in ``tail`` (the literal after a run's only slot, a content, up to the next atom).

    Verified with the content after the whole lead and after what is left of the lead at
    each head cut in ``heads`` (both cuts may be taken in one call). Best cut first.
    """
    if not codec.regex_byte_level or not tail or not _straddle_free(codec, tail, at_end=False):
        return ()
    contexts = [(anchor + lead, anchor_len)] + [(lead[h.pos :], 0) for h in heads]

    def cases(char: str) -> list[tuple[str, int]]:
        return [(left + nb + char + tail, drop) for nb in TAIL_NEIGHBOURS for left, drop in contexts]

    return _search(
        codec,
        _candidates(codec, tail, head=False),
        lambda pos: codec.encode(tail[pos:]),
        cases,
        lambda text, pos: text[: len(text) - len(tail) + pos],
        lambda text, pos: _after_anchor(text, anchor, len(text) - len(tail) + pos),
        head=False,
    )
