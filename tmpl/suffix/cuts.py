"""Boundary cuts: encode a tool content without the frame text around it.

A dynamic run is the text between two atoms, e.g. for Qwen2.5
``<|im_start|>`` + ``user\\n<tool_response>\\n`` + CONTENT + ``\\n</tool_response>``.
Encoding the whole run on every call costs as much again as the content itself for a
short result. A *cut* splits the run at a fixed place next to the content: the frame
text on the far side of the cut is encoded once (its IDs cached), and only the text on
the content's side is encoded per call.

A cut is exact when the tokenizer never merges across it. For byte-level BPE behind a
regex split (Qwen, Llama 3, Mistral Tekken, DeepSeek V3, gpt-oss, Phi-4: see
:attr:`tmpl.tokenize.Codec.regex_byte_level`) BPE runs inside each pre-token, and whether a
pre-token spans the cut is decided by the characters next to it: the frame text (fixed)
and the first (or last) character of the content, with a few more characters of
look-around for contractions (``'re``) and digit groups. So each cut is verified per
edge character, the first time a content with that edge character meets it (then
remembered): an ASCII character for itself, a non-ASCII one for its Unicode category
(the category's representatives below and the character itself), each with a set of
neighbours (contractions, digit runs, case changes, whitespace, punctuation, non-ASCII).
A check passes when the pre-tokenizer splits the whole run at the cut and the cut's IDs
equal the whole run's. A cut is taken only for edges that passed; any other content
(combining marks, separators, controls, a failed edge) encodes the whole run as before.
Verifying on first use keeps building a frame as cheap as before the cuts existed.

Cuts are not tried at all on other pipelines (SentencePiece-style BPE merges across
spaces), under a normalizer other than NFC, when an added token strips whitespace or is
matched after normalization, or when an added token could straddle the cut.

>>> run.head_cuts[0].allows("{")  # doctest: +SKIP
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from unicodedata import category

from ..errors import TokenizerChangedError
from ..tokenize import Codec

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


class Cut:
    """One cut of a run, with its verdicts per edge character.

    ``pos`` is where the frame text is cut (characters into the literal before the content
    for a head cut, into the literal after it for a tail cut); ``ids`` are the cached IDs of
    the frame text on the far side. ``verdicts`` maps an edge key (an ASCII character, or a
    Unicode category) to whether the cut was verified for it; :meth:`learn` fills it.
    """

    __slots__ = ("pos", "ids", "verdicts", "_check")

    def __init__(self, pos: int, ids: list[int], check: Callable[[str], bool]) -> None:
        self.pos = pos
        self.ids = ids
        self.verdicts: dict[str, bool] = {}
        self._check = check

    def learn(self, char: str) -> bool:
        """Verify the cut for edge ``char`` (and its category's representatives); remembered."""
        key = edge_key(char)
        verdict = self.verdicts.get(key)
        if verdict is None:
            if char < "\x80":
                verdict = self._check(char)
            elif key in CATEGORY_EDGES:
                verdict = all(self._check(c) for c in dict.fromkeys(CATEGORY_EDGES[key] + char))
            else:
                verdict = False  # combining marks, separators, controls: never cut next to
            self.verdicts[key] = verdict
        return verdict

    def allows(self, char: str) -> bool:
        """Whether a content whose edge character is ``char`` may be cut here."""
        verdict = self.verdicts.get(char if char < "\x80" else category(char))
        return self.learn(char) if verdict is None else verdict

    def __repr__(self) -> str:
        return f"Cut(pos={self.pos}, ids={self.ids}, verdicts={len(self.verdicts)})"


def edge_key(char: str) -> str:
    """The key a cut's verdict is kept under: the character if ASCII, else its Unicode category."""
    return char if char < "\x80" else category(char)


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


def _checker(
    codec: Codec,
    pos: int,
    cached: list[int],
    cases: Callable[[str], list[tuple[str, int]]],
    cut_text: Callable[[str, int], str],
    split_at: Callable[[str, int], tuple[str, int]],
    head: bool,
) -> Callable[[str], bool]:
    """The check of one cut for one edge character.

    ``cases(char)`` are the whole texts for edge ``char`` with how many leading IDs to drop
    (the anchor's); ``cut_text(text, pos)`` is what a call encodes when cut at ``pos``; the
    cached IDs go before it (head) or after it (tail). A case passes when the pre-tokenizer
    splits the text after the anchor (``split_at(text, pos)``: that text and the cut's offset
    in it) at the cut, and the cut's IDs equal the whole text's: equal IDs alone could be a
    coincidence of the vocabulary for one neighbour, a pre-token edge holds for all of them.
    """
    pre = codec.backend.pre_tokenizer

    def splits(text: str) -> bool:
        segment, at = split_at(text, pos)
        return at in (0, len(segment)) or any(start == at for _, (start, _) in pre.pre_tokenize_str(segment))

    def check(char: str) -> bool:
        group = cases(char)
        try:
            full = codec.encode_many([text for text, _ in group])
            cut = codec.encode_many([cut_text(text, pos) for text, _ in group])
        except TokenizerChangedError:
            # the frame is shared by every template of its fingerprint, and the tokenizer object it was
            # built with changed since: unverified, so the cut is not taken for this edge (the run is then
            # encoded whole, which is always exact)
            return False
        for (text, drop), whole, part in zip(group, full, cut):
            got = cached + part if head else part[drop:] + cached  # a head cut's text has no anchor
            if whole[drop:] != got or not splits(text):
                return False
        return True

    return check


def _after_anchor(text: str, anchor: str, at: int) -> tuple[str, int]:
    """The text the pre-tokenizer sees (the anchor atom is split off first) and ``at`` in it."""
    if anchor and text.startswith(anchor):
        return text[len(anchor) :], at - len(anchor)
    return text, at


def head_cuts(codec: Codec, anchor: str, anchor_len: int, lead: str, fill: Callable[[str], str]) -> tuple[Cut, ...]:
    """Cuts in ``lead`` (the literal between the run's anchor and the content), best first.

    ``fill(x)`` is the rest of the run with ``x`` as the content (literal text and other
    slots filled with probe values after it).
    """
    if not codec.regex_byte_level or not lead or not codec.straddle_free(lead, at_end=True):
        return ()
    start = len(anchor) + len(lead)

    def cases(char: str) -> list[tuple[str, int]]:
        return [(anchor + lead + fill(char + nb), anchor_len) for nb in HEAD_NEIGHBOURS]

    cuts = []
    for pos in _candidates(codec, lead, head=True):
        cached = codec.encode(anchor + lead[:pos])[anchor_len:]
        check = _checker(
            codec,
            pos,
            cached,
            cases,
            lambda text, pos: lead[pos:] + text[start:],
            lambda text, pos: (text[len(anchor) :], pos),
            head=True,
        )
        cuts.append(Cut(pos, cached, check))
    return tuple(cuts)


def tail_cuts(
    codec: Codec, anchor: str, anchor_len: int, lead: str, tail: str, heads: Sequence[Cut]
) -> tuple[Cut, ...]:
    """Cuts in ``tail`` (the literal after a run's only slot, a content, up to the next atom), best first.

    Checked with the content after the whole lead and after what is left of the lead at
    each head cut in ``heads`` (both cuts may be taken in one call).
    """
    if not codec.regex_byte_level or not tail or not codec.straddle_free(tail, at_end=False):
        return ()
    contexts = [(anchor + lead, anchor_len)] + [(lead[h.pos :], 0) for h in heads]

    def cases(char: str) -> list[tuple[str, int]]:
        return [(left + nb + char + tail, drop) for nb in TAIL_NEIGHBOURS for left, drop in contexts]

    cuts = []
    for pos in _candidates(codec, tail, head=False):
        cached = codec.encode(tail[pos:])
        check = _checker(
            codec,
            pos,
            cached,
            cases,
            lambda text, pos: text[: len(text) - len(tail) + pos],
            lambda text, pos: _after_anchor(text, anchor, len(text) - len(tail) + pos),
            head=False,
        )
        cuts.append(Cut(pos, cached, check))
    return tuple(cuts)
