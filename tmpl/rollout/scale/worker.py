"""What runs inside one worker of :class:`tmpl.DistributedRollout`: its own rollout, shard after shard.

A worker (a process or a Ray actor) calls the rollout factory once, so it has its own
``ChatTemplate``, codec, suffix state, tool-call parser, Toolbox and backend client, and warms them
before its first shard (:func:`warm`: how the template's turns close, the parser, the suffix frame
of each tool's result). Then it runs shards: contiguous runs of conversations, each with every
one of its ``sampling.n`` samples (a GRPO group never straddles two workers).

Inside a worker a shard's conversations are numbered from 0, but everything the worker hands out
carries the conversation's index in the whole rollout: the backend sees request ids
``<index>-<sample>-<turn>`` with the global index (:class:`ShardBackend`; servers shared by every
worker never see two requests with one id, and a scripted policy that reads the index sees the
same one as in a single process), results come back with the global ``index`` and
``sample_id``, and the samples whose drift is measured are chosen by their global index (the same
ones as in one process).

>>> runtime = WorkerRuntime(make_rollout, "process 0")     # doctest: +SKIP
>>> out = asyncio.run(runtime.run_shard(Shard(3, 12, conversations[12:16])))  # doctest: +SKIP
>>> [r.index for r in out.results][:2], out.metrics.samples  # doctest: +SKIP
([12, 12], 16)
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...backends.base import Backend, GenerationRequest, GenerationResult
from ...errors import TmplError, WorkerSetupError
from ...toolcalls.api import parser_for
from ...trajectory.types import restore_trajectory, state_of
from ..codes import EndCode
from ..drift import chosen, rerender_drift
from ..loop import Rollout, RolloutResult
from ..metrics import RolloutMetrics

#: the conversation index that starts a request id of the rollout loop (``<index>-<sample>-<turn>``)
_LEADING_INDEX = re.compile(r"(\d+)(.*)", re.DOTALL)


@dataclass
class Shard:
    """Conversations ``offset`` .. ``offset + len(conversations) - 1`` of a rollout, run by one worker."""

    index: int
    offset: int
    conversations: Sequence[Sequence[Mapping[str, Any]]]
    attempt: int = 1  # 2 and up: run again after its worker died (request ids then end with -w<attempt>)

    def describe(self) -> str:
        return f"shard {self.index} (conversations {self.offset}-{self.offset + len(self.conversations) - 1})"


@dataclass
class ShardOutput:
    """A shard's results (global indices), its metrics, the request ids its worker cancelled, and the CPU
    seconds its worker's process spent on it (every thread: tools and the tokenizer's included)."""

    index: int
    results: list[RolloutResult]
    metrics: RolloutMetrics
    cancelled: list[str] = field(default_factory=list)
    cpu_seconds: float = 0.0


class ShardBackend(Backend):
    """The worker's backend seen through one shard: request ids carry the global conversation index.

    ``"2-0-1"`` of a shard at offset 40 reaches the backend as ``"42-0-1"``, and its result comes
    back under ``"2-0-1"`` (and its ``sample``, ``"2/0"``, which servers route by, as ``"42/0"``).
    An id that does not start with an index (none of the loop's) gets a
    prefix instead. When the shard runs again after its worker died (``attempt`` 2 and up), ids end
    with ``-w<attempt>``: a server that still holds the dead worker's request never sees its id
    twice. Cancels go through too, and are listed in ``cancelled`` (global ids).

    >>> from tmpl.backends import Scripted
    >>> backend = ShardBackend(Scripted(lambda req: [int(req.request_id.split("-")[0])]), offset=40)
    >>> backend.global_id("2-0-1"), backend.global_id("warm"), ShardBackend(backend, 0, attempt=2).global_id("2-0-1")
    ('42-0-1', '40+warm', '2-0-1-w2')
    >>> backend.generate_batch([GenerationRequest("2-0-1", [1], 4, frozenset())])[0].token_ids
    [42]
    >>> backend._request(GenerationRequest("2-0-1", [1], 4, frozenset(), sample="2/0")).sample
    '42/0'
    """

    def __init__(self, inner: Backend, offset: int, attempt: int = 1) -> None:
        self.inner = inner
        self.offset = offset
        self.suffix = f"-w{attempt}" if attempt > 1 else ""
        self.batching = inner.batching
        self.threaded = inner.threaded
        self.cancelled: list[str] = []

    def global_id(self, request_id: str) -> str:
        """The id the backend sees for the loop's ``request_id``."""
        m = _LEADING_INDEX.fullmatch(request_id)
        if m is None:
            return f"{self.offset}+{request_id}{self.suffix}"
        return f"{int(m.group(1)) + self.offset}{m.group(2)}{self.suffix}"

    def _request(self, request: GenerationRequest) -> GenerationRequest:
        changes: dict[str, Any] = {"request_id": self.global_id(request.request_id)}
        sample = getattr(request, "sample", None)  # "<conversation>/<sample>": servers route a sample's turns together
        m = _LEADING_INDEX.fullmatch(sample) if isinstance(sample, str) else None
        if m is not None:
            changes["sample"] = f"{int(m.group(1)) + self.offset}{m.group(2)}"
        return dataclasses.replace(request, **changes)

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        results = self.inner.generate_batch([self._request(r) for r in requests])
        for request, result in zip(requests, results):
            result.request_id = request.request_id
        return results

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        result = await self.inner.agenerate(self._request(request))
        result.request_id = request.request_id
        return result

    async def cancel(self, request_id: str) -> None:
        rid = self.global_id(request_id)
        self.cancelled.append(rid)
        await self.inner.cancel(rid)

    async def update_weights(self, *args: Any, **kwargs: Any) -> None:
        await self.inner.update_weights(*args, **kwargs)

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    @weight_version.setter
    def weight_version(self, value: int) -> None:
        self.inner.weight_version = value

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # the backend's own attributes (stats, in_flight, servers...)
        return getattr(self.inner, name)


def warm(rollout: Rollout) -> str:
    """Probe what the rollout's first turns would (turn closes, parser, each tool's result frame); its fingerprint.

    Best effort: a template that cannot render a probe here fails the same way in the rollout,
    where the sample gets the error.
    """
    tpl = rollout.tpl
    try:
        stops = tpl.stop_token_ids  # probes how plain and tool-call turns close
        if rollout.toolbox is not None and rollout.tool_schemas:
            parser_for(tpl)
            close = list(tpl.tool_close_ids)
            for name in rollout.toolbox.names:
                message = {"role": "tool", "tool_call_id": "call_0", "name": name, "content": "{}"}
                tpl.suffix_ids([message], completion_ids=close or sorted(stops)[:1], tools=rollout.tool_schemas)
    except TmplError:
        pass
    return tpl.fingerprint


def runtime_for(factory: Callable[[], Any], name: str) -> Any:
    """The runtime of one worker: ``factory.worker_runtime(name)`` where the factory has one (a
    :class:`tmpl.harness.distributed.HarnessSettings`: harness runs instead of a rollout), else a
    :class:`WorkerRuntime` of the rollout ``factory`` builds. Either has ``fingerprint``, ``cancelled``,
    ``run_shard(shard) -> ShardOutput`` and ``close()``."""
    make = getattr(factory, "worker_runtime", None)
    if callable(make):
        return make(name)
    return WorkerRuntime(factory, name)


class WorkerRuntime:
    """One worker's rollout (built by ``factory`` here) and the shards it runs, one at a time."""

    def __init__(self, factory: Callable[[], Any], name: str) -> None:
        self.name = name
        try:
            rollout = factory()
        except TmplError:
            raise
        except Exception as exc:
            raise WorkerSetupError(name, f"the rollout factory raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(rollout, Rollout):
            raise WorkerSetupError(name, f"the factory returned a {type(rollout).__name__}, not a tmpl.Rollout")
        rollout.progress = False
        self.rollout = rollout
        self.backend: Backend = rollout.backend
        self.fingerprint = warm(rollout)
        self.current: ShardBackend | None = None  # the running shard's view of the backend

    @property
    def cancelled(self) -> list[str]:
        """Request ids (global) the running or last shard told its backend to cancel."""
        return list(self.current.cancelled) if self.current is not None else []

    async def run_shard(self, shard: Shard) -> ShardOutput:
        """Run the shard's conversations on this worker's rollout; results and metrics with global indices."""
        rollout = self.rollout
        view = self.current = ShardBackend(self.backend, shard.offset, shard.attempt)
        fraction = rollout.measure_drift
        later = not isinstance(fraction, bool) and 0 < fraction < 1  # chosen by global index, after the run
        rollout.backend = view
        if later:
            rollout.measure_drift = 0.0
        cpu = time.process_time()
        try:
            results = await rollout.run_async(shard.conversations)
            metrics = rollout.metrics
        finally:
            rollout.backend = self.backend
            rollout.measure_drift = fraction
        assert metrics is not None
        if shard.offset:
            for r in results:
                r.index += shard.offset
                r.trajectory = restore_trajectory({**state_of(r.trajectory), "sample_id": f"{r.index}/{r.sample}"})
        if later:
            self._measure_drift(results, metrics, fraction)
        return ShardOutput(shard.index, results, metrics, list(view.cancelled), time.process_time() - cpu)

    def _measure_drift(self, results: list[RolloutResult], metrics: RolloutMetrics, fraction: float) -> None:
        """What the loop's ``measure_drift`` does, for the samples chosen by their global index."""
        rollout = self.rollout
        for r in results:
            if r.code is EndCode.CRASHED or rollout.env_factory is not None or not chosen(fraction, r.index, r.sample):
                continue
            start = time.perf_counter()
            ids = r.trajectory.prompt_ids.tolist() + r.trajectory.completion_ids.tolist()
            r.drift, r.drift_detail = rerender_drift(rollout.tpl, r.messages, ids, rollout.tool_schemas)
            seconds = time.perf_counter() - start
            r.times.drift += seconds
            metrics.outside["drift"] = metrics.outside.get("drift", 0.0) + seconds
            if r.drift is not None:
                metrics.drift_measured += 1
                metrics.drift_samples += int(r.drift)
                if r.drift_detail is not None:
                    cause = r.drift_detail.cause.value
                    metrics.drift_causes[cause] = metrics.drift_causes.get(cause, 0) + 1

    def close(self) -> None:
        """Close the backend client and the Toolbox."""
        self.backend.close()
        if self.rollout.toolbox is not None:
            self.rollout.toolbox.close()
