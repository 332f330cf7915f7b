"""Decoding runs of ordinary tokens from a table, for tokenizers whose decoder is byte-level BPE.

A byte-level BPE tokenizer (GPT-2's scheme: Qwen, Llama 3, DeepSeek, gpt-oss) writes every byte
as one printable character in its vocabulary, and its ``ByteLevel`` decoder does nothing but map
each token's characters back to bytes, join the bytes of all tokens and read them as UTF-8, each
ill-formed sequence becoming one U+FFFD. A table from token ID to bytes does the same without a
call into the tokenizer (measured, a 25-token run of a tool call: 1.2 us against 4.6 us for
``decode``, whose per-call cost dominates short runs).

:func:`byte_table` gives a codec its table, only where the backend's decoder is exactly
``ByteLevel`` and its model BPE. Entries are filled as tokens are first met (``id_to_token``, the
decoder's rule applied); an added token gets no bytes (a run holding one is decoded by the
tokenizer). Before first use the table is checked against the tokenizer's own ``decode``: each
of the 256 byte tokens alone, seeded random runs of bytes 0x80-0xFF (every way UTF-8 can be
ill-formed: lone continuations, cut sequences, overlongs, surrogates) and seeded random runs of
any tokens; any difference and the codec gets no table (``None``): the tokenizer decodes, as
before. tests/test_toolcalls_bytedecode.py compares the two on every token and on random runs of
every byte-level tokenizer of the test data.

>>> table = byte_table(codec)                                     # doctest: +SKIP
>>> decode_run(table, codec.encode("héllo wörld")) == codec.decode(codec.encode("héllo wörld"))  # doctest: +SKIP
True
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence
from typing import Any

from ..tokenize import Codec
from ..tokenize.pipeline import byte_chars

_MEMO_KEY = "byte_decode_table"


def _byte_chars() -> dict[str, int]:
    """GPT-2's byte-to-printable-character map (:func:`tmpl.tokenize.pipeline.byte_chars`), inverted: the
    byte each character stands for."""
    return {c: b for b, c in byte_chars().items()}


def decode_run(table: ByteTable, ids: Sequence[int]) -> str | None:
    """The text of ``ids`` as the tokenizer decodes it, or None when the table cannot say (an added
    token or an ID outside the vocabulary in the run): decode with the tokenizer then."""
    if ids and min(ids) < 0:  # a list would read a negative ID from its end; the tokenizer refuses it
        return None
    try:
        return b"".join(map(table.__getitem__, ids)).decode("utf-8", "replace")
    except TypeError:  # an entry not filled yet, or an added token's
        pass
    except IndexError:
        return None
    if not table.fill(ids):
        return None
    return b"".join(map(table.__getitem__, ids)).decode("utf-8", "replace")


class ByteTable(list):  # type: ignore[type-arg]
    """Bytes per token ID (``None``: not met yet; ``False``: the tokenizer decodes it, an added token)."""

    def __init__(self, backend: Any, size: int, added: Iterable[int]) -> None:
        super().__init__([None] * size)
        self.backend = backend
        self.added = frozenset(added)

    def fill(self, ids: Sequence[int]) -> bool:
        """Fill the entries of ``ids``; False when one of them has no bytes (an added token)."""
        ok = True
        for tid in ids:
            entry = self[tid]
            if entry is None:
                entry = self[tid] = self._entry(tid)
            if entry is False:
                ok = False
        return ok

    def _entry(self, tid: int) -> bytes | bool:
        if tid in self.added:
            return False
        token = self.backend.id_to_token(tid)
        if token is None:
            return False
        # the decoder's rule: a token all of whose characters stand for bytes is those bytes; any
        # other token is its own UTF-8 (as the tokenizers library does)
        if _UNMAPPED.search(token) is None:
            data: bytes = token.translate(_TO_LATIN1).encode("latin-1")
            return data
        return bytes(token.encode("utf-8"))


_CHARS = _byte_chars()
_TO_LATIN1 = str.maketrans({c: chr(b) for c, b in _CHARS.items()})  # each byte's character -> that byte
_UNMAPPED = re.compile("[^" + re.escape("".join(_CHARS)) + "]")


def byte_table(codec: Codec) -> ByteTable | None:
    """The codec's checked byte table (made on first use), or None where it does not apply."""
    memo = codec.memo
    if _MEMO_KEY not in memo:
        memo[_MEMO_KEY] = _make(codec)
    table: ByteTable | None = memo[_MEMO_KEY]
    return table


def _make(codec: Codec) -> ByteTable | None:
    backend = codec.backend
    decoder, model = getattr(backend, "decoder", None), getattr(backend, "model", None)
    if type(decoder).__name__ != "ByteLevel" or type(model).__name__ != "BPE":
        return None
    table = ByteTable(backend, codec.vocab_size, codec.added)
    return table if _agrees(codec, table) else None


def _agrees(codec: Codec, table: ByteTable) -> bool:
    """Whether the table decodes like the tokenizer (the checks are the same every time)."""
    decode = codec.backend.decode
    singles = [codec.backend.token_to_id(c) for c in _CHARS]
    if any(t is None for t in singles):
        return False  # not GPT-2's byte alphabet: let the tokenizer decode
    high = [t for c, t in zip(_CHARS, singles) if _CHARS[c] >= 0x80]
    ordinary = [t for t in range(len(table)) if t not in table.added]
    rng = random.Random(len(table))
    runs: list[list[int]] = [[t] for t in singles]
    runs += [[rng.choice(high) for _ in range(rng.randint(1, 8))] for _ in range(600)]
    runs += [
        [rng.choice(high) if rng.random() < 0.3 else rng.choice(ordinary) for _ in range(rng.randint(1, 24))]
        for _ in range(400)
    ]
    for run in runs:
        got = decode_run(table, run)  # None: the table declines (a hole in the vocabulary), the tokenizer decodes
        if got is not None and got != decode(run, skip_special_tokens=False):
            return False
    return True
