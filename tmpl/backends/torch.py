"""``tmpl.backends.Torch``: transformers ``generate`` on batched, left-padded token IDs.

>>> backend = Torch(model, pad_token_id=tokenizer.pad_token_id)            # doctest: +SKIP
>>> [result] = backend.generate_batch([GenerationRequest("r0", ids, 64, frozenset({151645}))])  # doctest: +SKIP
>>> result.finish_reason, len(result.token_ids) == len(result.logprobs)  # doctest: +SKIP
('stop', True)

Requests are grouped by sampling settings and stop tokens (one ``generate`` call each).
Each result is cut at its first stop token (kept) or at its own ``max_tokens``. Logprobs
are those of the sampled tokens: ``raw`` (log-softmax of the logits) or ``processed``
(log-softmax of the scores after temperature, top-k and top-p). Works on CPU and GPU.

Vision-language models: a request whose ``images`` (:class:`tmpl.vision.ImageInputs`) hold images
gets its image inputs passed to ``generate`` (``pixel_values``, ``image_grid_thw``... exactly the
arrays the processor made, concatenated over the batch in request order, floats in the model's
dtype) with its token-type keys (``mm_token_type_ids``: 1 on placeholders) left-padded like the IDs.
Tested on a tiny Qwen2.5-VL (tests/test_vision_backends.py): the same tokens as ``model.generate``
on the processor's own full render of the conversation.

Mixture-of-experts routing replay: a request with ``routes_from`` gets the experts the model routed
each position to (``GenerationResult.routes``, ``[positions, layers, top_k]``), read from the model's
own router outputs while ``generate`` runs (``output_router_logits=True`` on its base model; each step's router logits,
top-k of their softmax as the router takes it, see :class:`_StepRoutes`), from ``routes_from`` to the
last sampled token, which is left out (no forward pass ran it), as vLLM reports them. ``gives_routes``
is True only for a model whose forward takes ``output_router_logits`` and whose config names its top-k.

The logprob of each sampled token is taken at the step it is sampled (see
:class:`_StepLogprobs`): ``generate`` never keeps a vocabulary row per generated token
(``output_logits`` / ``output_scores`` would hold ``batch x steps x vocab`` floats, 79 GB
for 256 x 512 x 151,665), so the extra memory is a few ``batch x vocab`` rows whatever
the generated length.
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ..trajectory.routes import compact_dtype
from .base import Backend, BackendError, GenerationRequest, GenerationResult, Sampling, StreamDelta, image_misfit

#: the model generation_config's sampling warpers that Sampling does not name: switched off,
#: so that what is sampled from is exactly Sampling's temperature, top-k and top-p
_UNNAMED_WARPERS_OFF = dict(min_p=None, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0, top_h=None)


def _is_out_of_memory(exc: BaseException) -> bool:
    """True for CUDA/CPU allocator failures (torch.OutOfMemoryError or its message)."""
    import torch

    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
    return isinstance(exc, oom) or "out of memory" in str(exc).lower()


def _release_cached_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _pad_token(explicit: int | None, tokenizer: Any, config: Any) -> int:
    """The first of: explicit, tokenizer pad, tokenizer eos, config pad, config eos; else 0.

    >>> _pad_token(None, None, None)
    0
    """
    candidates = [explicit]
    for source in (tokenizer, config):
        candidates += [getattr(source, "pad_token_id", None), getattr(source, "eos_token_id", None)]
    for candidate in candidates:
        if isinstance(candidate, (list, tuple)):
            candidate = candidate[0] if candidate else None
        if candidate is not None:
            return int(candidate)
    return 0


class _StepLogprobs:
    """The sampled token's logprob, taken step by step while ``generate`` runs.

    Each step, :meth:`hold` receives the distribution the token is drawn from (or the raw
    logits) as one ``batch x vocab`` float row and keeps it with its log-normalizer; once
    ``generate`` has appended the sampled tokens, :meth:`take` gathers one logprob per row
    and lets go of the row. What is kept between steps is ``batch`` floats per step.

    It plugs into ``generate`` three ways (all public transformers / torch hooks):

    - ``processed``: :meth:`processor`, a logits processor placed after the temperature,
      top-k and top-p warpers (which are passed as processors too, so the order is ours);
    - ``raw``: :meth:`forward_hook` on the model, which sees the logits exactly as
      ``generate`` does (``outputs.logits[:, -1]`` in float32) before any processor,
      including processors from the model's generation_config (repetition penalty...);
    - both: :meth:`criterion`, a stopping criterion, called once per step right after the
      sampled token is appended to ``input_ids``; it never stops anything.

    >>> import torch
    >>> steps = _StepLogprobs()
    >>> steps.hold(torch.tensor([[0.0, 0.0], [0.0, 2.0]]))
    >>> steps.take(torch.tensor([[7, 1], [7, 0]]))
    >>> [round(x, 4) for x in steps.matrix(1)[:, 0].tolist()]
    [-0.6931, -2.1269]
    """

    def __init__(self) -> None:
        self._row: Any = None
        self._log_norm: Any = None
        self._steps: list[Any] = []
        self._thread = threading.get_ident()

    def hold(self, row: Any) -> None:
        """Keep this step's float32 ``batch x vocab`` row and its logsumexp until :meth:`take`."""
        import torch

        self._row = row
        self._log_norm = torch.logsumexp(row, dim=-1)

    def take(self, input_ids: Any) -> None:
        """Gather the logprob of the token just appended (``input_ids[:, -1]``) from the held row."""
        if self._row is None:
            raise BackendError("Torch backend: a step was sampled without its logits being seen")
        tokens = input_ids[:, -1:].to(self._row.device)
        self._steps.append(self._row.gather(-1, tokens).squeeze(-1) - self._log_norm)
        self._row = self._log_norm = None

    def matrix(self, n_steps: int) -> Any:
        """``(batch, n_steps)`` logprobs of the first ``n_steps`` sampled tokens."""
        import torch

        if len(self._steps) < n_steps:
            raise BackendError(f"Torch backend: {len(self._steps)} logprob steps seen for {n_steps} generated tokens")
        return torch.stack(self._steps[:n_steps], dim=1)

    def processor(self) -> Any:
        """A transformers ``LogitsProcessor`` that holds the scores it is given, unchanged."""
        from transformers import LogitsProcessor

        steps = self

        class HoldScores(LogitsProcessor):
            def __call__(self, input_ids, scores):  # noqa: ARG002 - LogitsProcessor signature
                steps.hold(scores.float())
                return scores

        return HoldScores()

    def criterion(self) -> Any:
        """A transformers ``StoppingCriteria`` that takes each step's logprob and stops nothing."""
        import torch
        from transformers import StoppingCriteria

        steps = self

        class TakeSampled(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):  # noqa: ARG002 - StoppingCriteria signature
                steps.take(input_ids)
                return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

        return TakeSampled()

    def forward_hook(self, module: Any, args: Any, output: Any) -> None:  # noqa: ARG002 - torch hook signature
        """``register_forward_hook`` target: hold the last position's logits (this thread's calls only)."""
        if threading.get_ident() != self._thread:
            return
        logits = getattr(output, "logits", None)
        if logits is None:
            raise BackendError(f"Torch backend: {type(module).__name__} returned no .logits for raw logprobs")
        import torch

        self.hold(logits[:, -1].to(torch.float32, copy=True))


def _router_top_k(model: Any) -> int | None:
    """The experts per token of a mixture-of-experts model whose forward reports router logits, else None."""
    import inspect

    config = getattr(model, "config", None)
    top_k = getattr(config, "num_experts_per_tok", None) or getattr(config, "moe_topk", None)
    try:
        takes = "output_router_logits" in inspect.signature(getattr(model, "forward", None)).parameters
    except (TypeError, ValueError):  # no forward (a stand-in object) or no signature
        takes = False
    return int(top_k) if top_k and takes else None


def _expert_count(model: Any) -> int | None:
    config = getattr(model, "config", None)
    for name in ("num_experts", "num_local_experts", "n_routed_experts"):
        n = getattr(config, name, None)
        if isinstance(n, int) and n > 0:
            return n
    return None


class _StepRoutes:
    """The experts of every position, taken from the router logits of each forward pass of ``generate``.

    Hooked on the model's base model (``model.base_model``): :meth:`ask` (a forward pre-hook) passes it
    ``output_router_logits=True`` (on the causal-LM wrapper that would also compute the auxiliary
    load-balancing loss, which fails on ``generate``'s decoding steps), :meth:`forward_hook` reads
    ``outputs.router_logits`` (one ``[batch * positions, experts]`` tensor per MoE layer: the prefill's,
    then one position per decoding step) and keeps the top-k of their softmax, in float32, as Qwen3-MoE's
    and Mixtral's routers choose (``topk(softmax(logits))``): ``[batch, positions, layers, top_k]`` per
    step. Layers without a router (dense layers) are not in the outputs.
    """

    def __init__(self, top_k: int) -> None:
        self.top_k = top_k
        self.steps: list[Any] = []
        self._thread = threading.get_ident()

    def ask(self, module: Any, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:  # noqa: ARG002
        """Forward pre-hook (``with_kwargs=True``): ask the base model for its router logits."""
        if threading.get_ident() == self._thread:
            kwargs["output_router_logits"] = True
        return args, kwargs

    def hook(self, model: Any) -> list[Any]:
        """Hook onto ``model``'s base model; returns the handles to remove."""
        base = getattr(model, "base_model", model)
        return [
            base.register_forward_pre_hook(self.ask, with_kwargs=True),
            base.register_forward_hook(self.forward_hook),
        ]

    def forward_hook(self, module: Any, args: Any, output: Any) -> None:  # noqa: ARG002 - torch hook signature
        if threading.get_ident() != self._thread:
            return
        logits = getattr(output, "router_logits", None)
        if not logits:
            raise BackendError(f"Torch backend: {type(module).__name__} returned no router_logits for routes")
        import torch

        batch = output.last_hidden_state.shape[0]
        layers = []
        for layer in logits:
            probs = torch.softmax(layer.detach(), dim=-1, dtype=torch.float)
            layers.append(torch.topk(probs, self.top_k, dim=-1).indices.reshape(batch, -1, self.top_k))
        self.steps.append(torch.stack(layers, dim=2))

    def of(self, row: int, width: int, prompt: int, start: int, sampled: int, dtype: Any) -> Any:
        """Routes of one request (batch ``row``, prompt of ``prompt`` tokens left-padded to ``width``):
        positions ``start ..`` of prompt + sampled, up to the last sampled token (left out)."""
        import numpy as np
        import torch

        pieces = [self.steps[0][row, width - prompt + start :]]
        pieces += [step[row] for step in self.steps[1:sampled]]
        routes = torch.cat(pieces, dim=0).cpu().numpy()
        return np.ascontiguousarray(routes.astype(dtype))


def _warpers(sampling: Sampling) -> list[Any]:
    """Sampling's temperature, top-k and top-p as transformers warpers, in ``generate``'s order."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers: list[Any] = []
    if sampling.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(sampling.temperature))
    if sampling.top_k:
        warpers.append(TopKLogitsWarper(top_k=sampling.top_k, min_tokens_to_keep=1))
    if sampling.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=sampling.top_p, min_tokens_to_keep=1))
    return warpers


class Torch(Backend):
    """Generate with a transformers causal LM (``model.generate``).

    ``max_batch_size`` defaults to 256: sampled-token logprobs are taken step by step, so a
    batch no longer holds a vocabulary row per generated token (at 256 x 512 tokens and a
    151k vocabulary that alone was 79 GB); what a batch needs beyond the weights is the KV
    cache (prompt + generated tokens, model-dependent) and a few ``batch x vocab`` float rows
    for the current step (~155 MB each at 256 x 151k). A batch that still does not fit is
    halved and retried (see ``_generate_halving``), so a large default costs nothing when
    the device is small.
    """

    batching = True

    def __init__(
        self, model: Any, *, pad_token_id: int | None = None, max_batch_size: int = 256, tokenizer: Any = None
    ) -> None:
        """Pad token: ``pad_token_id``, else the tokenizer's pad or eos, else the config's pad or
        eos, else 0. Left padding sits under a zero attention mask, so any ID is correct there."""
        try:
            import torch  # noqa: F401
        except ImportError as exc:  # pragma: no cover - torch is a test dependency
            raise BackendError("tmpl.backends.Torch needs torch: pip install torch") from exc
        self.model = model
        self.pad_token_id = _pad_token(pad_token_id, tokenizer, getattr(model, "config", None))
        self.max_batch_size = max_batch_size
        self._top_k = _router_top_k(model)
        self._local = threading.local()  # the streamer of the request a worker thread generates (astream)
        #: routes for a mixture-of-experts model that reports its router logits (see the module docstring)
        self.gives_routes = self._top_k is not None

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        out: dict[str, GenerationResult] = {}
        groups: dict[tuple, list[GenerationRequest]] = defaultdict(list)
        for req in requests:
            if not req.prompt_ids:
                out[req.request_id] = GenerationResult.failed(req.request_id, "empty prompt")
            elif req.max_tokens <= 0:
                out[req.request_id] = GenerationResult(req.request_id, [], [], "length", req.sampling.logprobs)
            elif (problem := _image_problem(req)) is not None:
                out[req.request_id] = GenerationResult.failed(req.request_id, problem)
            else:  # requests with images batch with those whose image arrays have the same keys
                arrays = tuple(sorted(req.images.arrays)) if req.images is not None and req.images.count else None
                groups[(req.sampling, tuple(sorted(req.stop_token_ids)), arrays)].append(req)
        for (sampling, stops, _), group in groups.items():
            for lo in range(0, len(group), self.max_batch_size):
                for result in self._generate_halving(group[lo : lo + self.max_batch_size], sampling, stops):
                    out[result.request_id] = result
        return [out[r.request_id] for r in requests]

    async def astream(self, request: GenerationRequest) -> AsyncIterator[StreamDelta]:
        """One request generated in a worker thread (a batch of one), its token IDs passed on step by step
        (``generate``'s streamer) without logprobs; the last piece carries the whole result, logprobs
        included (taken in the same pass). A consumer that leaves early does not stop ``generate``: the
        thread runs to the end of the request (Torch has no :meth:`stop`), and its tokens are dropped.

        >>> async for piece in Torch(model).astream(request):   # doctest: +SKIP
        ...     piece.token_ids
        [151657]
        """
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[list[int]] = asyncio.Queue()

        class Steps:  # transformers' streamer protocol: put(the prompt), put(each step's tokens), end()
            prompt = True

            def put(self, value: Any) -> None:
                if self.prompt:
                    self.prompt = False
                    return
                loop.call_soon_threadsafe(pieces.put_nowait, [int(t) for t in value.reshape(-1).tolist()])

            def end(self) -> None:
                pass

        def run() -> GenerationResult:
            self._local.streamer = Steps()
            try:
                return self.generate_batch([request])[0]
            finally:
                self._local.streamer = None

        done = asyncio.ensure_future(asyncio.to_thread(run))
        sent = 0
        while True:
            getting = asyncio.ensure_future(pieces.get())
            try:
                await asyncio.wait({getting, done}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not getting.done():
                    getting.cancel()
            if not getting.done():  # the thread ended with no step waiting
                break
            ids = getting.result()[: max(0, request.max_tokens - sent)]
            if ids:
                sent += len(ids)
                yield StreamDelta(ids)
        result = done.result()
        while not pieces.empty():  # the steps the thread put before it ended
            ids = pieces.get_nowait()[: max(0, len(result.token_ids) - sent)]
            if ids:
                sent += len(ids)
                yield StreamDelta(ids)
        yield StreamDelta(list(result.token_ids[sent:]), None, result)

    def _generate_halving(self, chunk: list[GenerationRequest], sampling, stops) -> list[GenerationResult]:
        """Generate ``chunk``; out of memory splits it in halves and retries each (down to one
        request). Any other RuntimeError, or OOM on a single request, fails those requests only."""
        try:
            return self._generate(chunk, sampling, stops)
        except ValueError as exc:  # generate's validation of image inputs (a text-only model given some...)
            if not any(r.images is not None and r.images.count for r in chunk):
                raise
            return [GenerationResult.failed(r.request_id, f"{type(exc).__name__}: {exc}") for r in chunk]
        except RuntimeError as exc:
            if _is_out_of_memory(exc) and len(chunk) > 1:
                _release_cached_memory()
                half = len(chunk) // 2
                return self._generate_halving(chunk[:half], sampling, stops) + self._generate_halving(
                    chunk[half:], sampling, stops
                )
            return [GenerationResult.failed(r.request_id, f"{type(exc).__name__}: {exc}") for r in chunk]

    def _generate(self, group: list[GenerationRequest], sampling, stops: tuple[int, ...]) -> list[GenerationResult]:
        import torch
        from transformers import LogitsProcessorList, StoppingCriteriaList

        device = next(self.model.parameters()).device
        width = max(len(r.prompt_ids) for r in group)
        input_ids = torch.full((len(group), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(group), width), dtype=torch.long)
        for i, req in enumerate(group):
            n = len(req.prompt_ids)
            input_ids[i, width - n :] = torch.tensor(list(req.prompt_ids), dtype=torch.long)
            attention[i, width - n :] = 1
        images = _image_kwargs(group, width, device, next(self.model.parameters()).dtype)
        steps = _StepLogprobs()
        kwargs: dict[str, Any] = dict(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            max_new_tokens=max(r.max_tokens for r in group),
            pad_token_id=self.pad_token_id,
            eos_token_id=list(stops) or None,
            return_dict_in_generate=True,
            stopping_criteria=StoppingCriteriaList([steps.criterion()]),
            **images,
        )
        streamer = getattr(self._local, "streamer", None)
        if streamer is not None and len(group) == 1:  # astream's request: its tokens step by step
            kwargs["streamer"] = streamer
        processors: list[Any] = []
        if sampling.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:  # Sampling's warpers as our processors (neutral in the config): nothing runs after ours
            kwargs.update(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, **_UNNAMED_WARPERS_OFF)
            processors += _warpers(sampling)
        if sampling.logprobs == "processed":
            processors.append(steps.processor())
        kwargs["logits_processor"] = LogitsProcessorList(processors)
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        hook = self.model.register_forward_hook(steps.forward_hook) if sampling.logprobs == "raw" else None
        routing = None
        if self._top_k is not None and any(r.routes_from is not None for r in group):
            routing = _StepRoutes(self._top_k)
            route_hooks = routing.hook(self.model)
        try:
            with torch.no_grad():
                gen = self.model.generate(**kwargs)
        finally:
            if hook is not None:
                hook.remove()
            if routing is not None:
                for handle in route_hooks:
                    handle.remove()
        new = gen.sequences[:, width:]
        chosen = steps.matrix(new.shape[1])
        experts = _expert_count(self.model)
        route_dtype = compact_dtype(experts - 1 if experts else 2**31 - 1)
        stop_set = set(stops)
        results = []
        for i, req in enumerate(group):
            ids = new[i].tolist()
            lps = chosen[i].tolist()
            limit = min(req.max_tokens, len(ids))
            end, reason = limit, "length"
            for t in range(limit):
                if ids[t] in stop_set:
                    end, reason = t + 1, "stop"
                    break
            result = GenerationResult(req.request_id, ids[:end], lps[:end], reason, logprobs_mode=sampling.logprobs)
            start = req.routes_from
            if routing is not None and start is not None and 0 <= start <= len(req.prompt_ids) - 1:
                result.routes = routing.of(i, width, len(req.prompt_ids), start, end, route_dtype)
                result.routes_start = start
            results.append(result)
        return results


def _image_problem(req: GenerationRequest) -> str | None:
    """Why a request's image inputs cannot be used with its prompt IDs, or None."""
    problem = image_misfit(req)
    return None if problem is None else f"Torch backend: {problem}"


def _image_kwargs(group: list[GenerationRequest], width: int, device: Any, dtype: Any) -> dict[str, Any]:
    """``generate`` keyword arguments for the image inputs of a left-padded batch (empty without images).

    Per request, :meth:`ImageInputs.model_inputs` of its prompt; token-type keys are left-padded
    with 0 to ``width`` (0 for requests without images), image arrays are concatenated over the
    batch in request order (requests with images in one batch carry the same array keys).
    """
    import numpy as np
    import torch

    inputs = {
        r.request_id: r.images.model_inputs(list(r.prompt_ids))
        for r in group
        if r.images is not None and r.images.count
    }
    if not inputs:
        return {}
    with_images = [r for r in group if r.request_id in inputs]
    type_keys = sorted({k for r in with_images if r.images is not None for k in r.images.token_type_keys})
    out: dict[str, Any] = {}
    for key in type_keys:
        column = torch.zeros((len(group), width), dtype=torch.long)
        for i, req in enumerate(group):
            if req.request_id in inputs:
                row = inputs[req.request_id][key][0]
                column[i, width - len(row) :] = torch.as_tensor(row, dtype=torch.long)
        out[key] = column.to(device)
    assert with_images[0].images is not None
    for key in sorted(with_images[0].images.arrays):
        arr = np.concatenate([inputs[r.request_id][key] for r in with_images], axis=0)
        tensor = torch.from_numpy(np.ascontiguousarray(arr))
        out[key] = tensor.to(device, dtype=dtype) if tensor.is_floating_point() else tensor.to(device)
    return out
