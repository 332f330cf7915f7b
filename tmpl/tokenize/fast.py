"""The fast encoder: tiktoken's BPE, built from the tokenizer's own vocabulary and split regex.

``tokenizers`` spends most of an encode in its pre-tokenizer's regex engine; tiktoken (OpenAI's
Rust BPE with a faster regex engine) gives the same IDs in a fraction of the time for the
byte-level BPE pipelines it can reproduce exactly: a BPE model without dropout, byte fallback
or subword affixes; no normalizer, or NFC; one ``Isolated`` ``Split`` on a regex of the
constructs :mod:`tmpl.tokenize.pattern` accepts followed by a ``ByteLevel`` step that only maps
bytes (or a ``ByteLevel`` step alone, splitting with GPT-2's regex); added tokens without
``lstrip`` or ``single_word``. Anything else is a :class:`Decline` naming the reason, and the
tokenizer encodes.

Ranks: where the IDs of merge results grow with the merge index (Qwen, Llama 3, Mistral Nemo,
gpt-oss, Phi-4-mini), tiktoken ranks are the IDs themselves; otherwise the first merge index
producing a token (several merges may produce one: the first wins), mapped back to IDs.
tiktoken looks a whole piece up before merging, as ``ignore_merges=True`` does; for the other
models every ranked token is checked to BPE-encode to itself in the tokenizer's own model.

Per text, as the tokenizer: cut at non-normalized added tokens, NFC the text between them, cut
at normalized added tokens (their contents normalized), then encode each gap. Texts holding a
code point Python's ``unicodedata`` calls unassigned or a surrogate, and texts over
:data:`MAX_CHARS` characters, go to the tokenizer (``encode`` returns None). On build a fixed
corpus (:func:`check_corpus`) is encoded both ways; any difference declines.

>>> enc = FastEncoder.build(tokenizer.backend_tokenizer)  # doctest: +SKIP
>>> enc.encode('{"city": "Zürich"}') == tokenizer('{"city": "Zürich"}', add_special_tokens=False)["input_ids"]  # doctest: +SKIP
True
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import sys
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tiktoken

from .added import WHITE_SPACE, AddedCutter
from .pattern import check
from .pipeline import GPT2_SPLIT, Unsupported, byte_chars, pipeline_of, steps_of

#: texts longer than this go to the tokenizer itself (its regex engine gives up on some long
#: texts, e.g. 12 million spaces then "x", where tiktoken's would not: tmpl must fail as it does)
MAX_CHARS = 1 << 18


@dataclass(frozen=True)
class Decline:
    """Why the fast encoder does not serve a tokenizer (the tokenizer encodes every text)."""

    reason: str


@functools.cache
def _odd_classes() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """The odd code points below U+10000 and from it on, as two classes: ``re`` tests a class of
    BMP characters with one table lookup per character, a class reaching past the BMP by its
    ranges one by one (600 of them: 2 us per character)."""
    ranges: list[tuple[int, int]] = []
    start = -1
    for cp in range(sys.maxunicode + 2):
        odd = cp <= sys.maxunicode and unicodedata.category(chr(cp)) in ("Cn", "Cs")
        if odd and start < 0:
            start = cp
        elif not odd and start >= 0:
            ranges.append((start, cp - 1))
            start = -1

    def cls(pairs: list[tuple[int, int]]) -> re.Pattern[str]:
        return re.compile("[" + "".join(f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in pairs) + "]")

    bmp = [(lo, min(hi, 0xFFFF)) for lo, hi in ranges if lo <= 0xFFFF]
    astral = [(max(lo, 0x10000), hi) for lo, hi in ranges if hi >= 0x10000]
    return cls(bmp), cls(astral)


_ASTRAL = re.compile("[\U00010000-\U0010ffff]")


def has_odd_char(text: str) -> bool:
    """Whether ``text`` holds a code point Python's ``unicodedata`` calls unassigned (``Cn``) or
    a surrogate (``Cs``): the tokenizer's engines know a newer Unicode, so such texts go to it.

    >>> has_odd_char("a\\U000e0080b"), has_odd_char("Zürich 東京 🙂")
    (True, False)
    """
    bmp, astral = _odd_classes()
    return bmp.search(text) is not None or (_ASTRAL.search(text) is not None and astral.search(text) is not None)


def _split_regex(pipeline: dict[str, Any]) -> tuple[str, bool]:
    """(the split regex, whether the text is NFC-normalized first); Unsupported otherwise."""
    model, norm, pre = pipeline["model"], pipeline["normalizer"], pipeline["pre_tokenizer"]
    if model["type"] != "BPE":
        raise Unsupported(f"the model is {model['type']}, not BPE")
    if model["dropout"] not in (None, 0, 0.0):
        raise Unsupported(f"BPE dropout {model['dropout']} makes the IDs random")
    if model["byte_fallback"]:
        raise Unsupported("BPE with byte fallback")
    if model["continuing_subword_prefix"] or model["end_of_word_suffix"]:
        raise Unsupported("BPE with subword affixes")
    norms = steps_of(norm, "normalizers")
    if any(n.get("type") != "NFC" for n in norms):
        raise Unsupported(f"the normalizer {[n.get('type') for n in norms]} (only NFC is reproduced)")
    if pre is None:
        raise Unsupported("no pre-tokenizer")
    steps = steps_of(pre, "pretokenizers")
    kinds = [s.get("type") for s in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        if steps[0].get("add_prefix_space"):
            raise Unsupported("a ByteLevel step that adds a prefix space")
        return GPT2_SPLIT, bool(norms)
    if kinds != ["Split", "ByteLevel"]:
        raise Unsupported(f"the pre-tokenizer steps {kinds} (one Split then ByteLevel, or ByteLevel alone)")
    split, level = steps
    if level.get("add_prefix_space") or level.get("use_regex"):
        raise Unsupported("a ByteLevel step that adds a prefix space or splits again")
    if split.get("behavior") != "Isolated" or split.get("invert"):
        raise Unsupported(f"a {split.get('behavior')} split (invert={split.get('invert')})")
    regex = (split.get("pattern") or {}).get("Regex")
    if not isinstance(regex, str):
        raise Unsupported("a split on a plain string")
    return regex, bool(norms)


#: built BPE tables by (SHA-256 of the model's state, split regex): a tokenizer loaded again, or a
#: codec rebuilt after an added token, reuses them (the model's own checks take seconds)
_BUILT: OrderedDict[tuple[str, str], tuple[tiktoken.Encoding, list[int] | None, frozenset[str]]] = OrderedDict()
_BUILT_LIMIT = 8
_BUILT_LOCK = threading.Lock()


def _encoding(backend: Any, regex: str) -> tuple[tiktoken.Encoding, list[int] | None, frozenset[str]]:
    """tiktoken's encoding of the model's BPE with ``regex``, the rank -> ID list (None when the
    ranks are the IDs) and the multi-byte tokens no merge makes (kept, per model, in :data:`_BUILT`)."""
    state = backend.model.__getstate__()
    key = (hashlib.sha256(state.encode("utf-8") if isinstance(state, str) else state).hexdigest(), regex)
    with _BUILT_LOCK:
        if key in _BUILT:
            _BUILT.move_to_end(key)
            return _BUILT[key]
    ranks, id_of, unmerged = _ranks(backend.model, json.loads(state))
    encoding = tiktoken.Encoding(name=f"tmpl-{key[0][:12]}", pat_str=regex, mergeable_ranks=ranks, special_tokens={})
    with _BUILT_LOCK:
        _BUILT[key] = (encoding, id_of, unmerged)
        while len(_BUILT) > _BUILT_LIMIT:
            _BUILT.popitem(last=False)
    return encoding, id_of, unmerged


def _ranks(model: Any, state: dict[str, Any]) -> tuple[dict[bytes, int], list[int] | None, frozenset[str]]:
    """tiktoken's ranks of the model's byte-level tokens, the rank -> ID list (None when the ranks
    are the IDs) and the multi-byte tokens no merge makes. Unsupported where tiktoken's BPE would
    differ from the model's."""
    vocab: dict[str, int] = state["vocab"]
    merges = state["merges"]
    pairs = [m if isinstance(m, list) else m.split(" ", 1) for m in merges]
    order = list(dict.fromkeys(a + b for a, b in pairs))  # merge results, first producing merge first
    table = {ord(c): b for b, c in byte_chars().items()}
    table.update({cp: 0x10FFFF for cp in range(0x144) if cp not in table})  # not in the alphabet
    raw: dict[str, bytes] = {}
    for token in vocab:
        try:
            raw[token] = token.translate(table).encode("latin-1")
        except UnicodeEncodeError:
            continue  # a character outside the byte alphabet: byte-level BPE never yields it
    singles = {token for token, b in raw.items() if len(b) == 1}
    if len(singles) != 256:
        raise Unsupported(f"{256 - len(singles)} of the 256 single bytes are not in the vocabulary")
    results = set(order)
    if any(r not in vocab for r in order):
        raise Unsupported("a merge result that is not in the vocabulary")
    unmerged = frozenset(t for t, b in raw.items() if len(b) > 1 and t not in results)
    ids = [vocab[r] for r in order]
    top_single = max(vocab[t] for t in singles)
    monotone = all(x < y for x, y in zip(ids, ids[1:])) and (not ids or ids[0] > top_single)
    if not state.get("ignore_merges", False):
        _check_self_encoding(model, [r for r in order if r in raw], vocab)
    if monotone:
        ranks = {raw[t]: vocab[t] for t in singles}
        ranks.update((raw[r], vocab[r]) for r in order if r in raw)
        return ranks, None, unmerged
    ranks = {raw[t]: raw[t][0] for t in singles}
    id_of = [0] * (256 + len(order))
    for t in singles:
        id_of[raw[t][0]] = vocab[t]
    for k, r in enumerate(order):
        if r in raw:
            ranks[raw[r]] = 256 + k
        id_of[256 + k] = vocab[r]
    return ranks, id_of, unmerged


def _check_self_encoding(model: Any, tokens: list[str], vocab: dict[str, int]) -> None:
    """Without ``ignore_merges`` the model BPE-merges a whole piece that is a token, where tiktoken
    looks it up: the same only when each token BPE-encodes to itself. Asked of the model in one batch."""
    import tokenizers

    bare = tokenizers.Tokenizer(model)  # no normalizer, no pre-tokenizer: each string is one word
    bad: list[str] = []
    for start in range(0, len(tokens), 4096):  # in chunks: 150,000 encodings at once hold ~200 MB
        chunk = tokens[start : start + 4096]
        encodings = bare.encode_batch_fast(chunk, add_special_tokens=False)
        bad += [t for t, enc in zip(chunk, encodings) if enc.ids != [vocab[t]]]
    clear = getattr(model, "_clear_cache", None)
    if clear is not None:
        clear()  # the check's words would fill the model's word cache, leaving no room for the user's
    if bad:
        raise Unsupported(f"{len(bad)} tokens do not BPE-encode to themselves (e.g. {bad[0]!r})")


class FastEncoder:
    """Encode text to the tokenizer's IDs with tiktoken (see the module docstring)."""

    def __init__(
        self, encoding: tiktoken.Encoding, id_of: list[int] | None, nfc: bool, raw: AddedCutter, normalized: AddedCutter
    ) -> None:
        self.encoding = encoding
        core = getattr(encoding, "_core_bpe", None)  # tiktoken's Rust object: skips a Python wrapper per call
        self._encode: Callable[[str], list[int]] = getattr(core, "encode_ordinary", encoding.encode_ordinary)
        self._id_of = id_of
        self._nfc = nfc
        self._raw = raw
        self._normalized = normalized
        self._odd_bmp, self._odd_astral = (c.search for c in _odd_classes())
        #: neither kind of added token to cut at, and the ranks are the IDs: one call per ASCII text
        self._plain = id_of is None and not raw.first and not normalized.first

    @classmethod
    def build(cls, backend: Any) -> FastEncoder | Decline:
        """The encoder of a ``tokenizers.Tokenizer``, checked against it on :func:`check_corpus`;
        a :class:`Decline` (never an exception) where it does not reproduce the tokenizer."""
        try:
            return cls._build(backend)
        except Unsupported as exc:
            return Decline(str(exc))
        except Exception as exc:  # noqa: BLE001 - any failure of the build declines, the tokenizer encodes
            return Decline(f"the build raised {type(exc).__name__}: {exc}")

    @classmethod
    def _build(cls, backend: Any) -> FastEncoder:
        if backend.truncation is not None or backend.padding is not None:
            raise Unsupported("the tokenizer truncates or pads")
        if backend.encode_special_tokens:
            raise Unsupported("encode_special_tokens is set (added tokens are encoded as text)")
        regex, nfc = _split_regex(pipeline_of(backend))
        check(regex)
        added = list(backend.get_added_tokens_decoder().items())
        odd = [t.content for _, t in added if t.lstrip or t.single_word]
        if odd:
            raise Unsupported(f"{len(odd)} added tokens with lstrip or single_word (e.g. {odd[0]!r})")
        encoding, id_of, unmerged = _encoding(backend, regex)
        stray = sorted(unmerged - {t.content for _, t in added})
        if stray and getattr(backend.model, "ignore_merges", False):
            raise Unsupported(f"{len(stray)} tokens no merge makes, which ignore_merges would find (e.g. {stray[0]!r})")
        raw = AddedCutter((t.content, tid, bool(t.rstrip)) for tid, t in added if not t.normalized)
        norm = AddedCutter(
            (unicodedata.normalize("NFC", t.content) if nfc else t.content, tid, bool(t.rstrip))
            for tid, t in added
            if t.normalized
        )
        enc = cls(encoding, id_of, nfc, raw, norm)
        contents = [t.content for _, t in added]
        for text in check_corpus(contents):
            fast = enc.encode(text)
            if fast is not None and fast != backend.encode(text, add_special_tokens=False).ids:
                raise Unsupported(f"the check text {text!r} encodes differently")
        return enc

    def encode(self, text: str) -> list[int] | None:
        """The IDs of ``text``, or None when the tokenizer must encode it (see the module docstring)."""
        if len(text) > MAX_CHARS:
            return None
        raw = self._raw
        if text.isascii():
            if self._plain:
                return self._encode(text)
            if raw.may_hold(text) is None and self._normalized.may_hold(text) is None:
                return self._bpe(text)
        elif self._odd_bmp(text) is not None or (
            _ASTRAL.search(text) is not None and self._odd_astral(text) is not None
        ):
            return None
        if raw.may_hold(text) is None:
            return self._gap(text)
        out: list[int] = []
        for piece in raw.split(text):
            if isinstance(piece, int):
                out.append(piece)
            else:
                out += self._gap(piece)
        return out

    def _gap(self, text: str) -> list[int]:
        """IDs of text between non-normalized added tokens: normalized, cut at normalized ones, encoded."""
        if self._nfc and not text.isascii():
            text = unicodedata.normalize("NFC", text)
        cut = self._normalized
        if cut.may_hold(text) is None:
            return self._bpe(text)
        out: list[int] = []
        for piece in cut.split(text):
            if isinstance(piece, int):
                out.append(piece)
            else:
                out += self._bpe(piece)
        return out

    def _bpe(self, text: str) -> list[int]:
        ranks = self._encode(text)
        id_of = self._id_of
        return ranks if id_of is None else [id_of[r] for r in ranks]


def check_corpus(added: list[str] | None = None) -> list[str]:
    """Awkward texts the build encodes both ways: scripts, emoji sequences, combining marks, every
    White_Space code point, digits of several scripts, case folds (ſ K ß İ ﬀ), contractions in
    mixed case, white space runs before letters and line breaks, JSON, one character of each
    general category in several contexts, and added tokens in context.

    >>> len(check_corpus()) > 50
    True
    """
    texts = [
        "",
        "I'm sure it's theirs; they'll say we've 'd 'S 'T 'RE 'VE 'M 'LL 'D it'ſ IT'ſ we'K",
        "  two spaces\n\n\nthree breaks \r\n\tx  \n  y   \n \n\t\n",
        '{"a": [1, 22, 333, 4444, 55555], "b": -0.125e+10, "c": "x\\ny", "d": null}',
        "Zürich São Paulo Reykjavík Montréal Kraków Łódź İstanbul ½ ¾ ² ³ µ ª º ß ÿ",
        "Москва Αθήνα 東京都 北京市 서울 القاهرة תל אביב मुंबई กรุงเทพ ኢትዮጵያ Ελληνικά",
        "👩‍👩‍👧‍👦 🏳️‍🌈 👍🏽 🇫🇷 ❤️ 🙂🙃 ✈︎",
        "e\u0301 a\u0308 n\u0303 \u0301x Å Å ḱ q\u0307\u0323 \u1100\u1161\u11a8 한",
        "ſ ſſ K Kelvin ß SS ẞ İi ı ﬀ ﬁ ﬂ ﬃ ﬅ Ǆ ǅ ǆ",
        "٠١٢٣ ०१२३ ０１２３ ൧൨ 𝟘𝟙 ¹²³ Ⅻ ⅷ 12345678",
        "!!!???...,,,;;;:::---___***///\\\\\\|||<<>>",
        "\x00\x01\x1f\x7f\x80\x9f\x85\xad text with controls \u200b\u200d\ufeff",
        "abc123def 4567 89ab  'sx 'ss 'ß ''S's",
    ]
    spaces = "".join(chr(cp) for cp in sorted(WHITE_SPACE)) + "\x1c\x1d\x1e\x1f"
    texts += [f"a{s}b {s}{s}c\n{s}" for s in spaces]
    texts.append(spaces + "x" + spaces)
    for c in _category_samples():
        texts.append(f"x{c}x {c}7{c} a{c}\n{c}{c}'s {c}")
    for content in (added or [])[:64]:
        texts += [f"a {content} b", f"{content}\n  x{content}{content}  ", f"é{content}é"]
    return texts


@functools.cache
def _category_samples() -> tuple[str, ...]:
    """The first two code points of each general category (Cn and Cs left out)."""
    seen: dict[str, list[str]] = {}
    for cp in range(0x30000):
        cat = unicodedata.category(chr(cp))
        if cat not in ("Cn", "Cs") and len(seen.setdefault(cat, [])) < 2:
            seen[cat].append(chr(cp))
    return tuple(c for chars in seen.values() for c in chars)
