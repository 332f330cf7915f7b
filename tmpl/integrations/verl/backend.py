"""verl's server manager as a tmpl backend: token IDs in, token IDs and logprobs out.

verl's agent loops generate through ``server_manager.generate(request_id, *, prompt_ids,
sampling_params) -> TokenOutput`` (``token_ids``, ``log_probs``, ``stop_reason``). This backend
sends each of tmpl's requests there under one sticky id per sample (the same server, so its prefix
cache is reused), with the request's per-turn budget and the template's stop tokens. A request
with images also sends ``image_data`` (``GenerationRequest.image_sources``, the PIL images in
placeholder order) with the expanded IDs, as verl's own agent loops do (verl 0.9's vLLM server
collapses Qwen2.5-VL's expanded ``<|image_pad|>`` runs itself and passes ``multi_modal_data``).

Routing replay (``VerlServerBackend(..., routes=True)``, verl's ``rollout.enable_rollout_routing_replay``):
verl's servers start their engine with ``enable_return_routed_experts`` and return
``TokenOutput.routed_experts``, a ``[positions, layers, top_k]`` array over the prompt and the generated
tokens but the last (vLLM's ``CompletionOutput.routed_experts``; SGLang's, reshaped by verl), always
from position 0: verl sends no prompt start. The rows before the request's ``routes_from`` are dropped
(:func:`tmpl.backends.routes.from_position`), so each turn keeps the routes of its new positions only.

>>> backend = VerlServerBackend(agent_loop.server_manager, {"temperature": 1.0})  # doctest: +SKIP
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...backends.base import Backend, GenerationRequest, GenerationResult
from ...backends.routes import from_position

__all__ = ["VerlServerBackend", "verl_sampling_params"]


def verl_sampling_params(base: Mapping[str, Any], request: GenerationRequest) -> dict[str, Any]:
    """verl's sampling dict for one request: the loop's settings, this turn's budget, the stop tokens.

    >>> from tmpl.backends import GenerationRequest
    >>> req = GenerationRequest("r", [1, 2], 16, frozenset({7}))
    >>> verl_sampling_params({"temperature": 0.5, "logprobs": False}, req)
    {'temperature': 0.5, 'logprobs': True, 'max_tokens': 16, 'stop_token_ids': [7]}
    """
    params = dict(base)
    params.pop("max_new_tokens", None)
    params["logprobs"] = True  # tmpl records the sampled tokens' logprobs for every turn
    params["max_tokens"] = int(request.max_tokens)
    params["stop_token_ids"] = sorted(int(t) for t in request.stop_token_ids)
    return params


class VerlServerBackend(Backend):
    """Generate through a verl server manager (``AgentLoopBase.server_manager``), one request at a time."""

    batching = False

    def __init__(
        self,
        server_manager: Any,
        sampling_params: Mapping[str, Any],
        sticky_id: str | None = None,
        *,
        routes: bool = False,
    ) -> None:
        self.server_manager = server_manager
        self.params = dict(sampling_params)
        self.sticky_id = sticky_id or uuid.uuid4().hex
        #: verl's servers return routed experts (``rollout.enable_rollout_routing_replay``)
        self.gives_routes = routes

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        """One turn on verl's server; the result is cut at the request's budget."""
        extra: dict[str, Any] = {}
        if request.images is not None and request.images.count:
            sources = list(request.image_sources or ())
            if len(sources) != request.images.count:
                return GenerationResult.failed(
                    request.request_id,
                    f"verl server manager: {request.images.count} image(s) in the prompt but {len(sources)} in "
                    "image_sources (verl's server runs the processor on the images themselves)",
                )
            extra["image_data"] = sources
        try:
            out = await self.server_manager.generate(
                self.sticky_id,
                prompt_ids=list(request.prompt_ids),
                sampling_params=verl_sampling_params(self.params, request),
                **extra,
            )
        except Exception as exc:  # noqa: BLE001 - a server error fails this generation, not the batch
            return GenerationResult.failed(request.request_id, f"verl server manager: {type(exc).__name__}: {exc}")
        ids = [int(t) for t in out.token_ids][: request.max_tokens]
        logprobs = getattr(out, "log_probs", None)
        lps = None if logprobs is None or len(logprobs) < len(ids) else [float(x) for x in logprobs[: len(ids)]]
        if getattr(out, "stop_reason", None) == "aborted":
            reason = "abort"
        elif ids and ids[-1] in request.stop_token_ids:
            reason = "stop"
        else:
            reason = "length"
        routes, start = self._routes(request, out, len(ids))
        return GenerationResult(
            request.request_id,
            ids,
            lps,
            reason,  # type: ignore[arg-type]
            routes=routes,
            routes_start=start,
        )

    def _routes(self, request: GenerationRequest, out: Any, kept: int) -> tuple[Any, int]:
        """The turn's routes from ``out.routed_experts`` (from position 0), from ``routes_from`` to the last
        token kept (a completion cut at the request's budget takes only its kept tokens' routes)."""
        sent = getattr(out, "routed_experts", None)
        if request.routes_from is None or sent is None:
            return None, 0
        if hasattr(sent, "detach"):  # a torch tensor
            sent = sent.detach().cpu().numpy()
        routes, start = from_position(np.asarray(sent), 0, request.routes_from)
        return routes[: max(0, len(request.prompt_ids) + kept - start)], start
