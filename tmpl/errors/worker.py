"""Errors of a rollout worker, a process or a Ray actor (:class:`WorkerError`): its setup, a lost shard, Ray missing."""

from __future__ import annotations

from typing import Any

from .base import TmplError, _rebuild


class WorkerError(TmplError):
    """A worker of :class:`tmpl.DistributedRollout` (a process or a Ray actor) failed; ``worker`` names it."""

    def __init__(self, worker: str | None, reason: str) -> None:
        self.worker = worker
        self.reason = reason
        super().__init__(f"rollout worker {worker}: {reason}" if worker is not None else reason)

    def __reduce__(self) -> tuple[Any, ...]:  # sent from a worker to the driver: its attributes survive pickling
        return (_rebuild, (type(self), self.args, self.__dict__))


class WorkerSetupError(WorkerError, ValueError):
    """A worker could not be set up: its rollout factory does not pickle, raised, returned no
    ``tmpl.Rollout``, or built a template whose fingerprint differs from the other workers'.

    >>> raise WorkerSetupError("process 1", "the factory returned a list, not a tmpl.Rollout")
    Traceback (most recent call last):
    ...
    tmpl.errors.WorkerSetupError: rollout worker process 1: cannot set up: the factory returned a list, not a tmpl.Rollout
    """

    def __init__(self, worker: str | None, reason: str) -> None:
        super().__init__(worker, f"cannot set up: {reason}")
        self.reason = reason


class WorkerLostError(WorkerError):
    """Workers died and a shard of samples could not be run: no worker left, or the shard killed
    ``attempts`` workers in a row (each death re-runs it elsewhere first). ``shard`` names it.

    >>> raise WorkerLostError("process 0", "shard 3 (conversations 12-15)", "killed by SIGKILL", 3)
    Traceback (most recent call last):
    ...
    tmpl.errors.WorkerLostError: rollout worker process 0: shard 3 (conversations 12-15) lost after 3 attempt(s): killed by SIGKILL
    """

    def __init__(self, worker: str | None, shard: str, how: str, attempts: int) -> None:
        super().__init__(worker, f"{shard} lost after {attempts} attempt(s): {how}")
        self.shard, self.how, self.attempts = shard, how, attempts


class RayNotInstalledError(WorkerError, ImportError):
    """Ray workers were asked for (``mode="ray"`` or an ``address``) but ray is not installed.

    >>> raise RayNotInstalledError()
    Traceback (most recent call last):
    ...
    tmpl.errors.RayNotInstalledError: DistributedRollout(mode='ray') needs ray, which is not installed: pip install 'tmpl[ray]' (ray==2.60.0)
    """

    def __init__(self) -> None:
        WorkerError.__init__(
            self,
            None,
            "DistributedRollout(mode='ray') needs ray, which is not installed: pip install 'tmpl[ray]' (ray==2.60.0)",
        )
