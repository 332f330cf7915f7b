"""``ToolRLOOTrainer``: TRL's ``RLOOTrainer`` with a ``rollout_func`` (GRPO's contract), a tool mask, and one
row per training sequence.

>>> from tmpl.integrations.trl import ToolRLOOTrainer, make_rollout_func
>>> trainer = ToolRLOOTrainer(model=model, args=RLOOConfig(...), reward_funcs=reward, train_dataset=ds,
...                           rollout_func=make_rollout_func(tools=[get_weather], max_turns=4))  # doctest: +SKIP
>>> trainer.train()                                                                              # doctest: +SKIP

TRL's ``RLOOTrainer`` (1.16) generates one turn and has neither ``tools`` nor ``rollout_func``.
This subclass changes these methods:

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

**Several rows per sample** (``Rollout(history="template")``, an ``edit_history`` hook, sub-agents: a
sample whose episode has several training sequences). The trainer says ``takes_sequence_rows = True``, so
:func:`make_rollout_func` returns one row per sequence (its prompt up to its first sampled token, its
completion, its loss mask as ``env_mask``) and ``sample_index``, the prompt slot of each row; the reward
keys stay one per sample. When some sample of the batch (on any process) has more than one row, the batch
is scored here instead of by ``RLOOTrainer._generate_and_score_completions``, with this reward routing:

- the reward functions run once per **sample** (``prompts``, ``messages``, ``status``... one per prompt
  slot; ``completions``/``completion_ids`` are the sample's last row's), weighted and clipped as RLOO does;
- the KL penalty ``beta * KL`` is the sample's: the sum of ``old - ref`` over the model tokens of all its
  rows;
- the baseline is over **samples**: the ``num_generations`` consecutive samples of a prompt, leave-one-out
  (:func:`tmpl.episode.advantages.sample_advantages`, ``estimator="rloo"``), never over rows or turns;
  samples every reward function left unscored (None) are out of the baseline with advantage 0, as in TRL;
  ``normalize_advantages`` normalizes over the samples;
- each row of a sample gets that sample's advantage; its ratio is over its own loss mask (the tokens
  sampled in it, each sampled token in exactly one row's mask);
- the loss of a micro-batch is the **sum** of its rows' losses divided by ``per_device_train_batch_size``
  (the samples a micro-batch holds with one row each; RLOO's mean, which a batch of one row per sample
  still gets exactly), so an optimizer step's gradient is the mean over samples of the sum over each
  sample's rows: on policy, the gradient of one row holding all of the sample's sampled tokens;
- the row count is padded to a multiple of ``steps_per_generation`` with filler rows (a prompt, no
  completion token, advantage 0, ``sample_index`` -1) that add exactly 0, because TRL's
  ``split_tensor_dict`` drops the remainder; rows are shuffled and split as TRL does, so rows of one
  sample may land in different micro-batches (with ``steps_per_generation > gradient_accumulation_steps``
  in different optimizer steps, as samples already do). PPO's clipping acts on each row's ratio.

Batches where every sample has one row go through RLOO's own scoring, unchanged. Image prompts with
several rows per sample raise :class:`tmpl.errors.TrainerConfigError`.

Limits: RLOO's logged ``kl`` and ``entropy`` are averages over all completion tokens, so with
appended tokens counting as 0 they read lower than the averages over model tokens; the loss and
the KL penalty in the rewards are exact. ``rollout_func`` logprobs are not used (RLOO
recomputes old logprobs with the training model).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from trl import RLOOTrainer

from ...episode.advantages import sample_advantages
from ...errors import RolloutContractError, TrainerConfigError

_REQUIRED = ("prompt_ids", "completion_ids", "logprobs")
#: keys of a rollout_func output that are not reward-function arguments
_ROW_KEYS = (*_REQUIRED, "env_mask", "logprob_token_ids", "sample_index")


@dataclass
class _Rows:
    """A checked rollout_func output: one entry per row; ``sample_index[r]`` is row r's prompt slot."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    env_mask: list[list[int]]
    sample_index: list[int]
    samples: int

    @property
    def several(self) -> bool:
        """Some sample has more than one row."""
        return len(self.sample_index) != self.samples


class ToolRLOOTrainer(RLOOTrainer):
    """``RLOOTrainer`` whose generation goes through ``rollout_func`` (e.g. tmpl's multi-turn tool rollout).

    Takes every argument of ``RLOOTrainer`` plus ``rollout_func`` (required), with the contract of
    ``GRPOTrainer(rollout_func=...)``: :func:`tmpl.integrations.trl.make_rollout_func` builds one. A
    sample with several training sequences trains one row per sequence (see the module docstring).

    >>> ToolRLOOTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", args=RLOOConfig(output_dir="out"),
    ...                 reward_funcs=reward, train_dataset=ds,
    ...                 rollout_func=make_rollout_func(tools=[get_weather])).train()   # doctest: +SKIP
    """

    #: read by make_rollout_func: return one row per training sequence, with ``sample_index``
    takes_sequence_rows = True

    def __init__(self, *args: Any, rollout_func: Any, **kwargs: Any) -> None:
        if not callable(rollout_func):
            raise TypeError(f"ToolRLOOTrainer needs a callable rollout_func, got {type(rollout_func).__name__}")
        super().__init__(*args, **kwargs)
        self.rollout_func = rollout_func
        self._tmpl_inputs: list[dict[str, Any]] | None = None
        self._tmpl_rows: _Rows | None = None  # the rollout of this batch, when run before RLOO's scoring
        self._tmpl_completions: list[Any] = []  # per row, as TRL passes completions to reward functions
        self._tmpl_batch_mask: torch.Tensor | None = None  # tool mask of the generation batch being built
        self._tmpl_scoring_mask: torch.Tensor | None = None  # tool mask applied to the logprobs computed now

    # -- generation ------------------------------------------------------------------------------
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._tmpl_inputs = inputs
        try:
            if "images" in inputs[0] or "image" in inputs[0]:
                output = super()._generate_and_score_completions(inputs)  # its _generate runs the rollout
            else:
                prompts = [x["prompt"] for x in inputs]
                rows = self._rollout(prompts)
                flag = torch.tensor([int(rows.several)], device=self.accelerator.device)
                if bool(self.accelerator.gather(flag).any().item()):  # every process scores the same way
                    output = self._score_rows(inputs, prompts, rows)
                else:
                    self._tmpl_rows = rows
                    output = super()._generate_and_score_completions(inputs)
            if self._tmpl_batch_mask is None:  # pragma: no cover - _rollout always sets it
                raise RolloutContractError("env_mask", "no tool mask was built for this batch")
            output["tool_mask"] = self._tmpl_batch_mask
            _pad_rows(output, self.args.steps_per_generation if self.model.training else 1)
        finally:
            self._tmpl_inputs = None
            self._tmpl_rows = None
            self._tmpl_batch_mask = None
            self._tmpl_scoring_mask = None
        return output

    def _generate(self, prompts: list) -> tuple[list[list[int]], list[list[int]], list]:
        rows = self._tmpl_rows if self._tmpl_rows is not None else self._rollout(prompts)
        self._tmpl_rows = None
        if rows.several:
            raise TrainerConfigError(
                type(self).__name__,
                "train_dataset",
                "prompts with images whose samples have several training sequences "
                f"(rows per sample {_counts(rows)}): only text prompts train one row per sequence",
            )
        return rows.prompt_ids, rows.completion_ids, self._tmpl_completions

    def _rollout(self, prompts: list) -> _Rows:
        """Run ``rollout_func`` on the prompts, check its rows, build the tool mask, log lengths."""
        if getattr(self, "use_vllm", False) and self.state.global_step != self._last_loaded_step:
            self.vllm_generation.sync_weights()  # as GRPOTrainer does before calling its rollout_func
            self._last_loaded_step = self.state.global_step
        output = self.rollout_func(prompts, self)
        rows = _check_output(output, len(prompts))
        self._merge_reward_fields(output)

        width = max(len(ids) for ids in rows.completion_ids)
        multiple = getattr(self, "pad_to_multiple_of", None)
        if multiple:
            width = -(-width // multiple) * multiple
        mask = torch.ones((len(rows.env_mask), width), dtype=torch.long)
        for i, row in enumerate(rows.env_mask):
            mask[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        self._tmpl_batch_mask = self._tmpl_scoring_mask = mask.to(self.accelerator.device)

        contents = self.processing_class.batch_decode(rows.completion_ids, skip_special_tokens=True)
        if prompts and isinstance(prompts[0], list):
            self._tmpl_completions = [[{"role": "assistant", "content": c}] for c in contents]
        else:
            self._tmpl_completions = list(contents)
        self._log_lengths(rows)
        return rows

    def _merge_reward_fields(self, output: dict[str, Any]) -> None:
        """Extra keys reach the reward functions through the batch's inputs, as in GRPOTrainer."""
        inputs = self._tmpl_inputs or []
        for key, values in output.items():
            if key in _ROW_KEYS:
                continue
            for i, row in enumerate(inputs):
                row[key] = values[i] if isinstance(values, list) else values

    def _log_lengths(self, rows: _Rows) -> None:
        """Completion lengths per sample, counting model tokens of all its rows (as RLOO logs them per completion)."""
        device = self.accelerator.device
        mode = "train" if self.model.training else "eval"
        index = torch.tensor(rows.sample_index, device=device)
        per_row = torch.tensor([float(sum(m)) for m in rows.env_mask], device=device)
        model_tokens = torch.zeros(rows.samples, device=device).index_add_(0, index, per_row)
        prompts = torch.zeros(rows.samples, device=device).index_add_(
            0, index, torch.tensor([float(len(p)) for p in rows.prompt_ids], device=device)
        )
        ends = [*self.eos_token_ids, self._tokenizer.pad_token_id]
        last = {s: r for r, s in enumerate(rows.sample_index)}  # each sample's last row
        clipped = torch.tensor([float(rows.completion_ids[last[s]][-1] not in ends) for s in range(rows.samples)])
        prompts, model_tokens = self.accelerator.gather(prompts), self.accelerator.gather(model_tokens)
        if mode == "train":
            self.state.num_input_tokens_seen += int(prompts.sum().item() + model_tokens.sum().item())
        metrics = self._metrics[mode]
        metrics["num_tokens"] = [self.state.num_input_tokens_seen]
        metrics["completions/mean_length"].append(model_tokens.mean().item())
        metrics["completions/min_length"].append(model_tokens.min().item())
        metrics["completions/max_length"].append(model_tokens.max().item())
        metrics["completions/clipped_ratio"].append(self.accelerator.gather(clipped.to(device)).mean().item())

    # -- several rows per sample ----------------------------------------------------------------
    def _score_rows(self, inputs: list[dict[str, Any]], prompts: list, rows: _Rows) -> dict[str, Any]:
        """RLOO's scoring with several rows per sample: rewards and KL per sample, baseline over samples."""
        from trl.trainer.utils import pad

        device = self.accelerator.device
        mode = "train" if self.model.training else "eval"
        pad_id = self._tokenizer.pad_token_id
        multiple = getattr(self, "pad_to_multiple_of", None)
        index = torch.tensor(rows.sample_index, dtype=torch.long, device=device)

        def padded(seqs: list[list[int]], value: int, side: str) -> torch.Tensor:
            return pad([torch.tensor(x, dtype=torch.long) for x in seqs], value, side, multiple).to(device)

        prompt_ids = padded(rows.prompt_ids, pad_id, "left")
        prompt_mask = padded([[1] * len(x) for x in rows.prompt_ids], 0, "left")
        completion_ids = padded(rows.completion_ids, pad_id, "right")
        completion_mask = padded([[1] * len(x) for x in rows.completion_ids], 0, "right")
        if self.mask_truncated_completions:
            ends = [*self.eos_token_ids, pad_id]
            cut = torch.tensor([ids[-1] not in ends for ids in rows.completion_ids], device=device)
            completion_mask = completion_mask * (~cut).unsqueeze(1).long()
        ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention = torch.cat([prompt_mask, completion_mask], dim=1)
        width = completion_ids.size(1)
        batch_size = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size

        with torch.no_grad(), _no_checkpointing(self):
            old_token_logps = self._get_per_token_logps_and_entropies(self.model, ids, attention, width, batch_size)[0]
            old_logps = (old_token_logps * completion_mask).sum(1)
            ref_token_logps = self._reference_logps(ids, attention, width, batch_size) if self.beta != 0.0 else None

        # the reward functions see one entry per sample: its prompt, its last row's completion
        last = [max(r for r, s in enumerate(rows.sample_index) if s == k) for k in range(rows.samples)]
        completions = [self._tmpl_completions[r] for r in last]
        rewards_per_func = self._calculate_rewards(inputs, prompts, completions, [rows.completion_ids[r] for r in last])
        unscored = torch.isnan(rewards_per_func).all(dim=1)
        rewards = (rewards_per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)
        rewards[unscored] = torch.nan
        if self.reward_clip_range:
            rewards = rewards.clamp(min=self.reward_clip_range[0], max=self.reward_clip_range[1])
        if ref_token_logps is not None:
            token_kl = old_token_logps - ref_token_logps
            row_kl = (token_kl * completion_mask).sum(-1)
            sample_kl = torch.zeros(rows.samples, dtype=row_kl.dtype, device=device).index_add_(0, index, row_kl)
            rewards = rewards - self.beta * self.accelerator.gather(sample_kl)  # a sample's KL: all its rows
            stats = torch.stack([(token_kl * completion_mask).sum(), completion_mask.sum().float()])
            stats = self.accelerator.reduce(stats, reduction="sum")
            self._metrics[mode]["kl"].append((stats[0] / stats[1].clamp(min=1.0)).item())

        group = self.num_generations if mode == "train" else self.num_generations_eval
        advantages = torch.tensor(
            _group_advantages(rewards.cpu().double().numpy(), group, normalize=bool(self.normalize_advantages)),
            dtype=torch.float32,
            device=device,
        )
        here = slice(self.accelerator.process_index * rows.samples, (self.accelerator.process_index + 1) * rows.samples)
        row_advantages = advantages[here][index]  # each row: its sample's advantage

        grouped = rewards.view(-1, group)
        counts = (~torch.isnan(grouped)).sum(dim=1)
        mean = torch.nanmean(grouped, dim=1, keepdim=True)
        spread = torch.nansum((grouped - mean) ** 2, dim=1) / (counts - 1).clamp(min=1)
        metrics = self._metrics[mode]
        for i, name in enumerate(self.reward_func_names):
            column = rewards_per_func[:, i]
            metrics[f"rewards/{name}/mean"].append(torch.nanmean(column).item())
            metrics[f"rewards/{name}/std"].append(_nanstd(column))
        scored = (rewards_per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)
        scored[unscored] = torch.nan
        metrics["reward"].append(torch.nanmean(scored).item())
        metrics["reward_std"].append(_nanstd(scored))
        metrics["frac_reward_zero_std"].append(torch.isclose(spread, torch.zeros_like(spread)).float().mean().item())
        self._logs["prompt"].extend(self._gather_objects(prompts))
        self._logs["completion"].extend(self._gather_objects(completions))
        for i, name in enumerate(self.reward_func_names):
            self._logs["rewards"][name].extend(rewards_per_func[:, i].tolist())
        self._logs["advantages"].extend(advantages.tolist())
        self._flush_pending(rows.samples)
        return {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": completion_ids,
            "completion_mask": completion_mask,
            "old_logps": old_logps,
            "advantages": row_advantages,
            "sample_index": index,
        }

    def _gather_objects(self, values: list[Any]) -> list[Any]:
        """Every process's ``values``, concatenated in process order (one process: ``values``)."""
        processes = self.accelerator.num_processes
        if processes == 1:
            return list(values)
        parts: list[Any] = [None] * processes
        torch.distributed.all_gather_object(parts, list(values))
        return [v for part in parts for v in part]

    def _reference_logps(self, ids: torch.Tensor, attention: torch.Tensor, width: int, batch_size: int) -> torch.Tensor:
        """Per-token logprobs of the reference model (or of the base weights under a PEFT adapter), tool-masked."""
        if self.ref_model is not None:
            return self._get_per_token_logps_and_entropies(self.ref_model, ids, attention, width, batch_size)[0]
        from trl.trainer.utils import use_adapter

        model = self.accelerator.unwrap_model(self.model)
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            return self._get_per_token_logps_and_entropies(self.model, ids, attention, width, batch_size)[0]

    def _flush_pending(self, samples: int) -> None:
        """What reward functions logged with ``log_extra``/``log_metric``, gathered as RLOO's scoring does."""
        gather_object = self._gather_objects
        extra = getattr(self, "_pending_extra_logs", None)
        if extra is not None:
            for column in sorted(set(gather_object(list(extra)))):
                self._logs["extra"][column].extend(gather_object(extra.get(column, [None] * samples)))
            extra.clear()
        pending = getattr(self, "_pending_metrics", None)
        if pending is not None:
            mode = "train" if self.model.training else "eval"
            for name in sorted(set(gather_object(list(pending)))):
                values = pending.get(name, [])
                local = torch.tensor([sum(values), len(values)], dtype=torch.float32, device=self.accelerator.device)
                total, count = self.accelerator.gather(local).view(-1, 2).sum(dim=0).tolist()
                self._metrics[mode][name].append(total / count)
            pending.clear()

    # -- masking appended tokens -----------------------------------------------------------------
    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        self._tmpl_scoring_mask = inputs.get("tool_mask")
        if "sample_index" in inputs:
            # RLOO takes the mean of the row losses; the sum over per_device_train_batch_size (the samples of a
            # micro-batch) is wanted: the advantages times rows/samples give it (each row's loss is linear in it)
            rows = inputs["advantages"].size(0)
            per = self.args.per_device_train_batch_size if self.model.training else self.args.per_device_eval_batch_size
            inputs = {**inputs, "advantages": inputs["advantages"] * (rows / per)}
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


def _no_checkpointing(trainer: Any) -> Any:
    """TRL's context that turns gradient checkpointing off for a no-grad pass (a no-op where TRL has none)."""
    try:
        from trl.models.utils import disable_gradient_checkpointing
    except ImportError:  # pragma: no cover - TRL before it
        return contextlib.nullcontext()
    return disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs)


def _nanstd(values: torch.Tensor) -> float:
    """Standard deviation (n - 1) over the non-NaN values, as TRL logs it (NaN for fewer than two)."""
    kept = values[~torch.isnan(values)].double()
    return float(kept.std().item()) if kept.numel() > 1 else float("nan")


def _group_advantages(rewards: np.ndarray, group: int, *, normalize: bool) -> np.ndarray:
    """RLOO advantages per sample: leave-one-out over the scored samples of each group of ``group``.

    A sample no reward function scored (NaN) is out of its group's baseline; it and a group with fewer than
    two scored samples get 0 (TRL's rule). ``normalize``: RLOO's ``normalize_advantages`` over the scored.

    >>> _group_advantages(np.array([1.0, 0.0, 0.5, float("nan")]), 2, normalize=False).tolist()
    [1.0, -1.0, 0.0, 0.0]
    """
    out = np.full(len(rewards), np.nan)
    for start in range(0, len(rewards), group):
        block = rewards[start : start + group]
        scored = np.flatnonzero(~np.isnan(block))
        if len(scored) >= 2:
            out[start + scored] = sample_advantages(block[scored], estimator="rloo")
    if normalize:
        kept = out[~np.isnan(out)]
        if len(kept):
            spread = float(kept.std(ddof=1)) if len(kept) > 1 else float("nan")
            out = (out - kept.mean()) / (spread + 1e-4)
    return np.nan_to_num(out, nan=0.0)


def _pad_rows(output: dict[str, Any], multiple: int) -> None:
    """Filler rows up to a multiple of ``multiple`` (TRL's split_tensor_dict drops a remainder): the first
    row's prompt, no completion token (completion_mask 0), advantage 0, sample_index -1; they add exactly 0."""
    if "sample_index" not in output:
        return
    extra = (-output["sample_index"].size(0)) % multiple
    if not extra:
        return
    fill = {
        "prompt_ids": output["prompt_ids"][:1],
        "prompt_mask": output["prompt_mask"][:1],
        "completion_ids": output["completion_ids"][:1],
        "completion_mask": torch.zeros_like(output["completion_mask"][:1]),
        "old_logps": torch.zeros_like(output["old_logps"][:1]),
        "advantages": torch.zeros_like(output["advantages"][:1]),
        "sample_index": torch.full_like(output["sample_index"][:1], -1),
        "tool_mask": torch.ones_like(output["tool_mask"][:1]),
    }
    for key, row in fill.items():
        output[key] = torch.cat([output[key], row.expand(extra, *row.shape[1:])])


def _counts(rows: _Rows) -> list[int]:
    return [rows.sample_index.count(k) for k in range(rows.samples)]


def _check_output(output: Any, n: int) -> _Rows:
    """The rows of a rollout_func output, checked against TRL's contract (and ``sample_index``, when given)."""
    if not isinstance(output, dict):
        raise RolloutContractError("<output>", f"must be a dict, got {type(output).__name__}")
    missing = [k for k in _REQUIRED if k not in output]
    if missing:
        raise RolloutContractError(missing[0], f"missing (required keys: {', '.join(_REQUIRED)})")
    prompt_ids, completion_ids = output["prompt_ids"], output["completion_ids"]
    env_mask = output.get("env_mask") or [[1] * len(ids) for ids in completion_ids]
    index = output.get("sample_index")
    if index is None:
        index, per = list(range(n)), f"{n} prompts (one completion per prompt received)"
    else:
        index = [int(k) for k in index]
        if any(not 0 <= k < n for k in index) or index != sorted(index) or set(index) != set(range(n)):
            raise RolloutContractError(
                "sample_index",
                f"{index}: must name every one of the {n} prompts, each row's in order (rows of a sample together)",
            )
        per = f"{len(index)} rows in sample_index"
    for key, rows in (("prompt_ids", prompt_ids), ("completion_ids", completion_ids), ("env_mask", env_mask)):
        if len(rows) != len(index):
            raise RolloutContractError(key, f"{len(rows)} rows for {per}")
    for i, (ids, mask) in enumerate(zip(completion_ids, env_mask)):
        if not ids:
            raise RolloutContractError("completion_ids", f"row {i} is empty (TRL reads every completion's last token)")
        if len(mask) != len(ids):
            raise RolloutContractError("env_mask", f"row {i} has {len(mask)} entries for {len(ids)} completion tokens")
    return _Rows(
        [list(p) for p in prompt_ids], [list(c) for c in completion_ids], [list(m) for m in env_mask], index, n
    )
