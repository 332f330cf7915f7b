"""Weight updates while samples run, and the staleness policy (``max_staleness``, ``stale``).

:class:`WeightUpdates` is the part of :class:`tmpl.Rollout` that moves the engines to a new
policy version (:meth:`~WeightUpdates.update_weights_async`: requests held back, engines paused,
weights applied, version set) and decides what a sample sampled by old versions becomes: kept,
withheld, masked or dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..backends.base import Backend, UpdateMode, WeightSource
from .codes import EndCode
from .result import RolloutResult
from .sample import SampleRun
from .scheduler import Scheduler

if TYPE_CHECKING:
    from ..trajectory import Trajectory

#: what ``max_staleness`` does with a sample that is too stale
StalePolicy = Literal["withhold", "drop", "mask"]
STALE_POLICIES: tuple[str, ...] = ("withhold", "drop", "mask")


class WeightUpdates:
    """Policy versions, weight updates and the staleness policy of a rollout (a base of :class:`tmpl.Rollout`)."""

    backend: Backend

    def _init_weights(self, version: int, max_staleness: int | None, stale: StalePolicy) -> None:
        if stale not in STALE_POLICIES:
            raise ValueError(f"stale must be one of {', '.join(STALE_POLICIES)}, got {stale!r}")
        if max_staleness is not None and max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 or None, got {max_staleness}")
        self.version = int(version)
        self.max_staleness = max_staleness
        self.stale: StalePolicy = stale
        self._gate: asyncio.Event | None = None  # set while a weight update holds new requests back
        self._updating_to: int | None = None  # the version an update under way is labelling the engines with
        self._label_warned = False  # an engine label newer than the Rollout's was warned about (once)
        self._abort_epoch = 0  # abort-mode updates so far: an aborted request older than the last one resumes
        self._schedulers: set[Scheduler] = set()  # of the runs and streams under way
        self._live: dict[tuple[int, int], tuple[SampleRun, asyncio.Task[Any]]] = {}  # running samples
        self._home: asyncio.AbstractEventLoop | None = None  # the loop of a stream_sync's thread
        self.updates: list[dict[str, Any]] = []  # one entry per weight update: version, mode, seconds

    def update_weights(
        self,
        version: int,
        apply: WeightSource = None,
        *,
        mode: UpdateMode = "keep",
        reset_prefix_cache: bool = True,
    ) -> None:
        """Synchronous :meth:`update_weights_async` (also from the caller's thread of :meth:`stream_sync`)."""
        home = self._home
        coro = self.update_weights_async(version, apply, mode=mode, reset_prefix_cache=reset_prefix_cache)
        if home is not None and home.is_running():
            asyncio.run_coroutine_threadsafe(coro, home).result()
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            asyncio.run(coro)
            return
        coro.close()
        raise RuntimeError(
            "Rollout.update_weights() was called inside a running event loop; await update_weights_async()"
        )

    async def update_weights_async(
        self,
        version: int,
        apply: WeightSource = None,
        *,
        mode: UpdateMode = "keep",
        reset_prefix_cache: bool = True,
    ) -> None:
        """Move every engine to policy ``version`` while samples may be running.

        The engines pause, ``apply`` runs (None: only the version label changes; a folder: vLLM
        reloads the weights from it; a callable, sync or async, no arguments: the caller's own
        transfer), the prefix cache is reset (unless ``reset_prefix_cache=False``: KV computed by
        the old weights may then be reused), the version label is set, and the engines resume.
        No new request leaves the rollout meanwhile. ``mode`` says what happens to requests in flight:

        - ``"keep"``: they continue under the new weights (their tokens' versions change mid-turn);
        - ``"abort"``: they stop; the tokens sampled so far stay (once) and the sample continues from
          its own IDs under the new version (a partial rollout: nothing is re-rendered);
        - ``"drain"``: the update waits for them to finish.

        Engines that generate in batches (torch, offline vLLM, Scripted) are updated between two
        batches whatever the mode. Raises WeightUpdateError naming the engine and step that failed
        (the rollout's version then stays as it was).

        >>> await rollout.update_weights_async(7, apply="/ckpt/step-7", mode="abort")  # doctest: +SKIP
        """
        if mode not in ("keep", "abort", "drain"):
            raise ValueError(f"mode must be 'keep', 'abort' or 'drain', got {mode!r}")
        version = int(version)
        started = time.perf_counter()
        gate = asyncio.Event()
        previous, self._gate = self._gate, gate
        if previous is not None:  # another update under way: this one goes after it
            await previous.wait()
            self._gate = gate
        try:
            if mode == "abort":
                self._abort_epoch += 1
            async with contextlib.AsyncExitStack() as stack:
                for scheduler in list(self._schedulers):
                    await stack.enter_async_context(scheduler.hold())
                self._updating_to = version  # keep-mode requests may come back labelled with it before it is set
                await self.backend.update_weights(version, apply, mode=mode, reset_prefix_cache=reset_prefix_cache)
            self.version = version
            self.updates.append({"version": version, "mode": mode, "seconds": time.perf_counter() - started})
            self._drop_stale()
        finally:
            self._updating_to = None
            if self._gate is gate:
                self._gate = None
            gate.set()

    def _label_check(self) -> int | None:
        """The newest version an engine label may rightly carry now (the Rollout's, or the one an update
        under way is setting), or None once a newer label was warned about (the warning is given once)."""
        if self._label_warned:
            return None
        return self._ended_under()

    async def _open(self) -> None:
        """Wait while a weight update holds new requests back."""
        while self._gate is not None:
            await self._gate.wait()

    def _too_stale(self, oldest: int | None, now: int | None = None) -> bool:
        now = self.version if now is None else now
        return self.max_staleness is not None and oldest is not None and now - oldest > self.max_staleness

    def _ended_under(self) -> int:
        """The version a sample that ends now ended under: during an update, the one being set (its
        keep-mode requests come back labelled with it, so the older one would give negative staleness)."""
        return self.version if self._updating_to is None else max(self.version, self._updating_to)

    def _drop_stale(self) -> None:
        """``stale="drop"``: cancel the running samples the last update made too stale."""
        if self.stale != "drop" or self.max_staleness is None:
            return
        for run, task in list(self._live.values()):
            if not run.dropped and self._too_stale(run.oldest):
                run.dropped = True
                task.cancel()

    def _apply_staleness(self, result: RolloutResult) -> None:
        """Record the version the sample ended under and apply ``max_staleness``."""
        result.version = now = self._ended_under()
        if self.max_staleness is None or result.code is EndCode.STALE_DROPPED:
            return
        if not self._too_stale(result.oldest_version, now):
            return
        if self.stale == "withhold":
            result.stale_action = "withhold"
            result._loss_mask = np.zeros_like(result.mask)
        elif self.stale == "mask":
            versions = result.versions
            keep = result.mask.copy()
            keep[(versions >= 0) & (versions < now - self.max_staleness)] = 0
            result.stale_action = "mask"
            result._loss_mask = keep
            result._stale_below = now - self.max_staleness
        else:  # drop: the sample ended before an update made it too stale
            self._dropped(result.trajectory, result.oldest_version, now)
            result._mark_dropped()

    def _dropped(self, traj: Trajectory, oldest: int | None, now: int | None = None) -> None:
        now = self.version if now is None else now
        traj.reset()
        traj.abort(
            f"dropped: sampled from version {oldest}, {now - (oldest or 0)} versions behind "
            f"{now} (max_staleness={self.max_staleness})"
        )
