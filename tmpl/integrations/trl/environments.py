"""What TRL's reward functions get of environments: :func:`env_reward` (a reward function of the summed rewards)
and :func:`env_tasks` (each environment's task from its prompt)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def env_reward(env_reward: Sequence[float | None], **kwargs: Any) -> list[float | None]:  # noqa: ARG001 - TRL passes every column
    """A TRL reward function: each completion's environment reward (None where its environment gave none,
    which TRL leaves out of that completion's reward). Use with ``make_rollout_func(env_factory=...)`` or
    ``environment_factory=...``.

    >>> env_reward([1.0, None], completions=["a", "b"])
    [1.0, None]
    """
    return [None if r is None else float(r) for r in env_reward]


def env_tasks(conversations: Sequence[Sequence[Mapping[str, Any]]], trainer: Any) -> list[dict[str, Any]]:
    """Each completion's environment task: its dataset row where the trainer gives it (ToolRLOOTrainer keeps
    the batch's rows), else ``{"prompt": conversation}`` (GRPOTrainer hands a rollout_func the prompts only)."""
    rows = getattr(trainer, "_tmpl_inputs", None)
    if isinstance(rows, list) and len(rows) == len(conversations):
        return [{**row, "prompt": list(conv)} for row, conv in zip(rows, conversations)]
    return [{"prompt": list(conv)} for conv in conversations]


def _first_assistant(messages: Sequence[Mapping[str, Any]]) -> int:
    return next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
