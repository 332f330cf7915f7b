"""Errors of one sample's trajectory or a batch of them (:class:`TrajectoryError`): budgets, token IDs, logprobs,
spans, routes, collation, episodes and their calls and rewards, environments."""

from __future__ import annotations

from typing import Any

from .base import TmplError, _rebuild


def describe_sample(sample: object) -> str:
    """How an error names a sample: its ``sample_id``, or that it has none.

    >>> describe_sample("q17/2"), describe_sample(None)
    ("sample 'q17/2'", 'sample (no sample_id)')
    """
    return "sample (no sample_id)" if sample is None else f"sample {sample!r}"


class TrajectoryError(TmplError):
    """One sample's trajectory was given bad data or misused; ``sample`` is its ``sample_id``."""

    def __init__(self, sample: object, reason: str) -> None:
        self.sample = sample
        self.reason = reason
        super().__init__(f"{describe_sample(sample)}: {reason}")


class BudgetError(TrajectoryError, ValueError):
    """A budget is invalid: a bad ``max_length``, a prompt longer than it, a negative request.

    >>> raise BudgetError("q1", "prompt of 9000 tokens exceeds max_length=8192")
    Traceback (most recent call last):
    ...
    tmpl.errors.BudgetError: sample 'q1': prompt of 9000 tokens exceeds max_length=8192
    """


class TokenIdError(TrajectoryError, ValueError):
    """A token ID is not an integer, or lies outside ``[0, limit)``.

    ``field`` names the argument (``"ids"``, ``"prompt_ids"``), ``position`` the index in it
    (None when the argument itself is not a sequence), ``value`` the offending item.
    ``limit`` is ``vocab_size`` when the trajectory knows it, else ``2**31`` (IDs are stored as int32).

    >>> raise TokenIdError("q1", "ids", 3, 50000, limit=32000, vocab_known=True)
    Traceback (most recent call last):
    ...
    tmpl.errors.TokenIdError: sample 'q1': ids[3] = 50000 is outside [0, 32000) (vocab_size=32000)
    """

    def __init__(
        self, sample: object, field: str, position: int | None, value: object, *, limit: int, vocab_known: bool
    ) -> None:
        self.field = field
        self.position = position
        self.value = value
        if position is None:
            reason = f"{field} must be a sequence of token ids, not {type(value).__name__}"
        elif type(value) is int:
            bound = f"vocab_size={limit}" if vocab_known else "token ids are stored as int32"
            reason = f"{field}[{position}] = {value} is outside [0, {limit}) ({bound})"
        else:
            reason = f"{field}[{position}] = {value!r} is not an integer token id ({type(value).__name__})"
        super().__init__(sample, reason)


class LogprobError(TrajectoryError, ValueError):
    """A rollout logprob is not a number, is NaN or infinite, or is positive.

    Checked on the float32 value that is stored (a tiny positive double that rounds to 0.0 is 0.0).
    ``position`` is None when the argument itself is not a sequence.

    >>> raise LogprobError("q1", 2, float("nan"))
    Traceback (most recent call last):
    ...
    tmpl.errors.LogprobError: sample 'q1': logprobs[2] = nan is NaN
    """

    def __init__(self, sample: object, position: int | None, value: object) -> None:
        self.position = position
        self.value = value
        if position is None:
            reason = f"logprobs must be a sequence of floats, not {type(value).__name__}"
        elif type(value) is not float:
            reason = f"logprobs[{position}] = {value!r} is not a number ({type(value).__name__})"
        elif value != value:
            reason = f"logprobs[{position}] = nan is NaN"
        elif value > 0.0 and value != float("inf"):
            reason = f"logprobs[{position}] = {value!r} is positive (a log-probability is <= 0)"
        else:
            reason = f"logprobs[{position}] = {value!r} is not finite (float32)"
        super().__init__(sample, reason)


class SpanLabelError(TrajectoryError, ValueError):
    """A span label is invalid: ``message`` must be a non-negative int or None."""


class TrajectoryClosedError(TrajectoryError):
    """Tokens were appended to a trajectory whose status is final (DONE, TRUNCATED, ABORTED).

    ``status`` is the final status; the trajectory is unchanged. Check ``traj.running`` (or
    ``traj.max_new_tokens()``, which is 0) before generating the next turn.
    """

    def __init__(self, sample: object, status: object, status_reason: str, what: str) -> None:
        self.status = status
        self.status_reason = status_reason
        name = getattr(status, "name", status)
        detail = f" ({status_reason})" if status_reason else ""
        super().__init__(sample, f"cannot {what}: the trajectory is {name}{detail}; call reset() to retry")


class RoutesError(TrajectoryError, ValueError):
    """Mixture-of-experts routes (routing replay) that cannot be aligned with a sample's tokens: a count
    that does not match the positions, an unknown dtype, a layer count or top-k that changes between turns.

    The trajectory is left as it was; the rollout ends the sample with ``EndCode.BAD_ROUTES``.

    >>> raise RoutesError("q1", "routes of 3 layers x top-2 after 2 layers x top-2")
    Traceback (most recent call last):
    ...
    tmpl.errors.RoutesError: sample 'q1': routes of 3 layers x top-2 after 2 layers x top-2
    """


class CollateError(TrajectoryError, ValueError):
    """A batch cannot be collated; ``index`` is the trajectory's position in the batch (None for the batch)."""

    def __init__(self, index: int | None, sample: object, reason: str) -> None:
        self.index = index
        self.sample = sample
        self.reason = reason
        where = "batch" if index is None else f"trajectories[{index}] ({describe_sample(sample)})"
        TmplError.__init__(self, f"{where}: {reason}")


class EpisodeError(TrajectoryError):
    """An episode (:mod:`tmpl.episode`) was given a bad call or reward, or misused.

    ``call`` is the call's id (None: the episode itself), ``sample`` the episode's ``sample_id``.

    >>> raise EpisodeError("q1", "c2", "parent 'c9' is no earlier call of this episode")
    Traceback (most recent call last):
    ...
    tmpl.errors.EpisodeError: episode 'q1', call 'c2': parent 'c9' is no earlier call of this episode
    """

    def __init__(self, sample: object, call: object, reason: str) -> None:
        self.sample = sample
        self.call = call
        self.reason = reason
        parts = ([] if sample is None else [f"episode {sample!r}"]) + ([] if call is None else [f"call {call!r}"])
        TmplError.__init__(self, f"{', '.join(parts) or 'episode'}: {reason}")


class CallError(EpisodeError, ValueError):
    """A model call's data is bad: logprobs or versions of another length than its completion, no
    completion, a token ID or logprob out of range, a duplicate id, an unknown parent. ``field`` names
    the argument (``"logprobs"``, ``"completion_ids"``, ``"parent"``...).

    >>> raise CallError(None, "c0", "logprobs", "3 logprobs for 4 sampled tokens")
    Traceback (most recent call last):
    ...
    tmpl.errors.CallError: call 'c0': logprobs: 3 logprobs for 4 sampled tokens
    """

    def __init__(self, sample: object, call: object, field: str, reason: str) -> None:
        self.field = field
        super().__init__(sample, call, f"{field}: {reason}")
        self.reason = reason


class RewardError(EpisodeError, ValueError):
    """A reward is not a finite number, an episode has none, or a group cannot have a baseline
    (RLOO needs two samples). ``call`` names the call whose reward it is (None: the episode's)."""


class EnvError(TrajectoryError):
    """An environment (:mod:`tmpl.env`) of one sample failed or answered with something unusable.

    ``sample`` is the sample (``"<conversation>/<sample>"``), ``env`` the environment's class name,
    ``phase`` what it was doing (``"factory"``, ``"reset"``, ``"step"``, ``"close"``). The rollout ends
    the sample (``EndCode.ENV_FAILED`` when the environment raised, ``EndCode.ENV_REJECTED`` when its
    answer was refused) and names the error in ``RolloutResult.reason`` and ``env_error``.

    >>> raise EnvError("0/1", "raised RuntimeError: db is down", env="Shop", phase="step")
    Traceback (most recent call last):
    ...
    tmpl.errors.EnvError: sample '0/1': Shop.step raised RuntimeError: db is down
    """

    def __init__(self, sample: object, reason: str, *, env: str | None = None, phase: str | None = None) -> None:
        self.sample = sample
        self.reason = reason
        self.env = env
        self.phase = phase
        where = ".".join(p for p in (env, phase) if p)
        TmplError.__init__(self, f"{describe_sample(sample)}: {where + ' ' if where else ''}{reason}")

    def __reduce__(self) -> tuple[Any, ...]:  # keyword attributes survive pickling (DistributedRollout)
        return (_rebuild, (type(self), self.args, self.__dict__))


class EnvMessageError(EnvError, ValueError):
    """An environment returned a message that cannot go into the conversation: not a dict, no role, a
    role it may not append (``step`` appends ``tool``, ``user``, ``system`` or ``developer`` turns), no
    content. ``index`` is the message's position in what it returned.

    >>> raise EnvMessageError("0/0", "messages[1]: unknown role 'robot'", env="Shop", phase="step", index=1)
    Traceback (most recent call last):
    ...
    tmpl.errors.EnvMessageError: sample '0/0': Shop.step messages[1]: unknown role 'robot'
    """

    def __init__(
        self,
        sample: object,
        reason: str,
        *,
        env: str | None = None,
        phase: str | None = None,
        index: int | None = None,
    ) -> None:
        super().__init__(sample, reason, env=env, phase=phase)
        self.index = index


class EnvRewardError(EnvError, ValueError):
    """An environment's reward is not a finite number (NaN, infinity, a string).

    >>> raise EnvRewardError("0/0", "reward nan is not a finite number", env="Shop", phase="step")
    Traceback (most recent call last):
    ...
    tmpl.errors.EnvRewardError: sample '0/0': Shop.step reward nan is not a finite number
    """
