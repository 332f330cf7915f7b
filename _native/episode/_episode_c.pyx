# cython: language_level=3
"""The hot part of the episode builder, compiled (twin: ``tmpl/episode/_episode_py.py``).

:class:`SequenceBuffer` holds one training sequence's five arrays (IDs int32, mask uint8, logprobs
float32, versions int32, sampled uint8) in numpy arrays grown by amortized doubling into fresh ones
(views handed out never change) and written through typed memoryviews; :func:`best_match` compares a
prompt with each candidate sequence in C. Inputs are int32 / float32 numpy arrays that
:class:`tmpl.episode.Call` has already checked.

>>> import numpy as np
>>> buf = SequenceBuffer()
>>> buf.append_context(np.array([1, 2], dtype=np.int32), 10)
2
>>> best_match([buf], np.array([1, 2, 9], dtype=np.int32))
(0, 0, 2)
"""

from libc.stdint cimport int32_t, uint8_t

import numpy as np

from tmpl.trajectory.types import APPENDED_VERSION, MIN_ALLOC

__all__ = ["SequenceBuffer", "best_match"]

cdef int32_t _APPENDED = APPENDED_VERSION
cdef Py_ssize_t _MIN_ALLOC = MIN_ALLOC


cdef object _readonly(object view):
    view.flags.writeable = False
    return view


cdef class SequenceBuffer:
    """One training sequence's tokens, appended in place: context (mask 0) and sampled tokens.

    ``room`` arguments say how many tokens may still be appended (the caller's budget); what does not
    fit is left out and the count kept is returned.
    """

    cdef object _ids_a, _mask_a, _lp_a, _ver_a, _smp_a
    cdef int32_t[::1] _ids
    cdef uint8_t[::1] _mask
    cdef float[::1] _lp
    cdef int32_t[::1] _ver
    cdef uint8_t[::1] _smp
    cdef Py_ssize_t _n
    cdef Py_ssize_t _alloc

    def __init__(self):
        self._n = 0
        self._alloc = 0
        self._set(
            np.empty(0, dtype=np.int32),
            np.empty(0, dtype=np.uint8),
            np.empty(0, dtype=np.float32),
            np.empty(0, dtype=np.int32),
            np.empty(0, dtype=np.uint8),
        )

    cdef void _set(self, object ids, object mask, object lp, object ver, object smp):
        self._ids_a, self._mask_a, self._lp_a, self._ver_a, self._smp_a = ids, mask, lp, ver, smp
        self._ids = ids
        self._mask = mask
        self._lp = lp
        self._ver = ver
        self._smp = smp

    @property
    def length(self):
        """Tokens held."""
        return self._n

    cdef void _reserve(self, Py_ssize_t need):
        cdef Py_ssize_t size, n = self._n
        if need <= self._alloc:
            return
        size = max(need, 2 * self._alloc, _MIN_ALLOC)
        grown = []
        for old, dtype in (
            (self._ids_a, np.int32),
            (self._mask_a, np.uint8),
            (self._lp_a, np.float32),
            (self._ver_a, np.int32),
            (self._smp_a, np.uint8),
        ):
            arr = np.empty(size, dtype=dtype)
            arr[:n] = old[:n]
            grown.append(arr)
        self._set(grown[0], grown[1], grown[2], grown[3], grown[4])
        self._alloc = size

    cdef Py_ssize_t _common(self, const int32_t[::1] prompt):
        cdef Py_ssize_t i = 0, n = min(self._n, prompt.shape[0])
        cdef int32_t* ids = &self._ids[0] if self._alloc else NULL
        while i < n and ids[i] == prompt[i]:
            i += 1
        return i

    def common_prefix(self, prompt):
        """Length of the common prefix of the sequence's IDs and ``prompt`` (int32)."""
        return self._common(prompt)

    def id_at(self, Py_ssize_t position):
        """The ID at ``position`` (0 <= position < length)."""
        if not 0 <= position < self._n:
            raise IndexError(position)
        return int(self._ids[position])

    def append_context(self, ids, Py_ssize_t room):
        """Append tokens no model sampled here (mask 0, logprob 0.0, APPENDED_VERSION); returns how many fit."""
        cdef const int32_t[::1] src = ids
        cdef Py_ssize_t kept = max(0, min(src.shape[0], room))
        cdef Py_ssize_t i, start = self._n
        self._reserve(start + kept)
        for i in range(kept):
            self._ids[start + i] = src[i]
            self._mask[start + i] = 0
            self._lp[start + i] = 0.0
            self._ver[start + i] = _APPENDED
            self._smp[start + i] = 0
        self._n = start + kept
        return kept

    def append_sampled(self, ids, logprobs, versions, bint trained, Py_ssize_t room):
        """Append a call's sampled tokens (sampled 1; trained: mask 1 with their logprobs and versions,
        else mask 0, logprob 0.0, APPENDED_VERSION); returns how many fit."""
        cdef const int32_t[::1] src = ids
        cdef const float[::1] lps = logprobs
        cdef const int32_t[::1] vers = versions
        cdef Py_ssize_t kept = max(0, min(src.shape[0], room))
        cdef Py_ssize_t i, start = self._n
        if lps.shape[0] < kept or vers.shape[0] < kept:
            raise ValueError("logprobs and versions need one value per sampled token")
        self._reserve(start + kept)
        for i in range(kept):
            self._ids[start + i] = src[i]
            self._smp[start + i] = 1
            if trained:
                self._mask[start + i] = 1
                self._lp[start + i] = lps[i]
                self._ver[start + i] = vers[i]
            else:
                self._mask[start + i] = 0
                self._lp[start + i] = 0.0
                self._ver[start + i] = _APPENDED
        self._n = start + kept
        return kept

    def views(self):
        """(ids, mask, logprobs, versions, sampled): read-only views of the tokens held, never changed afterwards."""
        n = self._n
        return (
            _readonly(self._ids_a[:n]),
            _readonly(self._mask_a[:n]),
            _readonly(self._lp_a[:n]),
            _readonly(self._ver_a[:n]),
            _readonly(self._smp_a[:n]),
        )


def best_match(buffers, prompt):
    """``(merge, nearest, common)`` for a prompt (int32) against candidate sequences.

    ``merge``: the index of the longest buffer whose IDs are all a prefix of ``prompt`` (-1: none);
    ``nearest``: the index of the buffer with the longest common prefix with it, ``common`` that length
    (-1 and 0 without buffers). Ties go to the later buffer.
    """
    cdef const int32_t[::1] p = prompt
    cdef Py_ssize_t i = 0, c, merge = -1, merge_len = -1, nearest = -1, common = -1
    cdef SequenceBuffer buf
    for item in buffers:
        buf = <SequenceBuffer?>item
        c = buf._common(p)
        if c == buf._n and c >= merge_len:
            merge, merge_len = i, c
        if c >= common:
            nearest, common = i, c
        i += 1
    return merge, nearest, max(common, 0)
