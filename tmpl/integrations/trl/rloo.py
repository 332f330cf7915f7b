"""``ToolRLOOTrainer``: TRL's ``RLOOTrainer`` with a ``rollout_func`` (GRPO's contract) and a tool mask.

>>> from tmpl.integrations.trl import ToolRLOOTrainer, make_rollout_func
>>> trainer = ToolRLOOTrainer(model=model, args=RLOOConfig(...), reward_funcs=reward, train_dataset=ds,
...                           rollout_func=make_rollout_func(tools=[get_weather], max_turns=4))  # doctest: +SKIP
>>> trainer.train()                                                                              # doctest: +SKIP

TRL's ``RLOOTrainer`` (1.16) generates one turn and has neither ``tools`` nor ``rollout_func``.
This subclass changes four methods and nothing else:

- ``_generate`` calls ``rollout_func(prompts, trainer)`` (the same contract as ``GRPOTrainer``:
  ``prompt_ids``, ``completion_ids``, ``logprobs``, optional ``env_mask``, other keys for the
  reward functions), keeps vLLM weights in sync as GRPO does, and logs completion lengths
  counting model tokens only;
- ``_generate_and_score_completions`` adds the padded ``tool_mask`` (1 model token, 0 appended
  token, 1 padding) to the batch, so it is shuffled and split with the rest;
- ``_get_per_token_logps_and_entropies`` multiplies the per-token logprobs (and entropies) by
  the tool mask of the batch being scored. RLOO only ever uses per-token logprobs through sums
  over ``completion_mask`` (the sequence logprob of the ratio, the old logprob, the KL penalty
  ``old - ref``), so appended tokens add exactly 0 to each of them and get no gradient, while
  the attention still sees them (``completion_mask`` is untouched);
- ``_compute_loss`` selects the tool mask of the training batch before calling RLOO's.

Limits: RLOO's logged ``kl`` and ``entropy`` are averages over all completion tokens, so with
appended tokens counting as 0 they read lower than the averages over model tokens; the loss and
the KL penalty in the rewards are exact. ``rollout_func`` logprobs are not used (RLOO
recomputes old logprobs with the training model).
"""

from __future__ import annotations

from typing import Any

import torch
from trl import RLOOTrainer

from ...errors import RolloutContractError

_REQUIRED = ("prompt_ids", "completion_ids", "logprobs")


class ToolRLOOTrainer(RLOOTrainer):
    """``RLOOTrainer`` whose generation goes through ``rollout_func`` (e.g. tmpl's multi-turn tool rollout).

    Takes every argument of ``RLOOTrainer`` plus ``rollout_func`` (required), with the contract of
    ``GRPOTrainer(rollout_func=...)``: :func:`tmpl.integrations.trl.make_rollout_func` builds one.

    >>> ToolRLOOTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", args=RLOOConfig(output_dir="out"),
    ...                 reward_funcs=reward, train_dataset=ds,
    ...                 rollout_func=make_rollout_func(tools=[get_weather])).train()   # doctest: +SKIP
    """

    def __init__(self, *args: Any, rollout_func: Any, **kwargs: Any) -> None:
        if not callable(rollout_func):
            raise TypeError(f"ToolRLOOTrainer needs a callable rollout_func, got {type(rollout_func).__name__}")
        super().__init__(*args, **kwargs)
        self.rollout_func = rollout_func
        self._tmpl_inputs: list[dict[str, Any]] | None = None
        self._tmpl_batch_mask: torch.Tensor | None = None  # tool mask of the generation batch being built
        self._tmpl_scoring_mask: torch.Tensor | None = None  # tool mask applied to the logprobs computed now

    # -- generation ------------------------------------------------------------------------------
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._tmpl_inputs = inputs
        try:
            output = super()._generate_and_score_completions(inputs)
            if self._tmpl_batch_mask is None:  # pragma: no cover - _generate always sets it
                raise RolloutContractError("env_mask", "no tool mask was built for this batch")
            output["tool_mask"] = self._tmpl_batch_mask
        finally:
            self._tmpl_inputs = None
            self._tmpl_batch_mask = None
            self._tmpl_scoring_mask = None
        return output

    def _generate(self, prompts: list) -> tuple[list[list[int]], list[list[int]], list]:
        if getattr(self, "use_vllm", False) and self.state.global_step != self._last_loaded_step:
            self.vllm_generation.sync_weights()  # as GRPOTrainer does before calling its rollout_func
            self._last_loaded_step = self.state.global_step
        output = self.rollout_func(prompts, self)
        prompt_ids, completion_ids, env_mask = _check_output(output, len(prompts))
        self._merge_reward_fields(output)

        width = max(len(ids) for ids in completion_ids)
        multiple = getattr(self, "pad_to_multiple_of", None)
        if multiple:
            width = -(-width // multiple) * multiple
        mask = torch.ones((len(env_mask), width), dtype=torch.long)
        for i, row in enumerate(env_mask):
            mask[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        self._tmpl_batch_mask = self._tmpl_scoring_mask = mask.to(self.accelerator.device)

        contents = self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        if prompts and isinstance(prompts[0], list):
            completions: list = [[{"role": "assistant", "content": c}] for c in contents]
        else:
            completions = contents
        self._log_lengths(prompt_ids, completion_ids, env_mask)
        return prompt_ids, completion_ids, completions

    def _merge_reward_fields(self, output: dict[str, Any]) -> None:
        """Extra keys reach the reward functions through the batch's inputs, as in GRPOTrainer."""
        inputs = self._tmpl_inputs or []
        for key, values in output.items():
            if key in _REQUIRED or key in ("env_mask", "logprob_token_ids"):
                continue
            for i, row in enumerate(inputs):
                row[key] = values[i] if isinstance(values, list) else values

    def _log_lengths(
        self, prompt_ids: list[list[int]], completion_ids: list[list[int]], env_mask: list[list[int]]
    ) -> None:
        device = self.accelerator.device
        mode = "train" if self.model.training else "eval"
        prompt_lengths = self.accelerator.gather(torch.tensor([len(p) for p in prompt_ids], device=device))
        model_tokens = self.accelerator.gather(torch.tensor([sum(m) for m in env_mask], device=device)).float()
        if mode == "train":
            self.state.num_input_tokens_seen += int(prompt_lengths.sum().item() + model_tokens.sum().item())
        metrics = self._metrics[mode]
        metrics["num_tokens"] = [self.state.num_input_tokens_seen]
        metrics["completions/mean_length"].append(model_tokens.mean().item())
        metrics["completions/min_length"].append(model_tokens.min().item())
        metrics["completions/max_length"].append(model_tokens.max().item())
        ends = [*self.eos_token_ids, self._tokenizer.pad_token_id]
        clipped = torch.tensor([float(ids[-1] not in ends) for ids in completion_ids], device=device)
        metrics["completions/clipped_ratio"].append(self.accelerator.gather(clipped).mean().item())

    # -- masking appended tokens -----------------------------------------------------------------
    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        self._tmpl_scoring_mask = inputs.get("tool_mask")
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._tmpl_scoring_mask = None

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        *args: Any,
        **kwargs: Any,
    ):
        logps, entropies, *rest = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )
        mask = self._tmpl_scoring_mask
        if mask is not None:
            if tuple(mask.shape) != tuple(logps.shape):
                raise RolloutContractError(
                    "env_mask",
                    f"tool mask of shape {tuple(mask.shape)} does not match the scored completions "
                    f"{tuple(logps.shape)}",
                )
            logps = logps * mask.to(logps.dtype)
            if entropies is not None:
                entropies = entropies * mask.to(entropies.dtype)
        return (logps, entropies, *rest)


def _check_output(output: Any, n: int) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """The rows of a rollout_func output, checked against TRL's contract."""
    if not isinstance(output, dict):
        raise RolloutContractError("<output>", f"must be a dict, got {type(output).__name__}")
    missing = [k for k in _REQUIRED if k not in output]
    if missing:
        raise RolloutContractError(missing[0], f"missing (required keys: {', '.join(_REQUIRED)})")
    prompt_ids, completion_ids = output["prompt_ids"], output["completion_ids"]
    env_mask = output.get("env_mask") or [[1] * len(ids) for ids in completion_ids]
    for key, rows in (("prompt_ids", prompt_ids), ("completion_ids", completion_ids), ("env_mask", env_mask)):
        if len(rows) != n:
            raise RolloutContractError(key, f"{len(rows)} rows for {n} prompts (one completion per prompt received)")
    for i, (ids, mask) in enumerate(zip(completion_ids, env_mask)):
        if not ids:
            raise RolloutContractError("completion_ids", f"row {i} is empty (TRL reads every completion's last token)")
        if len(mask) != len(ids):
            raise RolloutContractError("env_mask", f"row {i} has {len(mask)} entries for {len(ids)} completion tokens")
    return [list(p) for p in prompt_ids], [list(c) for c in completion_ids], [list(m) for m in env_mask]
