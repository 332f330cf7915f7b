# cython: language_level=3
"""Token-ID utilities of the compiled core (twin: ``tmpl/_ids_py.py``).

Inputs are Python lists of ints (other sequences are converted once).
"""

from cpython.list cimport PyList_New, PyList_SET_ITEM, PyList_GET_ITEM, PyList_GET_SIZE
from cpython.ref cimport Py_INCREF


cdef inline list _as_list(object seq):
    return seq if type(seq) is list else list(seq)


def common_prefix_len(a, b):
    """Length of the longest common prefix of two ID sequences."""
    cdef list x = _as_list(a)
    cdef list y = _as_list(b)
    cdef Py_ssize_t n = min(PyList_GET_SIZE(x), PyList_GET_SIZE(y))
    cdef Py_ssize_t i = 0
    while i < n and <object>PyList_GET_ITEM(x, i) == <object>PyList_GET_ITEM(y, i):
        i += 1
    return i


def find_subsequence(haystack, needle, Py_ssize_t start=0):
    """Index of the first occurrence of ``needle`` in ``haystack`` at or after ``start``; -1 if absent."""
    cdef list h = _as_list(haystack)
    cdef list n = _as_list(needle)
    cdef Py_ssize_t lh = PyList_GET_SIZE(h)
    cdef Py_ssize_t ln = PyList_GET_SIZE(n)
    cdef Py_ssize_t i, j
    if start < 0:
        start = 0
    if ln == 0:
        return start if start <= lh else -1
    for i in range(start, lh - ln + 1):
        j = 0
        while j < ln and <object>PyList_GET_ITEM(h, i + j) == <object>PyList_GET_ITEM(n, j):
            j += 1
        if j == ln:
            return i
    return -1


def join_ids(chunks):
    """Concatenate a sequence of ID lists into one new list (one allocation)."""
    cdef list parts = [_as_list(c) for c in chunks]  # never write into the caller's list
    cdef Py_ssize_t total = 0
    cdef Py_ssize_t k, i, m, pos = 0
    cdef list part
    cdef object item
    for k in range(PyList_GET_SIZE(parts)):
        total += PyList_GET_SIZE(<list>PyList_GET_ITEM(parts, k))
    cdef list out = PyList_New(total)
    for k in range(PyList_GET_SIZE(parts)):
        part = <list>PyList_GET_ITEM(parts, k)
        m = PyList_GET_SIZE(part)
        for i in range(m):
            item = <object>PyList_GET_ITEM(part, i)
            Py_INCREF(item)
            PyList_SET_ITEM(out, pos, item)
            pos += 1
    return out


def ends_with_any(ids, stops):
    """True when the last ID of ``ids`` is in the set ``stops`` (False for an empty sequence)."""
    cdef list x = _as_list(ids)
    if PyList_GET_SIZE(x) == 0:
        return False
    return <object>PyList_GET_ITEM(x, PyList_GET_SIZE(x) - 1) in stops


def positions_of(ids, targets, Py_ssize_t start=0):
    """Positions ``i >= start`` whose ID is in ``targets`` (a set or frozenset), in order.

    Used to cut a completion at delimiter tokens (special tokens, tool-call markers).
    """
    cdef list x = _as_list(ids)
    cdef Py_ssize_t n = PyList_GET_SIZE(x)
    cdef Py_ssize_t i
    cdef list out = []
    if start < 0:
        start = 0
    for i in range(start, n):
        if <object>PyList_GET_ITEM(x, i) in targets:
            out.append(i)
    return out


def index_of_any(ids, targets, Py_ssize_t start=0):
    """First position ``i >= start`` whose ID is in ``targets``; -1 if there is none."""
    cdef list x = _as_list(ids)
    cdef Py_ssize_t n = PyList_GET_SIZE(x)
    cdef Py_ssize_t i
    if start < 0:
        start = 0
    for i in range(start, n):
        if <object>PyList_GET_ITEM(x, i) in targets:
            return i
    return -1
