"""Tool rounds of many samples in batches: calls started together, suffixes built together.

Samples of a rollout reach their tool rounds together: a batch of generations comes back at
once and every sample of it parses its completion in the same pass of the event loop. Each
sample hands its parsed completion to :meth:`ToolRounds.run`; one pass later the calls of all
of them start as one Toolbox batch (:meth:`Toolbox.start_batch`). A sample goes on as soon as
its own calls are answered (a slow tool holds back only its sample); the samples whose calls
are answered in the same pass get their suffixes from one :meth:`ChatTemplate.suffix_ids_batch`
(one tokenizer call for all their tool results). What each sample gets is exactly what its own
``run_batch_async([parsed])`` and ``suffix_ids`` would give; when a batched suffix fails, each
is built alone, so one sample's error stays its own.

Given the sample's remaining token budget (``budget``), a tool result longer than it could ever
hold is cut before the suffix is built (:func:`tmpl.tools.outputs.cut_to_tokens`: on
characters first, then exactly in tokens, with a marker the model sees), so no sample tokenizes
megabytes to keep kilobytes; a result that may need the cut is cut on a worker thread (the
tokenizer releases the GIL), so the event loop serves the other samples meanwhile. The count of
cut results is ``RoundResult.outputs_cut`` (and ``failures["output_cut"]``, which is not a
failure: ``failed`` leaves it out).

>>> rounds = ToolRounds(tpl, toolbox, schemas)                            # doctest: +SKIP
>>> done = await rounds.run(parsed, completion_ids, history_before)       # doctest: +SKIP
>>> done.messages, done.suffix, done.error                                # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any

from ..tools.outputs import body, cut_to_tokens
from . import images
from .suffixes import suffixes_of

if TYPE_CHECKING:
    from ..chat_template import ChatTemplate
    from ..toolcalls.types import ParsedCompletion
    from ..tools import Toolbox
    from ..tools.metrics import CallOutcome


@dataclass
class RoundResult:
    """One sample's tool round: its tool messages, counts, the suffix IDs (or the error building it).

    ``tool_seconds`` is this sample's wait for its calls divided by the samples whose calls
    started with its own, ``suffix_seconds`` the suffix batch's time divided by its samples: so
    the phase times summed over samples are the rollout's time in those phases, not that time
    counted once per waiting sample.
    """

    messages: list[dict[str, Any]]
    calls: int
    failed: int
    failures: dict[str, int]
    stop: bool
    suffix: list[int] | None = None
    error: Exception | None = None
    tool_seconds: float = 0.0
    suffix_seconds: float = 0.0
    outputs_cut: int = 0


class _Job:
    """One sample's tool round while it runs."""

    __slots__ = ("parsed", "completion", "before", "future", "started", "outcomes", "waited", "budget", "cut")

    def __init__(
        self,
        parsed: ParsedCompletion,
        completion: list[int],
        before: list[dict[str, Any]],
        future: asyncio.Future[RoundResult],
        budget: int | None,
    ) -> None:
        self.parsed, self.completion, self.before, self.future = parsed, completion, before, future
        self.budget = budget
        self.cut: int | None = None  # results cut to the budget, once :meth:`ToolRounds._bound` ran
        self.started = 0.0
        self.outcomes: list[CallOutcome] = []
        self.waited = 0.0  # seconds from the start of the calls until all of this sample's were answered


class ToolRounds:
    """Starts the tool rounds begun in one pass of the event loop as one batch; builds suffixes in batches."""

    def __init__(
        self,
        template: ChatTemplate,
        toolbox: Toolbox,
        schemas: Sequence[Any] | None,
        vision: Any = None,
        *,
        suffixes: bool = True,
    ) -> None:
        self.tpl = template
        #: False: no suffix is built (``history="template"`` renders the next prompt from the messages)
        self.want_suffixes = suffixes
        self.vision = vision  # a VisionTemplate: tools may return images (rollout/images.py)
        self.toolbox = toolbox
        self.schemas = schemas
        self.batches = 0  # Toolbox batches started
        self.suffix_batches = 0  # suffix_ids_batch calls
        self._to_start: list[_Job] = []
        self._to_suffix: list[_Job] = []

    async def run(
        self, parsed: ParsedCompletion, completion: list[int], before: list[dict[str, Any]], budget: int | None = None
    ) -> RoundResult:
        """Run the calls of ``parsed`` and build the suffix after ``completion`` (``before``: the history).

        ``budget``: tokens the sample may still append (None: no cut beyond the Toolbox's own).
        """
        loop = asyncio.get_running_loop()
        job = _Job(parsed, completion, before, loop.create_future(), budget)
        if not self._to_start:
            loop.call_soon(self._start)
        self._to_start.append(job)
        result: RoundResult = await job.future
        return result

    def _start(self) -> None:
        jobs, self._to_start = self._to_start, []
        self.batches += 1
        started = perf_counter()
        for job in jobs:
            job.started = started
        try:
            self.toolbox.start_batch([job.parsed for job in jobs], lambda i, done: self._answered(jobs[i], done))
        except Exception as exc:  # noqa: BLE001 - the batch could not start: every sample gets the error
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(exc)

    def _answered(self, job: _Job, future: asyncio.Future[list[CallOutcome]]) -> None:
        job.waited = perf_counter() - job.started
        exc = future.exception()
        if exc is not None:
            job.future.set_exception(exc)
            return
        job.outcomes = future.result()
        budget = job.budget
        if budget is not None and any(len(o.content) * 4 > budget for o in job.outcomes):
            # a result that may not fit: cut it on a worker thread (the tokenizer lets go of the GIL),
            # so the loop keeps serving the other samples meanwhile
            cutting = asyncio.get_running_loop().run_in_executor(None, self._bound, job)
            cutting.add_done_callback(functools.partial(self._bounded, job))
            return
        self._queue_suffix(job)

    def _bounded(self, job: _Job, cutting: asyncio.Future[int]) -> None:
        exc = cutting.exception()
        if exc is not None:
            job.future.set_exception(exc)
            return
        self._queue_suffix(job)

    def _queue_suffix(self, job: _Job) -> None:
        if not self._to_suffix:
            asyncio.get_running_loop().call_soon(self._suffix)
        self._to_suffix.append(job)

    def _suffix(self) -> None:
        jobs, self._to_suffix = self._to_suffix, []
        self.suffix_batches += 1
        n = len(jobs)
        cuts = [job.cut if job.cut is not None else self._bound(job) for job in jobs]
        messages = [[o.message() for o in job.outcomes] for job in jobs]
        if self.vision is not None:  # tools that returned images: their results as image parts
            messages = [images.tool_messages(job.outcomes, msgs) for job, msgs in zip(jobs, messages)]
        start = perf_counter()
        if self.want_suffixes:
            suffixes = self._suffixes(messages, [job.completion for job in jobs], [job.before for job in jobs])
        else:
            suffixes = [(None, None)] * n
        suffix_seconds = (perf_counter() - start) / n
        stop_on_error = self.toolbox.on_error == "stop"
        for job, msgs, (suffix, error), cut in zip(jobs, messages, suffixes, cuts):
            failures: dict[str, int] = {}
            for o in job.outcomes:
                if o.error is not None:
                    failures[o.error] = failures.get(o.error, 0) + 1
            failed = sum(failures.values())
            if cut:
                failures["output_cut"] = cut
            result = RoundResult(
                messages=msgs,
                calls=len(job.outcomes),
                failed=failed,
                failures=failures,
                stop=stop_on_error and failed > 0,
                suffix=suffix,
                error=error,
                tool_seconds=job.waited / n,
                suffix_seconds=suffix_seconds,
                outputs_cut=cut,
            )
            if not job.future.done():
                job.future.set_result(result)

    def _bound(self, job: _Job) -> int:
        """Cut each of ``job``'s results to its budget in tokens; how many results are cut (here or before)."""
        if job.budget is not None:
            for i, o in enumerate(job.outcomes):
                cut = cut_to_tokens(self.tpl.codec, body(o.content, o.chars), job.budget, o.chars)
                if cut is not None:
                    job.outcomes[i] = dataclasses.replace(o, content=cut, chars=o.chars or len(o.content))
        job.cut = sum(1 for o in job.outcomes if o.chars is not None)
        return job.cut

    def _suffixes(
        self,
        messages: list[list[dict[str, Any]]],
        completions: list[list[int]],
        histories: list[list[dict[str, Any]]],
    ) -> list[tuple[list[int] | None, Exception | None]]:
        """Every sample's suffix in one call; when that fails, each alone (so an error is its sample's only)."""
        if self.vision is not None:
            return images.suffixes(self.vision, messages, completions, histories, self.schemas)
        return suffixes_of(self.tpl, messages, completions, histories, self.schemas)
