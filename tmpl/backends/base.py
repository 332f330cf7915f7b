"""The backend interface: token IDs in; token IDs, sampled-token logprobs and a finish reason out.

A backend never sees text. The rollout loop (:mod:`tmpl.rollout`) sends one
:class:`GenerationRequest` per running sample and gets one :class:`GenerationResult` back.
Backends implement :meth:`Backend.generate_batch` (synchronous, many requests at once:
torch, the offline vLLM engine) or :meth:`Backend.agenerate` (asynchronous, one request,
as they come: vLLM servers); :class:`Backend` derives whichever is missing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..errors import BackendError

__all__ = ["Backend", "BackendError", "GenerationRequest", "GenerationResult", "Sampling"]

FinishReason = Literal["stop", "length", "abort", "error"]
LogprobsMode = Literal["raw", "processed"]


@dataclass(frozen=True)
class Sampling:
    """Sampling settings shared by all backends.

    ``n`` samples per conversation are drawn by the rollout (each is its own sample).
    ``logprobs`` chooses what the returned logprobs are: ``"raw"`` (log-softmax of the
    model's logits) or ``"processed"`` (after temperature, top-k and top-p), the two modes
    vLLM offers (``logprobs_mode="raw_logprobs" | "processed_logprobs"``).

    >>> Sampling(temperature=0.7, n=4).greedy
    False
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k
    n: int = 1
    seed: int | None = None
    logprobs: LogprobsMode = "raw"

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.logprobs not in ("raw", "processed"):
            raise ValueError(f"logprobs must be 'raw' or 'processed', got {self.logprobs!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class GenerationRequest:
    """One generation for one sample: continue ``prompt_ids`` for at most ``max_tokens``."""

    request_id: str
    prompt_ids: Sequence[int]
    max_tokens: int
    stop_token_ids: frozenset[int]
    sampling: Sampling = field(default_factory=Sampling)


@dataclass
class GenerationResult:
    """What a backend returns for one request.

    ``token_ids`` end with the stop token when ``finish_reason == "stop"``. ``logprobs`` has
    one entry per token (the sampled token's logprob) or is None when the backend gave none.
    """

    request_id: str
    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: FinishReason
    logprobs_mode: LogprobsMode = "raw"
    error: str | None = None

    @classmethod
    def failed(cls, request_id: str, error: str) -> GenerationResult:
        return cls(request_id, [], None, "error", error=error)


class Backend:
    """Base class. Subclasses override :meth:`generate_batch`, :meth:`agenerate`, or both.

    ``batching`` tells the rollout whether to gather requests into batches (True for
    engines that generate a batch at a time) or to send each as soon as it is ready;
    ``threaded`` whether a batch runs in a worker thread.
    """

    batching: bool = True
    #: run ``generate_batch`` in a worker thread (engines that release the GIL while they
    #: compute); False runs it on the event loop (cheap pure-Python backends)
    threaded: bool = True

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Generate for many requests; one result per request, in order."""
        if type(self).agenerate is Backend.agenerate:
            raise NotImplementedError(f"{type(self).__name__} implements neither generate_batch nor agenerate")

        async def run() -> list[GenerationResult]:
            return list(await asyncio.gather(*(self.agenerate(r) for r in requests)))

        return asyncio.run(run())

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        """Generate for one request (default: a batch of one in a worker thread)."""
        results = await asyncio.to_thread(self.generate_batch, [request])
        return results[0]

    async def cancel(self, request_id: str) -> None:  # noqa: B027 - optional hook
        """Cancel an in-flight request (servers); a no-op for local engines."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (connections, threads)."""
