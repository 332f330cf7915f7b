"""The root of every tmpl error (:class:`TmplError`), a changed tokenizer (:class:`TokenizerChangedError`), and how
errors with extra attributes cross a process boundary (pickled with their state)."""

from __future__ import annotations

from typing import Any


class TmplError(Exception):
    """Base class of every error raised by tmpl."""


class TokenizerChangedError(TmplError):
    """A tokenizer changed after tmpl read it (a token added, dropout set, the normalizer or
    pre-tokenizer replaced): its codec would give stale IDs, so it gives none. ``tokenizer`` names
    it, ``changes`` lists what changed.

    >>> raise TokenizerChangedError("Qwen2.5", ["vocabulary size 151665 -> 151667"])
    Traceback (most recent call last):
    ...
    tmpl.errors.TokenizerChangedError: tokenizer 'Qwen2.5' changed after tmpl read it (vocabulary size 151665 -> 151667); make a new ChatTemplate (or codec_for(tokenizer)) for it
    """

    def __init__(self, tokenizer: str, changes: list[str]) -> None:
        self.tokenizer = tokenizer
        self.changes = list(changes)
        self.reason = "; ".join(self.changes) or "changed"
        super().__init__(
            f"tokenizer {tokenizer!r} changed after tmpl read it ({self.reason}); "
            "make a new ChatTemplate (or codec_for(tokenizer)) for it"
        )


def _rebuild(cls: type[Exception], args: tuple[Any, ...], state: dict[str, Any]) -> Exception:
    """An error of ``cls`` with ``args`` and ``state`` as its attributes (the unpickling of :class:`EnvError`)."""
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err
