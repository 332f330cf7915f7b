"""The environment protocol: one stateful environment per sample, ``reset`` / ``step`` / ``close``.

An environment opens the conversation (:class:`EnvReset`: messages, this episode's tools and state),
answers every assistant turn (:class:`EnvStep`: tool results and/or user, system or developer turns,
a reward, whether the episode ended) and is closed on every end. ``Rollout(env_factory=...)`` makes
one per sample. Environments are sync (:class:`Env`) or async (:class:`AsyncEnv`, the same three
methods as coroutines); the loop inspects each method and awaits the ones that are coroutines.

>>> class Counter:
...     def reset(self, task):
...         self.n = 0
...         return EnvReset(messages=[{"role": "user", "content": f"Count to {task}."}], state=self)
...     def step(self, assistant):
...         self.n += 1
...         return EnvStep(messages=[{"role": "user", "content": "Go on."}], reward=1.0, done=self.n >= 3)
...     def close(self):
...         pass
>>> env = Counter()
>>> env.reset(3).messages[0]["role"], env.step({"role": "assistant", "content": "1"}).done
('user', False)
>>> is_async_env(env)
False
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

if TYPE_CHECKING:
    from ..tools import Toolbox

#: Roles an environment may append after an assistant turn (``EnvStep.messages``), in any order.
STEP_ROLES = frozenset({"tool", "user", "system", "developer"})
#: Roles an environment may open a conversation with (``EnvReset.messages``).
RESET_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


@dataclass
class EnvReset:
    """What ``reset(task)`` returns: the opening conversation, this episode's tools and its state.

    ``tools`` (a :class:`tmpl.Toolbox`, plain functions, or OpenAI-style schemas) are rendered into
    this sample's prompt and given to the parser; ``None`` keeps the rollout's own tools (if any).
    ``state`` comes back on the result as ``RolloutResult.env_state``.

    >>> EnvReset(messages=[{"role": "user", "content": "What time is it?"}]).tools is None
    True
    """

    messages: list[dict[str, Any]]
    tools: Toolbox | Sequence[Callable[..., Any]] | Sequence[dict[str, Any]] | None = None
    state: Any = None


@dataclass
class EnvStep:
    """What ``step(assistant)`` returns after each assistant turn.

    ``messages`` are appended after the assistant turn, in order: tool results (role ``"tool"``,
    one per call, in the calls' order) and/or ``"user"``, ``"system"`` or ``"developer"`` turns.
    Their suffix is exact, like a tool result's. ``reward`` (finite, or None) is added to the
    sample's ``env_reward``. ``done``: the episode ended (``EndCode.ENV_DONE``); ``truncated``:
    ended by the environment's own limit (``EndCode.ENV_TRUNCATED``). ``info`` is merged into
    ``RolloutResult.env_info``.

    >>> EnvStep(messages=[{"role": "user", "content": "Thanks!"}], reward=1.0, done=True).truncated
    False
    """

    messages: list[dict[str, Any]]
    reward: float | None = None
    done: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    """A synchronous environment: one instance per sample, never shared between samples.

    ``step`` gets the parsed assistant message: ``{"role": "assistant", "content": ...,
    "tool_calls": [{"id", "type": "function", "function": {"name", "arguments"}}], ...}``
    (``tool_calls`` only when the model made calls; ``arguments`` a dict; ``reasoning_content``
    when the template has reasoning). ``close`` is called exactly once, on every end.
    """

    def reset(self, task: Any) -> EnvReset: ...

    def step(self, assistant: dict[str, Any]) -> EnvStep: ...

    def close(self) -> None: ...


@runtime_checkable
class AsyncEnv(Protocol):
    """An asynchronous environment: :class:`Env`'s three methods as coroutines.

    >>> class Echo:
    ...     async def reset(self, task): return EnvReset(messages=[{"role": "user", "content": task}])
    ...     async def step(self, assistant): return EnvStep(messages=[], done=True)
    ...     async def close(self): pass
    >>> is_async_env(Echo())
    True
    """

    async def reset(self, task: Any) -> EnvReset: ...

    async def step(self, assistant: dict[str, Any]) -> EnvStep: ...

    async def close(self) -> None: ...


#: Makes one environment per sample (a class, or a function with no arguments). Picklable for
#: ``DistributedRollout`` (a module-level class or function, or ``functools.partial`` of one).
EnvFactory: TypeAlias = Callable[[], "Env | AsyncEnv"]


def is_async_env(env: object) -> bool:
    """Whether ``env.reset`` is a coroutine function (the loop awaits each method that is one).

    >>> is_async_env(object())
    False
    """
    return inspect.iscoroutinefunction(getattr(env, "reset", None))


async def call_env(env: object, method: str, *args: Any) -> Any:
    """Call ``env.<method>(*args)``, awaiting it if it is a coroutine function or returns an awaitable.

    Sync methods run in the calling thread (an environment that blocks should be async, or run its
    work in a thread of its own).

    >>> import asyncio
    >>> class E:
    ...     def close(self): return "closed"
    >>> asyncio.run(call_env(E(), "close"))
    'closed'
    """
    out = getattr(env, method)(*args)
    if inspect.isawaitable(out):
        out = await out
    return out
