"""``SampleRun``: the running state of one sample while its turns run, and the result it ends with."""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..trajectory.types import Status
from .codes import EndCode
from .drift import DriftDetail
from .metrics import SampleTimes
from .result import RolloutResult
from .timing import PhaseClock

if TYPE_CHECKING:
    from ..episode import Episode
    from ..trajectory import Trajectory
    from .history import KeptSpan, SampledTurn
    from .routes import RoutePiece
    from .subagent import SubAgentRun


@dataclass(slots=True, eq=False)
class SampleRun:
    """One sample's trajectory, messages, engine input, counters, clock and weight-update bookkeeping.

    Mutated by the loop turn after turn; :meth:`result` builds its :class:`RolloutResult`.
    """

    index: int  # which conversation
    sample: int  # which of its n samples
    traj: Trajectory
    history: list[dict[str, Any]]  # messages so far (decoded: for rewards and logs)
    sequence: list[int]  # the engine's next input: prompt + everything appended so far
    # counters
    turns: int = 0
    calls: int = 0
    failures: int = 0
    failure_kinds: dict[str, int] = field(default_factory=dict)  # failed tool calls by kind (FAILURE_KINDS)
    times: SampleTimes = field(default_factory=SampleTimes)
    clock: PhaseClock = field(init=False)
    # how it ended
    finish: str = "stop"  # the last generation's finish reason
    code: EndCode | None = None
    #: its environment (Rollout(env_factory=...), rollout/envs.py): the end waits for its close
    env: Any = None  # an EpisodeEnv, or None
    # requests and versions
    rid: str | None = None  # the id of the last generation request
    versions: array[int] = field(default_factory=lambda: array("i"))  # policy version per token (-1: appended)
    oldest: int | None = None  # the version its first request was submitted under
    resumed: int = 0  # generations continued after an abort-mode weight update
    unverified: int = 0  # suffix checks (verify_every) that could not run: the full render raised
    dropped: bool = False  # cancelled by the staleness policy (stale="drop")
    images: Any = None  # the ImageInputs of ``sequence`` (vision rollouts: rollout/images.py), else None
    image_sources: list[Any] | None = None  # those images themselves (PIL), read by images.sources
    # history="template" / edit_history (rollout/history.py): the episode of this sample's calls
    episode: Episode | None = None
    sampled: list[SampledTurn] = field(default_factory=list)  # every generation so far, for the splice
    gaps: dict[str, list[int]] = field(default_factory=dict)  # texts encoded so far -> their IDs
    view: list[dict[str, Any]] | None = None  # the messages as the current prompt shows them
    edit: str | None = None  # what changed the history before the next call (a branch's label)
    kept: list[tuple[KeptSpan, ...]] = field(default_factory=list)  # per prompt rendered: turns kept
    #: vision template mode: per episode sequence of the sample's calls, the images of its last call's prompt
    seq_images: dict[int, Any] = field(default_factory=dict)
    #: vision template mode: the sequence of the last call, and those the next call must not continue
    #: (their images differ from its prompt's under the same IDs), with why
    current: int | None = None
    apart: dict[int, str] = field(default_factory=dict)
    # sub-agents (rollout/subagent.py) its tool calls ran, with the turn of the parent call, in append mode
    # (in template mode their calls go to ``episode`` as they finish)
    subagents: list[tuple[int, SubAgentRun]] = field(default_factory=list)
    # routing replay (Rollout(routes=True), rollout/routes.py): the first position of ``sequence`` not yet
    # routed, the pieces of the current turn's routes, and (template mode) each episode sequence's routes
    routed: int = 0
    route_pieces: list[RoutePiece] = field(default_factory=list)
    seq_routes: dict[int, tuple[Any, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.clock = PhaseClock(self.times)

    def count_failures(self, by_kind: Mapping[str, int]) -> None:
        """Add one tool batch's failures by kind."""
        for kind, n in by_kind.items():
            if n:
                self.failure_kinds[kind] = self.failure_kinds.get(kind, 0) + n

    def end(self, code: EndCode, reason: str | None = None) -> bool:
        """End the sample with ``code``; a trajectory still running gets the code's final status.

        Returns False (the sample stops), so a turn can ``return run.end(...)``. With an environment
        still open the trajectory ends when it is closed (``finish_episode``: a close that raises
        ends it ``ENV_FAILED``).
        """
        self.code = code
        if self.env is not None and not self.env.closed:
            self.env.pending = reason
            return False
        if self.traj.running:
            status = code.status
            if status == Status.DONE:
                self.traj.finish()
            elif status == Status.TRUNCATED:
                self.traj.truncate(reason or code.value)
            else:
                self.traj.abort(reason or code.value)
        return False

    def result(
        self,
        *,
        drift: bool | None = None,
        drift_detail: DriftDetail | None = None,
        dropped: bool = False,
    ) -> RolloutResult:
        """The sample's result; ``dropped``: cancelled by ``stale="drop"`` (no versions, finish "abort")."""
        if self.episode is not None and not self.episode.finished:
            self.episode.finish(self.traj.status, self.traj.reason)
        result = RolloutResult(
            index=self.index,
            sample=self.sample,
            trajectory=self.traj,
            messages=self.history,
            turns=self.turns,
            tool_calls=self.calls,
            tool_failures=self.failures,
            finish_reason="abort" if dropped else self.finish,
            drift=drift,
            times=self.times,
            code=self.code,
            drift_detail=drift_detail,
            tool_failure_kinds=self.failure_kinds,
            _versions=np.frombuffer(self.versions, dtype=np.int32).copy(),
            resumed=self.resumed,
            unverified=self.unverified,
            _episode=self.episode,
            kept=self.kept,
            _subagents=self.subagents,
            _sequence_images=self.seq_images if self.episode is not None and self.images is not None else None,
            _sequence_routes=self.seq_routes if self.episode is not None and self.seq_routes else None,
        )
        if dropped:
            result._mark_dropped()
        return result
