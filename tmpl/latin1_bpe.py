"""Exact byte-level BPE IDs of Latin-1 text, in Python, for the regex-split pipelines.

``tokenizers`` spends most of an encode in its pre-tokenizer's regex (Oniguruma): on tool
results (JSON of 50-2,000 characters) about 145 us of CPU per 450 characters on Qwen2.5,
three quarters of it splitting. For text whose characters all lie in Latin-1 (U+0000-U+00FF,
every character of ASCII JSON and of most European text), the split regex's Unicode classes
reduce to fixed sets of 256 code points, and Python's ``re`` runs the same leftmost-first
backtracking search over them. Each pre-token is then a word that BPE encodes alone, the same
word every time: its IDs are asked of the tokenizer's own model once and kept. The result is
the tokenizer's IDs, not an approximation: about 27 us for the same 450 characters.

It serves a pipeline only when every step is one this module reproduces exactly
(:meth:`Latin1Encoder.build` says why not otherwise): a BPE model without dropout; no
normalizer, or NFC (the identity on Latin-1 text); ``Isolated`` ``Split`` pre-tokenizers (one, or
several in sequence as DeepSeek V3's) on regexes whose every construct is translated
(``\\p{L}``-style classes, ``\\s``), followed by a ``ByteLevel`` step that only maps bytes (or a
``ByteLevel`` step alone, splitting with GPT-2's regex). A text is encoded here only when it is Latin-1, holds no added token's text (the
tokenizer would cut it there first) and the split covers it whole; anything else is left to the
tokenizer (``encode`` returns None). On build, a fixed corpus of awkward strings is encoded both
ways, and any difference leaves the tokenizer in charge. The pipeline and the added tokens are
read once, on build, like the rest of a codec: a tokenizer given new tokens afterwards needs a new
codec (and template).

>>> enc = Latin1Encoder.build(tokenizer.backend_tokenizer)  # doctest: +SKIP
>>> text = '{"city": "Zürich", "temp": 21.5}'
>>> enc.encode(text) == tokenizer(text, add_special_tokens=False)["input_ids"]  # doctest: +SKIP
True
"""

from __future__ import annotations

import json
import re
import string
import unicodedata
from collections.abc import Iterable
from typing import Any

#: Unicode White_Space within Latin-1 (what ``\\s`` matches in the tokenizer's regex engine)
WHITE_SPACE = frozenset((0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0))

#: the split ``ByteLevel(use_regex=True)`` runs (GPT-2's; the ``tokenizers`` source holds the same)
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

#: words kept (pre-token -> IDs) before the cache starts again; a tool result has ~150 words
CACHE_LIMIT = 1 << 17


class Unsupported(ValueError):
    """A pipeline step or regex construct this module does not reproduce (the tokenizer encodes)."""


def _category_codes(prefix: str) -> list[int]:
    """Latin-1 code points whose general category starts with ``prefix`` (``L``, ``Lu``, ``N``, ...)."""
    return [cp for cp in range(256) if unicodedata.category(chr(cp)).startswith(prefix)]


#: the property classes of the split regexes in use, as Latin-1 code point sets
_PROPERTIES = {name: _category_codes(name) for name in ("L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "N", "P", "S")}


def _class_body(codes: Iterable[int]) -> str:
    """A character-class body (no brackets) matching exactly ``codes``, as ``\\xNN`` ranges."""
    out: list[str] = []
    run: list[int] = []
    for cp in sorted(set(codes)):
        if run and cp == run[-1] + 1:
            run.append(cp)
            continue
        if run:
            out.append(_range(run[0], run[-1]))
        run = [cp]
    if run:
        out.append(_range(run[0], run[-1]))
    return "".join(out)


def _range(lo: int, hi: int) -> str:
    return f"\\x{lo:02x}" if lo == hi else f"\\x{lo:02x}-\\x{hi:02x}"


_SPACE = _class_body(WHITE_SPACE)
_NOT_SPACE = _class_body(set(range(256)) - WHITE_SPACE)
#: escapes both engines read alike, inside and outside a class: control characters and escaped
#: ASCII punctuation (a literal in both)
_PLAIN_ESCAPES = set("rntfv") | set(string.punctuation)


def translate(pattern: str) -> str:
    """The Python ``re`` pattern that splits Latin-1 text as the tokenizer's regex ``pattern`` does.

    ``\\p{X}`` and ``\\s`` become explicit Latin-1 sets (inside a class, their members;
    outside, a class of them; ``\\P{X}`` and ``\\S`` outside, its complement); every other
    escape must be one both engines read alike. Raises :class:`Unsupported` otherwise, or for a
    capturing group (the split keeps whole matches).

    >>> print(translate(r"\\p{N}{1,3}"))
    [\\x30-\\x39\\xb2-\\xb3\\xb9\\xbc-\\xbe]{1,3}
    """
    out: list[str] = []
    i, in_class, n = 0, False, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            if i + 1 >= n:
                raise Unsupported(f"a trailing backslash in {pattern!r}")
            esc = pattern[i + 1]
            if esc in "pP":
                m = re.match(r"\{(\w+)\}", pattern[i + 2 :])
                if m is None or m.group(1) not in _PROPERTIES:
                    raise Unsupported(f"the class {pattern[i : i + 8]!r}... in {pattern!r}")
                codes = _PROPERTIES[m.group(1)]
                i += 2 + m.end()
                if esc == "P":
                    if in_class:
                        raise Unsupported(f"a negated property inside a class in {pattern!r}")
                    codes = sorted(set(range(256)) - set(codes))
                body = _class_body(codes)
                out.append(body if in_class else f"[{body}]")
                continue
            if esc in "sS":
                if in_class and esc == "S":
                    raise Unsupported(f"\\S inside a class in {pattern!r}")
                body = _SPACE if esc == "s" else _NOT_SPACE
                out.append(body if in_class else f"[{body}]")
                i += 2
                continue
            if esc not in _PLAIN_ESCAPES:
                raise Unsupported(f"the escape \\{esc} in {pattern!r}")
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            if ch == "[" or pattern.startswith("&&", i):
                raise Unsupported(f"a nested class or class intersection in {pattern!r}")
            if ch == "]":
                in_class = False
        elif ch == "[":
            in_class = True
            out.append(ch)
            i += 1
            if pattern[i : i + 1] == "^":
                out.append("^")
                i += 1
            if pattern[i : i + 1] == "]":
                raise Unsupported(f"a class starting with ']' in {pattern!r}")
            continue
        elif ch == "(":
            if not pattern.startswith("(?", i):
                raise Unsupported(f"a capturing group in {pattern!r}")
            _check_group(pattern, i)
        elif ch in "^$":  # line anchors in the tokenizer's engine, string anchors in Python's
            raise Unsupported(f"the anchor {ch!r} in {pattern!r}")
        out.append(ch)
        i += 1
    if in_class:
        raise Unsupported(f"an unclosed class in {pattern!r}")
    return "".join(out)


def _any_of(words: list[str]) -> re.Pattern[str]:
    """A pattern that finds any of ``words``, written as a trie: Mistral Nemo's 1,000 added tokens
    start with ``<`` or ``[``, and a plain alternation tries every one at each ``[`` of a JSON text."""
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}  # a word ends here

    def emit(node: dict[str, Any]) -> str:
        if "" in node:
            return ""  # a word ends here: finding it is enough, longer ones need not be tried
        alts = [re.escape(ch) + emit(child) for ch, child in sorted(node.items())]
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    return re.compile(emit(trie))


def _compiled(regex: str) -> re.Pattern[str]:
    """``translate(regex)`` compiled; Unsupported where Python refuses it, it has a group or it
    matches the empty string (the split's pieces would differ)."""
    try:
        pattern = re.compile(translate(regex))
    except re.error as exc:  # e.g. a variable-width lookbehind, which Python refuses
        raise Unsupported(f"Python's re does not take {regex!r}: {exc}") from None
    if pattern.groups:
        raise Unsupported(f"a group in {regex!r} (the split keeps whole matches)")
    if pattern.search("") is not None:
        raise Unsupported(f"{regex!r} matches the empty string")
    return pattern


def _check_group(pattern: str, i: int) -> None:
    """The ``(?`` construct at ``i`` means the same in both engines: non-capturing, lookaround,
    atomic, or the ``i`` flag (``m`` is dot-all in the tokenizer's engine but multi-line in
    Python's; other flags are refused too). Raises :class:`Unsupported` otherwise."""
    rest = pattern[i + 2 :]
    if rest[:1] in (":", "=", "!", ">") or rest[:2] in ("<=", "<!"):
        return
    flags = re.match(r"([A-Za-z-]*)[:)]", rest)
    if flags is None or set(flags.group(1)) - {"i"}:
        raise Unsupported(f"the group {pattern[i : i + 6]!r}... in {pattern!r}")


def byte_chars() -> dict[int, str]:
    """GPT-2's byte-level alphabet: the character that stands for each byte in a byte-level BPE
    vocabulary (printable Latin-1 for itself, the rest from U+0100 on, in byte order).

    >>> byte_chars()[ord(" ")], byte_chars()[ord("a")]
    ('Ġ', 'a')
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


#: translate() table over a piece's UTF-8 bytes read as Latin-1 (one character per byte)
_BYTE_CHARS = str.maketrans({chr(b): c for b, c in byte_chars().items()})


def _state(part: Any) -> dict[str, Any] | None:
    """A pipeline step as ``tokenizer.json`` writes it (None when the tokenizer has none)."""
    return None if part is None else dict(json.loads(part.__getstate__()))


def pipeline_of(backend: Any) -> dict[str, Any]:
    """The parts of a ``tokenizers.Tokenizer``'s pipeline that decide how text splits, as
    ``tokenizer.json`` writes them, without serialising the vocabulary: the model's type and BPE
    settings, the normalizer, the pre-tokenizer."""
    model = backend.model
    return {
        "model": {
            "type": type(model).__name__,
            "dropout": getattr(model, "dropout", None),
            "continuing_subword_prefix": getattr(model, "continuing_subword_prefix", None),
            "end_of_word_suffix": getattr(model, "end_of_word_suffix", None),
        },
        "normalizer": _state(backend.normalizer),
        "pre_tokenizer": _state(backend.pre_tokenizer),
    }


def steps_of(step: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    """A normalizer's (``key="normalizers"``) or pre-tokenizer's (``"pretokenizers"``) steps: a
    ``Sequence``'s members, else the step alone (none when absent)."""
    if step is None:
        return []
    return list(step.get(key, [step])) if step.get("type") == "Sequence" else [step]


def _steps(pipeline: dict[str, Any]) -> list[str]:
    """The split regexes of a pipeline this module reproduces, in order; raises :class:`Unsupported` otherwise."""
    model, norm, pre = pipeline.get("model") or {}, pipeline.get("normalizer"), pipeline.get("pre_tokenizer")
    if model.get("type") != "BPE":
        raise Unsupported(f"the model is {model.get('type')}, not BPE")
    if model.get("dropout") not in (None, 0, 0.0):
        raise Unsupported("BPE dropout makes the IDs random")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise Unsupported("BPE with subword affixes")
    if any(n.get("type") != "NFC" for n in steps_of(norm, "normalizers")):
        raise Unsupported(f"the normalizer {norm!r} may change Latin-1 text")
    if pre is None:
        raise Unsupported("no pre-tokenizer")
    steps = steps_of(pre, "pretokenizers")
    if len(steps) == 1 and steps[0].get("type") == "ByteLevel" and steps[0].get("use_regex", True):
        if steps[0].get("add_prefix_space"):
            raise Unsupported("a ByteLevel step that adds a prefix space")
        return [GPT2_SPLIT]  # ByteLevel's own split
    kinds = [s.get("type") for s in steps]
    if len(steps) < 2 or kinds[-1] != "ByteLevel" or any(k != "Split" for k in kinds[:-1]):
        raise Unsupported(f"the pre-tokenizer steps {kinds} (Split steps, then ByteLevel)")
    level = steps[-1]
    if level.get("add_prefix_space") or level.get("use_regex"):
        raise Unsupported("a ByteLevel step that adds a prefix space or splits again")
    regexes = []
    for split in steps[:-1]:
        if split.get("behavior") != "Isolated" or split.get("invert"):
            raise Unsupported(f"a {split.get('behavior')} split (invert={split.get('invert')})")
        regex = (split.get("pattern") or {}).get("Regex")
        if not isinstance(regex, str):
            raise Unsupported("a split on a plain string")
        regexes.append(regex)
    return regexes


class Latin1Encoder:
    """Encode Latin-1 text to the IDs the tokenizer gives it (see the module docstring)."""

    def __init__(self, backend: Any, regexes: list[str]) -> None:
        self.backend = backend
        self.patterns = [_compiled(regex) for regex in regexes]
        #: one split: its matches (a gap declines the text); several: each splits the last one's
        #: pieces, gaps kept as pieces (``Isolated``), through a split on the pattern as one group
        self._split = self.patterns[0].findall if len(regexes) == 1 else None
        self._splits = [] if self._split else [re.compile(f"({p.pattern})").split for p in self.patterns]
        self._tokenize = backend.model.tokenize
        #: added tokens by first character: a text holding one is left to the tokenizer
        contents = [t.content for t in backend.get_added_tokens_decoder().values() if t.content]
        self._added_first = "".join(sorted({c[0] for c in contents}))
        self._added = _any_of(contents) if contents else None
        self._words: dict[str, list[int]] = {}

    @classmethod
    def build(cls, backend: Any) -> Latin1Encoder:
        """The encoder of a ``tokenizers.Tokenizer``, checked against it on a fixed corpus.

        Raises :class:`Unsupported` (with the reason) when the pipeline has a step this module
        does not reproduce, or when the check finds a text it encodes differently.
        """
        if backend.truncation is not None or backend.padding is not None:
            raise Unsupported("the tokenizer truncates or pads")
        regexes = _steps(pipeline_of(backend))
        enc = cls(backend, regexes)
        for text in check_corpus():
            fast = enc.encode(text)
            if fast is not None and fast != backend.encode(text, add_special_tokens=False).ids:
                raise Unsupported(f"the check text {text!r} encodes differently")
        return enc

    def encode(self, text: str) -> list[int] | None:
        """The IDs of ``text``, or None when the tokenizer must encode it (not Latin-1, holds an
        added token's text, or a character no split alternative matches)."""
        if not text.isascii():
            try:
                text.encode("latin-1")
            except UnicodeEncodeError:
                return None
        added = self._added
        if added is not None:
            for c in self._added_first:
                if c in text:
                    if added.search(text) is not None:
                        return None
                    break
        if self._split is not None:
            pieces = self._split(text)
            if len("".join(pieces)) != len(text):  # a gap the split did not match: the tokenizer keeps it
                return None
        else:
            pieces = self._pieces(text)
        words = self._words
        get = words.get
        out: list[int] = []
        for piece in pieces:
            ids = get(piece)
            if ids is None:
                ids = self._word(piece)
            out += ids
        return out

    def _pieces(self, text: str) -> list[str]:
        """The pre-tokens of several ``Isolated`` splits in sequence: matches and the gaps between them."""
        pieces = [text]
        for split in self._splits:
            pieces = [part for piece in pieces for part in split(piece) if part]
        return pieces

    def _word(self, piece: str) -> list[int]:
        """BPE of one pre-token by the tokenizer's model (its bytes in the byte-level alphabet), kept."""
        ids = [tok.id for tok in self._tokenize(piece.encode("utf-8").decode("latin-1").translate(_BYTE_CHARS))]
        words = self._words
        if len(words) >= CACHE_LIMIT:
            words.clear()
        words[piece] = ids
        return ids


def check_corpus() -> list[str]:
    """Awkward Latin-1 strings the build check encodes both ways: contractions in both cases,
    whitespace runs before letters and line breaks, digits, punctuation runs, each Latin-1
    character next to a letter, a digit, a space and an apostrophe."""
    texts = [
        "",
        "I'm sure it's theirs; they'll say we've 'd 'S 'T 'RE 'VE 'M 'LL 'D",
        "  two spaces\n\n\nthree breaks \r\n\tx  \n  y   ",
        '{"a": [1, 22, 333, 4444, 55555], "b": -0.125e+10, "c": "x\\ny"}',
        "Zürich São Paulo Reykjavík Montréal ½ ¾ ² ³ ¹ µ ª º ß ÿ \xa0\x85 nbsp",
        "!!!???...,,,;;;:::---___***///\\\\\\|||",
        "\x00\x01\x1f\x7f\x80\x9f text with controls",
        "abc123def 4567 89ab  'sx 'ss 'ß ''S's",
    ]
    letters = "aZé½1 '\n"
    for cp in range(256):
        c = chr(cp)
        texts.append("".join(f"{x}{c}{c}{x}" for x in letters))
    return texts
