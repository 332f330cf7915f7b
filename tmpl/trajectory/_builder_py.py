"""Trajectory builder and collation, pure-Python twin of ``_builder_c.pyx``.

One ``Trajectory`` per sample holds its prompt and, in completion coordinates, three arrays that
always have the same length: token IDs (int32), the mask (uint8: 1 model token, 0 suffix token)
and rollout logprobs (float32, 0.0 on suffix tokens). ``collate_arrays`` pads a batch in one pass.

>>> traj = Trajectory([1, 2, 3], max_length=8, sample_id="q1")
>>> traj.max_new_tokens(10)
5
>>> traj.add_completion([4, 5], [-0.5, -0.25])
2
>>> traj.add_suffix([6, 7, 8, 9])  # only 3 tokens are left
3
>>> traj.status.name, traj.tokens_cut, traj.mask.tolist()
('TRUNCATED', 1, [1, 1, 0, 0, 0])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import CollateError, TrajectoryClosedError
from . import _validate
from .routes import RouteStore
from .types import (
    COMPLETION,
    MIN_ALLOC,
    STATUSES,
    SUFFIX,
    Span,
    Status,
    binding_budget,
    logprob_count_reason,
    missing_logprobs_reason,
    restore_trajectory,
    state_of,
    truncation_reason,
)

_RUNNING, _DONE, _TRUNCATED, _ABORTED = (int(s) for s in Status)


def _readonly(view: np.ndarray) -> np.ndarray:
    view.flags.writeable = False
    return view


class Trajectory:
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

    __slots__ = (
        "_sample_id",
        "_prompt",
        "_max_length",
        "_max_completion_length",
        "_capacity",
        "_alloc",
        "_limit",
        "_vocab_size",
        "_ids",
        "_mask",
        "_logprobs",
        "_n",
        "_status",
        "_reason",
        "_cut",
        "_turns",
        "_spans",
        "_routes",
    )

    def __init__(
        self,
        prompt_ids: Sequence[int],
        max_length: int,
        max_completion_length: int | None = None,
        *,
        vocab_size: int | None = None,
        sample_id: Any = None,
    ) -> None:
        self._sample_id = sample_id
        self._limit = _validate.id_limit(vocab_size, sample_id)
        self._vocab_size = vocab_size if vocab_size is None else self._limit
        prompt = _validate.ids_array(
            prompt_ids, sample=sample_id, field="prompt_ids", limit=self._limit, vocab_known=vocab_size is not None
        )
        self._max_length, self._max_completion_length, self._capacity = _validate.budgets(
            sample_id, max_length, max_completion_length, len(prompt)
        )
        self._prompt = _readonly(prompt)
        self._fresh_state()

    def _fresh_state(self) -> None:
        # Storage follows the tokens held, not the budget: it starts empty and grows on append.
        self._alloc = 0
        self._ids = np.empty(0, dtype=np.int32)
        self._mask = np.empty(0, dtype=np.uint8)
        self._logprobs = np.empty(0, dtype=np.float32)
        self._n = 0
        self._status = _RUNNING
        self._reason = ""
        self._cut = 0
        self._turns = 0
        self._spans: list[Span] = []
        self._routes: RouteStore | None = None

    # -- what it holds -------------------------------------------------------------------------
    @property
    def sample_id(self) -> Any:
        """The caller's name for this sample (used in errors)."""
        return self._sample_id

    @property
    def prompt_ids(self) -> np.ndarray:
        """Prompt token IDs (int32, read-only)."""
        return self._prompt

    @property
    def completion_ids(self) -> np.ndarray:
        """Completion token IDs, model and suffix tokens (int32, read-only view)."""
        return _readonly(self._ids[: self._n])

    @property
    def mask(self) -> np.ndarray:
        """1 on model tokens, 0 on suffix tokens (uint8, read-only view, same length as completion_ids)."""
        return _readonly(self._mask[: self._n])

    @property
    def logprobs(self) -> np.ndarray:
        """Rollout logprobs, 0.0 on suffix tokens (float32, read-only view, same length as completion_ids)."""
        return _readonly(self._logprobs[: self._n])

    @property
    def prompt_length(self) -> int:
        return len(self._prompt)

    @property
    def _storage_tokens(self) -> int:
        """Completion tokens the storage holds room for now (grows with the tokens; for benchmarks)."""
        return self._alloc

    @property
    def completion_length(self) -> int:
        return self._n

    @property
    def length(self) -> int:
        """Prompt plus completion tokens (never more than ``max_length``)."""
        return len(self._prompt) + self._n

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_completion_length(self) -> int:
        return self._max_completion_length

    @property
    def vocab_size(self) -> int | None:
        return self._vocab_size

    @property
    def remaining(self) -> int:
        """Completion tokens that still fit both budgets (whatever the status)."""
        return self._capacity - self._n

    @property
    def status(self) -> Status:
        return STATUSES[self._status]

    @property
    def running(self) -> bool:
        """True while tokens may be appended."""
        return self._status == _RUNNING

    @property
    def reason(self) -> str:
        """Why the status is TRUNCATED or ABORTED ('' otherwise)."""
        return self._reason

    @property
    def tokens_cut(self) -> int:
        """Tokens cut off by the truncation (0 unless TRUNCATED)."""
        return self._cut

    @property
    def num_turns(self) -> int:
        """Completions appended so far."""
        return self._turns

    @property
    def spans(self) -> list[Span]:
        """Where each range of the completion came from, in order."""
        return list(self._spans)

    @property
    def routes(self) -> np.ndarray | None:
        """Mixture-of-experts routes of every position of ``prompt_ids + completion_ids``:
        ``[length, layers, top_k]`` (uint8 up to 256 experts, read-only; rows whose route is not known
        are 0, see :attr:`routes_known`), or None when no routes were added (docs/rollouts.md,
        "Routing replay")."""
        return None if self._routes is None else self._routes.routes(self.length)

    @property
    def routes_known(self) -> np.ndarray:
        """1 where :attr:`routes` holds the position's route, 0 where it is not known (uint8 ``[length]``)."""
        if self._routes is None:
            return np.zeros(self.length, dtype=np.uint8)
        return self._routes.known(self.length)

    def add_routes(self, start: int, routes: Any) -> None:
        """Set the routes of positions ``start .. start + len(routes)`` of ``prompt_ids + completion_ids``.

        ``routes``: ``[positions, layers, top_k]`` numpy array, uint8, uint16 or int32, every position
        already appended, the same layers and top-k as earlier routes. Anything else raises
        :class:`tmpl.errors.RoutesError` and leaves the trajectory unchanged. Works whatever the status
        (a finished sample's last routes arrive with its last turn).

        >>> t = Trajectory([1, 2], max_length=8)
        >>> t.add_completion([3], [-0.1])
        1
        >>> t.add_routes(0, np.array([[[4, 1]], [[0, 7]]], dtype=np.uint8))
        >>> t.routes.shape, t.routes_known.tolist()
        ((3, 1, 2), [1, 1, 0])
        """
        store = self._routes if self._routes is not None else RouteStore(self._sample_id)
        store.add(int(start), routes, self.length)
        self._routes = store

    def __repr__(self) -> str:
        return (
            f"Trajectory(sample_id={self._sample_id!r}, prompt={len(self._prompt)}, completion={self._n}, "
            f"status={self.status.name})"
        )

    # -- budget --------------------------------------------------------------------------------
    def max_new_tokens(self, requested: int | None = None) -> int:
        """Tokens the model may generate now: ``min(requested, what both budgets leave)``; 0 once final."""
        left = self._capacity - self._n if self._status == _RUNNING else 0
        if requested is None:
            return left
        return min(_validate.requested_tokens(requested, self._sample_id), left)

    # -- storage -------------------------------------------------------------------------------
    def _reserve(self, need: int) -> None:
        """Make room for ``need`` completion tokens (never more than the budget allows).

        Grows by amortized doubling (first step ``MIN_ALLOC``) into fresh arrays; the tokens
        held are copied over and the old arrays are left untouched, so views handed out before
        keep what they showed.
        """
        if need <= self._alloc:
            return
        size = min(self._capacity, max(need, 2 * self._alloc, MIN_ALLOC))
        n = self._n
        for name, dtype in (("_ids", np.int32), ("_mask", np.uint8), ("_logprobs", np.float32)):
            grown = np.empty(size, dtype=dtype)
            grown[:n] = getattr(self, name)[:n]
            setattr(self, name, grown)
        self._alloc = size

    # -- appending -----------------------------------------------------------------------------
    def _closed(self, what: str) -> TrajectoryClosedError:
        return TrajectoryClosedError(self._sample_id, self.status, self._reason, what)

    def _append(self, kind: str, ids: np.ndarray, logprobs: np.ndarray | None, message: int) -> int:
        total = len(ids)
        kept = min(total, self._capacity - self._n)
        start, end = self._n, self._n + kept
        self._reserve(end)
        self._ids[start:end] = ids[:kept]
        if logprobs is None:
            self._mask[start:end] = 0
            self._logprobs[start:end] = 0.0
        else:
            self._mask[start:end] = 1
            self._logprobs[start:end] = logprobs[:kept]
        self._n = end
        self._spans.append(Span(kind, self._turns, None if message < 0 else message, start, end))
        if kind == COMPLETION:
            self._turns += 1
        if kept < total:
            budget = binding_budget(self._max_length, self._max_completion_length, len(self._prompt))
            self._status = _TRUNCATED
            self._reason = truncation_reason(kind, total, kept, budget)
            self._cut = total - kept
        return kept

    def add_completion(
        self, ids: Sequence[int], logprobs: Sequence[float] | None, *, message: int | None = None
    ) -> int:
        """Append model tokens (mask 1) with their rollout logprobs; returns how many were kept.

        A completion longer than ``max_new_tokens()`` allowed is cut to fit, ids and logprobs
        together, and the status becomes TRUNCATED. Missing logprobs (None) or a different count
        make the status ABORTED (nothing appended, returns 0). Bad IDs or logprobs raise
        TokenIdError / LogprobError and leave the trajectory unchanged; so does a final status
        (TrajectoryClosedError).
        """
        sample = self._sample_id
        if self._status != _RUNNING:
            raise self._closed("add a completion")
        code = _validate.message_code(message, sample)
        arr = _validate.ids_array(
            ids, sample=sample, field="ids", limit=self._limit, vocab_known=self._vocab_size is not None
        )
        if logprobs is None:
            self._abort(missing_logprobs_reason(len(arr)))
            return 0
        count = _validate.sequence_length(logprobs)
        if count is not None and count != len(arr):
            self._abort(logprob_count_reason(len(arr), count))
            return 0
        lps = _validate.logprobs_array(logprobs, sample=sample)
        if len(lps) != len(arr):
            self._abort(logprob_count_reason(len(arr), len(lps)))
            return 0
        return self._append(COMPLETION, arr, lps, code)

    def add_suffix(self, ids: Sequence[int], *, message: int | None = None) -> int:
        """Append tokens the model did not generate (tool results, generation prompts): mask 0, logprob 0.0.

        Returns how many were kept: a suffix that does not fit is cut (TRUNCATED, ``tokens_cut``).
        Raises TrajectoryClosedError once the status is final, TokenIdError on a bad ID.
        """
        sample = self._sample_id
        if self._status != _RUNNING:
            raise self._closed("add a suffix")
        code = _validate.message_code(message, sample)
        arr = _validate.ids_array(
            ids, sample=sample, field="ids", limit=self._limit, vocab_known=self._vocab_size is not None
        )
        return self._append(SUFFIX, arr, None, code)

    # -- status --------------------------------------------------------------------------------
    def _abort(self, reason: str) -> None:
        self._status = _ABORTED
        self._reason = reason

    def finish(self) -> Status:
        """Mark a RUNNING sample DONE; a final status stays as it is. Returns the status."""
        if self._status == _RUNNING:
            self._status = _DONE
        return self.status

    def truncate(self, reason: str, cut: int = 0) -> Status:
        """Mark a RUNNING sample TRUNCATED with ``reason``; ``cut``: tokens left out (0: a limit other
        than the token budgets ended it, e.g. the rollout's turn limit; a caller that appended part
        of something gives the rest). A final status stays. Returns the status."""
        if cut < 0:
            raise ValueError(f"cut must be >= 0, got {cut}")
        if self._status == _RUNNING:
            self._status = _TRUNCATED
            self._reason = str(reason)
            self._cut = int(cut)
        return self.status

    def abort(self, reason: str) -> Status:
        """Mark a RUNNING sample ABORTED with ``reason``; a final status stays as it is. Returns the status."""
        if self._status == _RUNNING:
            self._abort(str(reason))
        return self.status

    def reset(self) -> None:
        """Start the sample again from its prompt: empty completion, RUNNING, no spans.

        Fresh buffers are allocated, so arrays handed out before keep what they showed and
        nothing of the previous attempt is visible through the trajectory.
        """
        self._fresh_state()

    # -- pickling (portable between the twins) -----------------------------------------------
    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        return (restore_trajectory, (self._state(),))

    def _state(self) -> dict[str, Any]:
        return state_of(self)

    @classmethod
    def _from_state(cls, state: dict[str, Any]) -> Trajectory:
        traj = cls(
            state["prompt_ids"],
            state["max_length"],
            state["max_completion_length"],
            vocab_size=state["vocab_size"],
            sample_id=state["sample_id"],
        )
        n = len(state["completion_ids"])
        traj._reserve(n)
        traj._ids[:n] = state["completion_ids"]
        traj._mask[:n] = state["mask"]
        traj._logprobs[:n] = state["logprobs"]
        traj._n = n
        traj._spans = [Span(*s) for s in state["spans"]]
        traj._status = state["status"]
        traj._reason = state["reason"]
        traj._cut = state["tokens_cut"]
        traj._turns = state["num_turns"]
        traj._routes = RouteStore.from_state(state.get("routes"), state["sample_id"])
        return traj


# -- collation ---------------------------------------------------------------------------------
def _padded_width(width: int, multiple: int | None) -> int:
    if multiple is None or width % multiple == 0:
        return width
    return width + multiple - width % multiple


def _check_batch(
    trajectories: Sequence[Trajectory], pad_id: int, pad_to_multiple_of: int | None, mask_aborted: bool
) -> list[Trajectory]:
    batch = _validate.batch_list(trajectories)
    _validate.collate_options(len(batch), pad_id, pad_to_multiple_of)
    for i, traj in enumerate(batch):
        if not isinstance(traj, Trajectory):
            raise CollateError(i, None, f"is a {type(traj).__name__}, not a Trajectory of the pure twin")
        if traj._status == _ABORTED and not mask_aborted:
            raise CollateError(i, traj._sample_id, f"is ABORTED ({traj._reason}); drop it, or pass mask_aborted=True")
    return batch


def collate_arrays(
    trajectories: Sequence[Trajectory],
    pad_id: int,
    *,
    pad_to_multiple_of: int | None = None,
    mask_truncated: bool = False,
    mask_aborted: bool = False,
) -> dict[str, np.ndarray]:
    """Pad a batch into numpy arrays with TRL's GRPO keys and conventions (see ``tmpl.collate``)."""
    batch = _check_batch(trajectories, pad_id, pad_to_multiple_of, mask_aborted)
    rows = len(batch)
    prompt_lengths = np.array([len(t._prompt) for t in batch], dtype=np.int64)
    completion_lengths = np.array([t._n for t in batch], dtype=np.int64)
    width_p = _padded_width(int(prompt_lengths.max()), pad_to_multiple_of)
    width_c = _padded_width(int(completion_lengths.max()), pad_to_multiple_of)
    prompt_ids = np.full((rows, width_p), pad_id, dtype=np.int64)
    prompt_mask = np.zeros((rows, width_p), dtype=np.int64)
    completion_ids = np.full((rows, width_c), pad_id, dtype=np.int64)
    completion_mask = np.zeros((rows, width_c), dtype=np.int64)
    tool_mask = np.ones((rows, width_c), dtype=np.int64)
    logps = np.zeros((rows, width_c), dtype=np.float32)
    for row, traj in enumerate(batch):
        p, n = len(traj._prompt), traj._n
        prompt_ids[row, width_p - p :] = traj._prompt
        prompt_mask[row, width_p - p :] = 1
        completion_ids[row, :n] = traj._ids[:n]
        logps[row, :n] = traj._logprobs[:n]
        masked = (mask_truncated and traj._status == _TRUNCATED) or (mask_aborted and traj._status == _ABORTED)
        if masked:
            tool_mask[row] = 0
        else:
            completion_mask[row, :n] = 1
            tool_mask[row, :n] = traj._mask[:n]
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
