"""``Episode``: the model calls of one sample, merged into exact training sequences.

The rule. A call continues the longest sequence of its lineage (same ``agent`` and ``parent``) whose
IDs are all a prefix of the call's prompt: the rest of the prompt, ``prompt[len(sequence):]``, is
appended with mask 0, then the sampled tokens. Otherwise the call starts a new sequence, a *branch*,
with its whole prompt as mask-0 context, and the :class:`~tmpl.episode.Branch` records why (the first
differing token against the nearest earlier sequence; the first differing message and field when the
caller gives messages; the caller's edit label). So every sampled token is in exactly one sequence's
loss mask, and an append-only history is one sequence, equal to today's :class:`tmpl.Trajectory`.

>>> ep = Episode(sample_id="q1")
>>> ep.add_call(Call([1, 2], [3, 4], [-0.1, -0.2], id="a"))   # sequence 0
0
>>> ep.add_call(Call([1, 2, 3, 4, 5], [6], [-0.3], id="b"))   # continues it: 5 is context
0
>>> ep.add_call(Call([1, 9], [7], [-0.4], id="c"), edit="compaction")   # a branch
1
>>> s0, s1 = ep.sequences
>>> s0.ids.tolist(), s0.mask.tolist(), s0.calls
([1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 0, 1], ('a', 'b'))
>>> str(s1.branch)
'diverged from sequence 0 at token 1 (prompt has 9, sequence has 2); edit: compaction'
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import CallError, EpisodeError
from ..trajectory.types import COMPLETION, SUFFIX, Status, restore_trajectory, truncation_reason
from . import _twin
from .types import Branch, BranchKind, Call, CallSpan, TrainingSequence, check_reward, first_difference

if TYPE_CHECKING:
    from ..trajectory import Trajectory
    from ._episode_py import SequenceBuffer

__all__ = ["Episode", "SequenceRow"]

#: The room of a sequence without a budget (more tokens than int32 positions).
_UNBOUNDED = 2**31


class _Seq:
    """An episode's running state of one sequence (the arrays live in the twin's buffer)."""

    __slots__ = (
        "buf",
        "lineage",
        "branch",
        "calls",
        "spans",
        "turns",
        "status",
        "reason",
        "tokens_cut",
        "sampled_cut",
        "messages",
    )

    def __init__(self, buf: SequenceBuffer, lineage: tuple[str | None, str | None], branch: Branch) -> None:
        self.buf = buf
        self.lineage = lineage
        self.branch = branch
        self.calls: list[str] = []
        self.spans: list[CallSpan] = []
        self.turns: list[int] = []
        self.status = Status.RUNNING
        self.reason = ""
        self.tokens_cut = 0
        self.sampled_cut = 0
        self.messages: list[Mapping[str, Any]] | None = None


@dataclass(frozen=True, eq=False)
class SequenceRow:
    """One sequence as a row for :func:`tmpl.collate` (duck-typed like a ``RolloutResult``).

    ``trajectory`` splits the sequence at its first sampled token (prompt, then completion with the
    sequence's mask and logprobs); ``versions`` and ``loss_mask`` are the completion part's. So
    ``tmpl.collate(episode.rows(), pad_id)`` gives TRL's keys plus ``versions``, one row per sequence.
    """

    trajectory: Trajectory
    versions: np.ndarray
    loss_mask: np.ndarray
    sequence: TrainingSequence
    sample_id: Any


class Episode:
    """The model calls of one sample (one episode), merged into exact training sequences.

    - ``max_length``: a budget per sequence (None: none). A call that does not fit is cut like a turn
      of a :class:`tmpl.Trajectory`: the context first, then its sampled tokens; the sequence becomes
      TRUNCATED with the reason named, and ``sampled_cut`` counts every sampled token left out (calls
      that would continue a TRUNCATED sequence are cut whole, and counted).
    - ``sample_id``: names the episode in errors and rows; ``reward``: the episode's reward.

    See the module docstring for the merge and branch rule.
    """

    def __init__(self, *, max_length: int | None = None, sample_id: Any = None, reward: float | None = None) -> None:
        if max_length is not None and (
            isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1
        ):
            raise EpisodeError(sample_id, None, f"max_length must be a positive int or None, not {max_length!r}")
        self._max_length = max_length
        self._sample_id = sample_id
        self._calls: list[Call] = []
        self._index: dict[str, int] = {}  # call id -> position in _calls
        self._placed: dict[str, int] = {}  # call id -> its sequence
        self._seqs: list[_Seq] = []
        self._lineages: dict[tuple[str | None, str | None], list[int]] = {}
        self._rewards: dict[str, float] = {}
        self._apart: dict[str, tuple[int, ...]] = {}  # call id -> the sequences it was kept apart from
        self._reward: float | None = None if reward is None else check_reward(reward, sample_id, None)
        self._finished = False

    # -- what it holds -------------------------------------------------------------------------
    @property
    def sample_id(self) -> Any:
        return self._sample_id

    @property
    def max_length(self) -> int | None:
        return self._max_length

    @property
    def calls(self) -> tuple[Call, ...]:
        """The calls added, in order (each with its id)."""
        return tuple(self._calls)

    def call(self, call_id: str) -> Call:
        """The call named ``call_id`` (CallError when there is none)."""
        k = self._index.get(call_id)
        if k is None:
            raise CallError(self._sample_id, call_id, "id", "is no call of this episode")
        return self._calls[k]

    def kept_apart(self, call_id: str) -> tuple[int, ...]:
        """The sequences call ``call_id`` was kept from continuing (``add_call(apart=...)``; () if none)."""
        self.call(call_id)
        return self._apart.get(call_id, ())

    def sequence_of(self, call_id: str) -> int:
        """The index of the sequence that holds ``call_id``'s sampled tokens in its mask."""
        self.call(call_id)
        return self._placed[call_id]

    @property
    def num_sequences(self) -> int:
        return len(self._seqs)

    @property
    def sequences(self) -> list[TrainingSequence]:
        """Every sequence as a snapshot (read-only views: later calls never change them)."""
        return [self._snapshot(i) for i in range(len(self._seqs))]

    def sequence(self, index: int) -> TrainingSequence:
        """Sequence ``index`` as a snapshot."""
        return self._snapshot(range(len(self._seqs))[index])

    def _snapshot(self, i: int) -> TrainingSequence:
        seq = self._seqs[i]
        ids, mask, logprobs, versions, sampled = seq.buf.views()
        agent, parent = seq.lineage
        return TrainingSequence(
            index=i,
            ids=ids,
            mask=mask,
            logprobs=logprobs,
            versions=versions,
            sampled=sampled,
            calls=tuple(seq.calls),
            spans=tuple(seq.spans),
            turns=tuple(seq.turns),
            branch=seq.branch,
            agent=agent,
            parent=parent,
            status=seq.status,
            reason=seq.reason,
            tokens_cut=seq.tokens_cut,
            sampled_cut=seq.sampled_cut,
        )

    @property
    def finished(self) -> bool:
        return self._finished

    def __repr__(self) -> str:
        return f"Episode(sample_id={self._sample_id!r}, calls={len(self._calls)}, sequences={len(self._seqs)})"

    # -- rewards -------------------------------------------------------------------------------
    @property
    def reward(self) -> float | None:
        """The episode's reward (None: not given); set it with ``episode.reward = r`` (finite)."""
        return self._reward

    @reward.setter
    def reward(self, value: float | None) -> None:
        self._reward = None if value is None else check_reward(value, self._sample_id, None)

    def set_call_reward(self, call_id: str, value: float | None) -> None:
        """Give call ``call_id`` a (per-turn) reward, replacing the one it came with (None: remove it)."""
        self.call(call_id)
        if value is None:
            self._rewards.pop(call_id, None)
        else:
            self._rewards[call_id] = check_reward(value, self._sample_id, call_id)

    def call_reward(self, call_id: str) -> float | None:
        """Call ``call_id``'s reward (None: it has none)."""
        self.call(call_id)
        return self._rewards.get(call_id)

    # -- adding calls --------------------------------------------------------------------------
    def _room(self, seq: _Seq) -> int:
        if self._max_length is None:
            return _UNBOUNDED
        return max(0, self._max_length - seq.buf.length)

    def _checked(self, call: Call) -> Call:
        if not isinstance(call, Call):
            raise EpisodeError(self._sample_id, None, f"add_call takes a Call, not {type(call).__name__}")
        if self._finished:
            raise EpisodeError(self._sample_id, call.id, "the episode is finished: no call can be added")
        if call.id is None:
            k = len(self._calls)
            while f"call-{k}" in self._index:
                k += 1
            call = call._named(f"call-{k}")
        elif call.id in self._index:
            raise CallError(self._sample_id, call.id, "id", "is already a call of this episode")
        if call.parent is not None and call.parent not in self._index:
            raise CallError(self._sample_id, call.id, "parent", f"{call.parent!r} is no earlier call of this episode")
        return call

    def add_call(
        self,
        call: Call,
        *,
        edit: str | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        apart: Collection[int] = (),
    ) -> int:
        """Add one model call; returns the index of the sequence that holds its sampled tokens.

        ``edit``: what changed the history before this call (recorded on the branch when the call starts a
        sequence; a call that continues one changed nothing the tokens show). ``messages``: the messages
        the call's prompt was rendered from: a branch then names the first message and field that differ
        from the nearest sequence's last call's messages. ``apart``: sequences the call must not continue
        even where its prompt extends their IDs, because its context differs in what the IDs do not show
        (an image of the same size with other pixels): it continues another, or branches.

        >>> ep = Episode()
        >>> ep.add_call(Call([1, 2], [3], [-0.1])), ep.add_call(Call([1, 2, 3, 4], [5], [-0.2]), apart={0})
        (0, 1)
        """
        call = self._checked(call)
        assert call.id is not None
        if edit is not None and not isinstance(edit, str):
            raise EpisodeError(self._sample_id, call.id, f"edit must be a str label or None, not {type(edit).__name__}")
        prompt = call.prompt_ids
        lineage = call.lineage
        members = self._lineages.setdefault(lineage, [])
        merge, nearest, common = _twin.episode.best_match([self._seqs[i].buf for i in members], prompt)
        if merge >= 0 and members[merge] in apart:  # the longest of the others it extends, if any
            others = [i for i in members if i not in apart]
            found = _twin.episode.best_match([self._seqs[i].buf for i in others], prompt)[0]
            merge = members.index(others[found]) if found >= 0 else -1
        if merge >= 0:
            index = members[merge]
            seq = self._seqs[index]
            self._place(seq, call, prompt[seq.buf.length :])
        else:
            branch = self._branch(call, members, nearest, common, edit, messages)
            index = len(self._seqs)
            seq = _Seq(_twin.episode.SequenceBuffer(), lineage, branch)
            self._seqs.append(seq)
            members.append(index)
            self._place(seq, call, prompt)
        if messages is not None:
            seq.messages = [dict(m) for m in messages]
        if apart:
            self._apart[call.id] = tuple(sorted(int(i) for i in apart))
        self._calls.append(call)
        self._index[call.id] = len(self._calls) - 1
        self._placed[call.id] = index
        if call.reward is not None:
            self._rewards[call.id] = call.reward
        return index

    def _branch(
        self,
        call: Call,
        members: list[int],
        nearest: int,
        common: int,
        edit: str | None,
        messages: Sequence[Mapping[str, Any]] | None,
    ) -> Branch:
        if nearest < 0:
            if call.parent is not None:
                kind = BranchKind.SUBAGENT
            elif self._seqs:
                kind = BranchKind.AGENT
            else:
                kind = BranchKind.FIRST
            return Branch(kind, edit=edit)
        against = members[nearest]
        seq = self._seqs[against]
        prompt = call.prompt_ids
        got = int(prompt[common]) if common < len(prompt) else None
        expected = seq.buf.id_at(common) if common < seq.buf.length else None
        kind = BranchKind.REWOUND if got is None else BranchKind.DIVERGED
        message = field = None
        if messages is not None and seq.messages is not None:
            found = first_difference(seq.messages, list(messages))
            if found is not None:
                message, field = found
        return Branch(kind, against, common, expected, got, message, field, edit)

    def _place(self, seq: _Seq, call: Call, context: np.ndarray) -> None:
        """Append a call's new context, then its sampled tokens, to ``seq`` within the budget."""
        assert call.id is not None
        sampled = call.completion_ids
        n_ctx, n_smp = len(context), len(sampled)
        seq.calls.append(call.id)
        if call.turn is not None:
            seq.turns.append(call.turn)
        if seq.status is not Status.RUNNING:  # closed (its budget spent): the whole call is cut, and counted
            end = seq.buf.length
            seq.spans.append(CallSpan(call.id, end, end, n_smp))
            seq.tokens_cut += n_ctx + n_smp
            seq.sampled_cut += n_smp
            return
        kept_ctx = seq.buf.append_context(context, self._room(seq))
        start = seq.buf.length
        if kept_ctx < n_ctx:
            seq.spans.append(CallSpan(call.id, start, start, n_smp))
            self._truncate(seq, call, "context", n_ctx, kept_ctx, n_smp)
            return
        kept = seq.buf.append_sampled(sampled, call.logprobs, call.versions, call.trained, self._room(seq))
        seq.spans.append(CallSpan(call.id, start, start + kept, n_smp - kept))
        if kept < n_smp:
            self._truncate(seq, call, COMPLETION, n_smp, kept, n_smp - kept)

    def _truncate(self, seq: _Seq, call: Call, kind: str, total: int, kept: int, sampled_cut: int) -> None:
        seq.status = Status.TRUNCATED
        seq.reason = f"call {call.id!r}: " + truncation_reason(kind, total, kept, f"max_length={self._max_length}")
        if kind != COMPLETION:
            seq.reason += f"; its {sampled_cut} sampled tokens cut"
        seq.tokens_cut += total - kept + (sampled_cut if kind != COMPLETION else 0)
        seq.sampled_cut += sampled_cut

    def add_context(self, ids: Sequence[int] | np.ndarray, *, sequence: int | None = None) -> int:
        """Append tokens no call sampled (mask 0) to a sequence: e.g. the tool results and generation
        prompt a trajectory holds after its last completion. ``sequence``: which (default: the one of the
        last call). Returns how many fit the budget (the rest is cut: TRUNCATED, counted)."""
        if self._finished:
            raise EpisodeError(self._sample_id, None, "the episode is finished: no context can be added")
        if not self._seqs:
            raise EpisodeError(self._sample_id, None, "add_context needs a sequence: add a call first")
        if sequence is None:
            last = self._calls[-1].id
            assert last is not None
            sequence = self._placed[last]
        seq = self._seqs[range(len(self._seqs))[sequence]]
        arr = Call._ids(ids, "ids", None)
        if seq.status is not Status.RUNNING:
            seq.tokens_cut += len(arr)
            return 0
        kept = int(seq.buf.append_context(arr, self._room(seq)))
        if kept < len(arr):
            seq.status = Status.TRUNCATED
            seq.reason = truncation_reason(SUFFIX, len(arr), kept, f"max_length={self._max_length}")
            seq.tokens_cut += len(arr) - kept
        return kept

    def finish(self, status: Status = Status.DONE, reason: str = "") -> None:
        """Close the episode: RUNNING sequences become DONE; no call can be added afterwards.

        ``status``/``reason``: how the sample ended, given to the sequence of the last call when it is
        still RUNNING (a rollout sample that ended TRUNCATED or ABORTED; a sequence its budget closed
        keeps its own status and reason).

        >>> ep = Episode()
        >>> _ = ep.add_call(Call([1], [2], [-0.5]))
        >>> ep.finish(Status.TRUNCATED, "reached max_turns=1 with tool calls pending")
        >>> ep.sequences[0].status.name, ep.sequences[0].reason
        ('TRUNCATED', 'reached max_turns=1 with tool calls pending')
        """
        if status is not Status.DONE and self._calls:
            last = self._calls[-1].id
            assert last is not None
            seq = self._seqs[self._placed[last]]
            if seq.status is Status.RUNNING:
                seq.status, seq.reason = Status(status), str(reason)
        for seq in self._seqs:
            if seq.status is Status.RUNNING:
                seq.status = Status.DONE
        self._finished = True

    # -- conversions ---------------------------------------------------------------------------
    @classmethod
    def from_trajectory(
        cls,
        trajectory: Trajectory,
        *,
        versions: Sequence[int] | np.ndarray | None = None,
        sample_id: Any = None,
        reward: float | None = None,
    ) -> Episode:
        """The episode of an append-only trajectory: one call per completion, one sequence whose arrays
        equal the trajectory's (``prompt_ids + completion_ids``, mask, logprobs, with mask 0 over the prompt).

        ``versions``: the policy version of each completion token (a ``RolloutResult``'s; None: 0). A
        completion cut to nothing by the budget sampled no token kept and adds no call; a trajectory with
        no completion gives an episode with no sequence. The trajectory's final status, reason and cut
        carry over.

        >>> import tmpl
        >>> t = tmpl.Trajectory([1, 2], max_length=16)
        >>> t.add_completion([3], [-0.5]), t.add_suffix([4, 5]), t.add_completion([6], [-0.1])
        (1, 2, 1)
        >>> [s.ids.tolist() for s in Episode.from_trajectory(t).sequences]
        [[1, 2, 3, 4, 5, 6]]
        """
        prompt = np.asarray(trajectory.prompt_ids, dtype=np.int32)
        ids = np.asarray(trajectory.completion_ids, dtype=np.int32)
        logprobs = trajectory.logprobs
        vers = None if versions is None else np.asarray(versions)
        name = trajectory.sample_id if sample_id is None else sample_id
        episode = cls(max_length=trajectory.max_length, sample_id=name, reward=reward)
        end = 0
        for span in trajectory.spans:
            if span.kind != COMPLETION or span.size == 0:
                continue
            part = None if vers is None else vers[span.start : span.end]
            if part is not None and bool((part < 0).any()):
                part_versions: Any = None  # unknown (a crashed result's were lost)
            else:
                part_versions = 0 if part is None else part
            episode.add_call(
                Call(
                    np.concatenate([prompt, ids[: span.start]]),
                    ids[span.start : span.end],
                    logprobs[span.start : span.end],
                    versions=part_versions,
                    id=f"turn-{span.turn}",
                    turn=span.turn,
                )
            )
            end = span.end
        if episode._seqs:
            if end < len(ids):
                episode.add_context(ids[end:])
            seq = episode._seqs[0]
            status = trajectory.status
            if status is not Status.RUNNING:
                seq.status, seq.reason, seq.tokens_cut = status, trajectory.reason, trajectory.tokens_cut
                spans = trajectory.spans
                completion_cut = spans and spans[-1].kind == COMPLETION and trajectory.reason.startswith(COMPLETION)
                seq.sampled_cut = trajectory.tokens_cut if completion_cut else 0
        return episode

    @classmethod
    def from_result(cls, result: Any, *, reward: float | None = None) -> Episode:
        """The episode of a :class:`tmpl.RolloutResult` (append mode): :meth:`from_trajectory` of its
        trajectory with its versions, named ``(index, sample)``.

        The episode's mask is what was sampled, ``result.mask``; ``RolloutResult.sequences`` applies
        the rollout's staleness policy to it, as ``result.loss_mask`` does.
        """
        return cls.from_trajectory(
            result.trajectory,
            versions=result.versions,
            sample_id=(result.index, result.sample),
            reward=reward,
        )

    def rows(self) -> list[SequenceRow]:
        """One row per sequence for :func:`tmpl.collate` / ``collate_arrays`` (see :class:`SequenceRow`).

        >>> import tmpl
        >>> ep = Episode()
        >>> _ = ep.add_call(Call([1, 2], [3], [-0.5], versions=2))
        >>> batch = tmpl.trajectory.collate_arrays(ep.rows(), pad_id=0)
        >>> batch["prompt_ids"].tolist(), batch["completion_ids"].tolist(), batch["versions"].tolist()
        ([[1, 2]], [[3]], [[2]])
        """
        return [sequence_row(seq, self._sample_id, self._max_length) for seq in self.sequences]


def sequence_row(seq: TrainingSequence, sample_id: Any, max_length: int | None) -> SequenceRow:
    """``seq`` as a collate row named ``(sample_id, seq.index)`` (see :class:`SequenceRow`)."""
    p = seq.prompt_length
    spans = []
    turn, pos = 0, p
    for span in seq.spans:
        if span.start > pos:
            spans.append((SUFFIX, turn, None, pos - p, span.start - p))
        if span.size:
            spans.append((COMPLETION, turn, None, span.start - p, span.end - p))
            turn += 1
        pos = max(pos, span.end)
    if len(seq.ids) > pos:
        spans.append((SUFFIX, turn, None, pos - p, len(seq.ids) - p))
    state = {
        "prompt_ids": seq.ids[:p].copy(),
        "max_length": max(len(seq.ids), max_length or 0, 1),
        "max_completion_length": None,
        "vocab_size": None,
        "sample_id": (sample_id, seq.index),
        "completion_ids": seq.ids[p:].copy(),
        "mask": seq.mask[p:].copy(),
        "logprobs": seq.logprobs[p:].copy(),
        "spans": spans,
        "status": int(seq.status),
        "reason": seq.reason,
        "tokens_cut": seq.tokens_cut,
        "num_turns": turn,
    }
    trajectory = restore_trajectory(state)
    return SequenceRow(trajectory, seq.versions[p:], seq.mask[p:], seq, state["sample_id"])


def episodes_rows(episodes: Iterable[Episode]) -> list[SequenceRow]:
    """Every sequence of every episode, in order, as collate rows."""
    return [row for episode in episodes for row in episode.rows()]
