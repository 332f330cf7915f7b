"""The parts of a ``tokenizers.Tokenizer`` pipeline that decide how text splits, read once.

>>> steps_of({"type": "Sequence", "pretokenizers": [{"type": "Split"}, {"type": "ByteLevel"}]}, "pretokenizers")
[{'type': 'Split'}, {'type': 'ByteLevel'}]
>>> byte_chars()[ord(" ")]
'Ġ'
"""

from __future__ import annotations

import json
from typing import Any

#: the split ``ByteLevel(use_regex=True)`` runs (GPT-2's; the ``tokenizers`` source holds the same)
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


class Unsupported(ValueError):
    """A pipeline step or regex construct the fast encoder does not reproduce (private: the codec
    turns it into :attr:`tmpl.tokenize.Codec.fast_reason`, and the tokenizer encodes)."""


def byte_chars() -> dict[int, str]:
    """GPT-2's byte-level alphabet: the character that stands for each byte in a byte-level BPE
    vocabulary (printable Latin-1 for itself, the rest from U+0100 on, in byte order).

    >>> byte_chars()[ord("a")], byte_chars()[0]
    ('a', 'Ā')
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def state_of(part: Any) -> dict[str, Any] | None:
    """A pipeline step as ``tokenizer.json`` writes it (None when the tokenizer has none).

    >>> state_of(None) is None
    True
    """
    return None if part is None else dict(json.loads(part.__getstate__()))


def pipeline_of(backend: Any) -> dict[str, Any]:
    """The model's type and BPE settings, the normalizer and the pre-tokenizer of a
    ``tokenizers.Tokenizer``, as ``tokenizer.json`` writes them, without serialising the vocabulary.

    >>> pipeline_of(tokenizer.backend_tokenizer)["model"]["type"]  # doctest: +SKIP
    'BPE'
    """
    model = backend.model
    return {
        "model": {
            "type": type(model).__name__,
            "dropout": getattr(model, "dropout", None),
            "ignore_merges": getattr(model, "ignore_merges", None),
            "byte_fallback": getattr(model, "byte_fallback", None),
            "continuing_subword_prefix": getattr(model, "continuing_subword_prefix", None),
            "end_of_word_suffix": getattr(model, "end_of_word_suffix", None),
        },
        "normalizer": state_of(backend.normalizer),
        "pre_tokenizer": state_of(backend.pre_tokenizer),
    }


def steps_of(step: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    """A normalizer's (``key="normalizers"``) or pre-tokenizer's (``"pretokenizers"``) steps: a
    ``Sequence``'s members, else the step alone (none when absent)."""
    if step is None:
        return []
    return list(step.get(key, [step])) if step.get("type") == "Sequence" else [step]
