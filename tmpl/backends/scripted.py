"""``tmpl.backends.Scripted``: replays completions from a function (tests, benchmarks, dry runs).

>>> def policy(request):                        # doctest: +SKIP
...     return tok.encode("<tool_call>...</tool_call><|im_end|>")
>>> backend = Scripted(policy)                  # doctest: +SKIP

The function gets each :class:`~tmpl.backends.base.GenerationRequest` and returns token IDs,
``(token_ids, logprobs)``, or a full :class:`GenerationResult`. Token IDs are cut at the first
stop token and at ``max_tokens`` exactly as an engine would; logprobs default to
``logprob`` for every token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .base import Backend, GenerationRequest, GenerationResult


class Scripted(Backend):
    batching = True
    threaded = False  # replaying is instant: a worker thread would only add GIL hand-offs

    def __init__(
        self, policy: Callable[[GenerationRequest], Any], *, logprob: float = -0.25, record: bool = True
    ) -> None:
        self.policy = policy
        self.logprob = logprob
        #: every request seen, for inspection (``record=False`` keeps none: long benchmark runs,
        #: where every prompt of every turn would otherwise stay in memory)
        self.requests: list[GenerationRequest] = []
        self.record = record

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        return [self._one(r) for r in requests]

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
