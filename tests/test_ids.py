"""The ID utilities of the compiled core and their pure twin: same names, same results."""

from __future__ import annotations

import inspect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tmpl import _compat

id_lists = st.lists(st.integers(min_value=0, max_value=12), max_size=40)


def public_names(module) -> set[str]:
    return {
        n
        for n, v in vars(module).items()
        if not n.startswith("_")
        and callable(v)
        and not inspect.isclass(v)
        and getattr(v, "__module__", module.__name__) == module.__name__
    }


def test_twins_have_the_same_public_functions():
    try:
        native = _compat.load("native")
    except ImportError as exc:
        pytest.skip(f"compiled core not built: {exc}")
    pure = _compat.load("pure")
    for name in _compat.TWIN_MODULES:
        assert public_names(native[name]) == public_names(pure[name]), name


@settings(max_examples=400, deadline=None)
@given(a=id_lists, b=id_lists)
def test_common_prefix_len(core, a, b):
    n = core.ids.common_prefix_len(a, b)
    assert a[:n] == b[:n]
    assert n == min(len(a), len(b)) or a[n] != b[n]


@settings(max_examples=400, deadline=None)
@given(hay=id_lists, needle=st.lists(st.integers(0, 12), max_size=4), start=st.integers(-3, 45))
def test_find_subsequence(core, hay, needle, start):
    i = core.ids.find_subsequence(hay, needle, start)
    lo = max(start, 0)
    occurrences = [j for j in range(lo, len(hay) - len(needle) + 1) if hay[j : j + len(needle)] == needle]
    assert i == (occurrences[0] if occurrences else -1)


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(id_lists, max_size=6))
def test_join_ids(core, chunks):
    out = core.ids.join_ids(chunks)
    assert out == [x for c in chunks for x in c]
    if chunks:
        assert out is not chunks[0]  # a new list, never an alias of an input


def test_join_ids_accepts_tuples_and_keeps_inputs(core):
    parts = [(1, 2), [3], range(4, 6)]
    assert core.ids.join_ids(parts) == [1, 2, 3, 4, 5]
    assert parts[0] == (1, 2)


def test_ends_with_any(core):
    assert core.ids.ends_with_any([5, 6, 7], {7, 9})
    assert not core.ids.ends_with_any([7, 6], {7})
    assert not core.ids.ends_with_any([], {7})
