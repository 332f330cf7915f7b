"""Why a sample ended, as a code: retry decisions and per-cause counts never match text.

The trajectory's ``reason`` says the same in words (with numbers); the code is what programs
read. Each code belongs to one final status.

>>> EndCode.GENERATION_FAILED.retryable, EndCode.MAX_TURNS.retryable
(True, False)
>>> EndCode.MAX_TURNS.status.name
'TRUNCATED'
"""

from __future__ import annotations

import enum

from ..trajectory.types import Status


class EndCode(str, enum.Enum):
    """How a sample ended (``RolloutResult.code``)."""

    #: the model answered without (further) tool calls
    FINISHED = "finished"
    #: no token budget was left for another turn
    NO_BUDGET = "no_budget"
    #: a generation hit its per-turn token limit before a stop token
    TURN_LIMIT = "turn_limit"
    #: the trajectory cut a completion or a suffix at its budget
    BUDGET_CUT = "budget_cut"
    #: the last allowed turn still made tool calls
    MAX_TURNS = "max_turns"
    #: a tool failed and the toolbox says ``on_error="stop"``
    TOOL_STOP = "tool_stop"
    #: the backend returned an error for the generation
    GENERATION_FAILED = "generation_failed"
    #: the backend aborted the request
    BACKEND_ABORTED = "backend_aborted"
    #: the completion came without usable logprobs
    NO_LOGPROBS = "no_logprobs"
    #: the tool results could not be turned into a suffix
    SUFFIX_FAILED = "suffix_failed"
    #: a suffix differed from the template's full render (``verify_every``)
    VERIFY_FAILED = "verify_failed"
    #: an unexpected error inside the rollout
    CRASHED = "crashed"
    #: the environment (``Rollout(env_factory=...)``) ended the episode: ``EnvStep.done``
    ENV_DONE = "env_done"
    #: the environment ended the episode at a limit of its own: ``EnvStep.truncated``
    ENV_TRUNCATED = "env_truncated"
    #: the environment (its factory, ``reset``, ``step`` or ``close``) raised; the reason names the exception
    ENV_FAILED = "env_failed"
    #: the environment answered with something unusable: a malformed message, a role it may not append, a
    #: reward that is not a finite number (``tmpl.errors.EnvMessageError`` / ``EnvRewardError`` name it)
    ENV_REJECTED = "env_rejected"
    #: dropped by ``max_staleness`` with ``stale="drop"``: sampled by weights too many versions old
    STALE_DROPPED = "stale_dropped"
    #: the ``edit_history`` hook raised (the reason names the exception)
    EDIT_FAILED = "edit_failed"
    #: the ``edit_history`` hook returned messages that are no conversation (not a list of messages, an
    #: unknown role, unanswered tool calls) or that the template refuses to render
    EDIT_REJECTED = "edit_rejected"
    #: ``history="template"``: the template could not render the history, or the prompt spliced from
    #: sampled IDs and encoded text did not decode to its render (``tmpl.errors.HistorySpliceError``)
    RENDER_FAILED = "render_failed"
    #: ``routes=True``: the engine's mixture-of-experts routes could not be aligned with the tokens (a
    #: count that does not match, an unknown dtype, a layer count that changed, none given); nothing misaligned
    #: is kept (``tmpl.errors.RoutesError`` names what)
    BAD_ROUTES = "bad_routes"

    @property
    def status(self) -> Status:
        """The final status a sample with this code has."""
        return _STATUS[self]

    @property
    def retryable(self) -> bool:
        """Whether ``sample_retries`` runs a sample that ended so again."""
        return self in (EndCode.GENERATION_FAILED, EndCode.BACKEND_ABORTED)


_STATUS = {
    EndCode.FINISHED: Status.DONE,
    EndCode.ENV_DONE: Status.DONE,
    **dict.fromkeys(
        (
            EndCode.NO_BUDGET,
            EndCode.TURN_LIMIT,
            EndCode.BUDGET_CUT,
            EndCode.MAX_TURNS,
            EndCode.TOOL_STOP,
            EndCode.ENV_TRUNCATED,
        ),
        Status.TRUNCATED,
    ),
    **dict.fromkeys(
        (
            EndCode.GENERATION_FAILED,
            EndCode.ENV_FAILED,
            EndCode.ENV_REJECTED,
            EndCode.BACKEND_ABORTED,
            EndCode.NO_LOGPROBS,
            EndCode.SUFFIX_FAILED,
            EndCode.VERIFY_FAILED,
            EndCode.CRASHED,
            EndCode.STALE_DROPPED,
            EndCode.EDIT_FAILED,
            EndCode.EDIT_REJECTED,
            EndCode.RENDER_FAILED,
            EndCode.BAD_ROUTES,
        ),
        Status.ABORTED,
    ),
}
