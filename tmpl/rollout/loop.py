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
import dataclasses
import logging
import sys
import time
from array import array
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..backends.base import Backend, GenerationRequest, GenerationResult, Sampling
from ..chat_template import ChatTemplate
from ..episode import Episode
from ..errors import RoutesError, RoutesUnavailableError
from ..messages import validate_messages
from ..toolcalls.api import CompletionReader, parser_for
from ..tools.toolbox import as_toolbox
from ..trajectory.types import Status
from . import images as _images
from .codes import EndCode
from .collector import fewer_collections
from .drift import DRIFT_FRACTION, check_fraction
from .envs import EpisodeEnv, check_factory, env_turn, finish_episode, run_episode, schemas_of, with_env
from .history import HISTORY_MODES, HistoryContext
from .metrics import RolloutMetrics
from .result import RolloutResult
from .routes import RoutePiece, stitch
from .sample import SampleRun
from .scheduler import Scheduler
from .stream import stream_groups, stream_groups_in_thread
from .subagent import request_prefix, subagents_of
from .timing import PhaseClock, SetupTimes
from .toolround import ToolRounds
from .turn_steps import TurnSteps
from .versions import token_versions
from .weights import StalePolicy, WeightUpdates

logger = logging.getLogger("tmpl.rollout")

if TYPE_CHECKING:
    from ..trajectory import Trajectory
    from ..vision import VisionTemplate

__all__ = ["PARSE_OFF_LOOP", "Rollout", "RolloutResult", "StalePolicy"]

#: completions longer than this many tokens are parsed on a worker thread, so one sample's long parse
#: does not hold up the engine I/O of the others (shorter ones parse in place: a thread hop costs more)
PARSE_OFF_LOOP = 4096


class Rollout(TurnSteps, WeightUpdates):
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

    Given a :class:`tmpl.vision.VisionTemplate`, prompts and tool results may carry images
    (docs/vision.md, "Rollouts"): trajectories hold their image inputs, requests carry them; in template
    mode (or with ``edit_history``) each prompt is the processor's render, and ``RolloutResult.sequence_images``
    holds each sequence's own images.

    History (docs/rollouts.md, "History modes"): ``history="append"`` (default) keeps each sample one
    append-only sequence, prompt plus completions plus exact suffixes. ``history="template"`` renders
    each turn's prompt as the deployed template does for the conversation so far (reasoning dropped
    where the template drops it), with every earlier turn's sampled IDs put back wherever the render
    keeps their text (:mod:`tmpl.rollout.history`); the sample's generations are calls of an
    :class:`tmpl.episode.Episode`, merged into ``RolloutResult.sequences`` (one per branch).
    ``edit_history(messages, ctx)``: a hook called between turns (``ctx``: a
    :class:`tmpl.rollout.history.HistoryContext`) that returns the messages the next prompt renders
    (a window over old tool results, a compaction); it implies rendered prompts as in template mode.
    After a final answer it may return messages ending with a user message to go on. A hook that
    raises ends the sample ``EndCode.EDIT_FAILED``; messages that are no conversation or that the
    template refuses, ``EndCode.EDIT_REJECTED``.

    >>> def window(messages, ctx):                                                # doctest: +SKIP
    ...     ctx.label = "window"
    ...     old = [i for i, m in enumerate(messages) if m["role"] == "tool"][:-1]
    ...     return [dict(m, content="[omitted]") if i in old else m for i, m in enumerate(messages)]
    >>> rollout = tmpl.Rollout(tpl, backend, tools=toolbox, edit_history=window)   # doctest: +SKIP
    """

    def __init__(
        self,
        template: ChatTemplate | VisionTemplate,
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
        env_factory: Callable[[], Any] | None = None,
        progress: bool | None = None,
        version: int = 0,
        max_staleness: int | None = None,
        stale: StalePolicy = "withhold",
        history: str = "append",
        edit_history: Callable[[list[dict[str, Any]], HistoryContext], Any] | None = None,
        routes: bool = False,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if history not in HISTORY_MODES:
            raise ValueError(f"history must be one of {', '.join(map(repr, HISTORY_MODES))}, not {history!r}")
        if edit_history is not None and not callable(edit_history):
            raise TypeError(f"edit_history must be callable, not {type(edit_history).__name__}")
        if routes and not backend.gives_routes:  # said once, here: routes are never faked
            name = type(backend).__name__
            raise RoutesUnavailableError(f"routes=True: {name} gives no mixture-of-experts routes", backend=name)
        #: routing replay (docs/rollouts.md, "Routing replay"): every turn asks for the routes of its new positions
        self.routes = routes
        self._init_weights(version, max_staleness, stale)
        # a tmpl.vision.VisionTemplate: its text template, and the images hooks (images.py)
        self.tpl, self.vision = _images.unwrap(template)
        self.history = history
        self.edit_history = edit_history
        #: prompts rendered from the messages each turn (history="template" or a hook), not appended
        self._rendered = history == "template" or edit_history is not None
        self.backend = backend
        self.toolbox = as_toolbox(tools)
        self._subagents = subagents_of(self.toolbox)  # tools that run episodes of their own (subagent.py)
        if self.toolbox is not None:
            parser_for(self.tpl)  # fail now (NoToolParserError, with why) rather than mid-rollout
        # each turn's completion, parsed (without tools, a template with no tool-call format reads as text)
        self._read = CompletionReader(self.tpl, plain=self.toolbox is None)
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
        self._unverified_logged = False
        #: one environment per sample (tmpl.env; rollout/envs.py): ``run`` takes tasks, ``reset`` makes the prompts
        self.env_factory = check_factory(env_factory)
        if self.env_factory is not None and self.vision is not None:
            raise ValueError("env_factory with a VisionTemplate is not supported: environments append text turns")
        self._env_schemas: dict[str, list[dict[str, Any]]] = {}  # episodes' tool schemas, one list per content

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

    def _prompts(
        self, conversations: Sequence[Sequence[Mapping[str, Any]]], setup: SetupTimes, where: str, first: int = 0
    ) -> list[Any]:
        """The prompt of each conversation, validated (``where[first + i]`` names one at fault):
        through the processor with its images, or rendered in one call and encoded in one."""
        if self.env_factory is not None:  # tasks: each sample's environment opens its own conversation
            return [None] * len(conversations)
        for i, conv in enumerate(conversations, first):
            validate_messages(conv, where=f"{where}[{i}]")
            if self.vision is None:
                _images.refuse_images(conv, where=f"{where}[{i}]")
        with PhaseClock(setup)("tokenize"):
            if self.vision is not None:  # through the processor, each with its images
                return [_images.prompt_ids(self.vision, conv, self.tool_schemas) for conv in conversations]
            texts = self.tpl.render_many(conversations, tools=self.tool_schemas, add_generation_prompt=True)
            return self.tpl.codec.encode_shared(texts)

    async def _run_all(self, conversations: Sequence[Sequence[Mapping[str, Any]]]) -> list[RolloutResult]:
        start = time.perf_counter()
        setup = SetupTimes()
        prompts = self._prompts(conversations, setup, "conversations")
        scheduler = self._scheduler()
        rounds = self._tool_rounds()
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

    def _scheduler(self) -> Scheduler:
        """The batching scheduler of one run or stream."""
        return Scheduler(self.backend, max_batch=self.max_batch, max_concurrency=self.max_concurrency)

    def _tool_rounds(self) -> ToolRounds | None:
        """The tool rounds of one run or stream (None without tools): with their suffixes in append mode;
        in template mode each turn's prompt is rendered instead."""
        if self.toolbox is None:
            return None
        return ToolRounds(self.tpl, self.toolbox, self.tool_schemas, self.vision, suffixes=not self._rendered)

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

    # -- streaming (stream.py) ----------------------------------------------------------------
    def stream(
        self,
        prompts: Iterable[Sequence[Mapping[str, Any]]] | Any,
        *,
        max_in_flight: int | None = None,
    ) -> AsyncGenerator[list[RolloutResult], None]:
        """Yield finished groups (the ``sampling.n`` samples of one prompt) in the order they finish.

        ``prompts``: an iterable (or async iterable) of conversations, or an ``asyncio.Queue`` of
        them ended by ``None``. At most ``max_in_flight`` samples (default ``max_concurrency``) run
        at once; the caller may :meth:`update_weights` between groups. See
        :func:`tmpl.rollout.stream.stream_groups`.

        >>> async for group in rollout.stream(prompts, max_in_flight=64):   # doctest: +SKIP
        ...     train([group])
        """
        return stream_groups(self, prompts, max_in_flight=max_in_flight)

    def stream_sync(
        self, prompts: Iterable[Sequence[Mapping[str, Any]]], *, max_in_flight: int | None = None
    ) -> Iterator[list[RolloutResult]]:
        """:meth:`stream` for synchronous code: generation runs on an event loop in a thread of its own,
        so it goes on while the caller trains; :meth:`update_weights` from the caller's thread reaches it.

        >>> for group in rollout.stream_sync(prompts, max_in_flight=64):   # doctest: +SKIP
        ...     train([group]); rollout.update_weights(step, apply="/ckpt/step")
        """
        return stream_groups_in_thread(self, prompts, max_in_flight=max_in_flight)

    # -- one sample -----------------------------------------------------------------------
    async def _sample(
        self,
        i: int,
        s: int,
        conversation: Sequence[Mapping[str, Any]],
        prompt: list[int],
        scheduler: Scheduler,
        traj: Trajectory | None = None,
        attempt: int = 0,
        rounds: ToolRounds | None = None,
    ) -> RolloutResult:
        if self.env_factory is not None:  # its own environment, made, reset and closed around the turns
            return await run_episode(self, i, s, conversation, scheduler, attempt)
        return await self._sample_run(i, s, conversation, prompt, scheduler, traj, attempt, rounds)

    async def _sample_run(
        self,
        i: int,
        s: int,
        conversation: Sequence[Mapping[str, Any]],
        prompt: list[int],
        scheduler: Scheduler,
        traj: Trajectory | None = None,
        attempt: int = 0,
        rounds: ToolRounds | None = None,
        env: EpisodeEnv | None = None,
    ) -> RolloutResult:
        if traj is None or self._rendered:  # rendered: the last trajectory may be a branch's
            traj = self._trajectory(i, s, prompt)
        else:
            traj.reset()  # a retry starts clean: no stale ids, mask, logprobs or spans
        run = SampleRun(i, s, traj, [dict(m) for m in conversation], list(prompt), env=env)
        if self._rendered:
            run.episode = Episode(max_length=self.max_length, sample_id=(i, s))
            run.view = [dict(m) for m in conversation]
            run.gaps[self.tpl.codec.decode(list(prompt))] = list(prompt)  # the first prompt comes back as sent
        if self.vision is not None:
            run.images = _images.images_of(traj)
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
                return run.result(dropped=True)
            turns.result()  # a crash inside the turns raises here
        except Exception:
            if run.rid is not None:  # crashed: the backend may still hold its last request
                await scheduler.cancel(run.rid)
            raise
        if run.code is not None and run.code.status is Status.ABORTED and run.rid is not None:
            await scheduler.cancel(run.rid)  # an aborted sample: the backend drops what it holds of it
        if run.code is None:  # pragma: no cover - every turn that stops sets a code
            run.end(EndCode.FINISHED)
        if env is not None:  # closed before the trajectory ends: a close that raises names the sample's end
            await finish_episode(run)
        drift, detail = self._measure_drift(run)
        result = run.result(drift=drift, drift_detail=detail)
        return result if env is None else with_env(result, env)

    async def _turns(
        self, run: SampleRun, sampling: Sampling, scheduler: Scheduler, attempt: int, rounds: ToolRounds | None
    ) -> None:
        for turn in range(self.max_turns):
            if not await self._turn(run, turn, sampling, scheduler, attempt, rounds):
                return

    async def _generate(
        self, run: SampleRun, rid: str, budget: int, sampling: Sampling, scheduler: Scheduler
    ) -> tuple[GenerationResult, array[int]]:
        """One turn's generation and the version of each of its tokens.

        A request that an abort-mode weight update stopped is continued from its own tokens (the
        prompt plus what it sampled so far, never re-rendered) under the new weights; the pieces
        come back as one result, as if the turn had never been interrupted.
        """
        ids: list[int] = []
        lps: list[float] = []
        versions: array[int] = array("i")
        request_id = rid
        asked = run.routed if self.routes else None  # routing replay: the first position not yet routed
        run.route_pieces = []
        while True:
            if self._gate is not None:  # a weight update holds new requests back
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
                    images=run.images,
                    image_sources=None if run.images is None else _images.sources(run),
                    routes_from=asked,
                )
            )
            if asked is not None:  # checked and joined by the turn (routes.stitch)
                sent = len(run.sequence) + len(ids)
                run.route_pieces.append(
                    RoutePiece(asked, sent, len(result.token_ids), result.routes, result.routes_start)
                )
                if result.routes is not None:
                    asked = result.routes_start + len(result.routes)
            ceiling = self._label_check()
            own = token_versions(result, submitted, ceiling)
            if ceiling is not None and own and own[-1] > ceiling:
                self._label_warned = True
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
                versions=(versions + own).tolist(),
            )
            return merged, versions + own

    async def _turn(
        self,
        run: SampleRun,
        turn: int,
        sampling: Sampling,
        scheduler: Scheduler,
        attempt: int,
        rounds: ToolRounds | None = None,
    ) -> bool:
        """One generation and, when it called tools, one tool round. False once the sample ended."""
        if self._rendered and turn > 0 and not self._next_prompt(run, turn):
            return False
        traj = run.traj
        budget = traj.max_new_tokens(self.max_tokens_per_turn)
        if budget <= 0:
            return run.end(EndCode.NO_BUDGET, "no token budget left for another turn")
        rid = request_prefix() + f"{run.index}-{run.sample}-{turn}" + (f"-r{attempt}" if attempt else "")
        result, versions = await self._generate(run, rid, budget, sampling, scheduler)
        run.turns += 1
        run.finish = result.finish_reason
        if result.finish_reason == "error":
            return run.end(EndCode.GENERATION_FAILED, f"generation failed: {result.error}")
        if result.finish_reason == "abort":
            return run.end(EndCode.BACKEND_ABORTED, "the backend aborted the request")
        routes = self._turn_routes(run) if self.routes else None
        if routes is False:
            return False
        with run.clock("bookkeeping"):
            ids = result.token_ids
            sent = len(run.sequence)
            kept = traj.add_completion(ids, result.logprobs, message=len(run.history))
            whole = kept == len(ids)  # most turns: no copy of the slice
            run.sequence += ids if whole else ids[:kept]
            run.versions += versions if whole else versions[:kept]
            if routes is not None:  # the positions kept (a completion cut at the budget takes its routes along)
                start = routes[1]
                cut = routes[0][: max(0, traj.length - start)]
                traj.add_routes(start, cut)
                run.routed = start + len(cut)
        call = self._call(run, turn, sent, kept, result) if self._rendered and kept else None
        if not traj.running:  # cut at the budget, or no usable logprobs
            if call is not None:
                self._add_call(run, call, None)
            return run.end(EndCode.BUDGET_CUT if traj.status is Status.TRUNCATED else EndCode.NO_LOGPROBS)
        tools: Any = self.toolbox if run.env is None else schemas_of(self, run.env)  # an episode's own tools
        with run.clock("parse"):
            if len(result.token_ids) > PARSE_OFF_LOOP:  # a long parse waits on a thread, the loop serves the others
                parsed = await asyncio.to_thread(self._read, result.token_ids, tools=tools)
            else:  # most turns: a thread hop would cost more than the parse
                parsed = self._read(result.token_ids, tools=tools)
        assistant = parsed.to_message()
        if call is not None:
            self._add_call(run, call, assistant)
        run.history.append(assistant)
        if result.finish_reason == "length" or kept < len(result.token_ids):
            return run.end(EndCode.TURN_LIMIT, f"turn {turn} hit its token limit ({budget}) before a stop token")
        if run.env is not None:  # the environment answers every assistant turn (rollout/envs.py)
            return await env_turn(self, run, turn, assistant, result.token_ids)
        if not parsed.has_calls or self.toolbox is None:
            if self.edit_history is not None and turn < self.max_turns - 1:
                go = await self._edit(run, turn, answered=True)  # a simulated user may go on
                if go is not None:
                    return go
            return run.end(EndCode.FINISHED)
        if turn == self.max_turns - 1:
            return run.end(EndCode.MAX_TURNS, f"reached max_turns={self.max_turns} with tool calls pending")
        return await self._tool_round(run, parsed, assistant, result.token_ids, scheduler, rounds)

    def _turn_routes(self, run: SampleRun) -> Any:
        """This turn's routes, checked against its tokens and the sample's earlier routes: ``(routes, start)``;
        False when they cannot be aligned (the sample ended ``EndCode.BAD_ROUTES``, nothing of them kept)."""
        held = run.traj.routes
        shape = None if held is None else (int(held.shape[1]), int(held.shape[2]))
        try:
            return stitch(run.route_pieces, sample=f"{run.index}/{run.sample}", shape=shape)
        except RoutesError as exc:
            return run.end(EndCode.BAD_ROUTES, exc.reason)

    def _crashed(
        self,
        i: int,
        s: int,
        conversation: Sequence[Mapping[str, Any]],
        prompt: list[int],
        traj: Trajectory | None,
        exc: Exception,
    ) -> RolloutResult:
        """An unexpected error in one sample: the sample is ABORTED with the error as its reason."""
        if traj is None:
            traj = self._trajectory(i, s, prompt)
        if not traj.status.final:
            traj.abort(f"unexpected error in the rollout: {type(exc).__name__}: {exc}")
        return RolloutResult.crashed(i, s, traj, conversation)

    def _bar(self, total: int) -> Any:
        show = self.progress if self.progress is not None else sys.stderr.isatty()
        if not show:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=total, desc="rollout", unit="sample", file=sys.stderr)
