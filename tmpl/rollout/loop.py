"""``tmpl.Rollout``: multi-turn, token-in/token-out rollouts with tools.

>>> rollout = tmpl.Rollout(tpl, tmpl.backends.Torch(model), tools=toolbox, max_turns=8,
...                        max_length=8192, max_completion_length=4096,
...                        sampling=tmpl.Sampling(temperature=1.0, n=4))          # doctest: +SKIP
>>> results = rollout.run(conversations)                                         # doctest: +SKIP
>>> r = results[0]; r.prompt_ids, r.completion_ids, r.mask, r.logprobs, r.status  # doctest: +SKIP

Each conversation is tokenized once. Every turn sends token IDs to the backend and gets token
IDs back; the model's tokens are appended as they are (mask 1, with their logprobs); tool calls
are parsed from the token IDs, run, and their results appended as the template's exact suffix
(mask 0). Nothing is ever decoded and re-tokenized: ``.messages`` (decoded and parsed) is for
rewards and logging only. Samples run concurrently and finish at different turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import queue as _queue
import sys
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..backends.base import Backend, GenerationRequest, GenerationResult, Sampling, UpdateMode, WeightSource
from ..chat_template import ChatTemplate
from ..errors import TmplError
from ..messages import validate_messages
from ..toolcalls.api import parse_completion, parser_for
from ..trajectory import _twin
from ..trajectory.types import Span, Status

if TYPE_CHECKING:
    from ..toolcalls import Toolbox
    from ..trajectory import Trajectory
from .codes import EndCode
from .collector import fewer_collections
from .drift import DRIFT_FRACTION, DriftDetail, check_fraction, chosen, rerender_drift
from .metrics import RolloutMetrics, SampleTimes
from .scheduler import Scheduler
from .timing import PhaseClock
from .toolround import ToolRounds


@dataclass
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
    _attempts: int = field(default=1, repr=False)
    _versions: np.ndarray | None = field(default=None, repr=False)  # int32, one per completion token
    version: int = 0  # the rollout's policy version when the sample ended
    stale_action: str | None = None  # what max_staleness did: None, "withhold", "mask" or "drop"
    resumed: int = 0  # generations continued after an abort-mode weight update (partial rollouts)
    _loss_mask: np.ndarray | None = field(default=None, repr=False)  # mask after the staleness policy

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
            **{f"seconds/{k}": v for k, v in dataclasses.asdict(self.times).items()},
        }


class Rollout:
    """Run conversations turn after turn until the model stops calling tools.

    ``tools``: a :class:`tmpl.Toolbox`, a list of callables (wrapped in one), or None.
    ``max_turns``: generations per sample (a sample still calling tools after the last one is
    TRUNCATED). ``max_length`` / ``max_completion_length``: token budgets of each sample (see
    :class:`tmpl.Trajectory`). ``max_tokens_per_turn``: cap of one generation (default: what the
    budget leaves). ``measure_drift``: re-render finished samples once, to count samples whose
    IDs re-rendering would have changed and explain where and why (``drift_detail``): True
    (every sample), False/0 (none) or a fraction in (0, 1] of samples, chosen by a hash of
    conversation index and sample number (the same ones every run); default ``DRIFT_FRACTION``
    (1/16: one render and tokenization per 16 samples). ``verify_every``: check every k-th suffix against
    a full render of the conversation (0: never); a mismatch aborts the sample.
    ``sample_retries``: how many times a sample whose generation failed (backend error or
    abort) is run again from its prompt; its trajectory is reset first, so nothing of the
    failed attempt stays. ``progress``: a tqdm bar (default: when stderr is a terminal).

    Async RL (docs/rollouts.md, "Async RL"): ``version`` is the policy version of the weights
    loaded now (an integer the trainer chooses; :meth:`update_weights` moves it, or set it
    directly when the caller changes the weights itself); every sampled token records the
    version that sampled it. ``max_staleness``: a sample whose oldest sampled token is more than
    this many versions behind when it ends is handled by ``stale``: ``"withhold"`` (it finishes
    and keeps its reward for its group's baseline; ``loss_mask`` is all zeros), ``"drop"``
    (cancelled as soon as an update makes it too stale: ABORTED, ``EndCode.STALE_DROPPED``,
    nothing appended) or ``"mask"`` (``loss_mask`` off on the tokens sampled more than
    ``max_staleness`` versions ago). :meth:`stream` yields finished groups while generation goes on.
    """

    def __init__(
        self,
        template: ChatTemplate,
        backend: Backend,
        *,
        tools: Any = None,
        max_turns: int = 8,
        max_length: int = 8192,
        max_completion_length: int | None = 4096,
        max_tokens_per_turn: int | None = None,
        sampling: Sampling | None = None,
        measure_drift: bool | float = DRIFT_FRACTION,
        verify_every: int = 0,
        sample_retries: int = 0,
        max_batch: int = 256,
        max_concurrency: int = 256,
        progress: bool | None = None,
        version: int = 0,
        max_staleness: int | None = None,
        stale: StalePolicy = "withhold",
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if stale not in STALE_POLICIES:
            raise ValueError(f"stale must be one of {', '.join(STALE_POLICIES)}, got {stale!r}")
        if max_staleness is not None and max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 or None, got {max_staleness}")
        self.tpl = template
        self.backend = backend
        self.toolbox = _toolbox(tools)
        if self.toolbox is not None:
            parser_for(template)  # fail now (NoToolParserError, with why) rather than mid-rollout
        self.tool_schemas = self.toolbox.schemas if self.toolbox is not None else None
        self.max_turns = max_turns
        self.max_length = max_length
        self.max_completion_length = max_completion_length
        self.max_tokens_per_turn = max_tokens_per_turn
        self.sampling = sampling or Sampling()
        self.measure_drift = check_fraction(measure_drift)
        self.verify_every = verify_every
        self.sample_retries = sample_retries
        self.max_batch = max_batch
        self.max_concurrency = max_concurrency
        self.progress = progress
        self.metrics: RolloutMetrics | None = None  # of the last run
        self._suffix_count = 0
        self.version = int(version)
        self.max_staleness = max_staleness
        self.stale: StalePolicy = stale
        self._gate: asyncio.Event | None = None  # set while a weight update holds new requests back
        self._abort_epoch = 0  # abort-mode updates so far: an aborted request older than the last one resumes
        self._schedulers: set[Scheduler] = set()  # of the runs and streams under way
        self._live: dict[tuple[int, int], tuple[_SampleRun, asyncio.Task[Any]]] = {}  # running samples
        self._home: asyncio.AbstractEventLoop | None = None  # the loop of a stream_sync's thread
        self.updates: list[dict[str, Any]] = []  # one entry per weight update: version, mode, seconds

    # -- entry points ---------------------------------------------------------------------
    def run(self, conversations: Sequence[Sequence[Mapping[str, Any]]]) -> list[RolloutResult]:
        """Roll out every conversation ``sampling.n`` times; results in order (conversation, sample)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.run_async(conversations))
        raise RuntimeError("Rollout.run() was called inside a running event loop; await run_async() instead")

    async def run_async(self, conversations: Sequence[Sequence[Mapping[str, Any]]]) -> list[RolloutResult]:
        """The asynchronous form of :meth:`run`."""
        with fewer_collections():  # the collector was a third of the loop's own time (collector.py)
            return await self._run_all(conversations)

    async def _run_all(self, conversations: Sequence[Sequence[Mapping[str, Any]]]) -> list[RolloutResult]:
        start = time.perf_counter()
        for i, conv in enumerate(conversations):
            validate_messages(conv, where=f"conversations[{i}]")
        setup = _Setup()
        with PhaseClock(setup)("tokenize"):  # validated above: render each, one call into the tokenizer
            texts = [
                self.tpl.render(conv, tools=self.tool_schemas, add_generation_prompt=True) for conv in conversations
            ]
            prompts = self.tpl.codec.encode_shared(texts)
        scheduler = Scheduler(self.backend, max_batch=self.max_batch, max_concurrency=self.max_concurrency)
        rounds = ToolRounds(self.tpl, self.toolbox, self.tool_schemas) if self.toolbox is not None else None
        jobs = [(i, s) for i in range(len(conversations)) for s in range(self.sampling.n)]
        bar = self._bar(len(jobs))
        results: list[RolloutResult] = []
        cache_before = await self._cache_counters()
        self._schedulers.add(scheduler)
        tasks = [
            asyncio.ensure_future(self._one(i, s, conversations[i], prompts[i], scheduler, rounds, bar))
            for i, s in jobs
        ]
        try:
            results = list(await asyncio.gather(*tasks))
        except asyncio.CancelledError:
            # the run was cancelled (gather cancelled every sample) and gather returned at the first
            # one done: wait for the others to tell the backend about their requests (Backend.cancel)
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            self._schedulers.discard(scheduler)
            if bar is not None:
                bar.close()
        self.metrics = RolloutMetrics.from_results(
            results,
            wall_time=time.perf_counter() - start,
            engine_time=scheduler.engine_time,
            batches=scheduler.batches,
            tokenize_time=setup.tokenize,
        )
        await self._count_cache(cache_before)
        return results

    async def _cache_counters(self) -> tuple[float, float] | None:
        try:
            return await asyncio.wait_for(self.backend.prefix_cache_counters(), 15.0)
        except Exception:  # noqa: BLE001 - telemetry: a server that cannot say leaves it unmeasured
            return None

    async def _count_cache(self, before: tuple[float, float] | None) -> None:
        """Prefix-cache tokens looked up and hit since ``before``, into ``metrics``."""
        after = await self._cache_counters() if before is not None else None
        if before is not None and after is not None and self.metrics is not None:
            self.metrics.prefix_cache_queries = max(0.0, after[0] - before[0])
            self.metrics.prefix_cache_hits = max(0.0, after[1] - before[1])

    async def _one(
        self,
        i: int,
        s: int,
        conversation: Sequence[Mapping[str, Any]],
        prompt: list[int],
        scheduler: Scheduler,
        rounds: ToolRounds | None,
        bar: Any = None,
    ) -> RolloutResult:
        """One sample with its retries, then the staleness policy."""
        scheduler.start_sample()
        try:
            traj = None
            for attempt in range(self.sample_retries + 1):
                try:
                    result = await self._sample(i, s, conversation, prompt, scheduler, traj, attempt, rounds)
                except Exception as exc:  # noqa: BLE001 - one sample's failure must not take the batch down
                    result = self._crashed(i, s, conversation, prompt, traj, exc)
                traj = result.trajectory
                if result.code is None or not result.code.retryable:
                    break
            result._attempts = attempt + 1
            self._apply_staleness(result)
            return result
        finally:
            scheduler.end_sample()
            if bar is not None:
                bar.update(1)

    # -- streaming ----------------------------------------------------------------------------
    async def stream(
        self,
        prompts: Iterable[Sequence[Mapping[str, Any]]] | Any,
        *,
        max_in_flight: int | None = None,
    ) -> AsyncGenerator[list[RolloutResult], None]:
        """Yield finished groups (the ``sampling.n`` samples of one prompt) in the order they finish.

        ``prompts``: an iterable (or async iterable) of conversations, or an ``asyncio.Queue`` of
        them ended by ``None``. Prompts are taken as room frees up: at most ``max_in_flight`` samples
        (default ``max_concurrency``) run at once. ``index`` of a result is its prompt's position in
        the stream. Generation goes on while the caller handles a group, and the caller may
        :meth:`update_weights` between groups. ``metrics`` covers everything yielded once the stream ends.

        >>> async for group in rollout.stream(prompts, max_in_flight=64):   # doctest: +SKIP
        ...     batch.append(group)
        ...     if len(batch) == 8:
        ...         train(batch); batch = []
        ...         await rollout.update_weights_async(step, apply="/ckpt/step")
        """
        bound = max_in_flight if max_in_flight is not None else self.max_concurrency
        n = self.sampling.n
        if bound < n:
            raise ValueError(f"max_in_flight={bound} cannot hold one group of n={n} samples")
        start = time.perf_counter()
        scheduler = Scheduler(self.backend, max_batch=self.max_batch, max_concurrency=self.max_concurrency)
        rounds = ToolRounds(self.tpl, self.toolbox, self.tool_schemas) if self.toolbox is not None else None
        setup = _Setup()
        done: asyncio.Queue[tuple[int, list[RolloutResult]] | BaseException] = asyncio.Queue()
        room = asyncio.Condition()
        in_flight = 0
        groups: set[asyncio.Task[None]] = set()
        finished: list[RolloutResult] = []
        cache_before = await self._cache_counters()
        self._schedulers.add(scheduler)

        async def group(i: int, conv: Sequence[Mapping[str, Any]], prompt: list[int]) -> None:
            nonlocal in_flight
            try:
                tasks = [asyncio.ensure_future(self._one(i, s, conv, prompt, scheduler, rounds)) for s in range(n)]
                try:
                    results = list(await asyncio.gather(*tasks))
                except asyncio.CancelledError:
                    await asyncio.gather(*tasks, return_exceptions=True)
                    raise
                done.put_nowait((i, results))
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
                done.put_nowait(exc)
            finally:
                async with room:
                    in_flight -= n
                    room.notify_all()

        async def feed() -> int:
            nonlocal in_flight
            count = 0
            async for conv in _prompts(prompts):
                validate_messages(conv, where=f"prompts[{count}]")
                with PhaseClock(setup)("tokenize"):
                    text = self.tpl.render(conv, tools=self.tool_schemas, add_generation_prompt=True)
                    prompt = self.tpl.codec.encode_shared([text])[0]
                async with room:
                    await room.wait_for(lambda: in_flight + n <= bound)  # noqa: B023 - read when woken
                    in_flight += n
                task = asyncio.ensure_future(group(count, conv, list(prompt)))
                groups.add(task)
                task.add_done_callback(groups.discard)
                count += 1
            return count

        feeder = asyncio.ensure_future(feed())
        yielded = 0
        try:
            while True:
                if feeder.done() and yielded == feeder.result() and done.empty():
                    break
                getter = asyncio.ensure_future(done.get())
                waited = {getter} if feeder.done() else {getter, feeder}
                await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    await asyncio.gather(getter, return_exceptions=True)
                    if feeder.exception() is not None:
                        raise feeder.exception()  # type: ignore[misc]
                    continue
                item = getter.result()
                if isinstance(item, BaseException):
                    raise item
                yielded += 1
                finished += item[1]
                yield item[1]
        finally:
            pending = [feeder, *groups]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            self._schedulers.discard(scheduler)
            self.metrics = RolloutMetrics.from_results(
                finished,
                wall_time=time.perf_counter() - start,
                engine_time=scheduler.engine_time,
                batches=scheduler.batches,
                tokenize_time=setup.tokenize,
            )
            await self._count_cache(cache_before)

    def stream_sync(
        self, prompts: Iterable[Sequence[Mapping[str, Any]]], *, max_in_flight: int | None = None
    ) -> Iterator[list[RolloutResult]]:
        """:meth:`stream` for synchronous code: generation runs on an event loop in a thread of its own,
        so it goes on while the caller trains; :meth:`update_weights` from the caller's thread reaches it.

        >>> for group in rollout.stream_sync(prompts, max_in_flight=64):   # doctest: +SKIP
        ...     train([group]); rollout.update_weights(step, apply="/ckpt/step")
        """
        out: _queue.Queue[tuple[str, Any]] = _queue.Queue(maxsize=1)
        ready = threading.Event()
        stop = threading.Event()
        loop = asyncio.new_event_loop()

        async def put(item: tuple[str, Any]) -> bool:
            while not stop.is_set():
                try:
                    out.put_nowait(item)
                    return True
                except _queue.Full:
                    await asyncio.sleep(0.005)  # the caller is training: generation goes on meanwhile
            return False

        async def pump() -> None:
            groups = self.stream(prompts, max_in_flight=max_in_flight)
            try:
                async for group in groups:
                    if not await put(("group", group)):
                        break
                else:
                    await put(("end", None))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                await put(("error", exc))
            finally:
                await groups.aclose()
            while not stop.is_set():  # the loop stays up for update_weights until the caller is done
                await asyncio.sleep(0.005)

        def thread() -> None:
            asyncio.set_event_loop(loop)
            self._home = loop
            ready.set()
            try:
                loop.run_until_complete(pump())
            finally:
                self._home = None
                loop.close()

        worker = threading.Thread(target=thread, name="tmpl-stream", daemon=True)
        worker.start()
        ready.wait()
        try:
            while True:
                kind, value = out.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                yield value
        finally:
            stop.set()
            with contextlib.suppress(_queue.Empty):
                out.get_nowait()  # let a pump blocked on a full queue see ``stop``
            worker.join()

    # -- weight updates -----------------------------------------------------------------------
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
                await self.backend.update_weights(version, apply, mode=mode, reset_prefix_cache=reset_prefix_cache)
            self.version = version
            self.updates.append({"version": version, "mode": mode, "seconds": time.perf_counter() - started})
            self._drop_stale()
        finally:
            if self._gate is gate:
                self._gate = None
            gate.set()

    async def _open(self) -> None:
        """Wait while a weight update holds new requests back."""
        while self._gate is not None:
            await self._gate.wait()

    def _too_stale(self, oldest: int | None) -> bool:
        return self.max_staleness is not None and oldest is not None and self.version - oldest > self.max_staleness

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
        result.version = self.version
        if self.max_staleness is None or result.code is EndCode.STALE_DROPPED:
            return
        if not self._too_stale(result.oldest_version):
            return
        if self.stale == "withhold":
            result.stale_action = "withhold"
            result._loss_mask = np.zeros_like(result.mask)
        elif self.stale == "mask":
            versions = result.versions
            keep = result.mask.copy()
            keep[(versions >= 0) & (versions < self.version - self.max_staleness)] = 0
            result.stale_action = "mask"
            result._loss_mask = keep
        else:  # drop: the sample ended before an update made it too stale
            self._dropped(result.trajectory, result.oldest_version)
            result.code, result.stale_action = EndCode.STALE_DROPPED, "drop"
            result._versions = np.empty(0, dtype=np.int32)

    def _dropped(self, traj: Any, oldest: int | None) -> None:
        traj.reset()
        traj.abort(
            f"dropped: sampled from version {oldest}, {self.version - (oldest or 0)} versions behind "
            f"{self.version} (max_staleness={self.max_staleness})"
        )

    # -- one sample -----------------------------------------------------------------------
    async def _sample(
        self,
        i: int,
        s: int,
        conversation: Sequence[Mapping[str, Any]],
        prompt: list[int],
        scheduler: Scheduler,
        traj: Any = None,
        attempt: int = 0,
        rounds: ToolRounds | None = None,
    ) -> RolloutResult:
        if traj is None:
            traj = self._trajectory(i, s, prompt)
        else:
            traj.reset()  # a retry starts clean: no stale ids, mask, logprobs or spans
        run = _SampleRun(i, s, traj, [dict(m) for m in conversation], list(prompt))
        sampling = self.sampling
        if sampling.seed is not None and sampling.n > 1:
            sampling = dataclasses.replace(sampling, seed=sampling.seed + s, n=1)
        key = (i, s)
        # the turns run in a task of their own, which the staleness policy may cancel (stale="drop")
        # without the sample's own task being cancelled
        turns = asyncio.ensure_future(self._turns(run, sampling, scheduler, attempt, rounds))
        self._live[key] = (run, turns)
        try:
            try:
                await asyncio.wait({turns})
            except asyncio.CancelledError:  # the run was cancelled: so are the turns
                turns.cancel()
                await asyncio.gather(turns, return_exceptions=True)
                raise
            finally:
                if self._live.get(key, (None,))[0] is run:
                    del self._live[key]
            if turns.cancelled():
                if not run.dropped:
                    raise asyncio.CancelledError()
                self._dropped(traj, run.oldest)
                return RolloutResult(
                    i,
                    s,
                    traj,
                    run.history,
                    run.turns,
                    run.calls,
                    run.failures,
                    "abort",
                    times=run.times,
                    code=EndCode.STALE_DROPPED,
                    tool_failure_kinds=run.failure_kinds,
                    _versions=np.empty(0, dtype=np.int32),
                    stale_action="drop",
                    resumed=run.resumed,
                )
            turns.result()  # a crash inside the turns raises here
        except Exception:
            if run.rid is not None:  # crashed: the backend may still hold its last request
                await scheduler.cancel(run.rid)
            raise
        if run.code is not None and run.code.status is Status.ABORTED and run.rid is not None:
            await scheduler.cancel(run.rid)  # an aborted sample: the backend drops what it holds of it
        if run.code is None:  # pragma: no cover - every turn that stops sets a code
            run.end(EndCode.FINISHED)
        drift, detail = self._measure_drift(run)
        return RolloutResult(
            i,
            s,
            traj,
            run.history,
            run.turns,
            run.calls,
            run.failures,
            run.finish,
            drift,
            run.times,
            code=run.code,
            drift_detail=detail,
            tool_failure_kinds=run.failure_kinds,
            _versions=np.asarray(run.versions, dtype=np.int32),
            resumed=run.resumed,
        )

    async def _turns(
        self, run: _SampleRun, sampling: Sampling, scheduler: Scheduler, attempt: int, rounds: ToolRounds | None
    ) -> None:
        for turn in range(self.max_turns):
            if not await self._turn(run, turn, sampling, scheduler, attempt, rounds):
                return

    async def _generate(
        self, run: _SampleRun, rid: str, budget: int, sampling: Sampling, scheduler: Scheduler
    ) -> tuple[GenerationResult, list[int]]:
        """One turn's generation and the version of each of its tokens.

        A request that an abort-mode weight update stopped is continued from its own tokens (the
        prompt plus what it sampled so far, never re-rendered) under the new weights; the pieces
        come back as one result, as if the turn had never been interrupted.
        """
        ids: list[int] = []
        lps: list[float] = []
        versions: list[int] = []
        request_id = rid
        while True:
            await self._open()
            submitted, epoch = self.version, self._abort_epoch
            if run.oldest is None:
                run.oldest = submitted
            run.rid = request_id
            result = await scheduler.generate(
                GenerationRequest(
                    request_id,
                    run.sequence + ids,
                    budget - len(ids),
                    self.tpl.stop_token_ids,
                    sampling,
                    version=submitted,
                    sample=f"{run.index}/{run.sample}",
                )
            )
            own = _token_versions(result, submitted)
            preempted = result.finish_reason == "abort" and epoch != self._abort_epoch
            if preempted and (result.logprobs is not None or not result.token_ids):
                ids += result.token_ids
                lps += result.logprobs or []
                versions += own
                run.resumed += 1
                request_id = f"{rid}-p{run.resumed}"
                if len(ids) >= budget:  # the turn's budget is spent: it ends as a turn at its limit would
                    return GenerationResult(rid, ids, lps, "length", result.logprobs_mode), versions
                continue
            if not ids:
                return result, own
            merged = dataclasses.replace(
                result,
                token_ids=ids + result.token_ids,
                logprobs=lps + result.logprobs if result.logprobs is not None else None,
                versions=versions + own,
            )
            return merged, versions + own

    async def _turn(
        self,
        run: _SampleRun,
        turn: int,
        sampling: Sampling,
        scheduler: Scheduler,
        attempt: int,
        rounds: ToolRounds | None = None,
    ) -> bool:
        """One generation and, when it called tools, one tool round. False once the sample ended."""
        traj, tpl = run.traj, self.tpl
        budget = traj.max_new_tokens(self.max_tokens_per_turn)
        if budget <= 0:
            return run.end(EndCode.NO_BUDGET, "no token budget left for another turn")
        rid = f"{run.index}-{run.sample}-{turn}" + (f"-r{attempt}" if attempt else "")
        result, versions = await self._generate(run, rid, budget, sampling, scheduler)
        run.turns += 1
        run.finish = result.finish_reason
        if result.finish_reason == "error":
            return run.end(EndCode.GENERATION_FAILED, f"generation failed: {result.error}")
        if result.finish_reason == "abort":
            return run.end(EndCode.BACKEND_ABORTED, "the backend aborted the request")
        with run.clock("bookkeeping"):
            kept = traj.add_completion(result.token_ids, result.logprobs, message=len(run.history))
            run.sequence += result.token_ids[:kept]
            run.versions += versions[:kept]
        if not traj.running:  # cut at the budget, or no usable logprobs
            return run.end(EndCode.BUDGET_CUT if traj.status is Status.TRUNCATED else EndCode.NO_LOGPROBS)
        with run.clock("parse"):
            parsed = parse_completion(tpl, result.token_ids, tools=self.toolbox)
        assistant = parsed.to_message()
        run.history.append(assistant)
        if result.finish_reason == "length" or kept < len(result.token_ids):
            return run.end(EndCode.TURN_LIMIT, f"turn {turn} hit its token limit ({budget}) before a stop token")
        if not parsed.has_calls or self.toolbox is None:
            return run.end(EndCode.FINISHED)
        if turn == self.max_turns - 1:
            return run.end(EndCode.MAX_TURNS, f"reached max_turns={self.max_turns} with tool calls pending")
        return await self._tool_round(run, parsed, assistant, result.token_ids, scheduler, rounds)

    async def _tool_round(
        self,
        run: _SampleRun,
        parsed: Any,
        assistant: dict[str, Any],
        completion: list[int],
        scheduler: Scheduler,
        rounds: ToolRounds | None,
    ) -> bool:
        """Run the calls of one completion and append their exact suffix. False once the sample ended."""
        assert rounds is not None
        before = run.history[:-1]  # the messages before the assistant turn
        with scheduler.working():  # tools and suffix batched with the other samples of this pass
            done = await rounds.run(parsed, completion, before, run.traj.remaining)  # results cut to it
        run.times.tools += done.tool_seconds
        run.times.suffix += done.suffix_seconds
        tool_messages = done.messages
        run.calls += done.calls
        run.failures += done.failed
        run.count_failures(done.failures)
        if done.error is not None:
            if not isinstance(done.error, TmplError):
                raise done.error
            run.history += tool_messages
            return run.end(EndCode.SUFFIX_FAILED, f"cannot build the tool suffix: {done.error}")
        suffix = done.suffix
        assert suffix is not None
        with run.clock("suffix"):
            verified = not self.verify_every or self._verify(before, assistant, tool_messages, suffix)
        if not verified:
            run.history += tool_messages
            return run.end(EndCode.VERIFY_FAILED, "suffix verification against a full render failed")
        message_index = len(run.history)
        run.history += tool_messages
        with run.clock("bookkeeping"):
            appended = run.traj.add_suffix(suffix, message=message_index)
            run.sequence += suffix[:appended]
            run.versions += [-1] * appended
        if done.stop:
            return run.end(EndCode.TOOL_STOP, "a tool failed and on_error='stop'")
        if not run.traj.running:
            return run.end(EndCode.BUDGET_CUT)
        return True

    def _trajectory(self, i: int, s: int, prompt: list[int]) -> Any:
        return _twin.builder.Trajectory(
            prompt,
            self.max_length,
            self.max_completion_length,
            vocab_size=self.tpl.codec.vocab_size,
            sample_id=f"{i}/{s}",
        )

    def _crashed(
        self, i: int, s: int, conversation: Sequence[Mapping[str, Any]], prompt: list[int], traj: Any, exc: Exception
    ) -> RolloutResult:
        """An unexpected error in one sample: the sample is ABORTED with the error as its reason."""
        if traj is None:
            traj = self._trajectory(i, s, prompt)
        if not traj.status.final:
            traj.abort(f"unexpected error in the rollout: {type(exc).__name__}: {exc}")
        return RolloutResult(i, s, traj, [dict(m) for m in conversation], 0, 0, 0, "error", code=EndCode.CRASHED)

    # -- checks -----------------------------------------------------------------------------
    def _measure_drift(self, run: _SampleRun) -> tuple[bool | None, DriftDetail | None]:
        """Drift of one finished sample, if ``measure_drift`` chooses it (timed as the ``drift`` phase)."""
        if not chosen(self.measure_drift, run.index, run.sample):
            return None, None
        with run.clock("drift"):
            return self._drift(run.history, run.traj)

    def _drift(self, history: list[dict[str, Any]], traj: Trajectory) -> tuple[bool | None, DriftDetail | None]:
        """Would decoding and re-rendering this sample have changed its token IDs? Where and why?"""
        ours = traj.prompt_ids.tolist() + traj.completion_ids.tolist()
        return rerender_drift(self.tpl, history, ours, self.tool_schemas)

    def _verify(
        self,
        history: list[dict[str, Any]],
        assistant: dict[str, Any],
        tool_messages: list[dict[str, Any]],
        suffix: list[int],
    ) -> bool:
        self._suffix_count += 1
        if self._suffix_count % self.verify_every:
            return True
        try:
            text = self.tpl.renderer.text(
                history + [assistant] + tool_messages, tools=self.tool_schemas, add_generation_prompt=True
            )
        except TmplError:
            return True  # the template cannot render it: nothing to compare with
        full = self.tpl.codec.encode(text)
        n = len(suffix)
        return full[len(full) - n :] == suffix and n < len(full) and full[len(full) - n - 1] in self.tpl.stop_token_ids

    def _bar(self, total: int) -> Any:
        show = self.progress if self.progress is not None else sys.stderr.isatty()
        if not show:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=total, desc="rollout", unit="sample", file=sys.stderr)


class _Setup:
    """Seconds a run spends before any sample starts."""

    tokenize = 0.0


class _SampleRun:
    """The running state of one sample: its trajectory, messages, engine input, counters and clock."""

    __slots__ = (
        "index",
        "sample",
        "traj",
        "history",
        "sequence",
        "times",
        "clock",
        "calls",
        "failures",
        "turns",
        "finish",
        "code",
        "failure_kinds",
        "rid",
        "versions",
        "oldest",
        "resumed",
        "dropped",
    )

    def __init__(self, index: int, sample: int, traj: Any, history: list[dict[str, Any]], sequence: list[int]):
        self.index, self.sample, self.traj = index, sample, traj
        self.history = history  # messages so far (decoded: for rewards and logs)
        self.sequence = sequence  # the engine's next input: prompt + everything appended so far
        self.times = SampleTimes()
        self.clock = PhaseClock(self.times)
        self.calls = self.failures = self.turns = 0
        self.finish = "stop"
        self.code: EndCode | None = None
        self.failure_kinds: dict[str, int] = {}  # failed tool calls by kind (tmpl.toolcalls FAILURE_KINDS)
        self.rid: str | None = None  # the id of the last generation request
        self.versions: list[int] = []  # policy version per completion token (-1: appended, not sampled)
        self.oldest: int | None = None  # the version its first request was submitted under
        self.resumed = 0  # generations continued after an abort-mode weight update
        self.dropped = False  # cancelled by the staleness policy (stale="drop")

    def count_failures(self, by_kind: Mapping[str, int]) -> None:
        """Add one tool batch's failures by kind."""
        for kind, n in by_kind.items():
            if n:
                self.failure_kinds[kind] = self.failure_kinds.get(kind, 0) + n

    def end(self, code: EndCode, reason: str | None = None) -> bool:
        """End the sample with ``code``; a trajectory still running gets the code's final status.

        Returns False (the sample stops), so a turn can ``return run.end(...)``.
        """
        self.code = code
        if self.traj.running:
            status = code.status
            if status == Status.DONE:
                self.traj.finish()
            elif status == Status.TRUNCATED:
                self.traj.truncate(reason or code.value)
            else:
                self.traj.abort(reason or code.value)
        return False


#: what ``max_staleness`` does with a sample that is too stale
StalePolicy = Literal["withhold", "drop", "mask"]
STALE_POLICIES: tuple[str, ...] = ("withhold", "drop", "mask")


def _token_versions(result: GenerationResult, submitted: int) -> list[int]:
    """The engine's version per token when it gave one for each, else the version at submission."""
    n = len(result.token_ids)
    if result.versions is not None and len(result.versions) == n:
        return [int(v) for v in result.versions]
    return [submitted] * n


async def _prompts(source: Any) -> AsyncIterator[Any]:
    """Conversations from an ``asyncio.Queue`` (ended by None), an async iterable or an iterable."""
    if isinstance(source, asyncio.Queue):
        while (item := await source.get()) is not None:
            yield item
    elif hasattr(source, "__aiter__"):
        async for item in source:
            yield item
    else:
        for item in source:
            yield item
            await asyncio.sleep(0)  # let samples start while a long iterable is read


def _toolbox(tools: Any) -> Toolbox | None:
    if tools is None:
        return None
    from ..toolcalls import Toolbox

    if isinstance(tools, Toolbox):
        return tools
    return Toolbox(list(tools))
