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
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _compat
from ..backends.base import Backend, GenerationRequest, Sampling
from ..chat_template import ChatTemplate
from ..errors import TmplError
from ..messages import validate_messages
from ..toolcalls.api import parse_completion, parser_for
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
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
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

        async def one(i: int, s: int) -> RolloutResult:
            scheduler.start_sample()
            try:
                traj = None
                for attempt in range(self.sample_retries + 1):
                    try:
                        result = await self._sample(
                            i, s, conversations[i], prompts[i], scheduler, traj, attempt, rounds
                        )
                    except Exception as exc:  # noqa: BLE001 - one sample's failure must not take the batch down
                        result = self._crashed(i, s, conversations[i], prompts[i], traj, exc)
                    traj = result.trajectory
                    if result.code is None or not result.code.retryable:
                        break
                result._attempts = attempt + 1
                return result
            finally:
                scheduler.end_sample()
                if bar is not None:
                    bar.update(1)

        tasks = [asyncio.ensure_future(one(i, s)) for i, s in jobs]
        try:
            results = list(await asyncio.gather(*tasks))
        except asyncio.CancelledError:
            # the run was cancelled (gather cancelled every sample) and gather returned at the first
            # one done: wait for the others to tell the backend about their requests (Backend.cancel)
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            if bar is not None:
                bar.close()
        self.metrics = RolloutMetrics.from_results(
            results,
            wall_time=time.perf_counter() - start,
            engine_time=scheduler.engine_time,
            batches=scheduler.batches,
            tokenize_time=setup.tokenize,
        )
        return results

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
        try:
            for turn in range(self.max_turns):
                if not await self._turn(run, turn, sampling, scheduler, attempt, rounds):
                    break
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
        )

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
        run.rid = rid
        result = await scheduler.generate(
            GenerationRequest(rid, list(run.sequence), budget, tpl.stop_token_ids, sampling)
        )
        run.turns += 1
        run.finish = result.finish_reason
        if result.finish_reason == "error":
            return run.end(EndCode.GENERATION_FAILED, f"generation failed: {result.error}")
        if result.finish_reason == "abort":
            return run.end(EndCode.BACKEND_ABORTED, "the backend aborted the request")
        with run.clock("bookkeeping"):
            kept = traj.add_completion(result.token_ids, result.logprobs, message=len(run.history))
            run.sequence += result.token_ids[:kept]
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
            run.sequence += suffix[: run.traj.add_suffix(suffix, message=message_index)]
        if done.stop:
            return run.end(EndCode.TOOL_STOP, "a tool failed and on_error='stop'")
        if not run.traj.running:
            return run.end(EndCode.BUDGET_CUT)
        return True

    def _trajectory(self, i: int, s: int, prompt: list[int]) -> Any:
        return _compat.builder.Trajectory(
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


def _toolbox(tools: Any) -> Toolbox | None:
    if tools is None:
        return None
    from ..toolcalls import Toolbox

    if isinstance(tools, Toolbox):
        return tools
    return Toolbox(list(tools))
