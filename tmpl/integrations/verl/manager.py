"""verl's V1 agent-loop manager, with a reward batch laid out the way verl's reward managers read it.

verl 0.9.1's V1 trainer (``trainer.use_v1=true``, its default) lets an agent loop return several
``AgentLoopOutput`` per sample (``AgentLoopWorkerTQ._agent_loop_postprocess``): it scores them in
one batch (``AgentLoopWorker._compute_score``) whose prompts, responses and attention masks are each
padded on the right, while its reward managers find the last output's response length as
``attention_mask[-response_length:].sum()`` (``NaiveRewardManager.run_single``, the reward model's
``_preprocess_reward_inputs``), which assumes left-padded prompts. With outputs of different lengths
the reward function then reads the last response with pad tokens after it, or cut short.

:class:`TmplAgentLoopWorker` gives that batch prompts left-padded to one width (the rows otherwise
as they are), so every response is read whole; the score lands on the outputs as verl's own does.
:class:`TmplAgentLoopManager` is verl's manager with that worker: name it in the config when
``tmpl_tool_agent`` returns several training sequences per sample (template mode, ``edit_history``,
sub-agents)::

    actor_rollout_ref.rollout.agent.agent_loop_manager_class=tmpl.integrations.verl.TmplAgentLoopManager

It needs TransferQueue (``pip install transferqueue``), as verl's V1 trainer does; without it, using
these classes raises :class:`tmpl.errors.TrainerConfigError`.
"""

from __future__ import annotations

from typing import Any

from ...errors import TrainerConfigError

__all__ = ["TmplAgentLoopManager", "TmplAgentLoopWorker", "reward_batch_outputs"]

TQ_INSTALL = "pip install transferqueue==0.1.11 (verl 0.9.1's V1 trainer)"

try:
    from verl.trainer.ppo.v1 import agent_loop_tq
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ
except ImportError as exc:  # verl's V1 trainer imports TransferQueue
    _MISSING: ImportError | None = exc
else:
    _MISSING = None


def reward_batch_outputs(outputs: list[Any], pad_id: int) -> list[Any]:
    """``outputs`` with their prompts left-padded with ``pad_id`` to the longest one's length (shallow
    copies sharing ``extra_fields`` and ``metrics``): verl's reward batch then reads every response whole.

    >>> from types import SimpleNamespace as O   # stands in for AgentLoopOutput's model_copy
    >>> class Out(O):
    ...     def model_copy(self, update):
    ...         return Out(**{**vars(self), **update})
    >>> [o.prompt_ids for o in reward_batch_outputs([Out(prompt_ids=[5]), Out(prompt_ids=[6, 7])], 0)]
    [[0, 5], [6, 7]]
    """
    width = max(len(o.prompt_ids) for o in outputs)
    return [
        o.model_copy(update={"prompt_ids": [pad_id] * (width - len(o.prompt_ids)) + list(o.prompt_ids)})
        for o in outputs
    ]


if _MISSING is None:

    class TmplAgentLoopWorker(AgentLoopWorkerTQ.__ray_actor_class__):  # type: ignore[misc]
        """verl's V1 agent-loop worker whose reward batch of several outputs reads each response whole."""

        async def _compute_score(self, outputs: list[Any], kwargs: dict[str, Any]) -> None:
            if len(outputs) < 2 or outputs[-1].reward_score is not None:
                await super()._compute_score(outputs, kwargs=kwargs)
                return
            pad = self.tokenizer.pad_token_id
            padded = reward_batch_outputs(outputs, 0 if pad is None else int(pad))
            await super()._compute_score(padded, kwargs=kwargs)
            # reward_extra_info and the timing went to the shared extra_fields and metrics; the score:
            outputs[-1].reward_score = padded[-1].reward_score

    class TmplAgentLoopManager(AgentLoopManagerTQ):  # type: ignore[misc]
        """verl's V1 agent-loop manager with :class:`TmplAgentLoopWorker` workers."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.agent_loop_workers_class = _REMOTE_WORKER

    _REMOTE_WORKER = agent_loop_tq.ray.remote(TmplAgentLoopWorker)  # Ray, as verl's module has it (verl brings it)

else:

    def __getattr__(name: str) -> Any:
        if name in ("TmplAgentLoopManager", "TmplAgentLoopWorker"):
            raise TrainerConfigError(
                "verl",
                "trainer.use_v1",
                f"verl's V1 trainer needs TransferQueue, not importable here ({_MISSING}): {TQ_INSTALL}",
            )
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
