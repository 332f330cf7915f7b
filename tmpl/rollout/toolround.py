"""Tool rounds of many samples as one batch: one Toolbox run and one suffix call per pass of the loop.

Samples of a rollout reach their tool rounds together: a batch of generations comes back at
once and every sample of it parses its completion in the same pass of the event loop. Each
sample hands its parsed completion to :meth:`ToolRounds.run`; one pass later the round runs for
all of them: one :meth:`Toolbox.run_batch_async` over every call, then one
:meth:`ChatTemplate.suffix_ids_batch` (one tokenizer call for every tool result). What each
sample gets back is exactly what its own ``run_batch_async([parsed])`` and ``suffix_ids`` would
give; a suffix that fails is retried alone, so one sample's error stays its own.

>>> rounds = ToolRounds(tpl, toolbox, schemas)                            # doctest: +SKIP
>>> done = await rounds.run(parsed, completion_ids, history_before)       # doctest: +SKIP
>>> done.messages, done.suffix, done.error                                # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..chat_template import ChatTemplate
    from ..toolcalls import Toolbox


@dataclass
class RoundResult:
    """One sample's tool round: its tool messages, counts, the suffix IDs (or the error building it).

    ``tool_seconds`` / ``suffix_seconds`` are this sample's share of the batch's time (the batch
    time divided by its samples), so per-sample phase times add up to the rollout's.
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


class ToolRounds:
    """Gathers the tool rounds that samples start in the same pass of the event loop into one batch."""

    def __init__(self, template: ChatTemplate, toolbox: Toolbox, schemas: Sequence[Any] | None) -> None:
        self.tpl = template
        self.toolbox = toolbox
        self.schemas = schemas
        self.batches = 0
        self._pending: list[tuple[Any, list[int], list[dict[str, Any]], asyncio.Future[RoundResult]]] = []

    async def run(self, parsed: Any, completion: list[int], before: list[dict[str, Any]]) -> RoundResult:
        """Run the calls of ``parsed`` and build the suffix after ``completion`` (``before``: the history)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[RoundResult] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((parsed, completion, before, future))
        return await future

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        if batch:
            asyncio.get_running_loop().create_task(self._round(batch))

    async def _round(self, batch: list[tuple[Any, list[int], list[dict[str, Any]], asyncio.Future[RoundResult]]]) -> None:
        self.batches += 1
        n = len(batch)
        try:
            start = perf_counter()
            tools = await self.toolbox.run_batch_async([parsed for parsed, _, _, _ in batch])
            tool_seconds = (perf_counter() - start) / n
            start = perf_counter()
            suffixes = self._suffixes(tools.messages, [c for _, c, _, _ in batch], [h for _, _, h, _ in batch])
            suffix_seconds = (perf_counter() - start) / n
        except Exception as exc:  # noqa: BLE001 - the whole round failed: every sample gets the error
            for *_, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for b, (*_, future) in enumerate(batch):
            outcomes = tools.outcomes[b]
            failures: dict[str, int] = {}
            for o in outcomes:
                if o.error is not None:
                    failures[o.error] = failures.get(o.error, 0) + 1
            suffix, error = suffixes[b]
            result = RoundResult(
                messages=tools.messages[b],
                calls=len(outcomes),
                failed=sum(failures.values()),
                failures=failures,
                stop=tools.stop[b],
                suffix=suffix,
                error=error,
                tool_seconds=tool_seconds,
                suffix_seconds=suffix_seconds,
            )
            if not future.done():
                future.set_result(result)

    def _suffixes(
        self,
        messages: list[list[dict[str, Any]]],
        completions: list[list[int]],
        histories: list[list[dict[str, Any]]],
    ) -> list[tuple[list[int] | None, Exception | None]]:
        """Every sample's suffix in one call; when that fails, each alone (so an error is its sample's only)."""
        try:
            out = self.tpl.suffix_ids_batch(messages, completion_ids=completions, tools=self.schemas, histories=histories)
            return [(ids, None) for ids in out]
        except Exception:  # noqa: BLE001 - found again below, sample by sample
            pass
        results: list[tuple[list[int] | None, Exception | None]] = []
        for msgs, completion, history in zip(messages, completions, histories):
            try:
                ids = self.tpl.suffix_ids(msgs, completion_ids=completion, tools=self.schemas, history=history)
                results.append((ids, None))
            except Exception as exc:  # noqa: BLE001 - handed to the sample, which ends or crashes with it
                results.append((None, exc))
        return results
