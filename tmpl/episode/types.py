"""The vocabulary of an episode: a model call, why a sequence branched, a training sequence.

A :class:`Call` is one request to an engine: the prompt IDs it was sent and the IDs it sampled, with
one logprob and one policy version per sampled token. :class:`tmpl.episode.Episode` merges calls into
:class:`TrainingSequence` objects; each sequence after the first of its agent records in a
:class:`Branch` why it could not continue an earlier one.

>>> call = Call([1, 2, 3], [4, 5], [-0.5, -0.25], versions=3, id="c0", turn=0)
>>> call.completion_ids.tolist(), call.versions.tolist(), call.trained
([4, 5], [3, 3], True)
>>> Call([1, 2], [4, 5], [-0.5])
Traceback (most recent call last):
...
tmpl.errors.CallError: call 'call': logprobs: 1 logprobs for 2 sampled tokens
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..errors import CallError, LogprobError, RewardError, TokenIdError
from ..trajectory import _validate
from ..trajectory.types import APPENDED_VERSION, Status

__all__ = [
    "APPENDED_VERSION",
    "Branch",
    "BranchKind",
    "Call",
    "CallSpan",
    "TrainingSequence",
    "check_reward",
    "first_difference",
]

#: Message fields compared first, in this order, when two message lists are diffed; any other key follows, sorted.
MESSAGE_FIELDS: tuple[str, ...] = ("role", "content", "reasoning_content", "tool_calls", "tool_call_id", "name")


class BranchKind:
    """Why a sequence started (:attr:`Branch.kind`).

    - ``FIRST``: the episode's first call.
    - ``AGENT``: the first call of another agent label (no sequence of that agent yet).
    - ``SUBAGENT``: the first call of a sub-agent (a call with a ``parent``): its own fresh context.
    - ``DIVERGED``: the prompt differs from every earlier sequence of its agent; :attr:`Branch.token` is
      the first differing position against the nearest one.
    - ``REWOUND``: the prompt is a proper prefix of an earlier sequence (the history went back, e.g. a
      resample of an earlier prompt): its sampled tokens cannot extend that sequence.
    """

    FIRST = "first"
    AGENT = "agent"
    SUBAGENT = "subagent"
    DIVERGED = "diverged"
    REWOUND = "rewound"
    ALL: tuple[str, ...] = (FIRST, AGENT, SUBAGENT, DIVERGED, REWOUND)


def _label(call_id: object) -> object:
    return "call" if call_id is None else call_id


def _version_array(versions: Any, n: int, call_id: object) -> np.ndarray:
    """One int32 policy version per sampled token (>= 0); ``None``: unknown, stored as APPENDED_VERSION."""
    if versions is None:
        return np.full(n, APPENDED_VERSION, dtype=np.int32)
    if isinstance(versions, (int, np.integer)) and not isinstance(versions, bool):
        value = int(versions)
        if not 0 <= value < _validate.INT32_LIMIT:
            raise CallError(None, _label(call_id), "versions", f"version {value} is outside [0, 2**31)")
        return np.full(n, value, dtype=np.int32)
    try:
        arr = _validate.ids_array(
            versions, sample=None, field="versions", limit=_validate.INT32_LIMIT, vocab_known=False
        )
    except TokenIdError as err:
        raise CallError(None, _label(call_id), "versions", err.reason.replace("token ids", "versions")) from None
    if len(arr) != n:
        raise CallError(None, _label(call_id), "versions", f"{len(arr)} versions for {n} sampled tokens")
    return arr


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr = np.ascontiguousarray(arr)
    arr.flags.writeable = False
    return arr


def check_reward(value: Any, sample: object, call: object) -> float:
    """``value`` as a finite float, else RewardError naming the call (None: the episode's reward).

    >>> check_reward(1, None, "c0")
    1.0
    >>> check_reward(float("nan"), "q1", "c0")
    Traceback (most recent call last):
    ...
    tmpl.errors.RewardError: episode 'q1', call 'c0': reward nan is not a finite number
    """
    if isinstance(value, (str, bytes, bool)) or value is None:
        raise RewardError(sample, call, f"reward {value!r} is not a number")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise RewardError(sample, call, f"reward {value!r} is not a number") from None
    if not math.isfinite(out):
        raise RewardError(sample, call, f"reward {out!r} is not a finite number")
    return out


class Call:
    """One model call: the prompt IDs the engine was sent and what it sampled.

    - ``prompt_ids``: the engine's input; ``completion_ids``: the sampled IDs (at least one).
    - ``logprobs``: one per sampled token (finite, <= 0). A trained call needs them; a call that is
      not the policy's (``trained=False``: a simulated user, a summarizer) may pass None (0.0).
    - ``versions``: the policy version of each sampled token, or one int for all of them (default 0, a
      ``Rollout``'s first version); None: unknown (stored as ``APPENDED_VERSION``, as a crashed
      ``RolloutResult``'s versions are).
    - ``trained``: False for a model that is not the policy: its sampled tokens get mask 0 in every
      sequence and are marked in :attr:`TrainingSequence.sampled`.
    - ``id``: a name unique in its episode (None: the episode names it ``"call-<k>"``).
    - ``parent``: the id of the call whose tool ran this call's (sub-)agent; ``agent``: a lineage label.
      Calls of another agent or parent never merge with this agent's sequences.
    - ``turn``: the caller's turn index; ``reward``: a per-call (per-turn) reward.

    Arrays are read-only int32 (IDs, versions) and float32 (logprobs). Bad input raises CallError
    (RewardError for a reward) naming the call and the field.

    >>> Call([1], [2, 3], None, trained=False).logprobs.tolist()
    [0.0, 0.0]
    """

    __slots__ = (
        "_prompt",
        "_completion",
        "_logprobs",
        "_versions",
        "_trained",
        "_id",
        "_parent",
        "_agent",
        "_turn",
        "_reward",
    )

    def __init__(
        self,
        prompt_ids: Sequence[int] | np.ndarray,
        completion_ids: Sequence[int] | np.ndarray,
        logprobs: Sequence[float] | np.ndarray | None,
        *,
        versions: Sequence[int] | np.ndarray | int | None = 0,
        trained: bool = True,
        id: str | None = None,
        parent: str | None = None,
        agent: str | None = None,
        turn: int | None = None,
        reward: float | None = None,
    ) -> None:
        name = _label(id)
        if id is not None and not isinstance(id, str):
            raise CallError(None, name, "id", f"must be a str or None, not {type(id).__name__}")
        if parent is not None and not isinstance(parent, str):
            raise CallError(None, name, "parent", f"must be a call id (str) or None, not {type(parent).__name__}")
        if agent is not None and not isinstance(agent, str):
            raise CallError(None, name, "agent", f"must be a str or None, not {type(agent).__name__}")
        self._prompt = _readonly(self._ids(prompt_ids, "prompt_ids", name))
        completion = self._ids(completion_ids, "completion_ids", name)
        if len(completion) == 0:
            raise CallError(None, name, "completion_ids", "a call samples at least one token")
        self._completion = _readonly(completion)
        n = len(completion)
        if logprobs is None:
            if trained:
                raise CallError(
                    None, name, "logprobs", "a trained call needs one logprob per sampled token (never re-tokenized)"
                )
            lps = np.zeros(n, dtype=np.float32)
        else:
            count = _validate.sequence_length(logprobs)
            if count is not None and count != n:
                raise CallError(None, name, "logprobs", f"{count} logprobs for {n} sampled tokens")
            try:
                lps = _validate.logprobs_array(logprobs, sample=None)
            except LogprobError as err:
                raise CallError(None, name, "logprobs", err.reason) from None
            if len(lps) != n:
                raise CallError(None, name, "logprobs", f"{len(lps)} logprobs for {n} sampled tokens")
        self._logprobs = _readonly(lps)
        self._versions = _readonly(_version_array(versions, n, id))
        self._trained = bool(trained)
        self._id = id
        self._parent = parent
        self._agent = agent
        if turn is not None:
            try:
                turn = operator.index(turn)
            except TypeError:
                raise CallError(None, name, "turn", f"must be an int or None, not {type(turn).__name__}") from None
        self._turn = turn
        self._reward: float | None = None if reward is None else check_reward(reward, None, name)

    @staticmethod
    def _ids(ids: Any, field: str, name: object) -> np.ndarray:
        try:
            return _validate.ids_array(ids, sample=None, field=field, limit=_validate.INT32_LIMIT, vocab_known=False)
        except TokenIdError as err:
            raise CallError(None, name, field, err.reason) from None

    def _named(self, call_id: str) -> Call:
        """This call under another id (same arrays, not copied)."""
        twin = object.__new__(Call)
        for slot in Call.__slots__:
            setattr(twin, slot, getattr(self, slot))
        twin._id = call_id
        return twin

    @property
    def prompt_ids(self) -> np.ndarray:
        """The IDs the engine was sent (int32, read-only)."""
        return self._prompt

    @property
    def completion_ids(self) -> np.ndarray:
        """The IDs the engine sampled (int32, read-only, at least one)."""
        return self._completion

    @property
    def logprobs(self) -> np.ndarray:
        """One rollout logprob per sampled token (float32, read-only; 0.0 for an untrained call given none)."""
        return self._logprobs

    @property
    def versions(self) -> np.ndarray:
        """One policy version per sampled token (int32, read-only; APPENDED_VERSION where unknown)."""
        return self._versions

    @property
    def trained(self) -> bool:
        return self._trained

    @property
    def id(self) -> str | None:
        return self._id

    @property
    def parent(self) -> str | None:
        return self._parent

    @property
    def agent(self) -> str | None:
        return self._agent

    @property
    def turn(self) -> int | None:
        return self._turn

    @property
    def reward(self) -> float | None:
        """The reward given with the call (an episode may set another: ``Episode.set_call_reward``)."""
        return self._reward

    @property
    def lineage(self) -> tuple[str | None, str | None]:
        """``(agent, parent)``: calls merge only with sequences of the same lineage."""
        return (self._agent, self._parent)

    def __repr__(self) -> str:
        extra = "" if self._trained else ", trained=False"
        return f"Call(id={self._id!r}, prompt={len(self._prompt)}, completion={len(self._completion)}{extra})"


@dataclass(frozen=True)
class Branch:
    """Why a sequence started instead of continuing an earlier one.

    - ``kind``: one of :class:`BranchKind` (``"first"``, ``"agent"``, ``"subagent"``, ``"diverged"``, ``"rewound"``).
    - ``against``: the earlier sequence of the same agent with the longest common prefix (None: none).
    - ``token``: the first position where the prompt differs from it (the common prefix length).
    - ``expected``/``got``: that sequence's ID and the prompt's ID there (None past either's end).
    - ``message``/``field``: the first differing message and field, when the caller gave the calls'
      messages (``field`` None: the messages agree up to ``message``, which the earlier prompt did not
      have: the difference is in how the messages before it were rendered, e.g. a sampled turn rendered anew).
    - ``edit``: the caller's label for what changed the history (``"compaction"``, ``"template dropped reasoning"``...).

    >>> str(Branch("diverged", against=0, token=37, expected=11, got=12, message=2, field="content"))
    "diverged from sequence 0 at token 37 (prompt has 12, sequence has 11); message 2, field 'content'"
    """

    kind: str
    against: int | None = None
    token: int | None = None
    expected: int | None = None
    got: int | None = None
    message: int | None = None
    field: str | None = None
    edit: str | None = None

    def __str__(self) -> str:
        if self.kind in (BranchKind.DIVERGED, BranchKind.REWOUND):
            text = f"{self.kind} from sequence {self.against} at token {self.token}"
            ids = []
            if self.got is not None:
                ids.append(f"prompt has {self.got}")
            else:
                ids.append("prompt ends")
            ids.append(f"sequence has {self.expected}" if self.expected is not None else "sequence ends")
            text += f" ({', '.join(ids)})"
        else:
            text = self.kind
        if self.message is not None:
            text += f"; message {self.message}" + ("" if self.field is None else f", field {self.field!r}")
        if self.edit is not None:
            text += f"; edit: {self.edit}"
        return text


class CallSpan(NamedTuple):
    """Where a call's sampled tokens sit in its sequence: ``ids[start:end]`` (``end - start`` kept,
    ``cut`` cut by the budget). ``ids[:start]`` is the call's prompt whenever ``cut`` is 0 and the
    context before it was kept whole.

    >>> CallSpan("c1", 40, 52, 0).size
    12
    """

    call: str
    start: int
    end: int
    cut: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, eq=False)
class TrainingSequence:
    """One exact training sequence of an episode: a snapshot (read-only arrays aligned with ``ids``).

    - ``ids`` (int32): the first call's prompt, then each call's new context and sampled tokens.
    - ``mask`` (uint8): 1 exactly on tokens sampled by trained calls (each sampled token is in exactly
      one sequence's mask; it may appear again, mask 0, as context of later sequences).
    - ``logprobs`` (float32): the rollout logprobs on mask tokens, 0.0 elsewhere.
    - ``versions`` (int32): the policy version of mask tokens, ``APPENDED_VERSION`` (-1) elsewhere.
    - ``sampled`` (uint8): 1 on every token sampled here, trained or not (``sampled & ~mask``: an
      untrained model's tokens, e.g. a simulated user's).
    - ``calls``, ``spans``: the calls merged into it, in order, and where their sampled tokens are;
      ``turns``: their ``turn`` labels (those given).
    - ``branch``: why it started; ``agent``/``parent``: its lineage.
    - ``status``: RUNNING while the episode is open, DONE once finished, TRUNCATED when its budget cut
      it (``reason`` names the call and budget; ``tokens_cut`` tokens were left out, ``sampled_cut``
      of them sampled: no sampled token is lost silently).
    """

    index: int
    ids: np.ndarray
    mask: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    sampled: np.ndarray
    calls: tuple[str, ...]
    spans: tuple[CallSpan, ...]
    turns: tuple[int, ...]
    branch: Branch
    agent: str | None
    parent: str | None
    status: Status
    reason: str
    tokens_cut: int
    sampled_cut: int

    @property
    def length(self) -> int:
        return len(self.ids)

    @property
    def prompt_length(self) -> int:
        """Tokens before the first sampled one: the first call's prompt (as kept)."""
        return self.spans[0].start if self.spans else len(self.ids)

    @property
    def trained_tokens(self) -> int:
        """Tokens in the loss mask."""
        return int(self.mask.sum())

    def __repr__(self) -> str:
        return (
            f"TrainingSequence(index={self.index}, length={len(self.ids)}, calls={len(self.calls)}, "
            f"trained={self.trained_tokens}, branch={str(self.branch)!r}, status={self.status.name})"
        )


def _field_order(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    rest = sorted((set(a) | set(b)) - set(MESSAGE_FIELDS), key=str)
    return [*MESSAGE_FIELDS, *rest]


def first_difference(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]
) -> tuple[int, str | None] | None:
    """Where two message lists first differ: ``(message index, field)``; None when they are equal.

    Fields are compared in :data:`MESSAGE_FIELDS` order, then the others sorted (a missing field differs
    from a present one). When one list is a prefix of the other, the index is the shorter one's
    length and the field is None.

    >>> a = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "reasoning_content": "r"}]
    >>> first_difference(a, [a[0], {"role": "assistant", "content": "yo"}])
    (1, 'reasoning_content')
    >>> first_difference(a[:1], a)
    (1, None)
    """
    for i, (old, new) in enumerate(zip(before, after)):
        if old == new:
            continue
        missing = object()
        for key in _field_order(old, new):
            if old.get(key, missing) != new.get(key, missing):
                return i, key
        return i, None  # pragma: no cover - unequal mappings differ in some key
    if len(before) == len(after):
        return None
    return min(len(before), len(after)), None
