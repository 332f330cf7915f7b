"""``tmpl.backends.Torch``: transformers ``generate`` on batched, left-padded token IDs.

>>> backend = Torch(model, pad_token_id=tokenizer.pad_token_id)            # doctest: +SKIP
>>> [result] = backend.generate_batch([GenerationRequest("r0", ids, 64, frozenset({151645}))])  # doctest: +SKIP
>>> result.finish_reason, len(result.token_ids) == len(result.logprobs)  # doctest: +SKIP
('stop', True)

Requests are grouped by sampling settings and stop tokens (one ``generate`` call each).
Each result is cut at its first stop token (kept) or at its own ``max_tokens``. Logprobs
are those of the sampled tokens: ``raw`` (log-softmax of the logits) or ``processed``
(log-softmax of the scores after temperature, top-k and top-p). Works on CPU and GPU.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from .base import Backend, BackendError, GenerationRequest, GenerationResult


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


class Torch(Backend):
    """Generate with a transformers causal LM (``model.generate``)."""

    batching = True

    def __init__(
        self, model: Any, *, pad_token_id: int | None = None, max_batch_size: int = 64, tokenizer: Any = None
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

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        out: dict[str, GenerationResult] = {}
        groups: dict[tuple, list[GenerationRequest]] = defaultdict(list)
        for req in requests:
            if not req.prompt_ids:
                out[req.request_id] = GenerationResult.failed(req.request_id, "empty prompt")
            elif req.max_tokens <= 0:
                out[req.request_id] = GenerationResult(req.request_id, [], [], "length", req.sampling.logprobs)
            else:
                groups[(req.sampling, tuple(sorted(req.stop_token_ids)))].append(req)
        for (sampling, stops), group in groups.items():
            for lo in range(0, len(group), self.max_batch_size):
                for result in self._generate_halving(group[lo : lo + self.max_batch_size], sampling, stops):
                    out[result.request_id] = result
        return [out[r.request_id] for r in requests]

    def _generate_halving(self, chunk: list[GenerationRequest], sampling, stops) -> list[GenerationResult]:
        """Generate ``chunk``; out of memory splits it in halves and retries each (down to one
        request). Any other RuntimeError, or OOM on a single request, fails those requests only."""
        try:
            return self._generate(chunk, sampling, stops)
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

        device = next(self.model.parameters()).device
        width = max(len(r.prompt_ids) for r in group)
        input_ids = torch.full((len(group), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(group), width), dtype=torch.long)
        for i, req in enumerate(group):
            n = len(req.prompt_ids)
            input_ids[i, width - n :] = torch.tensor(list(req.prompt_ids), dtype=torch.long)
            attention[i, width - n :] = 1
        kwargs: dict[str, Any] = dict(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            max_new_tokens=max(r.max_tokens for r in group),
            pad_token_id=self.pad_token_id,
            eos_token_id=list(stops) or None,
            return_dict_in_generate=True,
            output_scores=sampling.logprobs == "processed",
            output_logits=sampling.logprobs == "raw",
        )
        if sampling.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                          top_k=sampling.top_k or None)
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        with torch.no_grad():
            gen = self.model.generate(**kwargs)
        steps = gen.logits if sampling.logprobs == "raw" else gen.scores
        new = gen.sequences[:, width:]
        # (batch, steps) logprobs of the sampled tokens, in one pass
        stacked = torch.stack([s.float() for s in steps], dim=1)
        chosen = torch.log_softmax(stacked, dim=-1).gather(-1, new[:, : stacked.shape[1]].unsqueeze(-1)).squeeze(-1)
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
            results.append(
                GenerationResult(req.request_id, ids[:end], lps[:end], reason, logprobs_mode=sampling.logprobs)
            )
        return results
