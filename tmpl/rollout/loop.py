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
from typing import Any

import numpy as np

from .. import _compat
from ..backends.base import Backend, GenerationRequest, Sampling
from ..chat_template import ChatTemplate
from ..errors import TmplError
from ..messages import validate_messages
from .metrics import RolloutMetrics, SampleTimes
from .scheduler import Scheduler
from ..toolcalls.api import parse_completion, parser_for
from ..trajectory.types import Span, Status


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
    trajectory: Any = field(repr=False)
    messages: list[dict[str, Any]]
    turns: int
    tool_calls: int
    tool_failures: int
    finish_reason: str  # the last generation's: stop / length / abort / error
    drift: bool | None = None  # would re-rendering the text have changed the IDs? (None: not measured)
    times: SampleTimes = field(default_factory=SampleTimes, repr=False)
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
            "status": self.status.name, "reason": self.reason, "turns": self.turns, "attempts": self.attempts,
            "tool_calls": self.tool_calls, "tool_failures": self.tool_failures,
            "tokens_generated": generated, "tokens_appended": len(self.mask) - generated,
            "drift": self.drift, "finish_reason": self.finish_reason,
            **{f"seconds/{k}": v for k, v in dataclasses.asdict(self.times).items()},
        }


class Rollout:
    """Run conversations turn after turn until the model stops calling tools.

    ``tools``: a :class:`tmpl.Toolbox`, a list of callables (wrapped in one), or None.
    ``max_turns``: generations per sample (a sample still calling tools after the last one is
    TRUNCATED). ``max_length`` / ``max_completion_length``: token budgets of each sample (see
    :class:`tmpl.Trajectory`). ``max_tokens_per_turn``: cap of one generation (default: what the
    budget leaves). ``measure_drift``: re-render each finished sample once, to count samples
    whose IDs re-rendering would have changed. ``verify_every``: check every k-th suffix against
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
        measure_drift: bool = True,
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
        self.measure_drift = measure_drift
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
        start = time.perf_counter()
        for i, conv in enumerate(conversations):
            validate_messages(conv, where=f"conversations[{i}]")
        t0 = time.perf_counter()
        prompts = [self.tpl.prompt_ids(conv, tools=self.tool_schemas) for conv in conversations]
        tokenize_time = time.perf_counter() - t0
        scheduler = Scheduler(self.backend, max_batch=self.max_batch, max_concurrency=self.max_concurrency)
        jobs = [(i, s) for i in range(len(conversations)) for s in range(self.sampling.n)]
        bar = self._bar(len(jobs))
        results: list[RolloutResult] = []

        async def one(i: int, s: int) -> RolloutResult:
            scheduler.start_sample()
            try:
                traj = None
                for attempt in range(self.sample_retries + 1):
                    try:
                        result = await self._sample(i, s, conversations[i], prompts[i], scheduler, traj, attempt)
                    except Exception as exc:  # one sample's failure must not take the batch down
                        result = self._crashed(i, s, conversations[i], prompts[i], traj, exc)
                    traj = result.trajectory
                    if not result.reason.startswith(_RETRYABLE):
                        break
                result._attempts = attempt + 1
                return result
            finally:
                scheduler.end_sample()
                if bar is not None:
                    bar.update(1)

        try:
            results = list(await asyncio.gather(*(one(i, s) for i, s in jobs)))
        finally:
            if bar is not None:
                bar.close()
        self.metrics = RolloutMetrics.from_results(
            results, wall_time=time.perf_counter() - start, engine_time=scheduler.engine_time,
            batches=scheduler.batches, tokenize_time=tokenize_time,
        )
        return results

    # -- one sample -----------------------------------------------------------------------
    async def _sample(self, i: int, s: int, conversation, prompt: list[int], scheduler: Scheduler,
                      traj=None, attempt: int = 0) -> RolloutResult:
        times = SampleTimes()
        tpl = self.tpl
        if traj is None:
            traj = _compat.builder.Trajectory(prompt, self.max_length, self.max_completion_length,
                                            vocab_size=tpl.codec.vocab_size, sample_id=f"{i}/{s}")
        else:
            traj.reset()  # a retry starts clean: no stale ids, mask, logprobs or spans
        history: list[dict[str, Any]] = [dict(m) for m in conversation]
        sampling = self.sampling
        if sampling.seed is not None and sampling.n > 1:
            sampling = dataclasses.replace(sampling, seed=sampling.seed + s, n=1)
        stops = tpl.stop_token_ids
        calls = failures = turns = 0
        finish = "stop"
        sequence = list(prompt)  # the engine's next input: prompt + everything appended so far
        for turn in range(self.max_turns):
            budget = traj.max_new_tokens(self.max_tokens_per_turn)
            if budget <= 0:
                traj.truncate("no token budget left for another turn")
                break
            rid = f"{i}-{s}-{turn}" if not attempt else f"{i}-{s}-{turn}-r{attempt}"
            request = GenerationRequest(rid, list(sequence), budget, stops, sampling)
            result = await scheduler.generate(request)
            turns += 1
            finish = result.finish_reason
            if result.finish_reason == "error":
                traj.abort(f"{_RETRYABLE[0]}: {result.error}")
                break
            if result.finish_reason == "abort":
                traj.abort(_RETRYABLE[1])
                break
            t0 = time.perf_counter()
            kept = traj.add_completion(result.token_ids, result.logprobs, message=len(history))
            sequence += result.token_ids[:kept]
            times.bookkeeping += time.perf_counter() - t0
            if not traj.running:
                break
            t0 = time.perf_counter()
            parsed = parse_completion(tpl, result.token_ids, tools=self.toolbox)
            times.parse += time.perf_counter() - t0
            assistant = parsed.to_message()
            if result.finish_reason == "length" or kept < len(result.token_ids):
                history.append(assistant)
                traj.truncate(f"turn {turn} hit its token limit ({budget}) before a stop token")
                break
            if not parsed.has_calls or self.toolbox is None:
                history.append(assistant)
                traj.finish()
                break
            if turn == self.max_turns - 1:
                history.append(assistant)
                traj.truncate(f"reached max_turns={self.max_turns} with tool calls pending")
                break
            with scheduler.working():
                t0 = time.perf_counter()
                batch = await self.toolbox.run_batch_async([parsed])
                times.tools += time.perf_counter() - t0
            tool_messages = batch.messages[0]
            calls += batch.metrics.calls
            failures += batch.metrics.failed
            t0 = time.perf_counter()
            try:
                suffix = tpl.suffix_ids(tool_messages, completion_ids=result.token_ids, tools=self.tool_schemas,
                                        history=history)
            except TmplError as exc:
                history += [assistant] + tool_messages
                traj.abort(f"cannot build the tool suffix: {exc}")
                break
            verified = not self.verify_every or self._verify(history, assistant, tool_messages, suffix)
            times.suffix += time.perf_counter() - t0
            if not verified:
                history += [assistant] + tool_messages
                traj.abort("suffix verification against a full render failed")
                break
            message_index = len(history) + 1
            history += [assistant] + tool_messages
            sequence += suffix[: traj.add_suffix(suffix, message=message_index)]
            if batch.stop[0]:
                traj.truncate("a tool failed and on_error='stop'")
                break
            if not traj.running:
                break
        else:  # pragma: no cover - every path above breaks out
            traj.finish()
        drift = None
        if self.measure_drift:
            t0 = time.perf_counter()
            drift = self._drift(history, traj)
            times.drift += time.perf_counter() - t0
        return RolloutResult(i, s, traj, history, turns, calls, failures, finish, drift, times)

    def _crashed(self, i, s, conversation, prompt, traj, exc: Exception) -> RolloutResult:
        """An unexpected error in one sample: the sample is ABORTED with the error as its reason."""
        if traj is None:
            traj = _compat.builder.Trajectory(prompt, self.max_length, self.max_completion_length,
                                            vocab_size=self.tpl.codec.vocab_size, sample_id=f"{i}/{s}")
        traj.abort(f"unexpected error in the rollout: {type(exc).__name__}: {exc}")
        return RolloutResult(i, s, traj, [dict(m) for m in conversation], 0, 0, 0, "error")

    # -- checks -----------------------------------------------------------------------------
    def _drift(self, history: list[dict[str, Any]], traj) -> bool | None:
        """Would decoding and re-rendering this sample have changed its token IDs?"""
        ours = traj.prompt_ids.tolist() + traj.completion_ids.tolist()
        try:
            gen = history[-1]["role"] != "assistant"
            text = self.tpl.renderer.text(history, tools=self.tool_schemas, add_generation_prompt=gen)
        except TmplError:
            return None
        return self.tpl.codec.encode(text)[: len(ours)] != ours

    def _verify(self, history, assistant, tool_messages, suffix: list[int]) -> bool:
        self._suffix_count += 1
        if self._suffix_count % self.verify_every:
            return True
        try:
            text = self.tpl.renderer.text(history + [assistant] + tool_messages, tools=self.tool_schemas,
                                          add_generation_prompt=True)
        except TmplError:
            return True  # the template cannot render it: nothing to compare with
        full = self.tpl.codec.encode(text)
        n = len(suffix)
        return full[len(full) - n :] == suffix and n < len(full) and full[len(full) - n - 1] in self.tpl.stop_token_ids

    def _bar(self, total: int):
        show = self.progress if self.progress is not None else sys.stderr.isatty()
        if not show:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=total, desc="rollout", unit="sample", file=sys.stderr)


#: abort reasons after which a sample may be retried (``sample_retries``)
_RETRYABLE = ("generation failed", "the backend aborted the request")


def _toolbox(tools: Any):
    if tools is None:
        return None
    from ..toolcalls import Toolbox

    if isinstance(tools, Toolbox):
        return tools
    return Toolbox(list(tools))
