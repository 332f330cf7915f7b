"""Sub-agents: a tool that runs a model episode of its own, whose calls join the parent's episode.

A :class:`SubAgent` wraps a :class:`tmpl.Rollout` (its own template, backend, tools, history mode) as a
tool the parent's model can call with one string argument (the task). When the parent's model calls it,
the sub-rollout runs one sample on ``[{"role": "user", "content": task}]``; its last answer is the tool
result the parent sees, and every model call of the sub-episode is added to the parent sample's episode
(:attr:`tmpl.RolloutResult.sequences`) with ``agent`` set to the sub-agent's name and ``parent`` to
the parent call (``"turn-<k>"``) whose tool call ran it. The sub-agent's calls never merge with the
parent's sequences (another lineage): each of its sampled tokens is trained once, in its own sequences.

>>> research = SubAgent(sub_rollout, name="research", description="Look something up.")  # doctest: +SKIP
>>> rollout = tmpl.Rollout(tpl, backend, tools=[get_weather, research])                    # doctest: +SKIP
>>> [r] = rollout.run([[{"role": "user", "content": "Plan my trip."}]])                    # doctest: +SKIP
>>> {s.agent for s in r.sequences}                                                         # doctest: +SKIP
{None, 'research'}

The sub-rollout's request IDs start with ``<name>@<tool call id>/`` so that they never collide with the
parent's on a shared server. Sub-agents run in the parent's event loop: a :class:`tmpl.Toolbox` with
``isolation="process"`` refuses one (a ``ToolboxError`` says so).
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from typing import Any, Protocol

from ..episode import Call, Episode
from ..errors import ToolboxError
from ..tools.toolbox import CURRENT_CALL

__all__ = ["SubAgent", "SubAgentRun", "request_prefix"]

#: the request-ID prefix of the rollout running in this context (a sub-agent's: ``name@call/``)
_PREFIX: contextvars.ContextVar[str] = contextvars.ContextVar("tmpl_subagent_prefix", default="")


def request_prefix() -> str:
    """The prefix of request IDs sent from this context ("" outside any sub-agent)."""
    return _PREFIX.get()


class _Runs(Protocol):
    """What a sub-agent needs of its rollout (a :class:`tmpl.Rollout`)."""

    @property
    def sampling(self) -> Any: ...

    async def run_async(self, conversations: Any) -> list[Any]: ...


class SubAgentRun:
    """One finished call of a sub-agent: its name, the tool call that ran it, its sample's result."""

    __slots__ = ("name", "tool_call_id", "result")

    def __init__(self, name: str, tool_call_id: str, result: Any) -> None:
        self.name, self.tool_call_id, self.result = name, tool_call_id, result

    def add_to(self, episode: Episode, parent: str) -> None:
        """Add the sub-episode's calls to ``episode`` under ``parent`` (the id of the parent's call),
        renamed ``<name>@<tool call id>/<call id>`` with agent ``<name>`` (``<name>/<agent>`` for a
        nested sub-agent's), their IDs, logprobs, versions and trained flag as sampled."""
        prefix = f"{self.name}@{self.tool_call_id}/"
        for call in self.result.episode.calls:
            episode.add_call(
                Call(
                    call.prompt_ids,
                    call.completion_ids,
                    call.logprobs,
                    versions=call.versions,
                    trained=call.trained,
                    id=prefix + str(call.id),
                    parent=parent if call.parent is None else prefix + call.parent,
                    agent=self.name if call.agent is None else f"{self.name}/{call.agent}",
                    turn=call.turn,
                    reward=call.reward,
                )
            )


class SubAgent:
    """A tool that runs ``rollout`` (one sample, ``sampling.n == 1``) on the task the model gives it.

    ``name`` and ``description`` are the tool's; ``task`` names its one string argument; ``timeout`` is
    the tool call's limit in seconds (the sub-episode's whole run). The tool result is the sub-sample's
    last assistant content, or a message naming how it ended when it did not finish.
    """

    def __init__(
        self, rollout: _Runs, *, name: str, description: str, task: str = "task", timeout: float = 600.0
    ) -> None:
        if not name.replace("_", "").replace("-", "").isalnum():
            raise ToolboxError(f"a sub-agent's name must be letters, digits, '_' or '-', not {name!r}")
        n = getattr(rollout.sampling, "n", 1)
        if n != 1:
            raise ToolboxError(f"sub-agent {name!r}: its rollout samples n={n}; a tool call runs one sample (n=1)")
        self.rollout, self.name, self.task = rollout, name, task
        self.tool_timeout = float(timeout)
        self.tool_schema = {
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": {task: {"type": "string", "description": "What the sub-agent is asked to do."}},
                    "required": [task],
                },
            },
        }
        self._finished: dict[str, SubAgentRun] = {}

    #: a Toolbox with isolation="process" refuses it: it runs in the rollout's own event loop
    in_process_only = True

    async def __call__(self, **arguments: Any) -> str:
        call = CURRENT_CALL.get(None)
        call_id = call.id if call is not None else f"call-{len(self._finished)}"
        task = arguments.get(self.task)
        if not isinstance(task, str):
            raise TypeError(f"{self.name} takes {self.task!r}, a string")
        token = _PREFIX.set(f"{request_prefix()}{self.name}@{call_id}/")
        try:
            [result] = await self.rollout.run_async([[{"role": "user", "content": task}]])
        finally:
            _PREFIX.reset(token)
        self._finished[call_id] = SubAgentRun(self.name, call_id, result)
        if result.status.name != "DONE":
            return f"The sub-agent {self.name} stopped ({result.code.value}): {result.reason}"
        answers = [m for m in result.messages if m.get("role") == "assistant"]
        content = answers[-1].get("content") if answers else None
        return content if isinstance(content, str) else ""

    def take(self, tool_call_id: str) -> SubAgentRun | None:
        """The finished run of the tool call ``tool_call_id`` (removed from this sub-agent), or None."""
        return self._finished.pop(tool_call_id, None)


def subagents_of(tools: Any) -> Mapping[str, SubAgent]:
    """The sub-agents among a Rollout's tools, by name."""
    if tools is None:
        return {}
    items = list(tools) if not hasattr(tools, "_tools") else [t.fn for t in tools._tools.values()]
    found = {}
    for item in items:
        fn = item[0] if isinstance(item, tuple) else item
        if isinstance(fn, SubAgent):
            found[fn.name] = fn
    return found
