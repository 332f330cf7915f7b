"""Generation backends taken from a TRL trainer: its vLLM engine, its vLLM server, or its model.

>>> with trainer_backend(trainer) as backend:   # doctest: +SKIP
...     results = tmpl.Rollout(tpl, backend, tools=tools).run(conversations)

- ``use_vllm`` in colocate mode: the trainer's ``vllm.LLM`` (``trainer.vllm_generation.llm``)
  through :class:`tmpl.backends.VLLM`; with ``vllm_enable_sleep_mode`` the engine is woken for
  the whole rollout (weights re-pushed first when they were discarded) and put back to sleep.
- ``use_vllm`` in server mode: TRL's own ``VLLMClient`` (``trainer.vllm_generation.vllm_client``,
  which exists on the main process only) through :class:`VLLMClientBackend`; other processes
  talk to the same server with :class:`tmpl.backends.VLLMServer` (its ``/v1/completions`` API).
- otherwise: :class:`tmpl.backends.Torch` on the trainer's unwrapped model (TRL's
  ``unwrap_model_for_generation``, so DeepSpeed ZeRO-3 parameters are gathered), no gradients.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

from ...backends import (
    VLLM,
    Backend,
    GenerationRequest,
    GenerationResult,
    Torch,
    VLLMServer,
)
from ...errors import TrainerConfigError


class VLLMClientBackend(Backend):
    """TRL's ``VLLMClient`` (server mode) as a tmpl backend: token IDs in, IDs and logprobs out.

    Requests with the same sampling settings and stop tokens go to the server in one
    ``client.generate(prompts=[ids, ...], n=1, ..., logprobs=0,
    generation_kwargs={"stop_token_ids": [...]})`` call, with the largest ``max_tokens`` of the
    batch; each result is then cut at its own ``max_tokens`` (sampling is autoregressive, so a
    prefix of a longer generation is a generation with the smaller limit). The client does not
    report why a generation ended: a result ending with a stop token is ``"stop"``, one that
    used its whole ``max_tokens`` otherwise ``"length"``, one the server ended earlier ``"stop"``.

    >>> backend = VLLMClientBackend(trainer.vllm_generation.vllm_client)   # doctest: +SKIP
    """

    batching = True
    threaded = True  # the client blocks on HTTP

    def __init__(self, client: Any, *, logprobs_mode: str = "processed") -> None:
        self.client = client
        self.logprobs_mode = logprobs_mode

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        out: dict[str, GenerationResult] = {}
        groups: dict[tuple, list[GenerationRequest]] = defaultdict(list)
        for req in requests:
            if req.images is not None and req.images.count:
                out[req.request_id] = GenerationResult.failed(
                    req.request_id,
                    "VLLMClient: the request holds images, which this backend does not send (TRL's client takes "
                    "them as `features` from image_features(); not wired)",
                )
            elif req.max_tokens <= 0:
                out[req.request_id] = GenerationResult(req.request_id, [], [], "length", self.logprobs_mode)
            else:
                groups[(req.sampling, tuple(sorted(req.stop_token_ids)))].append(req)
        for (sampling, stops), group in groups.items():
            for result in self._generate(group, sampling, stops):
                out[result.request_id] = result
        return [out[r.request_id] for r in requests]

    def _generate(self, group: list[GenerationRequest], sampling, stops: tuple[int, ...]) -> list[GenerationResult]:
        extra: dict[str, Any] = {"stop_token_ids": list(stops), "skip_special_tokens": False}
        if sampling.seed is not None:
            extra["seed"] = int(sampling.seed)
        try:
            answer = self.client.generate(
                prompts=[list(map(int, r.prompt_ids)) for r in group],
                n=1,
                temperature=float(sampling.temperature),
                top_p=float(sampling.top_p),
                top_k=int(sampling.top_k),
                max_tokens=max(r.max_tokens for r in group),
                logprobs=0,
                generation_kwargs=extra,
            )
            ids_rows = answer["completion_ids"]
            lp_rows = answer.get("logprobs")
            token_rows = answer.get("logprob_token_ids")
            if len(ids_rows) != len(group):
                raise ValueError(f"the server answered {len(ids_rows)} completions for {len(group)} prompts")
        except Exception as exc:  # noqa: BLE001 - the client or server failed this batch: each request fails with why
            return [GenerationResult.failed(r.request_id, f"VLLMClient: {type(exc).__name__}: {exc}") for r in group]
        stop_set = set(stops)
        results = []
        for k, req in enumerate(group):
            ids = [int(t) for t in ids_rows[k]]
            lps = _sampled_logprobs(
                ids, lp_rows[k] if lp_rows is not None else None, token_rows[k] if token_rows is not None else None
            )
            end, reason = min(len(ids), req.max_tokens), None
            for t in range(end):
                if ids[t] in stop_set:
                    end, reason = t + 1, "stop"
                    break
            if reason is None:
                reason = "length" if end >= req.max_tokens else "stop"
            results.append(
                GenerationResult(
                    req.request_id,
                    ids[:end],
                    None if lps is None else lps[:end],
                    reason,
                    logprobs_mode=self.logprobs_mode,
                )
            )
        return results


def _sampled_logprobs(ids: list[int], steps: Sequence[Any] | None, tokens: Sequence[Any] | None) -> list[float] | None:
    """The sampled tokens' logprobs from the client's ``(seq_len, num_logprobs)`` lists, or None when
    any is missing (vLLM sends None for a NaN logprob)."""
    if steps is None or len(steps) != len(ids):
        return None
    out = []
    for t, step in enumerate(steps):
        if not step:
            return None
        k = 0
        if tokens is not None and tokens[t]:
            try:
                k = list(tokens[t]).index(ids[t])
            except ValueError:
                return None  # the sampled token is not among the returned entries
        value = step[k]
        if value is None:
            return None
        out.append(float(value))
    return out


# -- choosing the backend of a trainer ---------------------------------------------------------


def trainer_name(trainer: Any) -> str:
    return type(trainer).__name__


@contextmanager
def trainer_backend(trainer: Any) -> Iterator[Backend]:
    """The trainer's own generation as a tmpl backend, for the duration of one rollout."""
    if getattr(trainer, "use_vllm", False):
        generation = getattr(trainer, "vllm_generation", None)
        if generation is None:
            raise TrainerConfigError(trainer_name(trainer), "use_vllm", "the trainer has no vllm_generation engine")
        mode = getattr(generation, "mode", None)
        if mode == "colocate":
            tp = int(getattr(generation, "tensor_parallel_size", 1) or 1)
            if tp > 1:
                raise TrainerConfigError(
                    trainer_name(trainer),
                    "vllm_tensor_parallel_size",
                    f"{tp} > 1 in colocate mode is not supported: each rank of a tensor-parallel group must call "
                    "the engine in lockstep, which a multi-turn rollout (samples finishing at different turns) "
                    "cannot do; use vllm_mode='server' or vllm_tensor_parallel_size=1",
                )
            with _awake(generation):
                yield VLLM(generation.llm)
        elif mode == "server":
            client = getattr(generation, "vllm_client", None)
            if client is not None:
                yield VLLMClientBackend(client)
            else:  # TRL creates the client on the main process only
                args = getattr(trainer, "args", None)
                yield VLLMServer(
                    [server_url(args)],
                    api="completions",
                    timeout=float(getattr(args, "vllm_server_timeout", 240.0) or 240.0),
                    logprobs_mode="processed",
                )
        else:
            raise TrainerConfigError(trainer_name(trainer), "vllm_mode", f"unknown mode {mode!r} (colocate or server)")
        return
    tokenizer = getattr(trainer, "_tokenizer", None) or trainer.processing_class
    with _unwrapped_model(trainer) as model:
        yield Torch(model, pad_token_id=tokenizer.pad_token_id)


def server_url(args: Any) -> str:
    """The vLLM server's base URL from a GRPO/RLOO config, as TRL builds it."""
    base = getattr(args, "vllm_server_base_url", None)
    if base:
        return str(base).rstrip("/")
    host = getattr(args, "vllm_server_host", "0.0.0.0")
    port = getattr(args, "vllm_server_port", 8000)
    return f"http://{host}:{port}"


@contextmanager
def _awake(generation: Any) -> Iterator[None]:
    """Keep a sleeping colocated engine awake for a whole multi-turn rollout (one wake, one sleep)."""
    if not getattr(generation, "enable_sleep_mode", False):
        yield
        return
    if getattr(generation, "_llm_weights_sleeping", False):
        generation.sync_weights()  # sleep level 2 discarded the weights: push the training weights again
    generation.llm.wake_up(tags=["kv_cache"])
    try:
        yield
    finally:
        generation.llm.sleep(level=2)
        generation._llm_weights_sleeping = True


@contextmanager
def _unwrapped_model(trainer: Any) -> Iterator[Any]:
    from trl.models import unwrap_model_for_generation

    args = trainer.args
    kwargs: dict[str, Any] = {"gather_deepspeed3_params": getattr(args, "ds3_gather_for_generation", True)}
    if "gradient_checkpointing_kwargs" in inspect.signature(unwrap_model_for_generation).parameters:
        kwargs["gradient_checkpointing_kwargs"] = getattr(args, "gradient_checkpointing_kwargs", None)
    wrapped = getattr(trainer, "model_wrapped", None) or trainer.model
    dist = getattr(trainer, "_dist", None)  # FSDP: generation needs the full parameters
    full = dist.summon_full_params(wrapped, recurse=False) if hasattr(dist, "summon_full_params") else nullcontext()
    with unwrap_model_for_generation(wrapped, trainer.accelerator, **kwargs) as model, full:
        yield model
