"""Input checks shared by both twins of the trajectory builder.

Token IDs and logprobs arrive as lists (vLLM, SGLang), tuples or numpy arrays. These functions
turn them into validated numpy arrays, or raise the typed error that names the sample, the
argument and the first offending position. The compiled core runs its own loop over lists and
tuples and calls these functions for everything else, so both twins agree by construction on
every input that is not a list or tuple (and the property tests check that they agree on those).

>>> ids_array([5, 7], sample="q1", field="ids", limit=10, vocab_known=True)
array([5, 7], dtype=int32)
>>> ids_array([5, 12], sample="q1", field="ids", limit=10, vocab_known=True)
Traceback (most recent call last):
...
tmpl.errors.TokenIdError: sample 'q1': ids[1] = 12 is outside [0, 10) (vocab_size=10)
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import BudgetError, LogprobError, SpanLabelError, TokenIdError

#: Token IDs are stored as int32: without a vocabulary size, IDs must lie in [0, 2**31).
INT32_LIMIT = 2**31

_TEXT = (str, bytes, bytearray)


def _items(value: Any, on_error: Callable[[], Exception]) -> Sequence[Any]:
    """``value`` as a list or tuple of items; ``on_error()`` when it is not a sequence of items."""
    if isinstance(value, (list, tuple)):
        return value
    if isinstance(value, _TEXT) or value is None:
        raise on_error()
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            raise on_error()
        items: list[Any] = value.tolist()
        return items
    try:
        return list(value)
    except TypeError:
        raise on_error() from None


def _numeric_array(value: Any, kinds: str) -> np.ndarray | None:
    """A 1-D numpy array of ``value`` when numpy sees it as one of ``kinds`` ("iu", "fiu"), else None."""
    if isinstance(value, np.ndarray):
        arr = value
    elif isinstance(value, (list, tuple)):
        if not value:
            return np.empty(0, dtype=np.int64)
        try:
            arr = np.array(value)
        except (OverflowError, ValueError, TypeError):
            return None
    else:
        return None
    if arr.ndim == 1 and arr.dtype.kind in kinds:
        return arr
    return None


def id_limit(vocab_size: int | None, sample: object) -> int:
    """Upper bound (exclusive) of valid token IDs: ``vocab_size``, or 2**31 when it is None."""
    if vocab_size is None:
        return INT32_LIMIT
    try:
        limit = operator.index(vocab_size)
    except TypeError:
        raise BudgetError(sample, f"vocab_size must be an int or None, not {type(vocab_size).__name__}") from None
    if not 0 < limit <= INT32_LIMIT:
        raise BudgetError(sample, f"vocab_size={limit} is outside [1, {INT32_LIMIT}]")
    return limit


def ids_array(ids: Any, *, sample: object, field: str, limit: int, vocab_known: bool) -> np.ndarray:
    """Validated 1-D int32 array of token IDs in ``[0, limit)``; TokenIdError at the first bad one."""
    arr = _numeric_array(ids, "iu")
    if arr is not None:
        bad = (arr < 0) | (arr >= limit)
        if bad.any():
            i = int(np.argmax(bad))
            raise TokenIdError(sample, field, i, int(arr[i]), limit=limit, vocab_known=vocab_known)
        return arr.astype(np.int32)
    items = _items(ids, lambda: TokenIdError(sample, field, None, ids, limit=limit, vocab_known=vocab_known))
    out = np.empty(len(items), dtype=np.int32)
    for i, item in enumerate(items):
        out[i] = token_id(item, i, sample=sample, field=field, limit=limit, vocab_known=vocab_known)
    return out


def token_id(item: Any, position: int, *, sample: object, field: str, limit: int, vocab_known: bool) -> int:
    """One token ID as an int in ``[0, limit)`` (``operator.index`` semantics), else TokenIdError."""
    try:
        value = int(operator.index(item))
    except TypeError:
        raise TokenIdError(sample, field, position, item, limit=limit, vocab_known=vocab_known) from None
    if not 0 <= value < limit:
        raise TokenIdError(sample, field, position, value, limit=limit, vocab_known=vocab_known)
    return value


def logprobs_array(logprobs: Any, *, sample: object) -> np.ndarray:
    """Validated 1-D float32 array of logprobs (finite, <= 0 as float32); LogprobError at the first bad one."""
    arr = _numeric_array(logprobs, "fiu")
    if arr is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            as32 = arr.astype(np.float32)
        bad = ~np.isfinite(as32) | (as32 > 0)
        if bad.any():
            i = int(np.argmax(bad))
            raise LogprobError(sample, i, float(arr[i]))
        return as32
    items = _items(logprobs, lambda: LogprobError(sample, None, logprobs))
    out = np.empty(len(items), dtype=np.float32)
    for i, item in enumerate(items):
        out[i] = logprob(item, i, sample=sample)
    return out


def logprob_value(item: Any, position: int, *, sample: object) -> float:
    """``float(item)`` for a number (not text), else LogprobError; the value itself is not checked."""
    if isinstance(item, _TEXT):
        raise LogprobError(sample, position, item)
    try:
        return float(item)
    except (TypeError, ValueError):
        raise LogprobError(sample, position, item) from None


def logprob(item: Any, position: int, *, sample: object) -> float:
    """One logprob, checked as the float32 that is stored: a number, finite, <= 0."""
    value = logprob_value(item, position, sample=sample)
    with np.errstate(over="ignore"):
        stored = float(np.float32(value))
    if stored != stored or stored > 0.0 or stored in (float("inf"), float("-inf")):
        raise LogprobError(sample, position, value)
    return stored


def sequence_length(value: Any) -> int | None:
    """``len(value)`` when it has one (no consuming of iterators), else None."""
    try:
        return len(value)
    except TypeError:
        return None


def message_code(message: int | None, sample: object) -> int:
    """The stored form of a span's message index: -1 for None, else the index (>= 0, < 2**31)."""
    if message is None:
        return -1
    try:
        index = operator.index(message)
    except TypeError:
        raise SpanLabelError(sample, f"message must be an int index or None, not {type(message).__name__}") from None
    if not 0 <= index < INT32_LIMIT:
        raise SpanLabelError(sample, f"message index {index} is negative or too large")
    return index


def budgets(sample: object, max_length: Any, max_completion_length: Any, prompt_length: int) -> tuple[int, int, int]:
    """``(max_length, max_completion_length, capacity)`` checked; capacity is the most completion tokens.

    ``max_completion_length=None`` means the completion is capped by ``max_length`` alone.
    """
    try:
        total = operator.index(max_length)
    except TypeError:
        raise BudgetError(sample, f"max_length must be an int, not {type(max_length).__name__}") from None
    if not 0 < total < INT32_LIMIT:
        raise BudgetError(sample, f"max_length={total} is outside [1, {INT32_LIMIT})")
    if max_completion_length is None:
        completion = total
    else:
        try:
            completion = operator.index(max_completion_length)
        except TypeError:
            raise BudgetError(
                sample, f"max_completion_length must be an int or None, not {type(max_completion_length).__name__}"
            ) from None
        if not 0 <= completion < INT32_LIMIT:
            raise BudgetError(sample, f"max_completion_length={completion} is outside [0, {INT32_LIMIT})")
    if prompt_length > total:
        raise BudgetError(sample, f"prompt of {prompt_length} tokens exceeds max_length={total}")
    return total, completion, min(completion, total - prompt_length)


def requested_tokens(requested: Any, sample: object) -> int:
    """A ``max_new_tokens`` request as a non-negative int."""
    try:
        value = operator.index(requested)
    except TypeError:
        raise BudgetError(sample, f"requested must be an int or None, not {type(requested).__name__}") from None
    if value < 0:
        raise BudgetError(sample, f"requested={value} is negative")
    return value


def batch_list(trajectories: Any) -> list[Any]:
    """The trajectories of a batch as a list; CollateError when they are not an iterable."""
    from ..errors import CollateError

    if isinstance(trajectories, list):
        return trajectories
    try:
        return list(trajectories)
    except TypeError:
        raise CollateError(
            None, None, f"trajectories must be a sequence of Trajectory, not {type(trajectories).__name__}"
        ) from None


def collate_options(n_rows: int, pad_id: Any, pad_to_multiple_of: Any) -> None:
    """Check a collation's batch size and options; CollateError naming what is wrong."""
    from ..errors import CollateError

    if n_rows == 0:
        raise CollateError(None, None, "no trajectories to collate")
    if isinstance(pad_id, bool) or not isinstance(pad_id, (int, np.integer)):
        raise CollateError(None, None, f"pad_id must be an int, not {type(pad_id).__name__}")
    if not -(2**63) <= int(pad_id) < 2**63:
        raise CollateError(None, None, f"pad_id={pad_id} does not fit int64")
    if pad_to_multiple_of is not None and (
        isinstance(pad_to_multiple_of, bool) or not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1
    ):
        raise CollateError(None, None, f"pad_to_multiple_of must be a positive int or None, not {pad_to_multiple_of!r}")
