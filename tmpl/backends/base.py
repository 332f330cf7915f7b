"""The backend interface: token IDs in; token IDs, sampled-token logprobs and a finish reason out.

A backend never sees text. The rollout loop (:mod:`tmpl.rollout`) sends one
:class:`GenerationRequest` per running sample and gets one :class:`GenerationResult` back.
Backends implement :meth:`Backend.generate_batch` (synchronous, many requests at once:
torch, the offline vLLM engine) or :meth:`Backend.agenerate` (asynchronous, one request,
as they come: vLLM servers); :class:`Backend` derives whichever is missing.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Union

from ..errors import BackendError, TrajectoryError, WeightUpdateError

if TYPE_CHECKING:
    from ..vision import ImageInputs

__all__ = [
    "Backend",
    "BackendError",
    "GenerationRequest",
    "GenerationResult",
    "Sampling",
    "StreamDelta",
    "image_misfit",
    "version_label",
    "versions_from_spans",
]

FinishReason = Literal["stop", "length", "abort", "error"]
UpdateMode = Literal["keep", "abort", "drain"]
#: what a weight update applies: nothing (a new label only), a folder of weights, or the caller's callable
WeightSource = Union[None, str, "os.PathLike[str]", Callable[[], Any]]
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
    """One generation for one sample: continue ``prompt_ids`` for at most ``max_tokens``.

    ``version`` is the policy version in effect when the request was submitted (what its tokens
    are attributed to when the engine does not say which weights sampled them).
    ``images``: the image inputs of the whole ``prompt_ids`` (:class:`tmpl.vision.ImageInputs`, spans
    relative to ``prompt_ids``), or None for a text-only prompt; backends that take images pass them
    to the engine. ``image_sources``: the images themselves (PIL images, one per carried image, in
    placeholder order), for engines that run the model's own processor on them (vLLM); the Torch
    backend needs only ``images``.
    """

    request_id: str
    prompt_ids: Sequence[int]
    max_tokens: int
    stop_token_ids: frozenset[int]
    sampling: Sampling = field(default_factory=Sampling)
    version: int = 0
    #: which sample the request belongs to (``"<conversation>/<sample>"``): servers route its turns together
    sample: str | None = None
    #: the image inputs of the whole ``prompt_ids`` (spans relative to ``prompt_ids``), None without images
    images: ImageInputs | None = None
    #: the images themselves (PIL), one per image of ``images``, in order: for engines that process them (vLLM)
    image_sources: Sequence[Any] | None = None
    #: mixture-of-experts routing replay: ask the engine for the experts it chose at every position from this
    #: index of ``prompt_ids`` on (vLLM's ``routed_experts_prompt_start``); None asks for no routes
    routes_from: int | None = None


@dataclass
class GenerationResult:
    """What a backend returns for one request.

    ``token_ids`` end with the stop token when ``finish_reason == "stop"``. ``logprobs`` has
    one entry per token (the sampled token's logprob) or is None when the backend gave none.
    ``versions`` has one policy version per token when the engine says which weights sampled
    each one (vLLM's ``weight_versions`` spans), else None (the rollout then uses the version in
    effect when the request was submitted).
    """

    request_id: str
    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: FinishReason
    logprobs_mode: LogprobsMode = "raw"
    error: str | None = None
    versions: list[int] | None = None
    #: the experts the engine routed each position to, ``[positions, layers, top_k]`` (a compact unsigned
    #: or int32 numpy array) for the positions ``routes_start ..`` of ``prompt_ids + token_ids``, as the
    #: engine reported them (vLLM: from ``routes_from`` to the last sampled token, which has none yet);
    #: None when routes were not asked for or the backend gives none
    routes: Any = None
    routes_start: int = 0

    @classmethod
    def failed(cls, request_id: str, error: str) -> GenerationResult:
        return cls(request_id, [], None, "error", error=error)


@dataclass
class StreamDelta:
    """A piece of a streamed generation (:meth:`Backend.astream`): the token IDs sampled since the last piece
    and their logprobs (None where the engine sends them only at the end); the last piece (which may hold
    IDs of its own) carries the whole :class:`GenerationResult` (``result``), whose IDs are every piece's
    IDs joined.

    >>> StreamDelta([5, 6], [-0.1, -0.2]).result is None
    True
    """

    token_ids: list[int]
    logprobs: list[float] | None = None
    #: the finished generation: set on the last piece only
    result: GenerationResult | None = None


def image_misfit(req: GenerationRequest) -> str | None:
    """Why a request's image inputs do not fit its prompt IDs (their placeholder runs), or None (also
    for a request without images): every backend that takes images checks it first."""
    if req.images is None or not req.images.count:
        return None
    try:
        req.images.check_aligned(req.prompt_ids)
    except TrajectoryError as exc:
        return f"the image inputs do not fit the prompt IDs: {exc.reason}"
    return None


def version_label(label: Any) -> int | None:
    """The integer policy version of an engine's weight-version label, or None for any other label.

    Versions are integers the trainer chooses; engines carry them as their decimal string (vLLM's
    label before any update is ``"default"``, which names no version).

    >>> version_label("7"), version_label(7), version_label("default"), version_label(None)
    (7, 7, None, None)
    """
    if isinstance(label, bool) or label is None:
        return None
    if isinstance(label, int):
        return label
    text = str(label).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    return None


def versions_from_spans(spans: Any, n_tokens: int, default: int | None = None) -> list[int] | None:
    """One version per output token from vLLM's ``weight_versions`` spans ``[{version, start, end}]``.

    Spans may be dicts (the server's JSON) or objects with those attributes (offline vLLM).
    Tokens of a span whose label names no integer version get ``default``; without spans, or when
    they do not cover the ``n_tokens`` tokens exactly once, the answer is None (not reported).

    >>> versions_from_spans([{"version": "default", "start": 0, "end": 2}, {"version": "3", "start": 2, "end": 5}], 5, 2)
    [2, 2, 3, 3, 3]
    >>> versions_from_spans([{"version": "3", "start": 0, "end": 4}], 5) is None
    True
    """
    if not spans:
        return None
    out: list[int] = []
    try:
        for span in spans:
            fields = span if isinstance(span, dict) else vars(span)  # JSON, or vLLM's WeightVersionSpan
            start, end = int(fields["start"]), int(fields["end"])
            if start != len(out) or end < start:
                return None
            label = version_label(fields.get("version"))
            value = label if label is not None else default
            if value is None:
                return None
            out += [value] * (end - start)
    except (KeyError, TypeError, ValueError):
        return None
    return out if len(out) == n_tokens else None


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
    #: the policy version of the weights now loaded (set by :meth:`update_weights`)
    weight_version: int = 0
    #: whether the backend returns mixture-of-experts routes (``GenerationResult.routes``) when asked
    gives_routes: bool = False

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

    async def astream(self, request: GenerationRequest) -> AsyncIterator[StreamDelta]:
        """Generate for one request, its tokens as the engine samples them: pieces of new token IDs, the
        last one carrying the whole :class:`GenerationResult`. The base class has one piece: the result of
        :meth:`agenerate` (engines that stream override it: VLLMServer, Scripted). Closing the iterator early (or cancelling
        its consumer) ends the engine request as cancelling :meth:`agenerate` does.

        >>> async for piece in backend.astream(request):          # doctest: +SKIP
        ...     print(piece.token_ids, piece.result is not None)
        [151657, 198] False
        [] True
        """
        result = await self.agenerate(request)
        yield StreamDelta(list(result.token_ids), None if result.logprobs is None else list(result.logprobs), result)

    async def update_weights(
        self,
        version: int,
        apply: WeightSource = None,
        *,
        mode: UpdateMode = "keep",  # noqa: ARG002 - matters to engines that pause mid-request
        reset_prefix_cache: bool = True,  # noqa: ARG002 - matters to engines with a prefix cache
    ) -> None:
        """Change the weights to ``version`` (called by :meth:`tmpl.Rollout.update_weights`).

        ``apply``: None (only the version label changes), a folder of weights (engines that can
        reload from one), or a callable (sync or async, no arguments) that does the transfer. The
        base class runs a callable and refuses a folder; engines that generate in batches are only
        called between batches, so ``mode`` changes nothing for them (every token of a batch is
        sampled by the weights it started with).
        """
        if callable(apply):
            out = apply()
            if asyncio.iscoroutine(out):
                await out
        elif apply is not None:
            raise WeightUpdateError(
                type(self).__name__, "apply", f"cannot reload weights from a folder ({apply}); pass apply=a callable"
            )
        self.weight_version = version

    async def prefix_cache_counters(self) -> tuple[float, float] | None:
        """``(queried tokens, hit tokens)`` of the engines' prefix caches so far, or None when unknown."""
        return None

    async def cancel(self, request_id: str) -> None:  # noqa: B027 - optional hook
        """Cancel an in-flight request (servers); a no-op for local engines."""

    async def stop(self, request_id: str) -> bool:  # noqa: ARG002 - a hook: engines that can stop override it
        """Ask the engine to end in-flight request ``request_id`` now, keeping what it sampled: the
        request's ``agenerate`` then returns those tokens with ``finish_reason="abort"``. False where
        this backend cannot (nothing sampled would come back: cancel the request instead).

        >>> await backend.stop("gw1-7")   # then: result = await the agenerate task  # doctest: +SKIP
        True
        """
        return False

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (connections, threads)."""
