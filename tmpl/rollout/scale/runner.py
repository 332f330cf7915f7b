"""``tmpl.DistributedRollout``: one rollout's samples sharded over worker processes or Ray actors.

>>> runner = tmpl.DistributedRollout(
...     tmpl.rollout.RolloutSettings("Qwen/Qwen3-4B", ["http://node1:8000", "http://node2:8000"],
...                          tools=[get_weather], options={"max_turns": 8, "sampling": tmpl.Sampling(n=4)}),
...     workers=8)                                                             # doctest: +SKIP
>>> results = runner.run(conversations)         # in input order, as tmpl.Rollout.run gives them  # doctest: +SKIP
>>> runner.metrics.summary()                    # merged over the shards                           # doctest: +SKIP
>>> runner.close()                              # or: with tmpl.DistributedRollout(...) as runner  # doctest: +SKIP

One process tops out near 1,750 sample-turns per second (benchmarks/rollout_scale.py), on one core;
many GPUs behind vLLM servers finish more. Here the conversations are cut into shards (contiguous
runs of conversations, every sample of a conversation in the same shard) and the shards are run by
``workers`` workers, one shard at a time each, the next shard going to the first worker free:

- **where**: local processes (``multiprocessing``, spawn) by default; Ray actors when ray is
  installed and initialized (``ray.init`` was called), when an ``address`` is given (then
  ``ray.init(address=...)`` here), or with ``mode="ray"``;
- **what each worker has**: its own ``tmpl.Rollout``, built there by the factory you pass (a
  picklable callable, or a :class:`RolloutSettings`), so its own ChatTemplate, codec, suffix state,
  parser, Toolbox and backend client, warmed before its first shard; every worker must build the
  same template (the fingerprints are compared). All of them share the servers the factory names;
- **results**: in input order, with the conversation's index in the whole input, and the metrics
  of the shards merged (:func:`~.merge.merge_metrics`): ``rollout.metrics``;
- **a worker that dies** (killed, out of memory, a segfault in a tool): the shard it was running
  runs again on another worker (or on a fresh one started in its place, up to ``max_restarts`` per
  run) from its prompts, and only the answer of the run that finishes counts: no sample is lost,
  none appended twice. A worker's results come back when its whole shard is done, so a death costs
  the shard's work so far: ``shard_size`` bounds it;
- **cancel** (the task of :meth:`run_async` cancelled, Ctrl-C in :meth:`run`): every worker cancels
  its shard, whose rollout cancels every request in flight on the servers (``Backend.cancel``);
  the request ids are in ``runner.cancelled``; then the cancellation propagates.

Tools are built in the worker: with :class:`RolloutSettings`, a list of tools is pickled to each
worker (module-level functions; a lambda or closure raises :class:`~tmpl.errors.ToolIsolationError`
naming it), or ``tools`` is a factory that returns them there; with your own factory, everything
is built by it. A factory that does not pickle raises :class:`~tmpl.errors.WorkerSetupError`.
"""

from __future__ import annotations

import asyncio
import math
import pickle
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ...errors import ToolIsolationError, WorkerLostError, WorkerSetupError
from ...messages import validate_messages
from ..loop import Rollout, RolloutResult
from ..metrics import RolloutMetrics
from .merge import merge_metrics
from .pools import Event, ProcessPool, RayPool, import_ray, unpacked
from .worker import Shard, ShardOutput

Mode = Literal["auto", "process", "ray"]


@dataclass(frozen=True)
class RolloutSettings:
    """What each worker builds its ``tmpl.Rollout`` from: a template source, servers, tools, options.

    ``template``: what ``tmpl.ChatTemplate.from_pretrained`` takes (a folder or a hub id).
    ``servers``: the vLLM server URL(s) every worker sends to (``tmpl.backends.VLLMServer``, with
    ``server`` as its keyword arguments). ``tools``: a list of tools (pickled to each worker:
    module-level functions or picklable callables), or a factory (a module-level function with no
    arguments) that returns the tools or a ``tmpl.Toolbox`` inside the worker (tools that cannot be
    pickled: clients, open files), or None. ``options``: ``tmpl.Rollout`` keyword arguments
    (``max_turns``, ``sampling``...). Calling it builds the Rollout (what each worker does).

    >>> settings = RolloutSettings("../shared/tokenizers/qwen2.5-instruct", "http://127.0.0.1:8000",
    ...                            tools=[get_weather], options={"max_turns": 4})   # doctest: +SKIP
    >>> settings().max_turns                                                         # doctest: +SKIP
    4
    """

    template: str
    servers: str | Sequence[str]
    tools: Sequence[Callable[..., Any]] | Callable[[], Any] | None = None
    server: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self) -> Rollout:
        from ...backends import VLLMServer
        from ...chat_template import ChatTemplate

        tools = self.tools() if callable(self.tools) else self.tools
        backend = VLLMServer(self.servers, **dict(self.server))
        return Rollout(ChatTemplate.from_pretrained(self.template), backend, tools=tools, **dict(self.options))

    def check_env_factory(self) -> None:
        """Raise WorkerSetupError when ``options["env_factory"]`` cannot be sent to the workers."""
        factory = dict(self.options).get("env_factory")
        if factory is None:
            return
        try:
            pickle.dumps(factory)
        except Exception as exc:  # noqa: BLE001 - any pickling failure is the same answer
            raise WorkerSetupError(
                None,
                f"env_factory does not pickle ({type(exc).__name__}: {exc}); each worker makes its samples' "
                "environments with it: pass a module-level class or function (or a functools.partial of one)",
            ) from exc

    def check_tools(self) -> None:
        """Raise ToolIsolationError for the first tool of a list that cannot be sent to a worker."""
        if self.tools is None or callable(self.tools):
            return
        for position, tool in enumerate(self.tools):
            name = getattr(tool, "__name__", None) or f"tools[{position}]"
            try:
                pickle.dumps(tool)
            except Exception as exc:  # noqa: BLE001 - any pickling failure is the same answer
                raise ToolIsolationError(
                    name,
                    f"it does not pickle ({type(exc).__name__}: {exc}); define it at module level, or pass "
                    "RolloutSettings(tools=<a module-level function that returns the tools>) to build them in "
                    "each worker",
                ) from exc


class DistributedRollout:
    """Run one rollout's samples on ``workers`` worker processes or Ray actors (see the module doc).

    ``rollout``: a :class:`RolloutSettings`, or a picklable callable with no arguments that returns
    a ``tmpl.Rollout`` (a module-level function or a ``functools.partial`` of one), called once in
    each worker. ``mode``: ``"auto"`` (Ray when ray is initialized or ``address`` is given, else
    processes), ``"process"`` or ``"ray"`` (``ray.init()`` here when nothing is initialized; that
    cluster is shut down by :meth:`close`). ``shard_size``: conversations per shard (default: the
    input cut in four shards per worker). ``max_restarts``: workers started in place of dead ones
    in one run (default: ``workers``); a shard that loses ``max_attempts`` workers in a row raises
    :class:`~tmpl.errors.WorkerLostError`. ``ray_options``: ``ray.remote`` options of each actor
    (default ``num_cpus=1``). Workers start at the first run and stay until :meth:`close`.

    >>> def make_rollout():                                           # doctest: +SKIP
    ...     tpl = tmpl.ChatTemplate.from_pretrained("Qwen/Qwen3-4B")
    ...     return tmpl.Rollout(tpl, tmpl.backends.VLLMServer(URLS), tools=[get_weather], max_turns=8)
    >>> with tmpl.DistributedRollout(make_rollout, workers=4) as runner:  # doctest: +SKIP
    ...     results = runner.run(conversations)
    """

    #: seconds a worker may take to set up (import, load the tokenizer, warm the template)
    start_timeout = 300.0
    #: seconds the workers may take to answer a cancel before they are stopped
    cancel_timeout = 60.0

    def __init__(
        self,
        rollout: Callable[[], Rollout],
        *,
        workers: int = 2,
        mode: Mode = "auto",
        address: str | None = None,
        shard_size: int | None = None,
        max_restarts: int | None = None,
        max_attempts: int = 3,
        ray_options: Mapping[str, Any] | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if shard_size is not None and shard_size < 1:
            raise ValueError(f"shard_size must be >= 1, got {shard_size}")
        if mode not in ("auto", "process", "ray"):
            raise ValueError(f"mode must be 'auto', 'process' or 'ray', got {mode!r}")
        if isinstance(rollout, Rollout):
            raise WorkerSetupError(
                None,
                "pass a factory that builds the Rollout in each worker (a module-level function, a "
                "functools.partial, or tmpl.rollout.RolloutSettings), not a Rollout: its tokenizer, tools and "
                "backend connections cannot be sent to another process",
            )
        if not callable(rollout):
            raise WorkerSetupError(None, f"the rollout factory must be callable, got {type(rollout).__name__}")
        if isinstance(rollout, RolloutSettings):
            rollout.check_tools()
            rollout.check_env_factory()
        self.factory = rollout
        self.workers = workers
        self.shard_size = shard_size
        self.max_restarts = workers if max_restarts is None else max_restarts
        self.max_attempts = max_attempts
        self.ray_options = dict(ray_options or {})
        self.mode = self._mode(mode, address)
        self._ray_owned = False
        if self.mode == "ray":
            ray = import_ray()
            if not ray.is_initialized():
                ray.init(address=address)
                self._ray_owned = True
        self._blob = self._pickled(rollout) if self.mode == "process" else b""
        self._pool: ProcessPool | RayPool | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._running = threading.Lock()
        #: the template fingerprint every worker reported (set when the workers start)
        self.fingerprint: str | None = None
        #: metrics of the last run, merged over its shards
        self.metrics: RolloutMetrics | None = None
        #: request ids (as the servers saw them) the workers cancelled in the last run
        self.cancelled: list[str] = []
        #: workers that died in the last run: (worker, how, the shard it was running or None)
        self.deaths: list[tuple[str, str, str | None]] = []
        #: how many times each shard of the last run was started (1 each when no worker died)
        self.attempts: list[int] = []
        #: CPU seconds the workers' processes spent on the last run's shards (all threads; lost shards not counted)
        self.worker_cpu = 0.0

    # -- set up ---------------------------------------------------------------------------------
    @staticmethod
    def _mode(mode: Mode, address: str | None) -> Literal["process", "ray"]:
        if mode == "ray" or address is not None:
            return "ray"
        if mode == "process":
            return "process"
        try:
            import ray
        except ImportError:
            return "process"
        return "ray" if ray.is_initialized() else "process"

    @staticmethod
    def _pickled(factory: Callable[[], Rollout]) -> bytes:
        try:
            return pickle.dumps(factory)
        except Exception as exc:  # noqa: BLE001 - any pickling failure is the same answer
            raise WorkerSetupError(
                None,
                f"the rollout factory does not pickle ({type(exc).__name__}: {exc}); pass a module-level "
                "function (or a functools.partial of one) that builds the template, backend and tools in "
                "the worker, or tmpl.rollout.RolloutSettings",
            ) from exc

    def _start(self) -> ProcessPool | RayPool:
        if self._pool is not None:
            return self._pool
        pool: ProcessPool | RayPool
        if self.mode == "process":
            pool = ProcessPool(self._blob, self.workers)
        else:
            pool = RayPool(self.factory, self.workers, self.ray_options)
        self._pool = pool
        self._finalizer = weakref.finalize(self, pool.close)
        try:
            for slot in range(self.workers):
                pool.start(slot)
            waiting = set(range(self.workers))
            deadline = time.monotonic() + self.start_timeout
            while waiting:
                if time.monotonic() > deadline:
                    names = ", ".join(pool.name(s) for s in sorted(waiting))
                    raise WorkerSetupError(names, f"not ready after {self.start_timeout:.0f} s")
                for event in pool.poll(0.2):
                    self._setup_event(pool, event)
                    waiting.discard(event.slot)
        except BaseException:
            self.close()
            raise
        return pool

    def _setup_event(self, pool: ProcessPool | RayPool, event: Event) -> None:
        """A worker's ready / setup / died event during start-up or after a restart."""
        if event.kind == "setup" or (event.kind == "died" and event.shard is None and self.fingerprint is None):
            raise WorkerSetupError(pool.name(event.slot), str(event.payload))
        if event.kind == "ready":
            if self.fingerprint is None:
                self.fingerprint = event.payload
            elif event.payload != self.fingerprint:
                raise WorkerSetupError(
                    pool.name(event.slot),
                    f"its template's fingerprint {str(event.payload)[:12]} differs from the other workers' "
                    f"{self.fingerprint[:12]}: every worker must build the same template",
                )

    def pids(self) -> list[int | None]:
        """The process id of each worker (None: not started, or dead and not replaced)."""
        pool = self._pool
        return [pool.pid(s) if pool is not None else None for s in range(self.workers)]

    # -- entry points -------------------------------------------------------------------------------
    def run(self, conversations: Sequence[Sequence[Mapping[str, Any]]]) -> list[RolloutResult]:
        """Roll out every conversation ``sampling.n`` times on the workers; results in input order."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.run_async(conversations))
        raise RuntimeError("DistributedRollout.run() was called inside a running event loop; await run_async()")

    async def run_async(self, conversations: Sequence[Sequence[Mapping[str, Any]]]) -> list[RolloutResult]:
        """The asynchronous form of :meth:`run`; cancelling its task cancels every worker's shard."""
        for i, conv in enumerate(conversations):
            if isinstance(conv, Sequence) and not isinstance(conv, str):  # else an environment's task (env_factory)
                validate_messages(conv, where=f"conversations[{i}]")
        if not self._running.acquire(blocking=False):
            raise RuntimeError("this DistributedRollout is already running; one run at a time")
        try:
            start = time.perf_counter()
            shards = self._shards(conversations)
            stop = threading.Event()
            driver = asyncio.get_running_loop().run_in_executor(None, self._drive, shards, stop)
            try:
                outputs = await asyncio.shield(driver)
            except asyncio.CancelledError:
                stop.set()  # the driver cancels every worker's shard and waits for them to answer
                await asyncio.wait([driver])
                raise
            results = [r for out in outputs for r in out.results]
            self.worker_cpu = sum(out.cpu_seconds for out in outputs)
            self.metrics = merge_metrics([out.metrics for out in outputs], wall_time=time.perf_counter() - start)
            return results
        finally:
            self._running.release()

    def _shards(self, conversations: Sequence[Sequence[Mapping[str, Any]]]) -> list[Shard]:
        n = len(conversations)
        size = self.shard_size or max(1, math.ceil(n / (4 * self.workers)))
        return [Shard(k, start, conversations[start : start + size]) for k, start in enumerate(range(0, n, size))]

    # -- the driver (a thread) ------------------------------------------------------------------------
    def _drive(self, shards: list[Shard], stop: threading.Event) -> list[ShardOutput]:
        self.cancelled, self.deaths, self.attempts = [], [], [0] * len(shards)
        if not shards:
            return []
        pool = self._start()
        pending: deque[int] = deque(range(len(shards)))
        busy: dict[int, int] = {}  # slot -> shard
        outputs: dict[int, ShardOutput] = {}
        packed: dict[int, Any] = {}  # outputs not unpickled yet: after their worker has its next shard
        restarts = self.max_restarts
        try:
            while len(outputs) + len(packed) < len(shards):
                if stop.is_set():
                    self._cancel(pool, busy)
                    return []
                for slot in pool.live():
                    if slot not in busy and pending:
                        k = pending.popleft()
                        busy[slot] = k
                        self.attempts[k] += 1
                        shards[k].attempt = self.attempts[k]
                        pool.submit(slot, shards[k])
                for k in list(packed):  # the free workers are busy again: now the driver unpickles
                    outputs[k] = unpacked(packed.pop(k))
                if not pool.live():
                    k = pending[0] if pending else min(busy.values(), default=0)
                    how = self.deaths[-1][1] if self.deaths else "no worker is left"
                    raise WorkerLostError(None, shards[k].describe(), f"no worker is left ({how})", self.attempts[k])
                for event in pool.poll(0.05):
                    if event.kind in ("ready", "setup"):
                        self._setup_event(pool, event)
                    elif event.kind == "done":
                        k = busy.pop(event.slot)
                        assert k == event.shard, (k, event.shard)
                        packed[k] = event.payload
                    elif event.kind == "failed":
                        busy.pop(event.slot, None)
                        raise event.payload
                    elif event.kind == "died":
                        k_lost = busy.pop(event.slot, None)
                        lost = shards[k_lost].describe() if k_lost is not None else None
                        self.deaths.append((pool.name(event.slot), str(event.payload), lost))
                        if k_lost is not None:
                            if self.attempts[k_lost] >= self.max_attempts:
                                raise WorkerLostError(
                                    pool.name(event.slot), lost or "", str(event.payload), self.attempts[k_lost]
                                )
                            pending.appendleft(k_lost)  # next, on the first worker free
                        if restarts > 0:
                            restarts -= 1
                            pool.start(event.slot)
        except BaseException:
            self._cancel(pool, busy)
            raise
        for k in list(packed):
            outputs[k] = unpacked(packed.pop(k))
        return [outputs[k] for k in range(len(shards))]

    def _cancel(self, pool: ProcessPool | RayPool, busy: dict[int, int]) -> None:
        """Cancel the shards running on ``busy`` workers and wait for their answers (or their end)."""
        for slot in busy:
            pool.cancel(slot)
        deadline = time.monotonic() + self.cancel_timeout
        while busy and time.monotonic() < deadline:
            for event in pool.poll(0.05):
                if event.kind == "cancelled":
                    self.cancelled += event.payload
                if event.kind in ("cancelled", "done", "failed", "died", "setup"):
                    busy.pop(event.slot, None)
        for slot in list(busy):  # no answer: stopped, so no stale answer reaches the next run
            pool.stop(slot)
            pool.start(slot)

    # -- tear down ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the workers (and the Ray cluster this runner started). Idempotent."""
        if self._finalizer is not None:
            self._finalizer()  # pool.close, once
            self._finalizer = None
        self._pool = None
        self.fingerprint = None
        if self._ray_owned:
            import_ray().shutdown()
            self._ray_owned = False

    def __enter__(self) -> DistributedRollout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DistributedRollout(mode={self.mode!r}, workers={self.workers}, started={self._pool is not None})"
