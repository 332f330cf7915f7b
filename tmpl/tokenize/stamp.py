"""A stamp of what decides a tokenizer's IDs, taken when a codec is made, compared on each encode.

Read through the ``tokenizers`` backend in about a microsecond: whether a token was added since
(the ID the next added token would take now has a token: the same as the vocabulary size with
added tokens growing, which the backend counts in time proportional to its added tokens),
``encode_special_tokens``, the BPE model's ``dropout``, ``ignore_merges`` and ``byte_fallback``
(through the model wrapper held from the build, which sees its setters), and the normalizer's
and pre-tokenizer's state (read again each time: a replaced one is a new object).

Not seen per call (``codec_for`` sees them, comparing the added tokens whole and the model): an
added token whose text the vocabulary already has (the size does not change), flags changed on
an existing added token, a model replaced wholesale.

>>> stamp = Stamp(tokenizer.backend_tokenizer)  # doctest: +SKIP
>>> tokenizer.backend_tokenizer.model.dropout = 0.5  # doctest: +SKIP
>>> stamp.changes()  # doctest: +SKIP
['dropout None -> 0.5']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: the stamp's fields, in order, as :meth:`Stamp.changes` names them
FIELDS = (
    "added token",
    "encode_special_tokens",
    "dropout",
    "ignore_merges",
    "byte_fallback",
    "normalizer",
    "pre-tokenizer",
)


class Stamp:
    """The backend's state as :meth:`read` gives it, kept from when the stamp was made."""

    __slots__ = ("backend", "model", "model_size", "next_id", "vocab_size", "value", "same")

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        #: the model wrapper of the build: its setters (dropout...) show through it
        self.model = backend.model
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.model_size: int = backend.get_vocab_size(with_added_tokens=False)
        #: the ID ``tokenizers`` gives the next added token that is new to the vocabulary
        self.next_id: int = _next_id(backend)
        if backend.id_to_token(self.next_id) is not None:  # not where tokenizers puts the next one
            self.next_id = -1  # read the vocabulary size itself (slower, as sound)
        self.value = self.read()
        #: whether the backend still reads as when the stamp was made (the per-call check)
        self.same: Callable[[], bool] = self._same_reader()

    def read(self) -> tuple[Any, ...]:
        """The fields of :data:`FIELDS`, now."""
        b, m = self.backend, self.model
        n, p = b.normalizer, b.pre_tokenizer
        return (
            b.id_to_token(self.next_id) if self.next_id >= 0 else b.get_vocab_size(with_added_tokens=True),
            b.encode_special_tokens,
            getattr(m, "dropout", None),
            getattr(m, "ignore_merges", None),
            getattr(m, "byte_fallback", None),
            None if n is None else n.__getstate__(),
            None if p is None else p.__getstate__(),
        )

    def _same_reader(self) -> Callable[[], bool]:
        """:meth:`read` compared with the stamp, as a closure over what it reads (no tuple, no
        attribute lookups on the stamp: it runs on every encode)."""
        if self.next_id < 0 or not all(hasattr(self.model, a) for a in ("dropout", "ignore_merges", "byte_fallback")):
            value = self.value
            read = self.read
            return lambda: read() == value
        b, m, next_id = self.backend, self.model, self.next_id
        added, special, dropout, ignore, fallback, norm, pre = self.value

        def same() -> bool:
            n = b.normalizer
            p = b.pre_tokenizer
            return (
                b.id_to_token(next_id) == added
                and b.encode_special_tokens == special
                and m.dropout == dropout
                and m.ignore_merges == ignore
                and m.byte_fallback == fallback
                and (n is None if norm is None else n is not None and n.__getstate__() == norm)
                and (p is None if pre is None else p is not None and p.__getstate__() == pre)
            )

        return same

    def changes(self) -> list[str]:
        """What differs from the stamp, one phrase each (empty when nothing does)."""
        now = self.read()
        out: list[str] = []
        for name, old, new in zip(FIELDS, self.value, now):
            if old == new:
                continue
            if name == "added token":
                size = self.backend.get_vocab_size(with_added_tokens=True)
                out.append(f"vocabulary size {self.vocab_size} -> {size}")
            elif name in ("normalizer", "pre-tokenizer"):
                out.append(f"{name} {'added' if old is None else 'removed' if new is None else 'replaced'}")
            else:
                out.append(f"{name} {old} -> {new}")
        return out


def _next_id(backend: Any) -> int:
    """The ID ``tokenizers`` (``AddedVocabulary::add_tokens``) gives a new added token: one past
    the largest added ID when that is at or past the model's size, else the model's size."""
    model_size = int(backend.get_vocab_size(with_added_tokens=False))
    ids = list(backend.get_added_tokens_decoder())
    top = max(ids) if ids else -1
    return top + 1 if ids and top >= model_size else model_size
