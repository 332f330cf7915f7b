"""The vocabulary of a trajectory, shared by both twins: its status, its spans, its status reasons.

Both the compiled ``Trajectory`` and its pure twin build their reasons with the
functions here, so the two report the same words.

>>> Status.TRUNCATED.final, Status.RUNNING.final
(True, False)
>>> Span("completion", 0, 2, 0, 37).size
37
"""

from __future__ import annotations

import enum
from array import array
from typing import Any, Final, NamedTuple

#: Span kinds: tokens the model generated, and tokens appended after them (tool results, prompts).
COMPLETION = "completion"
SUFFIX = "suffix"
SPAN_KINDS: tuple[str, str] = (COMPLETION, SUFFIX)

#: The version of a token no policy sampled: tool results, generation prompts, context (a sampled token
#: carries the policy version that sampled it, >= 0). Rollout results, collated batches and episodes
#: (:mod:`tmpl.episode`) all use it.
APPENDED_VERSION: Final = -1
#: One appended token's version as ``array("i")`` (``APPENDED * n``: n appended tokens), the form the
#: rollout keeps versions in (:mod:`tmpl.rollout.versions` re-exports it).
APPENDED = array("i", [APPENDED_VERSION])

#: First allocation of a trajectory's completion storage (tokens); it then doubles as tokens
#: arrive, never past what the budgets allow, so memory follows the tokens held, not the budget.
MIN_ALLOC = 256


class Status(enum.IntEnum):
    """Where a sample stands. It only moves forward: RUNNING, then one final status (until ``reset()``).

    - RUNNING: tokens may still be appended.
    - DONE: the caller called ``finish()``; everything appended fit.
    - TRUNCATED: a completion or suffix did not fit the budget and was cut (``tokens_cut`` says how much).
    - ABORTED: a completion came without usable logprobs, or the caller called ``abort(reason)``.
    """

    RUNNING = 0
    DONE = 1
    TRUNCATED = 2
    ABORTED = 3

    @property
    def final(self) -> bool:
        """True for DONE, TRUNCATED and ABORTED: nothing more is appended."""
        return self is not Status.RUNNING


#: Status members by code (the compiled core stores the code).
STATUSES: tuple[Status, ...] = tuple(Status)


class Span(NamedTuple):
    """A range of completion tokens and where it came from.

    ``start``/``end`` index the completion (``traj.completion_ids[start:end]``). ``turn`` counts
    the model turns before the span: completion k has turn k, and the suffix after it (tool
    results, the next generation prompt) has turn k + 1, the turn it leads into. ``message`` is
    the caller's message index, or None when not given.

    >>> Span("suffix", 1, 3, 37, 52)
    Span(kind='suffix', turn=1, message=3, start=37, end=52)
    """

    kind: str
    turn: int
    message: int | None
    start: int
    end: int

    @property
    def size(self) -> int:
        """Number of tokens in the span."""
        return self.end - self.start


def binding_budget(max_length: int, max_completion_length: int, prompt_length: int) -> str:
    """Which budget caps the completion: ``"max_completion_length=N"`` or ``"max_length=N"`` (on a tie)."""
    if max_completion_length < max_length - prompt_length:
        return f"max_completion_length={max_completion_length}"
    return f"max_length={max_length}"


def truncation_reason(kind: str, total: int, kept: int, budget: str) -> str:
    """Reason of a TRUNCATED status: what was cut, by how much, at which budget.

    >>> truncation_reason("suffix", 40, 25, "max_length=8192")
    'suffix of 40 tokens cut to 25 (15 cut): max_length=8192 reached'
    """
    return f"{kind} of {total} tokens cut to {kept} ({total - kept} cut): {budget} reached"


def missing_logprobs_reason(n_ids: int) -> str:
    """Reason of an ABORTED status when a completion came without logprobs."""
    return f"completion of {n_ids} tokens arrived without logprobs (never re-tokenized)"


def logprob_count_reason(n_ids: int, n_logprobs: int) -> str:
    """Reason of an ABORTED status when ids and logprobs differ in count."""
    return f"completion has {n_ids} ids but {n_logprobs} logprobs"


def state_of(traj: Any) -> dict[str, Any]:
    """Everything a trajectory holds, as plain values and array copies (what pickling stores)."""
    return {
        "prompt_ids": traj.prompt_ids.copy(),
        "max_length": traj.max_length,
        "max_completion_length": traj.max_completion_length,
        "vocab_size": traj.vocab_size,
        "sample_id": traj.sample_id,
        "completion_ids": traj.completion_ids.copy(),
        "mask": traj.mask.copy(),
        "logprobs": traj.logprobs.copy(),
        "spans": [tuple(span) for span in traj.spans],
        "status": int(traj.status),
        "reason": traj.reason,
        "tokens_cut": traj.tokens_cut,
        "num_turns": traj.num_turns,
        # mixture-of-experts routes with their known flags (None: none added); routes.RouteStore.state
        "routes": None if traj.routes is None else {"routes": traj.routes.copy(), "known": traj.routes_known.copy()},
    }


def restore_trajectory(state: dict[str, Any]) -> Any:
    """Rebuild a pickled trajectory on the twin in use (so pickles move between compiled and pure)."""
    from .. import trajectory  # the package (initialised by then), whose _twin holds the twin in use

    return trajectory._twin.builder.Trajectory._from_state(state)
