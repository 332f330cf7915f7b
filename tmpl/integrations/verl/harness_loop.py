"""``tmpl_harness_agent``: a verl agent loop whose sample is one run of an agent harness through the gateway.

For each sample verl gives the loop, it makes a :class:`tmpl.harness.HarnessTask` (``tasks_from(kwargs)``,
``kwargs`` being the sample's fields: ``raw_prompt``, ``extra_info``, ``uid``...; default: the last user text
of ``raw_prompt``), serves a :class:`tmpl.gateway.Gateway` on the loop's template and on verl's own server
manager (:class:`~tmpl.integrations.verl.VerlServerBackend`: one sticky id per run, so the run's calls stay
on one engine server and reuse its prefix cache; verl's sampling settings, the per-call budget verl's
``response_length``), and runs the harness once (:class:`tmpl.harness.HarnessRollout`: a fresh session and
working directory, its process tree killed at its timeout, the verifier's reward).

Outputs per sequence, as for ``tmpl_tool_agent`` (:mod:`.agent_loop`): one ``AgentLoopOutput`` per training
sequence of the run's episode that trains a token, the main sequence last (several outputs need verl's V1
trainer, GRPO or GAE, and :class:`~tmpl.integrations.verl.TmplAgentLoopManager`: else the same
:class:`tmpl.errors.TrainerConfigError` names the sample). ``response_mask`` is the sequence's loss mask,
``response_logprobs`` its sampling logprobs; ``reward_score`` is the verifier's reward (verl then takes it
instead of calling its reward function), and ``extra_fields`` add ``harness_status``, ``harness_reward``,
``harness_reason``, ``harness_calls``, ``harness_seconds`` and ``harness_session``. A run without a recorded
call (``NO_CALLS``, ``SETUP_FAILED``...) is one output: the prompt rendered by the template, one stand-in
token outside the mask.

>>> from tmpl.integrations.verl import register_harness_agent                                   # doctest: +SKIP
>>> register_harness_agent(catalog.npm.HARNESSES["claude-code"], tasks_from=lambda s: HarnessTask(...))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput, _agent_loop_registry, register

from ...chat_template import ChatTemplate
from ...errors import TmplError, TrainerConfigError
from .agent_loop import ROW_ESTIMATORS, TmplToolAgentLoop, _is_tmpl_manager, _setting, training_rows
from .backend import VerlServerBackend

__all__ = ["TmplHarnessAgentLoop", "register_harness_agent", "task_from_sample"]


def task_from_sample(sample: Mapping[str, Any]) -> Any:
    """The default task of a verl sample: the last user text of its ``raw_prompt``, no verifier.

    >>> task_from_sample({"raw_prompt": [{"role": "user", "content": "Make hello.txt"}]}).prompt
    'Make hello.txt'
    """
    from ...harness import HarnessTask

    users = [m for m in sample.get("raw_prompt") or () if isinstance(m, Mapping) and m.get("role") == "user"]
    if not users:
        raise TrainerConfigError("verl", "raw_prompt", "the sample's raw_prompt has no user message for the harness")
    content = users[-1].get("content")
    if not isinstance(content, str):
        content = "".join(p.get("text", "") for p in content or () if isinstance(p, Mapping))
    return HarnessTask(content)


@register("tmpl_harness_agent")
class TmplHarnessAgentLoop(TmplToolAgentLoop):
    """verl agent loop: one harness run per sample (see the module docstring). Configure it with
    :func:`register_harness_agent`."""

    harness: Any = None
    tasks_from: Callable[[Mapping[str, Any]], Any] | None = None
    harness_options: dict[str, Any] = {}
    gateway_options: dict[str, Any] = {}

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        from ...gateway import Gateway
        from ...harness import HarnessRollout

        if self.harness is None:
            raise TrainerConfigError(
                "verl", "agent_name", "tmpl_harness_agent has no harness: register_harness_agent(...)"
            )
        if self.vision:
            raise TrainerConfigError("verl", "processor", "harness runs are text-only: images are not passed on")
        task = (type(self).tasks_from or task_from_sample)(kwargs)
        if task.id is None:
            sample = kwargs.get("uid") or kwargs.get("index")
            task = type(task)(task.prompt, task.files, task.verifier, id=f"verl-{sample}", timeout=task.timeout)
        config = self.rollout_config
        gateway = Gateway(
            self.template,  # text-only (vision refused above)
            VerlServerBackend(self.server_manager, sampling_params),
            max_tokens=int(config.response_length),
            max_context=int(config.prompt_length) + int(config.response_length),
            **self.gateway_options,
        )
        try:
            options = {"progress": False, **self.harness_options}
            [result] = await HarnessRollout(self.harness, gateway, n=1, concurrency=1, **options).arun([task])
        finally:
            gateway.close()
        episode = result.episode
        rows = training_rows(SimpleNamespace(sequences=episode.sequences)) if episode is not None else []  # type: ignore[arg-type]
        if episode is None or not rows:
            return self._stand_in(result, kwargs)
        if len(rows) > 1:
            self._check_harness_rows(result, rows, kwargs)
        outputs = [
            self._harness_output(result, seq, i, len(rows), len(episode.sequences)) for i, seq in enumerate(rows)
        ]
        return outputs[0] if len(outputs) == 1 else outputs

    def _harness_fields(self, result: Any) -> dict[str, Any]:
        return {
            "harness_status": result.status,
            "harness_reward": result.reward,
            "harness_reason": result.reason,
            "harness_calls": result.calls,
            "harness_seconds": result.seconds,
            "harness_session": result.session,
        }

    def _harness_output(self, result: Any, seq: Any, row: int, rows: int, sequences: int) -> AgentLoopOutput:
        p = seq.prompt_length
        extra = self._harness_fields(result)
        extra |= {"tmpl_sequence": seq.index, "tmpl_sequences": sequences, "tmpl_branch": str(seq.branch)}
        extra |= {
            "tmpl_agent": seq.agent,
            "tmpl_row": row,
            "tmpl_rows": rows,
            "tmpl_versions": seq.versions[p:].tolist(),
        }
        return AgentLoopOutput(
            prompt_ids=seq.ids[:p].tolist(),
            response_ids=seq.ids[p:].tolist(),
            response_mask=seq.mask[p:].astype(int).tolist(),
            response_logprobs=seq.logprobs[p:].tolist(),
            num_turns=len(seq.calls),
            metrics=AgentLoopMetrics(),
            reward_score=result.reward,
            extra_fields=extra,
        )

    def _stand_in(self, result: Any, kwargs: Mapping[str, Any]) -> AgentLoopOutput:
        """A run without calls keeps its sample's place: the prompt as rendered, one token outside the mask."""
        messages = [dict(m) for m in kwargs.get("raw_prompt") or [{"role": "user", "content": ""}]]
        extra = self._harness_fields(result)
        extra |= {"tmpl_sequence": 0, "tmpl_sequences": 0, "tmpl_branch": "none", "tmpl_agent": None}
        extra |= {"tmpl_row": 0, "tmpl_rows": 1, "tmpl_versions": [-1]}
        tpl = self.template
        assert isinstance(tpl, ChatTemplate)  # text-only: run() refuses a processor
        return AgentLoopOutput(
            prompt_ids=tpl.prompt_ids(messages),
            response_ids=[_stand_in_token(tpl)],
            response_mask=[0],
            response_logprobs=[0.0],
            num_turns=0,
            metrics=AgentLoopMetrics(),
            reward_score=result.reward,
            extra_fields=extra,
        )

    def _check_harness_rows(self, result: Any, rows: list[Any], kwargs: Mapping[str, Any]) -> None:
        """Several rows only where verl keeps them one sample (as :meth:`TmplToolAgentLoop._check_rows`)."""
        parts = [f"{key}={kwargs[key]}" for key in ("uid", "index") if kwargs.get(key) is not None]
        sample = f"sample {' '.join(parts) or result.task_id} (harness run {result.session})"
        branches = "; ".join(f"sequence {s.index}: {s.branch}" for s in rows[1:3])
        if not _setting(self.config, "trainer.use_v1", False):
            raise TrainerConfigError(
                "verl",
                "trainer.use_v1",
                f"{sample} has {len(rows)} training sequences ({branches}) but verl's legacy trainer takes one "
                "AgentLoopOutput per sample; set trainer.use_v1=true",
            )
        estimator = _setting(self.config, "algorithm.adv_estimator", None)
        name = None if estimator is None else str(getattr(estimator, "value", estimator)).lower()
        if name is not None and name not in ROW_ESTIMATORS:
            raise TrainerConfigError(
                "verl",
                "algorithm.adv_estimator",
                f"{sample} has {len(rows)} training sequences; verl's {name!r} would count it {len(rows)} times: "
                f"use one of {sorted(ROW_ESTIMATORS)}",
            )
        setting = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"
        if not _is_tmpl_manager(_setting(self.config, setting, None)):
            raise TrainerConfigError(
                "verl", setting, f"{sample} has {len(rows)} training sequences: set it to "
                "tmpl.integrations.verl.TmplAgentLoopManager",
            )  # fmt: skip


def _stand_in_token(tpl: ChatTemplate) -> int:
    """The token that stands in for an empty response: the template's turn close, else EOS."""
    try:
        return int(tpl.tool_close_ids[-1])
    except TmplError:  # a template that cannot render tool turns
        eos = getattr(tpl.tokenizer, "eos_token_id", None)
        return int(eos if eos is not None else min(tpl.stop_token_ids))


def register_harness_agent(
    harness: Any,
    *,
    tasks_from: Callable[[Mapping[str, Any]], Any] | None = None,
    name: str = "tmpl_harness_agent",
    gateway_options: Mapping[str, Any] | None = None,
    **harness_options: Any,
) -> type[TmplHarnessAgentLoop]:
    """Register a :class:`TmplHarnessAgentLoop` running ``harness`` (a :class:`tmpl.harness.Harness`) under
    ``name``. ``tasks_from(sample)`` makes each sample's :class:`~tmpl.harness.HarnessTask` (its verifier
    gives the reward); ``gateway_options`` go to the :class:`~tmpl.gateway.Gateway`, the rest to
    :class:`~tmpl.harness.HarnessRollout` (``isolation``, ``verifier_timeout``, ``env``...). Set the
    dataset's ``agent_name`` (or ``rollout.agent.default_agent_loop``) to ``name``."""
    from ...harness import Harness

    if not isinstance(harness, Harness):
        raise TypeError(f"register_harness_agent: harness must be a tmpl.harness.Harness, not {type(harness).__name__}")
    cls = type(
        f"TmplHarnessAgentLoop_{name}",
        (TmplHarnessAgentLoop,),
        {
            "harness": harness,
            "tasks_from": staticmethod(tasks_from) if tasks_from is not None else None,
            "harness_options": dict(harness_options),
            "gateway_options": dict(gateway_options or {}),
            "__module__": __name__,
        },
    )
    globals()[cls.__name__] = cls  # verl instantiates agent loops by their import path
    _agent_loop_registry[name] = {"_target_": f"{__name__}.{cls.__name__}"}
    return cls
