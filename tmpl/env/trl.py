"""TRL's ``environment_factory`` objects as tmpl environments.

TRL (checked in 1.16, ``GRPOTrainer``) takes ``environment_factory``: a callable returning an object with
a ``reset(**row)`` method (the dataset row as keywords; it returns ``None`` or a string that is appended
to the last message of the row's ``prompt``), optional ``get_reward()`` (called once per finished
rollout), and public methods: each one is a tool (its name, type hints and Google docstring are the
schema). TRL runs a call as ``method(**arguments)``; the tool message is ``{"role": "tool", "name":
name, "content": str(result)}`` (a list result is kept as content parts) and a call that raises answers
``str({"error": str(exc)})``. The episode ends when the model makes no call.

:func:`from_trl_environment` turns such a factory into a tmpl :data:`~tmpl.env.EnvFactory` that does the
same, so an environment written for TRL runs in ``Rollout(env_factory=...)`` unchanged:

>>> class Counter:
...     def reset(self, **row):
...         self.n = 0
...         return " Count with the tool."
...     def increment(self, by: int) -> int:
...         '''Add to the counter.
...
...         Args:
...             by: How much.
...         '''
...         self.n += by
...         return self.n
...     def get_reward(self) -> float:
...         return float(self.n)
>>> env = from_trl_environment(Counter)()
>>> import asyncio
>>> opened = asyncio.run(env.reset({"prompt": [{"role": "user", "content": "Hi."}]}))
>>> opened.messages[-1]["content"], [t["function"]["name"] for t in opened.tools]
('Hi. Count with the tool.', ['increment'])
>>> call = {"id": "c1", "type": "function", "function": {"name": "increment", "arguments": {"by": 2}}}
>>> step = asyncio.run(env.step({"role": "assistant", "content": "", "tool_calls": [call]}))
>>> step.messages[0]["content"], step.done
('2', False)
>>> final = asyncio.run(env.step({"role": "assistant", "content": "Done."}))
>>> final.done, final.reward
(True, 2.0)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import EnvAdapterError
from ..toolcalls.schema import tool_schema
from .protocol import EnvReset, EnvStep

#: the methods TRL does not expose as tools
NOT_TOOLS = frozenset({"reset", "get_reward"})


def trl_tool_methods(env: Any) -> list[Callable[..., Any]]:
    """The bound methods TRL exposes as tools: public functions of the class, ``reset`` and
    ``get_reward`` excepted, in TRL's order (``inspect.getmembers`` of the class: by name)."""
    return [
        getattr(env, name)
        for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
        if name not in NOT_TOOLS and not name.startswith("_")
    ]


def _with_observation(prompt: list[dict[str, Any]], observation: Any) -> list[dict[str, Any]]:
    """TRL's rule: a string (or parts) from ``reset`` is appended to the last message's content."""
    if observation is None:
        return prompt
    content = prompt[-1].get("content")
    if isinstance(observation, list) and isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if isinstance(observation, str) and isinstance(content, list):
        observation = [{"type": "text", "text": observation}]
    if content is None:
        content = observation
    else:
        content = content + observation
    return prompt[:-1] + [{**prompt[-1], "content": content}]


class TrlEnvironment:
    """A tmpl :class:`~tmpl.env.AsyncEnv` over one object written for TRL's ``environment_factory``.

    ``reset(task)``: ``task`` is a dataset row (a mapping with ``prompt``; every key is passed to the
    environment's ``reset`` as TRL passes it) or a conversation (passed as ``prompt=``); without a
    ``prompt`` the conversation is one empty user message, as in TRL. ``step``: runs the assistant's calls
    on the environment's methods in order (coroutine methods awaited), answering as TRL does; no call ends
    the episode with ``get_reward()`` (when the environment has one) as its reward. ``state`` on the result
    is the TRL environment itself (what TRL gives reward functions as ``environments``).
    """

    def __init__(self, env: Any, *, reward: bool = True) -> None:
        if not callable(getattr(env, "reset", None)):
            raise EnvAdapterError(
                "from_trl_environment",
                f"{type(env).__name__} has no callable reset: TRL's environment_factory must return an object "
                "with reset(**row) (and its tools as public methods)",
            )
        self.env = env
        self.reward = reward
        self.tools = {m.__name__: m for m in trl_tool_methods(env)}

    async def reset(self, task: Any) -> EnvReset:
        if isinstance(task, Mapping):
            row = dict(task)
        elif isinstance(task, Sequence) and not isinstance(task, str):
            row = {"prompt": list(task)}
        else:
            raise EnvAdapterError(
                "from_trl_environment",
                f"a task is a dataset row (a mapping with 'prompt') or a conversation, not {type(task).__name__}",
            )
        prompt = [dict(m) for m in (row.get("prompt") or [{"role": "user", "content": ""}])]
        observation = self.env.reset(**row)
        if inspect.isawaitable(observation):
            observation = await observation
        if observation is not None and not isinstance(observation, (str, list)):
            raise EnvAdapterError(
                "from_trl_environment",
                f"{type(self.env).__name__}.reset returned {type(observation).__name__}; TRL takes None or a "
                "string (or content parts) to append to the last prompt message",
            )
        schemas = [tool_schema(m) for m in self.tools.values()]
        return EnvReset(messages=_with_observation(prompt, observation), tools=schemas or None, state=self.env)

    async def step(self, assistant: dict[str, Any]) -> EnvStep:
        calls = assistant.get("tool_calls") or []
        if not calls:
            return EnvStep(messages=[], reward=await self._final_reward(), done=True)
        messages = []
        for call in calls:
            function = call.get("function") or {}
            name = function.get("name", "unknown")
            try:
                if call.get("type", "function") != "function":
                    raise ValueError(f"Unsupported tool call type: {call.get('type')}")
                if name not in self.tools:
                    raise ValueError(f"Tool {name} not found.")
                arguments = function.get("arguments") or {}
                if not isinstance(arguments, Mapping):
                    raise ValueError(f"arguments of {name} are not an object: {arguments!r}")
                result = self.tools[name](**arguments)
                if inspect.isawaitable(result):
                    result = await result
            except Exception as exc:  # noqa: BLE001 - TRL answers every failure of a call with its message
                result = {"error": str(exc)}
            message: dict[str, Any] = {
                "role": "tool",
                "name": name,
                "content": result if isinstance(result, list) else str(result),
            }
            if call.get("id"):
                message["tool_call_id"] = call["id"]
            messages.append(message)
        return EnvStep(messages=messages)

    async def _final_reward(self) -> float | None:
        get_reward = getattr(self.env, "get_reward", None)
        if not self.reward or not callable(get_reward):
            return None
        value = get_reward()
        if inspect.isawaitable(value):
            value = await value
        return None if value is None else float(value)

    async def close(self) -> None:
        """TRL never closes its environments (it pools and resets them); neither does this."""


class TrlEnvFactory:
    """Makes one :class:`TrlEnvironment` per sample from TRL's ``environment_factory`` (picklable when
    the factory is, for ``DistributedRollout``)."""

    def __init__(self, factory: Callable[[], Any], *, reward: bool = True) -> None:
        if not callable(factory):
            raise EnvAdapterError("from_trl_environment", f"the factory must be callable, not {type(factory).__name__}")
        self.factory = factory
        self.reward = reward

    def __call__(self) -> TrlEnvironment:
        return TrlEnvironment(self.factory(), reward=self.reward)

    def __repr__(self) -> str:
        return f"from_trl_environment({getattr(self.factory, '__name__', self.factory)!r})"


def from_trl_environment(factory: Callable[[], Any], *, reward: bool = True) -> TrlEnvFactory:
    """A tmpl environment factory from TRL's ``environment_factory`` (a class or a function with no
    arguments): each environment wraps a fresh ``factory()`` in :class:`TrlEnvironment`. ``reward=False``
    leaves ``get_reward`` out of the sample's environment reward.

    >>> rollout = Rollout(tpl, backend, env_factory=from_trl_environment(MyTrlEnv))   # doctest: +SKIP
    """
    return TrlEnvFactory(factory, reward=reward)


__all__ = ["NOT_TOOLS", "TrlEnvFactory", "TrlEnvironment", "from_trl_environment", "trl_tool_methods"]
