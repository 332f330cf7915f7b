"""``tmpl.backends.Scripted``: replays completions from a function (tests, benchmarks, dry runs).

>>> def policy(request):                        # doctest: +SKIP
...     return tok.encode("<tool_call>...</tool_call><|im_end|>")
>>> backend = Scripted(policy)                  # doctest: +SKIP

The function gets each :class:`~tmpl.backends.base.GenerationRequest` and returns token IDs,
``(token_ids, logprobs)``, or a full :class:`GenerationResult`. Token IDs are cut at the first
stop token and at ``max_tokens`` exactly as an engine would; logprobs default to
``logprob`` for every token.

Streamed (:meth:`Scripted.astream`), a completion comes in ``pieces`` pieces; ``pace`` (an async
function of the request and the piece's index) is awaited before each piece, so a test can hold a
stream before its first token (a long prefill) or mid-way (a slow engine) and release it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from .base import Backend, GenerationRequest, GenerationResult, StreamDelta


class Scripted(Backend):
    batching = True
    threaded = False  # replaying is instant: a worker thread would only add GIL hand-offs

    def __init__(
        self,
        policy: Callable[[GenerationRequest], Any],
        *,
        logprob: float = -0.25,
        record: bool = True,
        pieces: int = 3,
        pace: Callable[[GenerationRequest, int], Awaitable[None]] | None = None,
    ) -> None:
        if pieces < 1:
            raise ValueError(f"pieces must be at least 1, got {pieces}")
        self.policy = policy
        #: how many pieces a streamed completion comes in, and what is awaited before each
        self.pieces = pieces
        self.pace = pace
        self.logprob = logprob
        #: every request seen, for inspection (``record=False`` keeps none: long benchmark runs,
        #: where every prompt of every turn would otherwise stay in memory)
        self.requests: list[GenerationRequest] = []
        self.record = record

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        return [self._one(r) for r in requests]

    async def astream(self, request: GenerationRequest) -> AsyncIterator[StreamDelta]:
        """The scripted completion in ``pieces`` pieces (``pace`` awaited before each), the last carrying
        the whole result.

        >>> async for piece in Scripted(lambda r: [1, 2, 3, 0], pieces=2).astream(request):  # doctest: +SKIP
        ...     piece.token_ids
        [1, 2]
        [3, 0]
        """
        result = self._one(request)
        ids, lps = result.token_ids, result.logprobs
        n = len(ids)
        bounds = sorted({round(n * k / self.pieces) for k in range(self.pieces + 1)})
        for k, (a, b) in enumerate(zip(bounds, bounds[1:] or [n])):
            await (self.pace(request, k) if self.pace is not None else asyncio.sleep(0))
            last = b >= n
            yield StreamDelta(list(ids[a:b]), None if lps is None else list(lps[a:b]), result if last else None)

    def _one(self, req: GenerationRequest) -> GenerationResult:
        if self.record:
            self.requests.append(req)
        out = self.policy(req)
        if isinstance(out, GenerationResult):
            return out
        ids, lps = out if isinstance(out, tuple) else (out, None)
        ids = list(ids)
        lps = list(lps) if lps is not None else [self.logprob] * len(ids)
        end, reason = min(len(ids), req.max_tokens), "length"
        for t in range(end):
            if ids[t] in req.stop_token_ids:
                end, reason = t + 1, "stop"
                break
        if reason == "length" and end == len(ids) and ids and len(ids) <= req.max_tokens:
            reason = "stop" if ids[-1] in req.stop_token_ids else "length"
        return GenerationResult(req.request_id, ids[:end], lps[:end], reason, req.sampling.logprobs)
