"""The hot part of the episode builder, pure-Python twin of ``_native/episode/_episode_c.pyx``.

:class:`SequenceBuffer` holds one training sequence's five arrays (IDs int32, mask uint8, logprobs
float32, versions int32, sampled uint8), grown by amortized doubling into fresh arrays (views handed
out never change); :func:`best_match` finds, among open sequences, the one a prompt continues.
Inputs are int32 / float32 numpy arrays that :class:`tmpl.episode.Call` has already checked.

>>> buf = SequenceBuffer()
>>> buf.append_context(np.array([1, 2], dtype=np.int32), 10)
2
>>> buf.append_sampled(np.array([3], dtype=np.int32), np.array([-0.5], dtype=np.float32),
...                    np.array([4], dtype=np.int32), True, 10)
1
>>> [a.tolist() for a in buf.views()]
[[1, 2, 3], [0, 0, 1], [0.0, 0.0, -0.5], [-1, -1, 4], [0, 0, 1]]
>>> best_match([buf], np.array([1, 2, 3, 9], dtype=np.int32)), best_match([buf], np.array([1, 7], dtype=np.int32))
((0, 0, 3), (-1, 0, 1))
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..trajectory.types import APPENDED_VERSION, MIN_ALLOC

__all__ = ["SequenceBuffer", "best_match"]

_FIELDS: tuple[tuple[str, type[np.generic]], ...] = (
    ("_ids", np.int32),
    ("_mask", np.uint8),
    ("_logprobs", np.float32),
    ("_versions", np.int32),
    ("_sampled", np.uint8),
)


def _readonly(view: np.ndarray) -> np.ndarray:
    view.flags.writeable = False
    return view


class SequenceBuffer:
    """One training sequence's tokens, appended in place: context (mask 0) and sampled tokens.

    ``room`` arguments say how many tokens may still be appended (the caller's budget); what does not
    fit is left out and the count kept is returned.
    """

    __slots__ = ("_ids", "_mask", "_logprobs", "_versions", "_sampled", "_n", "_alloc")

    def __init__(self) -> None:
        self._n = 0
        self._alloc = 0
        self._ids = np.empty(0, dtype=np.int32)
        self._mask = np.empty(0, dtype=np.uint8)
        self._logprobs = np.empty(0, dtype=np.float32)
        self._versions = np.empty(0, dtype=np.int32)
        self._sampled = np.empty(0, dtype=np.uint8)

    @property
    def length(self) -> int:
        """Tokens held."""
        return self._n

    def _reserve(self, need: int) -> None:
        if need <= self._alloc:
            return
        size = max(need, 2 * self._alloc, MIN_ALLOC)
        n = self._n
        for name, dtype in _FIELDS:
            grown = np.empty(size, dtype=dtype)
            grown[:n] = getattr(self, name)[:n]
            setattr(self, name, grown)
        self._alloc = size

    def common_prefix(self, prompt: np.ndarray) -> int:
        """Length of the common prefix of the sequence's IDs and ``prompt`` (int32)."""
        n = min(self._n, len(prompt))
        differ = self._ids[:n] != prompt[:n]
        return int(np.argmax(differ)) if differ.any() else n

    def id_at(self, position: int) -> int:
        """The ID at ``position`` (0 <= position < length)."""
        return int(self._ids[position])

    def append_context(self, ids: np.ndarray, room: int) -> int:
        """Append tokens no model sampled here (mask 0, logprob 0.0, APPENDED_VERSION); returns how many fit."""
        kept = max(0, min(len(ids), room))
        start, end = self._n, self._n + kept
        self._reserve(end)
        self._ids[start:end] = ids[:kept]
        self._mask[start:end] = 0
        self._logprobs[start:end] = 0.0
        self._versions[start:end] = APPENDED_VERSION
        self._sampled[start:end] = 0
        self._n = end
        return kept

    def append_sampled(
        self, ids: np.ndarray, logprobs: np.ndarray, versions: np.ndarray, trained: bool, room: int
    ) -> int:
        """Append a call's sampled tokens (sampled 1; trained: mask 1 with their logprobs and versions,
        else mask 0, logprob 0.0, APPENDED_VERSION); returns how many fit."""
        kept = max(0, min(len(ids), room))
        start, end = self._n, self._n + kept
        self._reserve(end)
        self._ids[start:end] = ids[:kept]
        self._sampled[start:end] = 1
        if trained:
            self._mask[start:end] = 1
            self._logprobs[start:end] = logprobs[:kept]
            self._versions[start:end] = versions[:kept]
        else:
            self._mask[start:end] = 0
            self._logprobs[start:end] = 0.0
            self._versions[start:end] = APPENDED_VERSION
        self._n = end
        return kept

    def views(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(ids, mask, logprobs, versions, sampled): read-only views of the tokens held, never changed afterwards."""
        n = self._n
        return (
            _readonly(self._ids[:n]),
            _readonly(self._mask[:n]),
            _readonly(self._logprobs[:n]),
            _readonly(self._versions[:n]),
            _readonly(self._sampled[:n]),
        )


def best_match(buffers: Sequence[SequenceBuffer], prompt: np.ndarray) -> tuple[int, int, int]:
    """``(merge, nearest, common)`` for a prompt (int32) against candidate sequences.

    ``merge``: the index of the longest buffer whose IDs are all a prefix of ``prompt`` (-1: none);
    ``nearest``: the index of the buffer with the longest common prefix with it, ``common`` that length
    (-1 and 0 without buffers). Ties go to the later buffer.
    """
    merge, merge_len, nearest, common = -1, -1, -1, -1
    for i, buf in enumerate(buffers):
        c = buf.common_prefix(prompt)
        if c == buf._n and c >= merge_len:
            merge, merge_len = i, c
        if c >= common:
            nearest, common = i, c
    return merge, nearest, max(common, 0)
