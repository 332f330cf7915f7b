"""Text to token IDs through the ``tokenizers`` backend of a Hugging Face tokenizer.

The codec is the only place tmpl tokenizes. It also knows the tokenizer's added
tokens, and which of them split text cleanly ("atoms"): the tokenizer cuts the
text at an atom before anything else runs, so IDs on the two sides of an atom
never depend on each other. Splicing at atoms is what makes suffixes exact.

An atom may strip whitespace on its right (``rstrip``, Phi's ``<|end|>``): tmpl
always encodes the text after an atom together with the atom itself, so the
stripping happens exactly as in a full render. It may not strip on its left
(the text before it would lose whitespace), match single words only, or be
matched after normalization.

A codec reads the tokenizer once; a tokenizer changed afterwards (tokens added, dropout, a new
normalizer or pre-tokenizer) makes every encode raise :class:`~tmpl.errors.TokenizerChangedError`
(see :mod:`tmpl.tokenize.stamp`), and :func:`codec_for` builds a new codec for it.

>>> codec = codec_for(tokenizer)  # doctest: +SKIP
>>> codec.encode("<|im_end|>\\n")  # doctest: +SKIP
[151645, 198]
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from ..errors import TmplError, TokenizerChangedError
from .fast import FastEncoder
from .pipeline import pipeline_of, steps_of
from .stamp import Stamp


@dataclass(frozen=True)
class AddedTokenInfo:
    id: int
    content: str
    special: bool
    atom: bool  # splits text cleanly on its left and right (see Codec)


class Codec:
    """Tokenize text exactly as ``tokenizer(text, add_special_tokens=False)`` does, but faster.

    The tokenizer is read once, when the codec is made: its added tokens, vocabulary size and
    pipeline, and a :class:`~tmpl.tokenize.stamp.Stamp` of what decides its IDs. Every encode
    (:meth:`encode`, :meth:`encode_many`, :meth:`encode_shared`, :meth:`encode_reference`,
    :meth:`encode_with_offsets`) first compares the stamp, and raises
    :class:`~tmpl.errors.TokenizerChangedError` naming what changed (a token added, dropout, the
    normalizer or pre-tokenizer replaced...): make a new ``ChatTemplate`` (``codec_for`` then
    builds a new codec). A change undone (dropout set back) reads as no change. Truncation or
    padding set since are no error: the backend then encodes every text, applying them.

    The per-call stamp does not see flags changed on an existing added token, nor an added token
    whose text the vocabulary already holds (neither changes the vocabulary size): ``codec_for``
    does (it compares the added tokens whole), so a new ``ChatTemplate`` is always right.

    ``fast``: encode with the tiktoken encoder (:mod:`tmpl.tokenize.fast`) where it reproduces
    the pipeline (the tokenizer's own IDs at a fraction of its CPU); False sends every text to the
    backend. The default is on, unless the environment sets ``TMPL_FAST_ENCODE=0`` (read when the
    codec is made).

    >>> from transformers import AutoTokenizer  # doctest: +SKIP
    >>> codec = Codec(AutoTokenizer.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct"))  # doctest: +SKIP
    >>> codec.encode("<|im_end|>\\n")  # doctest: +SKIP
    [151645, 198]
    """

    def __init__(self, tokenizer: Any, fast: bool | None = None) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise TmplError(
                f"{type(tokenizer).__name__} has no `tokenizers` backend; tmpl needs a fast tokenizer "
                "(load it with AutoTokenizer.from_pretrained(..., use_fast=True))"
            )
        self.name = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
        self.backend = backend
        self.stamp = Stamp(backend)
        self._same = self.stamp.same
        self._encode = backend.encode
        #: the batch call that skips character offsets (``encode_batch_fast``, tokenizers >= 0.21);
        #: the same IDs, 10-30% less time than ``encode`` on 100+ characters
        self._encode_ids = getattr(backend, "encode_batch_fast", backend.encode_batch)
        has_normalizer = backend.normalizer is not None
        decoder = backend.get_added_tokens_decoder()
        #: the added tokens whole (ID, content and flags), as ``codec_for`` compares them
        self.added_state = added_state(decoder)
        self.added: dict[int, AddedTokenInfo] = {}
        for tid, tok in decoder.items():
            atom = not (tok.lstrip or tok.single_word or (tok.normalized and has_normalizer))
            self.added[tid] = AddedTokenInfo(tid, tok.content, bool(tok.special), atom)
        self.added_by_text: dict[str, int] = {info.content: tid for tid, info in self.added.items()}
        self.atom_ids: frozenset[int] = frozenset(tid for tid, info in self.added.items() if info.atom)
        self.special_ids: frozenset[int] = frozenset(tid for tid, info in self.added.items() if info.special)
        #: atoms that can close a turn: not whitespace alone (Gemma's "\n" added tokens never close one)
        self.close_ids: frozenset[int] = frozenset(tid for tid in self.atom_ids if self.added[tid].content.strip())
        self.vocab_size: int = self.stamp.vocab_size
        self._hash: str | None = None
        self._regex_byte_level: bool | None = None
        self._atom_pattern: re.Pattern[str] | None = None
        #: what layers above learn once per tokenizer pipeline (e.g. the suffix engine's verified cuts)
        self.memo: dict[str, Any] = {}
        if fast is None:
            fast = os.environ.get("TMPL_FAST_ENCODE", "1") != "0"
        self._fast: FastEncoder | None = None
        self._fast_built = not fast
        #: texts the tokenizer still encodes before the fast encoder is built (see FAST_AFTER_TEXTS)
        self._until_fast = self.FAST_AFTER_TEXTS
        #: why the tokenizer encodes every text (None while the fast encoder serves, or before it is built)
        self.fast_reason: str | None = None if fast else "turned off (Codec(..., fast=False) or TMPL_FAST_ENCODE=0)"

    #: The fast encoder's build takes 1-4 s on a 2-core machine (the model's own check of every
    #: token): it is built once the tokenizer has encoded this many texts of this codec, where it
    #: starts to pay (a rollout passes it in its first turn), so a short-lived process (a budgeted
    #: template check in its worker, ``tmpl check``) never pays it. :attr:`fast` builds it at once.
    FAST_AFTER_TEXTS = 256

    @property
    def fast(self) -> FastEncoder | None:
        """The tiktoken encoder (:mod:`tmpl.tokenize.fast`), or None where it does not reproduce
        the pipeline (:attr:`fast_reason` says why). Built on first use."""
        if not self._fast_built:
            built = FastEncoder.build(self.backend)
            if isinstance(built, FastEncoder):
                self._fast = built
            else:
                self.fast_reason = built.reason
            self._fast_built = True
        return self._fast

    @property
    def regex_byte_level(self) -> bool:
        """Whether BPE runs inside regex-split pre-tokens, so IDs never merge across a pre-token edge.

        True for byte-level BPE behind ``Split`` pre-tokenizers (or ``ByteLevel(use_regex=True)``),
        with no normalizer but NFC, and added tokens that strip nothing and match the raw text.
        The suffix engine cuts frame text off a content only under this pipeline (see
        :mod:`tmpl.suffix.cuts`).
        """
        if self._regex_byte_level is None:
            self._regex_byte_level = _is_regex_byte_level(pipeline_of(self.backend), self.backend)
        return self._regex_byte_level

    def check(self) -> None:
        """Raise :class:`~tmpl.errors.TokenizerChangedError` if the tokenizer changed since the
        codec was made (see the class docstring)."""
        if not self._same():
            raise TokenizerChangedError(self.name, self.stamp.changes())

    def _fast_now(self, texts: int = 1) -> FastEncoder | None:
        """:attr:`fast` after :meth:`check` (once ``texts`` more texts pass :data:`FAST_AFTER_TEXTS`),
        unless the backend was set to truncate or pad since (it then encodes every text itself)."""
        if not self._same():
            raise TokenizerChangedError(self.name, self.stamp.changes())
        backend = self.backend
        if backend.truncation is not None or backend.padding is not None:
            return None
        if self._fast_built:
            return self._fast
        self._until_fast -= texts
        return self.fast if self._until_fast <= 0 else None

    def encode(self, text: str) -> list[int]:
        """Token IDs of ``text`` with no BOS/EOS added."""
        fast = self._fast_now()
        if fast is not None:
            got = fast.encode(text)
            if got is not None:
                return got
        ids: list[int] = self._encode(text, add_special_tokens=False).ids
        return ids

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        """Token IDs of several texts (or one), without offsets.

        The hot path of suffixes and prompts. Text goes through :attr:`fast` where the pipeline
        allows (the tokenizer's own IDs at a fraction of its CPU: JSON tool results of ~211
        characters, 24-26 us against 157-209 us); the rest in one call into the backend:
        ``encode_batch_fast`` computes no character offsets, which makes it faster than
        ``encode`` from about 100 characters on, and runs a batch on the backend's thread pool.

        >>> codec.encode_many(["<|im_end|>\\n", "hi"])  # doctest: +SKIP
        [[151645, 198], [6023]]
        """
        fast = self._fast_now(len(texts))
        if fast is None:
            return [enc.ids for enc in self._encode_ids(texts, add_special_tokens=False)]
        out = [fast.encode(text) for text in texts]
        rest = [k for k, ids in enumerate(out) if ids is None]
        if rest:
            for k, enc in zip(rest, self._encode_ids([texts[k] for k in rest], add_special_tokens=False)):
                out[k] = enc.ids
        return out  # type: ignore[return-value]

    #: A shared prefix shorter than this is encoded with each text (not worth the cut).
    SHARED_PREFIX_MIN_CHARS = 256

    def encode_shared(self, texts: list[str]) -> list[list[int]]:
        """IDs of many texts, the prefix they all share encoded once.

        Prompts of one dataset share their system prompt and tool schemas (often 2,000+
        characters before a short user message). The shared prefix is cut right after its last
        added token, where the tokenizer splits text before anything else runs, and only under
        a pipeline where that cut is exact (:attr:`regex_byte_level`, no added token spanning
        the cut); the first text is encoded whole as a check, and any mismatch falls back to
        encoding every text whole. The IDs are those of :meth:`encode_many`, always.

        >>> codec.encode_shared([system + "<|im_start|>user\\nhi", system + "<|im_start|>user\\nyo"])  # doctest: +SKIP
        """
        self.check()
        cut = self._shared_cut(texts)
        if cut == 0:
            return self.encode_many(texts)
        encoded = self.encode_many([texts[0][:cut], texts[0], *(t[cut:] for t in texts)])
        head, check, rests = encoded[0], encoded[1], encoded[2:]
        if head + rests[0] != check:  # pragma: no cover - the conditions above make the cut exact
            return self.encode_many(texts)
        return [head + ids for ids in rests]

    def _shared_cut(self, texts: list[str]) -> int:
        """Where the texts' shared prefix can be cut exactly (0: nowhere worth it)."""
        if len(texts) < 2 or not self.regex_byte_level:
            return 0
        prefix = os.path.commonprefix(texts)
        if len(prefix) < self.SHARED_PREFIX_MIN_CHARS:
            return 0
        if self._atom_pattern is None:  # longest first: where atoms overlap, the longer one is the token
            contents = sorted((info.content for info in self.added.values() if info.atom), key=len, reverse=True)
            if not contents:
                return 0
            self._atom_pattern = re.compile("|".join(map(re.escape, contents)))
        ends = [m.end() for m in self._atom_pattern.finditer(prefix)]
        for cut in reversed(ends):
            if cut < self.SHARED_PREFIX_MIN_CHARS:
                break
            if self.straddle_free(prefix[:cut], at_end=True):
                return cut
        return 0

    def straddle_free(self, text: str, at_end: bool) -> bool:
        """No added token can span the join between ``text`` and any text on its far side
        (after it when ``at_end``, before it otherwise)."""
        for info in self.added.values():
            content = info.content
            for k in range(1, len(content)):
                if (at_end and text.endswith(content[:k])) or (not at_end and text.startswith(content[k:])):
                    return False
        return True

    def encode_reference(self, text: str) -> list[int]:
        """The tokenizer's own IDs of ``text``, never through :attr:`fast`: what a check compares
        tmpl's IDs against (suffix verification, drift, the proofs), so the checks stay independent
        of the encoder they check.

        >>> codec.encode_reference("Zürich") == codec.encode("Zürich")  # doctest: +SKIP
        True
        """
        self.check()
        ids: list[int] = self._encode_ids([text], add_special_tokens=False)[0].ids
        return ids

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token IDs of ``text`` and each token's (start, end) character offsets."""
        self.check()
        enc = self._encode(text, add_special_tokens=False)
        return enc.ids, enc.offsets

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        text: str = self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return text

    def token_text(self, tid: int) -> str:
        """The text of one token as the template writes it (added tokens by content)."""
        info = self.added.get(tid)
        return info.content if info is not None else self.decode([tid])

    @property
    def content_hash(self) -> str:
        """SHA-256 of the whole tokenization pipeline (vocabulary, merges, normalizer, added tokens)."""
        if self._hash is None:
            self._hash = hashlib.sha256(self.backend.to_str().encode("utf-8")).hexdigest()
        return self._hash


def _is_regex_byte_level(pipeline: dict[str, Any], backend: Any) -> bool:
    """See :attr:`Codec.regex_byte_level`; ``pipeline`` holds the model type, normalizer and
    pre-tokenizer as ``tokenizer.json`` writes them."""
    model, norm, pre = pipeline.get("model") or {}, pipeline.get("normalizer"), pipeline.get("pre_tokenizer")
    if model.get("type") != "BPE" or pre is None:
        return False
    norms = steps_of(norm, "normalizers")
    if any(n.get("type") != "NFC" for n in norms):
        return False
    steps = steps_of(pre, "pretokenizers")
    if not steps or steps[-1].get("type") != "ByteLevel":
        return False
    splits = steps[:-1]
    if any(s.get("type") != "Split" or s.get("behavior") != "Isolated" or s.get("invert") for s in splits):
        return False
    if not splits and not steps[-1].get("use_regex", True):
        return False  # byte-level with no split at all: BPE over whole texts
    if steps[-1].get("add_prefix_space"):
        return False
    for tok in backend.get_added_tokens_decoder().values():
        if tok.lstrip or tok.rstrip or tok.single_word or (tok.normalized and norms):
            return False
    return True


def added_state(decoder: dict[int, Any]) -> tuple[tuple[Any, ...], ...]:
    """The added tokens of ``get_added_tokens_decoder()`` as comparable tuples (ID, content, flags)."""
    return tuple(
        (tid, t.content, bool(t.special), bool(t.lstrip), bool(t.rstrip), bool(t.single_word), bool(t.normalized))
        for tid, t in sorted(decoder.items())
    )


def current(codec: Codec, tokenizer: Any) -> bool:
    """Whether ``codec`` still describes ``tokenizer``: the same backend object, the same stamp,
    the same added tokens (content and flags) and the same model object type."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return (
        backend is codec.backend
        and codec.stamp.same()
        and type(backend.model) is type(codec.stamp.model)
        and backend.get_vocab_size(with_added_tokens=False) == codec.stamp.model_size
        and added_state(backend.get_added_tokens_decoder()) == codec.added_state
    )


_CODECS: weakref.WeakKeyDictionary[Any, Codec] = weakref.WeakKeyDictionary()
_CODECS_LOCK = threading.Lock()


def codec_for(tokenizer: Any) -> Codec:
    """The codec of a Hugging Face tokenizer, built once per tokenizer object, and again when the
    tokenizer changed since (see :func:`current`): whatever tmpl learned of the old one (the
    codec's memo, the suffix engine's state under the old content hash, the parsers kept per
    codec) is left behind with it.

    Held by a weak reference to the tokenizer (a codec holds only the ``tokenizers`` backend),
    so dropping the tokenizer frees its codec too.
    """
    with _CODECS_LOCK:
        codec = _CODECS.get(tokenizer)
        if codec is None or not current(codec, tokenizer):
            codec = Codec(tokenizer)
            try:
                _CODECS[tokenizer] = codec
            except TypeError:  # pragma: no cover - a tokenizer class without weak references
                pass
        return codec
