"""``tmpl_tool_agent``: a verl agent loop that runs tmpl's multi-turn tool rollout.

Each sample is one :class:`tmpl.Rollout` (tool-call parsing from token IDs, the
:class:`tmpl.Toolbox`, exact suffixes, budgets, drift) generating through verl's
``server_manager`` (:class:`~tmpl.integrations.verl.VerlServerBackend`). The result is verl's
``AgentLoopOutput``: ``response_ids`` are every turn (model tokens and appended tool results),
``response_mask`` 1 on model tokens and 0 on appended ones, ``response_logprobs`` the sampling
logprobs (0.0 on appended tokens). ``extra_fields`` (verl's field for additions; each key becomes a
``non_tensor_batch`` column) carries tmpl's status and reason, tool counts, the messages, and the
policy versions: ``tmpl_versions`` (one per response token, -1 on appended tokens), ``tmpl_version``
(the version the sample ended under) and ``tmpl_staleness``. verl's own ``min_global_steps`` /
``max_global_steps`` are not set: verl fills them from its server's ``global_steps``, which
``VerlServerBackend`` does not read (tmpl's versions are those of ``Rollout.update_weights``).

>>> from tmpl.integrations.verl import register_tool_agent          # doctest: +SKIP
>>> register_tool_agent(tools=[get_weather, get_time], max_turns=8)  # then agent_name: tmpl_tool_agent  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    _agent_loop_registry,
    register,
)

from ...chat_template import ChatTemplate
from ...rollout import Rollout
from .backend import VerlServerBackend

__all__ = ["TmplToolAgentLoop", "register_tool_agent"]

_TEMPLATES: dict[tuple[int, str], ChatTemplate] = {}


@register("tmpl_tool_agent")
class TmplToolAgentLoop(AgentLoopBase):  # type: ignore[misc]
    """verl agent loop around :class:`tmpl.Rollout` (one sample per ``run``).

    Configure with :func:`register_tool_agent` (tools and ``tmpl.Rollout`` options); the token
    budgets come from verl's ``rollout.prompt_length`` and ``rollout.response_length``.
    """

    tools: Sequence[Any] = ()
    rollout_options: dict[str, Any] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("tools", None)  # verl's own tool objects: tmpl runs its Toolbox instead
        super().__init__(*args, **kwargs)
        opts = dict(self.apply_chat_template_kwargs or {})
        key = (id(self.tokenizer), repr(sorted(opts.items())))
        if key not in _TEMPLATES:  # one template (and its proven frames) per tokenizer, settings and process
            _TEMPLATES[key] = ChatTemplate(self.tokenizer, opts.pop("chat_template", None), **opts)
        self.template = _TEMPLATES[key]

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Roll out ``kwargs["raw_prompt"]`` (a message list) with tools; one ``AgentLoopOutput``."""
        config = self.rollout_config
        options = {"max_turns": 8, **self.rollout_options}
        rollout = Rollout(
            self.template,
            VerlServerBackend(self.server_manager, sampling_params),
            tools=self.tools or None,
            max_length=int(config.prompt_length) + int(config.response_length),
            max_completion_length=int(config.response_length),
            progress=False,
            **options,
        )
        [result] = await rollout.run_async([list(kwargs["raw_prompt"])])
        return AgentLoopOutput(
            prompt_ids=result.prompt_ids.tolist(),
            response_ids=result.completion_ids.tolist(),
            response_mask=result.mask.tolist(),
            response_logprobs=result.logprobs.tolist(),
            num_turns=len(result.messages),
            metrics=AgentLoopMetrics(),
            extra_fields={
                "tmpl_status": result.status.name,
                "tmpl_reason": result.reason,
                "tool_calls": result.tool_calls,
                "tool_failures": result.tool_failures,
                "messages": result.messages,
                # tmpl's policy versions: one per response token (-1 on appended tokens), the version
                # the sample ended under and its staleness (versions between its oldest token and that)
                "tmpl_versions": result.versions.tolist(),
                "tmpl_version": result.version,
                "tmpl_staleness": result.staleness,
            },
        )


def register_tool_agent(
    tools: Sequence[Any], *, name: str = "tmpl_tool_agent", **rollout_options: Any
) -> type[TmplToolAgentLoop]:
    """Register a ``TmplToolAgentLoop`` with ``tools`` (callables or a :class:`tmpl.Toolbox`) under ``name``.

    ``rollout_options`` go to :class:`tmpl.Rollout` (``max_turns``, ``max_tokens_per_turn``,
    ``verify_every``, ...). Returns the registered class; set the dataset's ``agent_name`` (or
    ``rollout.agent.default_agent_loop``) to ``name``.
    """
    cls = type(
        f"TmplToolAgentLoop_{name}",
        (TmplToolAgentLoop,),
        {"tools": tools, "rollout_options": dict(rollout_options), "__module__": __name__},
    )
    globals()[cls.__name__] = cls  # verl instantiates agent loops by their import path
    _agent_loop_registry[name] = {"_target_": f"{__name__}.{cls.__name__}"}
    return cls
