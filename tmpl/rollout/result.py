"""``RolloutResult``: one finished sample, its token sequences, counts, versions and staleness.

Built by the rollout loop from a sample's running state (:meth:`tmpl.rollout.sample.SampleRun.result`),
or for a sample that crashed (:meth:`RolloutResult.crashed`); always by keyword.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..episode import Episode, SequenceRow
from ..episode.builder import sequence_row
from ..trajectory.images import has_images, restore_image_trajectory
from ..trajectory.types import Span, Status, state_of
from .codes import EndCode
from .drift import DriftDetail
from .metrics import SampleTimes

if TYPE_CHECKING:
    from ..episode import TrainingSequence
    from ..trajectory import Trajectory
    from .history import KeptSpan


@dataclass(kw_only=True)
class RolloutResult:
    """One sample: exact token sequences with masks and logprobs, plus what happened.

    ``mask`` is 1 on model tokens and 0 on tokens tmpl appended (tool results, generation
    prompts); ``logprobs`` are the backend's for model tokens and 0.0 elsewhere. ``messages``
    are the conversation with the parsed assistant turns and tool results (decoded: for rewards
    and logs, never for training). ``reason`` says why a sample is TRUNCATED or ABORTED.

    ``versions`` has the policy version that sampled each completion token (-1 on appended
    tokens); ``version`` is the rollout's version when the sample ended, ``staleness`` how many
    versions its oldest sampled token is behind it. ``loss_mask`` is ``mask`` after the
    rollout's staleness policy (``stale_action``: None, ``"withhold"`` or ``"mask"``).

    >>> r.versions.tolist(), r.version, r.staleness      # doctest: +SKIP
    ([3, 3, 4, -1, -1, 4], 5, 2)

    ``sequences`` are the sample's exact training sequences (docs/episodes.md): with
    ``history="append"`` one, equal to ``prompt_ids + completion_ids`` with ``mask``, ``logprobs`` and
    ``versions``; with ``history="template"`` or an ``edit_history`` hook one per branch, and then
    ``trajectory`` is the last sequence's (the prompt of the last branch and what followed it).
    ``kept`` says, per prompt rendered, where each earlier turn's sampled IDs came back.

    >>> [(s.ids.shape, s.trained_tokens, str(s.branch)) for s in r.sequences]   # doctest: +SKIP
    [((812,), 143, 'first')]
    """

    index: int  # which conversation
    sample: int  # which of its n samples
    trajectory: Trajectory = field(repr=False)
    messages: list[dict[str, Any]]
    turns: int
    tool_calls: int
    tool_failures: int
    finish_reason: str  # the last generation's: stop / length / abort / error
    drift: bool | None = None  # would re-rendering the text have changed the IDs? (None: not measured)
    times: SampleTimes = field(default_factory=SampleTimes, repr=False)
    code: EndCode | None = None  # how the sample ended (the reason in words is ``reason``)
    drift_detail: DriftDetail | None = None  # where and why it drifted (set when ``drift`` is True)
    tool_failure_kinds: dict[str, int] = field(default_factory=dict, repr=False)  # failed calls by kind
    #: Rollout(env_factory=...): the sum of the rewards its environment's steps gave (None: none gave one)
    env_reward: float | None = None
    #: the episode's state (``EnvReset.state``), ``EnvStep.info`` merged over its steps, and the typed error
    #: its environment ended with, in words (``"EnvMessageError: ..."``; None when it ended cleanly)
    env_state: Any = field(default=None, repr=False)
    env_info: dict[str, Any] = field(default_factory=dict, repr=False)
    env_error: str | None = None
    _attempts: int = field(default=1, repr=False)
    _versions: np.ndarray | None = field(default=None, repr=False)  # int32, one per completion token
    version: int = 0  # the rollout's policy version when the sample ended
    stale_action: str | None = None  # what max_staleness did: None, "withhold", "mask" or "drop"
    resumed: int = 0  # generations continued after an abort-mode weight update (partial rollouts)
    #: suffix checks due under ``verify_every`` that could not run: the full render of the conversation
    #: raised (the suffix was appended unchecked; the rollout logs the error once)
    unverified: int = 0
    _loss_mask: np.ndarray | None = field(default=None, repr=False)  # mask after the staleness policy
    #: stale="mask": sampled tokens of a version below this are off the loss (their sequences' too)
    _stale_below: int | None = field(default=None, repr=False)
    #: the episode of the sample's calls (history="template" / edit_history); None: built from the trajectory
    _episode: Episode | None = field(default=None, repr=False)
    #: per prompt rendered from the history (history="template" / edit_history): the earlier turns it kept
    kept: list[tuple[KeptSpan, ...]] = field(default_factory=list, repr=False)
    #: append mode: the sub-agents its tool calls ran (turn of the parent call, run), added to ``episode``
    _subagents: list[Any] = field(default_factory=list, repr=False)
    #: the episode was built from the trajectory on first use (append mode), not kept from the calls
    _built: bool = field(default=False, repr=False)
    #: vision template mode (history="template" / edit_history): per episode sequence, the images of its
    #: last call's prompt (None: append mode or a text template)
    _sequence_images: dict[int, Any] | None = field(default=None, repr=False)
    #: routing replay in template mode: per episode sequence, ``(routes, known)`` of its positions (None:
    #: append mode, whose one sequence is the trajectory, or no routes)
    _sequence_routes: dict[int, tuple[Any, Any]] | None = field(default=None, repr=False)

    @property
    def episode(self) -> Episode:
        """The sample's calls merged into training sequences (:class:`tmpl.episode.Episode`).

        In append mode it is built on first use from the trajectory (one sequence, equal to it), with the
        calls of the sub-agents its tool calls ran (:class:`tmpl.rollout.SubAgent`) in sequences of their own.
        """
        if self._episode is None:
            self._built = True
            episode = Episode.from_result(self, reward=self.env_reward)  # an environment's reward, if any
            for turn, sub in self._subagents:
                sub.add_to(episode, f"turn-{turn}")
            self._episode = episode
        return self._episode

    @property
    def from_calls(self) -> bool:
        """True when the sequences come from the sample's model calls (template mode, an ``edit_history``
        hook, sub-agents), False when its trajectory alone is its one sequence (append mode)."""
        return bool(self._subagents) or (self._episode is not None and not self._built)

    @property
    def sequences(self) -> list[TrainingSequence]:
        """The exact training sequences: ids, mask, logprobs, versions, turns covered, branch, status.

        Their ``mask`` is the loss mask, after the rollout's staleness policy as :attr:`loss_mask` is:
        all 0 for a withheld sample, 0 on the tokens sampled too many versions ago under ``stale="mask"``
        (``result.episode.sequences`` keep what was sampled, as :attr:`mask` does).

        >>> [seq.mask.sum() for seq in r.sequences], r.loss_mask.sum()   # doctest: +SKIP
        ([12], 12)
        """
        sequences = self.episode.sequences
        if self.stale_action == "withhold":
            return [_with_mask(seq, np.zeros_like(seq.mask)) for seq in sequences]
        if self.stale_action == "mask" and self._stale_below is not None:
            out = []
            for seq in sequences:
                keep = seq.mask.copy()
                keep[(seq.versions >= 0) & (seq.versions < self._stale_below)] = 0
                out.append(_with_mask(seq, keep))
            return out
        return sequences

    @property
    def sequence_images(self) -> list[Any]:
        """The image inputs (:class:`tmpl.vision.ImageInputs`) of each of :attr:`sequences`, spans in that
        sequence's positions, so a trainer can rebuild its model inputs; None for a sequence without
        recorded images (a text template, a sub-agent's sequence).

        Append mode: the trajectory's (:attr:`images`) for its one sequence. Template mode or an
        ``edit_history`` hook with a :class:`tmpl.vision.VisionTemplate`: each sequence's own, the images
        its calls were sent (a sequence merges calls only when they were sent the same images).

        >>> [(s.index, im.count) for s, im in zip(r.sequences, r.sequence_images)]   # doctest: +SKIP
        [(0, 2), (1, 1)]
        >>> r.sequence_images[1].model_inputs(r.sequences[1].ids)  # pixel_values, image_grid_thw...  # doctest: +SKIP
        """
        appended = self._episode is None or self._built  # append mode: sequence 0 is the trajectory
        if self._sequence_images is None and (self.images is None or not appended):
            return [None] * len(self.episode.sequences)
        lengths = [len(seq.ids) for seq in self.episode.sequences]
        return sequence_images(self.images, self._sequence_images, lengths)

    def rows(self) -> list[SequenceRow]:
        """One row per training sequence for :func:`tmpl.collate` (their loss masks: :attr:`sequences`').

        Append mode: one row, the sample's trajectory; template mode, an edit hook or sub-agents: one per
        sequence, each its prompt (up to its first sampled token) and completion. A sequence with images
        (:attr:`sequence_images`) is a row whose trajectory carries them, so the batch has its image arrays.

        >>> batch = tmpl.collate([row for r in results for row in r.rows()], pad_id=0)   # doctest: +SKIP
        """
        rows = [sequence_row(seq, (self.index, self.sample), self.trajectory.max_length) for seq in self.sequences]
        if self.routes is not None or self._sequence_routes:  # each row's trajectory holds its sequence's routes
            rows = [
                row if routes is None else dataclasses.replace(row, trajectory=with_routes(row.trajectory, *routes))
                for row, routes in zip(rows, self.sequence_routes)
            ]
        if self._sequence_images is None and self.images is None:
            return rows
        return [
            row if images is None else dataclasses.replace(row, trajectory=with_images(row.trajectory, images))
            for row, images in zip(rows, self.sequence_images)
        ]

    @property
    def prompt_ids(self) -> np.ndarray:
        return self.trajectory.prompt_ids

    @property
    def completion_ids(self) -> np.ndarray:
        return self.trajectory.completion_ids

    @property
    def mask(self) -> np.ndarray:
        return self.trajectory.mask

    @property
    def logprobs(self) -> np.ndarray:
        return self.trajectory.logprobs

    @property
    def status(self) -> Status:
        return self.trajectory.status

    @property
    def reason(self) -> str:
        return self.trajectory.reason

    @property
    def spans(self) -> list[Span]:
        return self.trajectory.spans

    @property
    def images(self) -> Any:
        """The sample's :class:`tmpl.vision.ImageInputs` (prompt and tool-result images, spans in
        sequence positions), or None for a text-only sample."""
        traj: Any = self.trajectory
        return traj.images if has_images(traj) else None

    @property
    def routes(self) -> np.ndarray | None:
        """Mixture-of-experts routes of every position of ``prompt_ids + completion_ids``, ``[length, layers,
        top_k]`` (``Rollout(routes=True)``; None otherwise); :attr:`routes_known` marks the positions whose route
        is known (the last sampled token of a finished sample has none: the engine never ran it).

        >>> r.routes.shape, r.routes_known.sum() == len(r.routes) - 1   # doctest: +SKIP
        ((812, 48, 8), True)
        """
        routes: np.ndarray | None = getattr(self.trajectory, "routes", None)  # None: a trajectory without any
        return routes

    @property
    def routes_known(self) -> np.ndarray:
        """1 where :attr:`routes` holds the position's route, else 0 (uint8, one per position)."""
        known = getattr(self.trajectory, "routes_known", None)
        return np.zeros(len(self.prompt_ids) + len(self.completion_ids), dtype=np.uint8) if known is None else known

    @property
    def sequence_routes(self) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """``(routes, known)`` of each of :attr:`sequences`, aligned with its ``ids``; None for a sequence
        without routes (a sub-agent's, or no ``routes=True``). Append mode: the trajectory's for sequence 0;
        template mode: each sequence's own, from the calls that went to it."""
        sequences = self.episode.sequences
        recorded = self._sequence_routes
        if recorded is None:
            if self.routes is None or self.from_calls and self._episode is not None and not self._built:
                return [None] * len(sequences)
            recorded = {0: (self.routes, self.routes_known)}
        out: list[tuple[np.ndarray, np.ndarray] | None] = []
        for k, seq in enumerate(sequences):
            held = recorded.get(k)
            out.append(None if held is None else fit_routes(held[0], held[1], len(seq.ids)))
        return out

    @property
    def versions(self) -> np.ndarray:
        """Policy version of each completion token (int32, -1 where the model did not sample; -1
        everywhere for a sample that crashed, whose record of versions was lost with it: it is ABORTED)."""
        if self._versions is None:
            return np.full(len(self.trajectory.completion_ids), -1, dtype=np.int32)
        return self._versions

    @property
    def oldest_version(self) -> int | None:
        """The oldest version among the sampled tokens (None: no token was sampled)."""
        sampled = self.versions[self.versions >= 0]
        return int(sampled.min()) if len(sampled) else None

    @property
    def staleness(self) -> int:
        """``version`` minus the oldest sampled token's version (0 when nothing was sampled)."""
        oldest = self.oldest_version
        return 0 if oldest is None else self.version - oldest

    @property
    def loss_mask(self) -> np.ndarray:
        """``mask`` with the staleness policy applied: zeros when withheld, stale tokens off when masked."""
        return self._loss_mask if self._loss_mask is not None else self.mask

    @property
    def withheld(self) -> bool:
        """Withheld by ``max_staleness``: it counts for its group's baseline, none of its tokens for the loss."""
        return self.stale_action == "withhold"

    def _mark_dropped(self) -> None:
        """What ``stale="drop"`` leaves of a sample: its code, its action, no token versions (its
        trajectory is reset and aborted by the policy)."""
        self.code, self.stale_action = EndCode.STALE_DROPPED, "drop"
        self._versions = np.empty(0, dtype=np.int32)

    @property
    def attempts(self) -> int:
        """How many times the sample was run (more than 1 after retries, see ``sample_retries``)."""
        return self._attempts

    @property
    def metrics(self) -> dict[str, Any]:
        """Per-sample numbers: turns, tool calls and failures, tokens, drift, seconds by phase."""
        generated = int(self.mask.sum())
        return {
            "status": self.status.name,
            "reason": self.reason,
            "turns": self.turns,
            "attempts": self.attempts,
            "tool_calls": self.tool_calls,
            "tool_failures": self.tool_failures,
            "tokens_generated": generated,
            "tokens_appended": len(self.mask) - generated,
            "drift": self.drift,
            "drift_cause": self.drift_detail.cause.value if self.drift_detail else None,
            "finish_reason": self.finish_reason,
            "version": self.version,
            "staleness": self.staleness,
            "stale_action": self.stale_action,
            "resumed": self.resumed,
            "unverified": self.unverified,
            **{f"seconds/{k}": v for k, v in dataclasses.asdict(self.times).items()},
        }

    @classmethod
    def crashed(
        cls, index: int, sample: int, trajectory: Trajectory, conversation: Sequence[Mapping[str, Any]]
    ) -> RolloutResult:
        """A sample that an unexpected error ended (its trajectory already ABORTED): no turn counted."""
        return cls(
            index=index,
            sample=sample,
            trajectory=trajectory,
            messages=[dict(m) for m in conversation],
            turns=0,
            tool_calls=0,
            tool_failures=0,
            finish_reason="error",
            code=EndCode.CRASHED,
        )


def _with_mask(seq: TrainingSequence, mask: np.ndarray) -> TrainingSequence:
    """``seq`` with another (read-only) mask: a snapshot of its own, the episode's left as it is."""
    mask.setflags(write=False)
    return dataclasses.replace(seq, mask=mask)


def fit_routes(routes: np.ndarray, known: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Routes and known flags cut or padded (unknown) to ``length`` positions."""
    if len(routes) >= length:
        return routes[:length], known[:length]
    pad = length - len(routes)
    return (
        np.concatenate([routes, np.zeros((pad, *routes.shape[1:]), dtype=routes.dtype)]),
        np.concatenate([known, np.zeros(pad, dtype=np.uint8)]),
    )


def with_routes(trajectory: Trajectory, routes: np.ndarray, known: np.ndarray) -> Trajectory:
    """A row's trajectory holding the routes of its sequence (``known`` flags kept)."""
    state = state_of(trajectory)
    state["routes"] = {"routes": routes, "known": known}
    out: Trajectory = type(trajectory)._from_state(state)
    return out


def with_images(trajectory: Trajectory, images: Any) -> Trajectory:
    """A row's trajectory (prompt and completion of one sequence) as an ImageTrajectory holding ``images``
    (spans in sequence positions; checked against its placeholders)."""
    out: Trajectory = restore_image_trajectory(state_of(trajectory), images)
    return out


def sequence_images(result_images: Any, recorded: Mapping[int, Any] | None, lengths: Sequence[int]) -> list[Any]:
    """The image inputs of each training sequence of a result (``lengths``: their lengths): the images
    recorded for it (template mode: its last call's prompt's, cut to the sequence), or, without records
    (append mode), the trajectory's for sequence 0; None where none were recorded."""
    if recorded is None:
        return [result_images if k == 0 else None for k in range(len(lengths))]
    out: list[Any] = []
    for k, n in enumerate(lengths):
        images = recorded.get(k)
        if images is not None:
            images = images.split(sum(1 for _, end in images.spans if end <= n))[0]
        out.append(images)
    return out
