"""Token-ID utilities, pure-Python twin of ``tmpl/_ids_c.pyx``."""

from __future__ import annotations

from collections.abc import Container, Sequence


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two ID sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def find_subsequence(haystack: Sequence[int], needle: Sequence[int], start: int = 0) -> int:
    """Index of the first occurrence of ``needle`` in ``haystack`` at or after ``start``; -1 if absent."""
    h, n = list(haystack), list(needle)
    start = max(start, 0)
    if not n:
        return start if start <= len(h) else -1
    first, ln = n[0], len(n)
    for i in range(start, len(h) - ln + 1):
        if h[i] == first and h[i : i + ln] == n:
            return i
    return -1


def join_ids(chunks: Sequence[Sequence[int]]) -> list[int]:
    """Concatenate a sequence of ID lists into one new list."""
    out: list[int] = []
    for part in chunks:
        out.extend(part)
    return out


def ends_with_any(ids: Sequence[int], stops: Container[int]) -> bool:
    """True when the last ID of ``ids`` is in the set ``stops`` (False for an empty sequence)."""
    return bool(len(ids)) and ids[-1] in stops


def positions_of(ids: Sequence[int], targets: Container[int], start: int = 0) -> list[int]:
    """Positions ``i >= start`` whose ID is in ``targets`` (a set or frozenset), in order.

    Used to cut a completion at delimiter tokens (special tokens, tool-call markers).
    """
    x = list(ids)
    return [i for i in range(max(start, 0), len(x)) if x[i] in targets]


def index_of_any(ids: Sequence[int], targets: Container[int], start: int = 0) -> int:
    """First position ``i >= start`` whose ID is in ``targets``; -1 if there is none."""
    x = list(ids)
    for i in range(max(start, 0), len(x)):
        if x[i] in targets:
            return i
    return -1
