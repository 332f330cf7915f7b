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

The sub-rollout's request IDs start with ``<name>@<tool call id>#<k>/`` (``k`` counts the sub-agent's runs)
so that they never collide with the parent's, nor with another run's, on a shared server. Sub-agents run in the parent's event loop: a :class:`tmpl.Toolbox` with
``isolation="process"`` refuses one (a ``ToolboxError`` says so).
"""

from __future__ import annotations

import contextvars
import itertools
import weakref
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

    __slots__ = ("name", "label", "result")

    def __init__(self, name: str, label: str, result: Any) -> None:
        self.name, self.label, self.result = name, label, result

    def add_to(self, episode: Episode, parent: str) -> None:
        """Add the sub-episode's calls to ``episode`` under ``parent`` (the id of the parent's call),
        renamed ``<label>/<call id>`` (``label``: ``<name>@<tool call id>#<k>``) with agent ``<name>``
        (``<name>/<agent>`` for a nested sub-agent's), their IDs, logprobs, versions and trained flag as sampled."""
        prefix = f"{self.label}/"
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
        # finished runs by the ToolCall object that ran them (a model-written call id may repeat across
        # samples or turns); an entry whose call is gone (its sample cancelled) is dropped at the next run
        self._finished: dict[int, tuple[weakref.ref[Any], SubAgentRun]] = {}
        self._runs = itertools.count()

    #: a Toolbox with isolation="process" refuses it: it runs in the rollout's own event loop
    in_process_only = True

    async def __call__(self, **arguments: Any) -> str:
        call = CURRENT_CALL.get(None)
        task = arguments.get(self.task)
        if not isinstance(task, str):
            raise TypeError(f"{self.name} takes {self.task!r}, a string")
        label = f"{self.name}@{call.id if call is not None else 'call'}#{next(self._runs)}"
        token = _PREFIX.set(f"{request_prefix()}{label}/")
        try:
            [result] = await self.rollout.run_async([[{"role": "user", "content": task}]])
        finally:
            _PREFIX.reset(token)
        if call is not None:
            for key in [k for k, (ref, _) in self._finished.items() if ref() is None]:
                del self._finished[key]
            self._finished[id(call)] = (weakref.ref(call), SubAgentRun(self.name, label, result))
        if result.status.name != "DONE":
            return f"The sub-agent {self.name} stopped ({result.code.value}): {result.reason}"
        answers = [m for m in result.messages if m.get("role") == "assistant"]
        content = answers[-1].get("content") if answers else None
        return content if isinstance(content, str) else ""

    def take(self, call: Any) -> SubAgentRun | None:
        """The finished run of the tool call ``call`` (the ToolCall object; removed here), or None."""
        entry = self._finished.get(id(call))
        if entry is None or entry[0]() is not call:
            return None
        del self._finished[id(call)]
        return entry[1]


def subagents_of(toolbox: Any) -> Mapping[str, SubAgent]:
    """The sub-agents among a Rollout's tools (its Toolbox, or None), by name."""
    tools = [] if toolbox is None else [t.fn for t in toolbox._tools.values()]
    return {fn.name: fn for fn in tools if isinstance(fn, SubAgent)}
