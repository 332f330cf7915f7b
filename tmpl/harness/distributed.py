"""Harness runs spread over :class:`tmpl.DistributedRollout` workers (local processes or Ray actors).

>>> settings = HarnessSettings(spec, make_gateway, options={"n": 4, "concurrency": 8})             # doctest: +SKIP
>>> with tmpl.DistributedRollout(settings, workers=4) as runner:                                  # doctest: +SKIP
...     results = runner.run([HarnessTask("Fix the test", files="repo/", verifier=CommandVerifier("pytest -q")), ...])

:class:`HarnessSettings` is the factory ``DistributedRollout`` sends to each worker (it pickles: the
:class:`~tmpl.harness.Harness`, the gateway, the :class:`~tmpl.harness.HarnessRollout` options). Each worker
builds ONE :class:`~tmpl.harness.HarnessRollout` with one gateway and runs shard after shard of the tasks on it:

- ``gateway`` a URL: every worker's runs go to that shared ``tmpl serve`` (its trainer routes);
- ``gateway`` a picklable callable (a module-level function, a ``functools.partial``) returning a
  :class:`tmpl.gateway.Gateway`: each worker builds its own in-process gateway, once, served on 127.0.0.1
  while a shard runs. Its backend's servers see each call with the session's key as the sample
  (``GenerationRequest.sample``), so a run's calls stay on one engine server (sticky) whichever worker
  serves it.

A shard's tasks keep their place in the whole input: a task without an ``id`` is named ``task<index>`` by
its global index, so sessions and results name it the same on any worker. Results come back in input order
(each task's ``n`` runs together), one :class:`~tmpl.harness.HarnessResult` per run.

A worker that dies (killed, out of memory): its shard runs again on another worker (or one started in its
place), from its tasks: every run again with a fresh session (a new key) and a fresh working directory; only
the answer of the attempt that finishes counts, so no run is recorded twice. The dead worker's harness
processes die with it (each runs under a keeper whose lifeline is the worker). Memory per run is bounded: a
run's session is finished and taken out of the gateway as the run ends (:class:`HarnessRollout`), so a
worker holds the episodes of its current shard's finished runs only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import WorkerSetupError
from .rollout import HarnessRollout
from .spec import Harness
from .task import HarnessTask

__all__ = ["HarnessSettings", "HarnessWorkerRuntime"]


@dataclass(frozen=True)
class HarnessSettings:
    """What each worker builds its :class:`HarnessRollout` from: ``harness``, ``gateway`` (a URL, or a
    picklable callable returning a :class:`~tmpl.gateway.Gateway`) and ``options`` (:class:`HarnessRollout`'s
    keywords: ``n``, ``concurrency``, ``isolation``...). Calling it builds the rollout here.

    >>> s = HarnessSettings(Harness("echo", ("true",), dialect="openai-chat"), "http://127.0.0.1:8100", {"n": 2})
    >>> s().n, s().gateway
    (2, 'http://127.0.0.1:8100')
    """

    harness: Harness
    gateway: str | Callable[[], Any]
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.harness, Harness):
            raise WorkerSetupError(None, f"harness must be a tmpl.harness.Harness, not {type(self.harness).__name__}")
        if not isinstance(self.gateway, str) and not callable(self.gateway):
            raise WorkerSetupError(
                None,
                "gateway must be a URL or a picklable callable returning a tmpl.gateway.Gateway (built in each worker)",
            )

    def __call__(self) -> HarnessRollout:
        gateway = self.gateway if isinstance(self.gateway, str) else self.gateway()
        return HarnessRollout(self.harness, gateway, **{"progress": False, **self.options})

    def worker_runtime(self, name: str) -> HarnessWorkerRuntime:
        """The runtime of one worker (what :func:`tmpl.rollout.scale.worker.runtime_for` asks for)."""
        return HarnessWorkerRuntime(self, name)


class HarnessWorkerRuntime:
    """One worker's :class:`HarnessRollout` (one gateway) and the shards of tasks it runs, one at a time."""

    def __init__(self, settings: HarnessSettings, name: str) -> None:
        self.name = name
        try:
            self.rollout = settings()
        except Exception as exc:
            raise WorkerSetupError(name, f"building the harness rollout raised {type(exc).__name__}: {exc}") from exc
        # every worker must run the same harness (the driver compares what each reports)
        self.fingerprint = f"harness {settings.harness.name} {settings.harness.dialect} {settings.harness.argv!r}"
        self.cancelled: list[str] = []

    async def run_shard(self, shard: Any) -> Any:
        """Run the shard's tasks (every one ``n`` times); results with the tasks' global names."""
        from ..rollout.metrics import RolloutMetrics
        from ..rollout.scale.worker import ShardOutput

        tasks = [_named(task, shard.offset + k) for k, task in enumerate(shard.conversations)]
        cpu, began = time.process_time(), time.perf_counter()
        results = await self.rollout.arun(tasks)
        metrics = RolloutMetrics(samples=len(results), wall_time=time.perf_counter() - began)
        metrics.done = sum(r.ok for r in results)
        metrics.end_codes = {}
        for r in results:
            metrics.end_codes[r.status] = metrics.end_codes.get(r.status, 0) + 1
        # harness results where a rollout's would be: the driver only orders and returns them
        return ShardOutput(shard.index, results, metrics, [], time.process_time() - cpu)  # type: ignore[arg-type]

    def close(self) -> None:
        """Close the worker's in-process gateway (its backend client)."""
        close = getattr(self.rollout.gateway, "close", None)
        if callable(close):
            close()


def _named(task: HarnessTask | str, index: int) -> HarnessTask:
    """``task`` with an id: its own, else ``task<index>`` by its index in the whole input."""
    if isinstance(task, str):
        return HarnessTask(task, id=f"task{index}")
    if isinstance(task, HarnessTask) and task.id is None:
        return HarnessTask(task.prompt, task.files, task.verifier, id=f"task{index}", timeout=task.timeout)
    return task  # HarnessRollout refuses what is neither, naming it
