"""Rollout results as what ``rollout_func`` returns to TRL (:func:`to_trl_output`: the ID, logprob and mask
lists and the reward columns, :data:`REWARD_KEYS`, :data:`ENV_KEYS`), one row per sample or per training
sequence, and the rollout's metrics logged to the trainer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import TrainerConfigError
from ...rollout.loop import RolloutResult
from ...rollout.metrics import RolloutMetrics

#: Keys this function adds for the reward functions (besides TRL's required ones and env_mask).
REWARD_KEYS: tuple[str, ...] = (
    "messages",
    "tool_results",
    "status",
    "reason",
    "turns",
    "tool_calls",
    "tool_failures",
    "rollout_metrics",
)


#: Keys added with environments (``env_factory`` / ``environment_factory``), one value per sample.
ENV_KEYS: tuple[str, ...] = ("environments", "env_reward")


def to_trl_output(
    results: Sequence[RolloutResult],
    metrics: RolloutMetrics,
    conversations: Sequence[Sequence[Mapping[str, Any]]],
    *,
    fill_id: int,
    mask_aborted: bool = True,
    mask_truncated: bool = False,
    rows: bool = False,
    trainer: str = "GRPOTrainer",
) -> dict[str, Any]:
    """TRL's ``rollout_func`` output for finished rollouts (one row per result, in order).

    A completion that holds no token (a sample aborted before its first token) becomes one
    ``fill_id`` token with ``env_mask`` 0, because TRL reads every completion's last token.
    With ``mask_aborted`` (``mask_truncated``), an ABORTED (TRUNCATED) completion's ``env_mask``
    is all 0: it keeps its place in its group but adds nothing to the loss.

    ``rows=True`` (a trainer that takes several rows per sample, :class:`ToolRLOOTrainer`): one row per
    training sequence (``result.rows()``: the sequence's prompt up to its first sampled token, its
    completion, its loss mask as ``env_mask``) and ``sample_index``, the sample of each row; the reward
    keys stay one per sample. ``rows=False`` (GRPOTrainer): a sample with several sequences (template
    mode, ``edit_history``, sub-agents) raises TrainerConfigError rather than losing all but one.

    >>> out = to_trl_output(results, metrics, conversations, fill_id=0, rows=True)   # doctest: +SKIP
    >>> out["sample_index"], len(out["status"])                                      # doctest: +SKIP
    ([0, 0, 1], 2)
    """
    out: dict[str, Any] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}
    sample_index: list[int] = []
    extras: dict[str, list[Any]] = {k: [] for k in REWARD_KEYS if k != "rollout_metrics"}
    for i, (r, conversation) in enumerate(zip(results, conversations)):
        off = (mask_aborted and r.status.name == "ABORTED") or (mask_truncated and r.status.name == "TRUNCATED")
        for prompt, ids, mask, logprobs in _sample_rows(r, i, fill_id, rows=rows, trainer=trainer):
            out["prompt_ids"].append(prompt)
            out["completion_ids"].append(ids)
            out["logprobs"].append(logprobs)
            out["env_mask"].append([0] * len(mask) if off else mask)
            sample_index.append(i)
        extras["messages"].append(r.messages)
        extras["tool_results"].append([m for m in r.messages[len(conversation) :] if m.get("role") == "tool"])
        extras["status"].append(r.status.name)
        extras["reason"].append(r.reason)
        extras["turns"].append(r.turns)
        extras["tool_calls"].append(r.tool_calls)
        extras["tool_failures"].append(r.tool_failures)
    if rows:
        out["sample_index"] = sample_index
    out.update(extras)
    out["rollout_metrics"] = metrics.to_dict()
    return out


def _sample_rows(
    r: RolloutResult, i: int, fill_id: int, *, rows: bool, trainer: str
) -> list[tuple[list[int], list[int], list[int], list[float]]]:
    """A sample's rows: ``(prompt_ids, completion_ids, env_mask, logprobs)``, one per training sequence."""
    if r.from_calls:
        sequences = r.rows()
        if len(sequences) > 1 and not rows:
            kinds = ", ".join(f"{row.sequence.index}: {row.sequence.branch}" for row in sequences)
            raise TrainerConfigError(
                trainer,
                "rollout_func",
                f"sample {i} (conversation {r.index}, sample {r.sample}) has {len(sequences)} training sequences "
                f"({kinds}); {trainer} trains one completion per prompt and would lose all but one. Use "
                "tmpl.integrations.trl.ToolRLOOTrainer, which trains one row per sequence with the sample's "
                "advantage, or Rollout(history='append') without edit_history or sub-agents",
            )
        if sequences:
            return [
                (
                    row.trajectory.prompt_ids.tolist(),
                    row.trajectory.completion_ids.tolist(),
                    row.loss_mask.astype(int).tolist(),
                    row.trajectory.logprobs.tolist(),
                )
                for row in sequences
            ]
    ids, mask, logprobs = r.completion_ids.tolist(), r.mask.tolist(), r.logprobs.tolist()
    if not ids:
        ids, mask, logprobs = [fill_id], [0], [0.0]
    return [(r.prompt_ids.tolist(), ids, mask, logprobs)]


def _log(trainer: Any, metrics: RolloutMetrics) -> None:
    """Add the rollout's metrics to the trainer's logged metrics (TRL averages them per logging step)."""
    store = getattr(trainer, "_metrics", None)
    if not isinstance(store, dict):
        return
    model = getattr(trainer, "model", None)
    mode = "train" if getattr(model, "training", True) else "eval"
    bucket = store.get(mode)
    if bucket is None:
        return
    for key, value in metrics.to_dict(prefix="tmpl/").items():
        bucket.setdefault(key, []).append(value)
