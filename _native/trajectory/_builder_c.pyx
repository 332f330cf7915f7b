# cython: language_level=3
"""Trajectory builder and collation of the compiled core (twin: ``tmpl/trajectory/_builder_py.py``).

The completion buffers (int32 IDs, uint8 mask, float32 logprobs) are numpy arrays allocated
once per attempt at the size the budgets allow; this module writes them through raw pointers.
Lists and tuples of exact ``int``/``float`` are read item by item in C; any other input goes
through ``tmpl.trajectory._validate`` (shared with the pure twin), so both report the same errors.

>>> traj = Trajectory([1, 2, 3], max_length=8, sample_id="q1")
>>> traj.add_completion([4, 5], [-0.5, -0.25])
2
>>> traj.add_suffix([6, 7, 8, 9])
3
>>> traj.status.name, traj.tokens_cut
('TRUNCATED', 1)
"""

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.object cimport PyObject
from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy, memset
from libc.math cimport isnan, isinf

import numpy as np

from tmpl.trajectory import _validate
from tmpl.trajectory.routes import RouteStore
from tmpl.errors import CollateError, LogprobError, TokenIdError, TrajectoryClosedError
from tmpl.trajectory.types import (
    COMPLETION,
    MIN_ALLOC,
    STATUSES,
    SUFFIX,
    Span,
    binding_budget,
    logprob_count_reason,
    missing_logprobs_reason,
    restore_trajectory,
    state_of,
    truncation_reason,
)


cdef extern from "Python.h":
    bint PyLong_CheckExact(object o)
    bint PyFloat_CheckExact(object o)
    double PyFloat_AS_DOUBLE(object o)
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) except? -1
    Py_ssize_t PySequence_Fast_GET_SIZE(object o)
    PyObject** PySequence_Fast_ITEMS(object o)


cdef enum:
    RUNNING = 0
    DONE = 1
    TRUNCATED = 2
    ABORTED = 3

cdef enum:
    KIND_COMPLETION = 0
    KIND_SUFFIX = 1

cdef enum:
    FAST_OK = 0        # every item read and checked in C
    FAST_FALLBACK = 1  # an item that is not an exact int/float: redo the input through tmpl.trajectory._validate

cdef struct SpanRec:
    int32_t kind
    int32_t turn
    int32_t message
    int32_t start
    int32_t end


cdef object _readonly(object view):
    view.flags.writeable = False
    return view


cdef inline bint _is_list_or_tuple(object o):
    return type(o) is list or type(o) is tuple


cdef char* _data(object array) except? NULL:
    """Address of a C-contiguous numpy array's data; the caller keeps ``array`` alive."""
    cdef Py_buffer view
    PyObject_GetBuffer(array, &view, PyBUF_SIMPLE)
    cdef char* address = <char*>view.buf
    PyBuffer_Release(&view)
    return address


cdef int _read_int_items(object seq, Py_ssize_t total, int32_t* out, Py_ssize_t room, long long limit,
                         object sample, str field, bint vocab_known) except -1:
    """Check the exact ints of a list/tuple against ``[0, limit)``, writing the first ``room`` to ``out``.

    Returns FAST_FALLBACK at the first item that is not an exact int (the caller redoes the input
    through tmpl.trajectory._validate, which checks in the same order); raises TokenIdError at a bad ID.
    """
    cdef PyObject** items = PySequence_Fast_ITEMS(seq)
    cdef Py_ssize_t i
    cdef object item
    cdef long long value
    cdef int overflow = 0
    for i in range(total):
        item = <object>items[i]
        if not PyLong_CheckExact(item):
            return FAST_FALLBACK
        value = PyLong_AsLongLongAndOverflow(item, &overflow)
        if overflow != 0 or value < 0 or value >= limit:
            raise TokenIdError(sample, field, i, int(item), limit=limit, vocab_known=vocab_known)
        if i < room:
            out[i] = <int32_t>value
    return FAST_OK


cdef class Trajectory:
    """One sample's tokens: prompt, then completion tokens with their mask and logprobs.

    ``max_length`` caps prompt + completion, ``max_completion_length`` (None: no separate cap)
    caps the completion; the completion arrays grow with the tokens appended (amortized
    doubling, never past what both budgets allow).
    Arrays handed out are read-only views that never change afterwards (``reset()`` starts
    on fresh buffers). ``vocab_size`` enables the vocabulary check of token IDs; ``sample_id``
    names the sample in every error.

    >>> traj = Trajectory([1, 2], max_length=6, max_completion_length=3)
    >>> traj.add_completion([3, 4], [-0.1, -0.2]), traj.max_new_tokens(8)
    (2, 1)
    """

    cdef object _sample_id
    cdef object _vocab_size
    cdef object _reason
    cdef object _prompt_arr   # int32, read-only
    cdef object _block        # uint8 numpy array: [ids int32 x alloc][logprobs float32 x alloc][mask uint8 x alloc]
    cdef object _views        # (ids, mask, logprobs) typed numpy views of the whole block, made on first use
    cdef int32_t* _prompt
    cdef int32_t* _ids
    cdef uint8_t* _mask
    cdef float* _lp
    cdef Py_ssize_t _p
    cdef Py_ssize_t _n
    cdef Py_ssize_t _cap      # completion tokens both budgets allow
    cdef Py_ssize_t _alloc    # completion tokens the block holds now (grows up to _cap)
    cdef Py_ssize_t _max_length
    cdef Py_ssize_t _mcl
    cdef Py_ssize_t _cut
    cdef Py_ssize_t _turns
    cdef long long _limit
    cdef int _status
    cdef SpanRec* _spans
    cdef Py_ssize_t _nspans
    cdef Py_ssize_t _span_cap
    cdef object _routes       # tmpl.trajectory.routes.RouteStore, or None: no routes added

    def __cinit__(self):
        self._spans = NULL
        self._nspans = 0
        self._span_cap = 0

    def __dealloc__(self):
        free(self._spans)

    def __init__(self, prompt_ids, max_length, max_completion_length=None, *, vocab_size=None, sample_id=None):
        cdef Py_ssize_t total
        self._sample_id = sample_id
        self._limit = _validate.id_limit(vocab_size, sample_id)
        self._vocab_size = None if vocab_size is None else self._limit
        prompt = None
        if _is_list_or_tuple(prompt_ids):
            total = PySequence_Fast_GET_SIZE(prompt_ids)
            prompt = np.empty(total, dtype=np.int32)
            if _read_int_items(prompt_ids, total, <int32_t*>_data(prompt), total, self._limit, sample_id,
                               "prompt_ids", vocab_size is not None) == FAST_FALLBACK:
                prompt = None
        if prompt is None:
            prompt = _validate.ids_array(prompt_ids, sample=sample_id, field="prompt_ids", limit=self._limit,
                                       vocab_known=vocab_size is not None)
        self._max_length, self._mcl, self._cap = _validate.budgets(
            sample_id, max_length, max_completion_length, len(prompt)
        )
        self._p = len(prompt)
        self._prompt = <int32_t*>_data(prompt)  # a fresh contiguous array in both paths
        self._prompt_arr = _readonly(prompt)
        self._fresh_state()

    cdef _fresh_state(self):
        # Storage follows the tokens held, not the budget: it starts empty and grows on append.
        self._set_block(np.empty(1, dtype=np.uint8), 0)
        self._n = 0
        self._status = RUNNING
        self._reason = ""
        self._cut = 0
        self._turns = 0
        self._nspans = 0
        self._routes = None

    cdef _set_block(self, object block, Py_ssize_t alloc):
        self._block = block
        self._alloc = alloc
        self._views = None
        cdef char* base = _data(block)
        self._ids = <int32_t*>base
        self._lp = <float*>(base + 4 * alloc)
        self._mask = <uint8_t*>(base + 8 * alloc)

    cdef int _reserve(self, Py_ssize_t need) except -1:
        """Make room for ``need`` completion tokens (``need`` never exceeds the budget).

        Grows by amortized doubling (first step MIN_ALLOC) into a fresh block; the tokens held
        are copied over and the old block is left untouched, so views handed out before keep
        what they showed.
        """
        if need <= self._alloc:
            return 0
        cdef Py_ssize_t size = max(need, 2 * self._alloc, MIN_ALLOC)
        if size > self._cap:
            size = self._cap
        cdef Py_ssize_t n = self._n
        cdef int32_t* ids = self._ids
        cdef float* lp = self._lp
        cdef uint8_t* mask = self._mask
        old = self._block  # keeps the source alive while copying
        self._set_block(np.empty(9 * size, dtype=np.uint8), size)
        memcpy(self._ids, ids, n * sizeof(int32_t))
        memcpy(self._lp, lp, n * sizeof(float))
        memcpy(self._mask, mask, n)
        return 0

    cdef tuple _typed(self):
        cdef Py_ssize_t cap = self._alloc
        if self._views is None:
            block = self._block
            self._views = (
                block[: 4 * cap].view(np.int32),
                block[8 * cap : 9 * cap],
                block[4 * cap : 8 * cap].view(np.float32),
            )
        return self._views

    # -- what it holds -------------------------------------------------------------------------
    @property
    def sample_id(self):
        """The caller's name for this sample (used in errors)."""
        return self._sample_id

    @property
    def prompt_ids(self):
        """Prompt token IDs (int32, read-only)."""
        return self._prompt_arr

    @property
    def completion_ids(self):
        """Completion token IDs, model and suffix tokens (int32, read-only view)."""
        return _readonly(self._typed()[0][: self._n])

    @property
    def mask(self):
        """1 on model tokens, 0 on suffix tokens (uint8, read-only view, same length as completion_ids)."""
        return _readonly(self._typed()[1][: self._n])

    @property
    def logprobs(self):
        """Rollout logprobs, 0.0 on suffix tokens (float32, read-only view, same length as completion_ids)."""
        return _readonly(self._typed()[2][: self._n])

    @property
    def prompt_length(self):
        return self._p

    @property
    def _storage_tokens(self):
        """Completion tokens the storage holds room for now (grows with the tokens; for benchmarks)."""
        return self._alloc

    @property
    def completion_length(self):
        return self._n

    @property
    def length(self):
        """Prompt plus completion tokens (never more than ``max_length``)."""
        return self._p + self._n

    @property
    def max_length(self):
        return self._max_length

    @property
    def max_completion_length(self):
        return self._mcl

    @property
    def vocab_size(self):
        return self._vocab_size

    @property
    def remaining(self):
        """Completion tokens that still fit both budgets (whatever the status)."""
        return self._cap - self._n

    @property
    def status(self):
        return STATUSES[self._status]

    @property
    def running(self):
        """True while tokens may be appended."""
        return self._status == RUNNING

    @property
    def reason(self):
        """Why the status is TRUNCATED or ABORTED ('' otherwise)."""
        return self._reason

    @property
    def tokens_cut(self):
        """Tokens cut off by the truncation (0 unless TRUNCATED)."""
        return self._cut

    @property
    def num_turns(self):
        """Completions appended so far."""
        return self._turns

    @property
    def spans(self):
        """Where each range of the completion came from, in order."""
        cdef Py_ssize_t k
        cdef SpanRec* s
        out = []
        for k in range(self._nspans):
            s = &self._spans[k]
            out.append(Span(
                COMPLETION if s.kind == KIND_COMPLETION else SUFFIX,
                s.turn,
                None if s.message < 0 else s.message,
                s.start,
                s.end,
            ))
        return out

    @property
    def routes(self):
        """Mixture-of-experts routes of every position of ``prompt_ids + completion_ids``:
        ``[length, layers, top_k]`` (uint8 up to 256 experts, read-only; rows whose route is not known
        are 0, see :attr:`routes_known`), or None when no routes were added (docs/rollouts.md,
        "Routing replay")."""
        return None if self._routes is None else self._routes.routes(self._p + self._n)

    @property
    def routes_known(self):
        """1 where :attr:`routes` holds the position's route, 0 where it is not known (uint8 ``[length]``)."""
        if self._routes is None:
            return np.zeros(self._p + self._n, dtype=np.uint8)
        return self._routes.known(self._p + self._n)

    def add_routes(self, start, routes):
        """Set the routes of positions ``start .. start + len(routes)`` of ``prompt_ids + completion_ids``.

        ``routes``: ``[positions, layers, top_k]`` numpy array, uint8, uint16 or int32, every position
        already appended, the same layers and top-k as earlier routes. Anything else raises
        :class:`tmpl.errors.RoutesError` and leaves the trajectory unchanged. Works whatever the status
        (a finished sample's last routes arrive with its last turn).
        """
        store = self._routes if self._routes is not None else RouteStore(self._sample_id)
        store.add(int(start), routes, self._p + self._n)
        self._routes = store

    def __repr__(self):
        return (
            f"Trajectory(sample_id={self._sample_id!r}, prompt={self._p}, completion={self._n}, "
            f"status={self.status.name})"
        )

    # -- budget --------------------------------------------------------------------------------
    def max_new_tokens(self, requested=None):
        """Tokens the model may generate now: ``min(requested, what both budgets leave)``; 0 once final."""
        cdef Py_ssize_t left = self._cap - self._n if self._status == RUNNING else 0
        cdef long long want
        cdef int overflow = 0
        if requested is None:
            return left
        if PyLong_CheckExact(requested):
            want = PyLong_AsLongLongAndOverflow(requested, &overflow)
            if overflow > 0:
                return left
            if overflow == 0 and want >= 0:
                return want if want < left else left
        return min(_validate.requested_tokens(requested, self._sample_id), left)

    # -- reading inputs into the free part of the buffers ---------------------------------------
    cdef Py_ssize_t _read_ids(self, object ids, Py_ssize_t room) except -1:
        """Validate ``ids``, write the first ``room`` of them after the completion; returns their count."""
        cdef Py_ssize_t total
        cdef bint vocab_known = self._vocab_size is not None
        if _is_list_or_tuple(ids):
            total = PySequence_Fast_GET_SIZE(ids)
            self._reserve(self._n + (total if total < room else room))
            if _read_int_items(ids, total, self._ids + self._n, room, self._limit, self._sample_id, "ids",
                               vocab_known) == FAST_OK:
                return total
        arr = _validate.ids_array(ids, sample=self._sample_id, field="ids", limit=self._limit, vocab_known=vocab_known)
        total = len(arr)
        if total and room:
            self._reserve(self._n + (total if total < room else room))
            memcpy(self._ids + self._n, _data(arr), min(total, room) * sizeof(int32_t))
        return total

    cdef int _read_logprobs_fast(self, object seq, Py_ssize_t total, Py_ssize_t room) except -1:
        """Check exact floats of a list/tuple, writing the first ``room`` after the completion."""
        cdef PyObject** items = PySequence_Fast_ITEMS(seq)
        cdef float* out = self._lp + self._n
        cdef Py_ssize_t i
        cdef object item
        cdef double value
        cdef float stored
        for i in range(total):
            item = <object>items[i]
            if not PyFloat_CheckExact(item):
                return FAST_FALLBACK
            value = PyFloat_AS_DOUBLE(item)
            stored = <float>value
            if isnan(stored) or isinf(stored) or stored > 0.0:
                raise LogprobError(self._sample_id, i, value)
            if i < room:
                out[i] = stored
        return FAST_OK

    cdef Py_ssize_t _read_logprobs(self, object logprobs, Py_ssize_t room) except -1:
        """Validate ``logprobs``, write the first ``room`` after the completion; returns their count."""
        cdef Py_ssize_t total
        if _is_list_or_tuple(logprobs):
            total = PySequence_Fast_GET_SIZE(logprobs)
            if self._read_logprobs_fast(logprobs, total, room) == FAST_OK:
                return total
        arr = _validate.logprobs_array(logprobs, sample=self._sample_id)
        total = len(arr)
        if total and room:
            memcpy(self._lp + self._n, _data(arr), min(total, room) * sizeof(float))
        return total

    # -- appending -----------------------------------------------------------------------------
    cdef _push_span(self, int32_t kind, int32_t message, Py_ssize_t start, Py_ssize_t end):
        cdef Py_ssize_t grown
        cdef SpanRec* spans
        if self._nspans == self._span_cap:
            grown = 8 if self._span_cap == 0 else 2 * self._span_cap
            spans = <SpanRec*>realloc(self._spans, grown * sizeof(SpanRec))
            if spans == NULL:
                raise MemoryError()
            self._spans = spans
            self._span_cap = grown
        self._spans[self._nspans] = SpanRec(kind, <int32_t>self._turns, message, <int32_t>start, <int32_t>end)
        self._nspans += 1

    cdef Py_ssize_t _commit(self, int32_t kind, Py_ssize_t total, int32_t message):
        """Make the first ``min(total, room)`` written tokens part of the completion."""
        cdef Py_ssize_t room = self._cap - self._n
        cdef Py_ssize_t kept = total if total < room else room
        cdef Py_ssize_t start = self._n
        if kind == KIND_COMPLETION:
            memset(self._mask + start, 1, kept)
        else:
            memset(self._mask + start, 0, kept)
            memset(self._lp + start, 0, kept * sizeof(float))
        self._n = start + kept
        self._push_span(kind, message, start, self._n)
        if kind == KIND_COMPLETION:
            self._turns += 1
        if kept < total:
            self._status = TRUNCATED
            self._reason = truncation_reason(
                COMPLETION if kind == KIND_COMPLETION else SUFFIX, total, kept,
                binding_budget(self._max_length, self._mcl, self._p),
            )
            self._cut = total - kept
        return kept

    cdef _closed(self, str what):
        return TrajectoryClosedError(self._sample_id, STATUSES[self._status], self._reason, what)

    def add_completion(self, ids, logprobs, *, message=None):
        """Append model tokens (mask 1) with their rollout logprobs; returns how many were kept.

        A completion longer than ``max_new_tokens()`` allowed is cut to fit, ids and logprobs
        together, and the status becomes TRUNCATED. Missing logprobs (None) or a different count
        make the status ABORTED (nothing appended, returns 0). Bad IDs or logprobs raise
        TokenIdError / LogprobError and leave the trajectory unchanged; so does a final status
        (TrajectoryClosedError).
        """
        cdef Py_ssize_t total, count
        cdef Py_ssize_t room = self._cap - self._n
        if self._status != RUNNING:
            raise self._closed("add a completion")
        cdef int32_t code = -1 if message is None else _validate.message_code(message, self._sample_id)
        total = self._read_ids(ids, room)
        if logprobs is None:
            self._abort(missing_logprobs_reason(total))
            return 0
        if _is_list_or_tuple(logprobs):
            count = PySequence_Fast_GET_SIZE(logprobs)
        else:
            known = _validate.sequence_length(logprobs)
            count = total if known is None else known
        if count != total:
            self._abort(logprob_count_reason(total, count))
            return 0
        if total < room:
            room = total  # storage was reserved for the ids kept; logprobs never write past them
        count = self._read_logprobs(logprobs, room)
        if count != total:
            self._abort(logprob_count_reason(total, count))
            return 0
        return self._commit(KIND_COMPLETION, total, code)

    def add_suffix(self, ids, *, message=None):
        """Append tokens the model did not generate (tool results, generation prompts): mask 0, logprob 0.0.

        Returns how many were kept: a suffix that does not fit is cut (TRUNCATED, ``tokens_cut``).
        Raises TrajectoryClosedError once the status is final, TokenIdError on a bad ID.
        """
        if self._status != RUNNING:
            raise self._closed("add a suffix")
        cdef int32_t code = -1 if message is None else _validate.message_code(message, self._sample_id)
        cdef Py_ssize_t total = self._read_ids(ids, self._cap - self._n)
        return self._commit(KIND_SUFFIX, total, code)

    # -- status --------------------------------------------------------------------------------
    cdef _abort(self, str reason):
        self._status = ABORTED
        self._reason = reason

    def finish(self):
        """Mark a RUNNING sample DONE; a final status stays as it is. Returns the status."""
        if self._status == RUNNING:
            self._status = DONE
        return STATUSES[self._status]

    def truncate(self, reason, cut=0):
        """Mark a RUNNING sample TRUNCATED with ``reason``; ``cut``: tokens left out (0: a limit other
        than the token budgets ended it, e.g. the rollout's turn limit; a caller that appended part
        of something gives the rest). A final status stays. Returns the status."""
        if cut < 0:
            raise ValueError(f"cut must be >= 0, got {cut}")
        if self._status == RUNNING:
            self._status = TRUNCATED
            self._reason = str(reason)
            self._cut = cut
        return STATUSES[self._status]

    def abort(self, reason):
        """Mark a RUNNING sample ABORTED with ``reason``; a final status stays as it is. Returns the status."""
        if self._status == RUNNING:
            self._abort(str(reason))
        return STATUSES[self._status]

    def reset(self):
        """Start the sample again from its prompt: empty completion, RUNNING, no spans.

        Fresh buffers are allocated, so arrays handed out before keep what they showed and
        nothing of the previous attempt is visible through the trajectory.
        """
        self._fresh_state()

    # -- pickling (portable between the twins) -----------------------------------------------
    def __reduce__(self):
        return (restore_trajectory, (state_of(self),))

    def _state(self):
        return state_of(self)

    @classmethod
    def _from_state(cls, state):
        cdef Trajectory traj = cls(
            state["prompt_ids"], state["max_length"], state["max_completion_length"],
            vocab_size=state["vocab_size"], sample_id=state["sample_id"],
        )
        cdef Py_ssize_t n = len(state["completion_ids"])
        traj._reserve(n)
        ids, mask, logprobs = traj._typed()
        ids[:n] = state["completion_ids"]
        mask[:n] = state["mask"]
        logprobs[:n] = state["logprobs"]
        traj._n = n
        for kind, turn, message, start, end in state["spans"]:
            traj._turns = turn
            traj._push_span(KIND_COMPLETION if kind == COMPLETION else KIND_SUFFIX,
                            -1 if message is None else message, start, end)
        traj._status = state["status"]
        traj._reason = state["reason"]
        traj._cut = state["tokens_cut"]
        traj._turns = state["num_turns"]
        traj._routes = RouteStore.from_state(state.get("routes"), state["sample_id"])
        return traj


# -- collation ---------------------------------------------------------------------------------
cdef struct RowRef:
    const int32_t* prompt
    const int32_t* ids
    const uint8_t* mask
    const float* lp
    Py_ssize_t p
    Py_ssize_t n
    bint masked


cdef Py_ssize_t _padded_width(Py_ssize_t width, object multiple):
    cdef Py_ssize_t m
    if multiple is None:
        return width
    m = multiple
    if width % m == 0:
        return width
    return width + m - width % m


cdef void _fill(const RowRef* rows, Py_ssize_t n_rows, int64_t pad,
                int64_t* prompt_ids, int64_t* prompt_mask, Py_ssize_t width_p,
                int64_t* completion_ids, int64_t* completion_mask, int64_t* tool_mask, float* logps,
                Py_ssize_t width_c) noexcept nogil:
    """Write every position of every output once: left-padded prompt, right-padded completion."""
    cdef Py_ssize_t r, j, off, p, n
    cdef const int32_t* prompt
    cdef const int32_t* ids
    cdef const uint8_t* mask
    cdef const float* lp
    cdef int64_t* out
    cdef float* out_lp
    cdef int64_t keep
    for r in range(n_rows):
        # row fields in locals: stores through int64_t* must not force reloads of the row
        prompt = rows[r].prompt
        ids = rows[r].ids
        mask = rows[r].mask
        lp = rows[r].lp
        p = rows[r].p
        n = rows[r].n
        keep = 0 if rows[r].masked else 1
        off = width_p - p
        out = prompt_ids + r * width_p
        for j in range(off):
            out[j] = pad
        for j in range(p):
            out[off + j] = prompt[j]
        out = prompt_mask + r * width_p
        for j in range(off):
            out[j] = 0
        for j in range(off, width_p):
            out[j] = 1
        out = completion_ids + r * width_c
        for j in range(n):
            out[j] = ids[j]
        for j in range(n, width_c):
            out[j] = pad
        out = completion_mask + r * width_c
        for j in range(n):
            out[j] = keep
        for j in range(n, width_c):
            out[j] = 0
        out = tool_mask + r * width_c
        if keep:
            for j in range(n):
                out[j] = mask[j]
            for j in range(n, width_c):
                out[j] = 1
        else:
            for j in range(width_c):
                out[j] = 0
        out_lp = logps + r * width_c
        if n:
            memcpy(out_lp, lp, n * sizeof(float))
        if width_c > n:
            memset(out_lp + n, 0, (width_c - n) * sizeof(float))


def collate_arrays(trajectories, pad_id, *, pad_to_multiple_of=None, mask_truncated=False, mask_aborted=False):
    """Pad a batch into numpy arrays with TRL's GRPO keys and conventions (see ``tmpl.collate``)."""
    cdef list batch = _validate.batch_list(trajectories)
    cdef Py_ssize_t n_rows = len(batch)
    cdef Py_ssize_t i, width_p = 0, width_c = 0
    cdef Trajectory traj
    cdef RowRef* rows
    cdef int64_t pad
    cdef bint m_trunc = mask_truncated, m_abort = mask_aborted
    _validate.collate_options(n_rows, pad_id, pad_to_multiple_of)
    pad = pad_id
    for i in range(n_rows):
        item = batch[i]
        if not isinstance(item, Trajectory):
            raise CollateError(i, None, f"is a {type(item).__name__}, not a Trajectory of the compiled core")
        traj = <Trajectory>item
        if traj._status == ABORTED and not m_abort:
            raise CollateError(i, traj._sample_id, f"is ABORTED ({traj._reason}); drop it, or pass mask_aborted=True")
    rows = <RowRef*>malloc(max(n_rows, 1) * sizeof(RowRef))
    if rows == NULL:
        raise MemoryError()
    buffers = []  # keeps every buffer read below alive, even if a thread resets a trajectory meanwhile
    try:
        for i in range(n_rows):
            traj = <Trajectory>batch[i]
            buffers.append(traj._block)
            rows[i].prompt = traj._prompt
            rows[i].ids = traj._ids
            rows[i].mask = traj._mask
            rows[i].lp = traj._lp
            rows[i].p = traj._p
            rows[i].n = traj._n
            rows[i].masked = (m_trunc and traj._status == TRUNCATED) or (m_abort and traj._status == ABORTED)
            if traj._p > width_p:
                width_p = traj._p
            if traj._n > width_c:
                width_c = traj._n
        width_p = _padded_width(width_p, pad_to_multiple_of)
        width_c = _padded_width(width_c, pad_to_multiple_of)
        prompt_ids = np.empty((n_rows, width_p), dtype=np.int64)
        prompt_mask = np.empty((n_rows, width_p), dtype=np.int64)
        completion_ids = np.empty((n_rows, width_c), dtype=np.int64)
        completion_mask = np.empty((n_rows, width_c), dtype=np.int64)
        tool_mask = np.empty((n_rows, width_c), dtype=np.int64)
        logps = np.empty((n_rows, width_c), dtype=np.float32)
        prompt_lengths = np.empty(n_rows, dtype=np.int64)
        completion_lengths = np.empty(n_rows, dtype=np.int64)
        _fill_and_lengths(rows, n_rows, pad, prompt_ids, prompt_mask, width_p,
                          completion_ids, completion_mask, tool_mask, logps, width_c,
                          prompt_lengths, completion_lengths)
    finally:
        free(rows)
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "old_per_token_logps": logps,
        "prompt_lengths": prompt_lengths,
        "completion_lengths": completion_lengths,
    }


cdef _fill_and_lengths(const RowRef* rows, Py_ssize_t n_rows, int64_t pad,
                       int64_t[:, ::1] prompt_ids, int64_t[:, ::1] prompt_mask, Py_ssize_t width_p,
                       int64_t[:, ::1] completion_ids, int64_t[:, ::1] completion_mask,
                       int64_t[:, ::1] tool_mask, float[:, ::1] logps, Py_ssize_t width_c,
                       int64_t[::1] prompt_lengths, int64_t[::1] completion_lengths):
    """Lengths, then the padded arrays in one fill loop without the GIL."""
    cdef Py_ssize_t r
    cdef bint has_p = n_rows > 0 and width_p > 0
    cdef bint has_c = n_rows > 0 and width_c > 0
    cdef int64_t* pid = &prompt_ids[0, 0] if has_p else NULL
    cdef int64_t* pm = &prompt_mask[0, 0] if has_p else NULL
    cdef int64_t* cid = &completion_ids[0, 0] if has_c else NULL
    cdef int64_t* cm = &completion_mask[0, 0] if has_c else NULL
    cdef int64_t* tm = &tool_mask[0, 0] if has_c else NULL
    cdef float* lo = &logps[0, 0] if has_c else NULL
    for r in range(n_rows):
        prompt_lengths[r] = rows[r].p
        completion_lengths[r] = rows[r].n
    with nogil:
        _fill(rows, n_rows, pad, pid, pm, width_p, cid, cm, tm, lo, width_c)
