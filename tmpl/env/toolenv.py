"""``ToolEnv``: an environment over a Toolbox, with an optional simulated user and reward.

``step`` runs the assistant's tool calls with the toolbox (plain functions, MCP servers, sandboxed
code: whatever the :class:`tmpl.Toolbox` holds) and returns their tool messages. When the assistant
makes no calls, the simulated user (``user=``: a function, or a :class:`~tmpl.env.user.SimulatedUser`
model) answers with a user turn, or ends the episode by answering None; without a user the
episode ends there. ``reward(messages)`` (sync or async) scores the episode when it ends. The
toolbox is closed at ``close()`` (``close_tools=False`` for a Toolbox that episodes share).

>>> def weather(city: str) -> str:
...     '''Weather.
...
...     Args:
...         city: The city.
...     '''
...     return f"{city}: sunny"
>>> import asyncio
>>> env = ToolEnv([weather], user=lambda messages: None if len(messages) > 4 else "And tomorrow?",
...               reward=lambda messages: 1.0)
>>> asyncio.run(env.reset("Weather in Paris?")).messages
[{'role': 'user', 'content': 'Weather in Paris?'}]
>>> call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}
>>> asyncio.run(env.step({"role": "assistant", "content": "", "tool_calls": [call]})).messages[0]["content"]
'Paris: sunny'
>>> asyncio.run(env.step({"role": "assistant", "content": "Sunny."})).messages
[{'role': 'user', 'content': 'And tomorrow?'}]
>>> last = asyncio.run(env.step({"role": "assistant", "content": "Sunny too."}))
>>> last.done, last.reward
(True, 1.0)
>>> asyncio.run(env.close())
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..episode import Call
from ..tools.toolbox import Toolbox, as_toolbox
from .protocol import EnvReset, EnvStep
from .user import SimulatedUser

#: what a simulated user function may return: a reply, a message, messages, or None (the episode ends)
UserReply = str | Mapping[str, Any] | Sequence[Mapping[str, Any]] | None


class ToolEnv:
    """An async environment over ``tools`` (a Toolbox or callables; None: no tools).

    ``reset(task)``: ``task`` is the opening conversation (a list of messages), a string (one user
    message) or a dict with ``"messages"`` (and ``"state"``, returned as ``RolloutResult.env_state``).
    ``user``: a function ``user(messages) -> str | message | messages | None`` (sync or async) or a
    :class:`SimulatedUser`, called when the assistant makes no tool calls. ``reward``: a function
    ``reward(messages) -> float`` (sync or async), called once when the episode ends. ``model_calls``:
    the simulated user's model calls, which the rollout records in the sample's episode, untrained.
    """

    def __init__(
        self,
        tools: Toolbox | Sequence[Callable[..., Any]] | None = None,
        *,
        user: Callable[[list[dict[str, Any]]], Any] | SimulatedUser | None = None,
        reward: Callable[[list[dict[str, Any]]], Any] | None = None,
        close_tools: bool = True,
    ) -> None:
        self.toolbox = as_toolbox(tools)
        self.user = user
        self.reward = reward
        self.close_tools = close_tools
        self.messages: list[dict[str, Any]] = []  # the conversation so far, as the environment saw it
        self.state: Any = None
        self.model_calls: list[Call] = []
        self.closed = False

    async def reset(self, task: Any) -> EnvReset:
        if isinstance(task, str):
            messages: Any = [{"role": "user", "content": task}]
        elif isinstance(task, Mapping):
            messages, self.state = task.get("messages"), task.get("state")
        else:
            messages = task
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise TypeError(
                f"a ToolEnv task is messages, a string or a dict with 'messages', not {type(task).__name__}"
            )
        self.messages = [dict(m) for m in messages]
        self.model_calls = []
        return EnvReset(messages=copy.deepcopy(self.messages), tools=self.toolbox, state=self.state)

    async def step(self, assistant: dict[str, Any]) -> EnvStep:
        self.messages.append(dict(assistant))
        calls = assistant.get("tool_calls") or []
        if calls:
            if self.toolbox is None:
                raise RuntimeError(f"the assistant called {len(calls)} tool(s) of an environment without tools")
            batch = await self.toolbox.run_batch_async([calls])
            results = batch.messages[0]
            self.messages += results
            if batch.stop[0]:  # on_error="stop": a tool failed
                return await self._end(copy.deepcopy(results), truncated=True, info={"tool_stop": True})
            return EnvStep(messages=copy.deepcopy(results))
        turns = await self._user_turns()
        if not turns:
            return await self._end([])
        self.messages += turns
        return EnvStep(messages=copy.deepcopy(turns))

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.toolbox is not None and self.close_tools:
            self.toolbox.close()

    async def _user_turns(self) -> list[dict[str, Any]]:
        """The simulated user's answer as messages ([]: the episode ends)."""
        if self.user is None:
            return []
        if isinstance(self.user, SimulatedUser):
            reply, call = await self.user.reply(self.messages, call_id=f"user-{len(self.model_calls)}")
            if call is not None:
                self.model_calls.append(call)
        else:
            reply = self.user(copy.deepcopy(self.messages))
            if inspect.isawaitable(reply):
                reply = await reply
        if reply is None:
            return []
        if isinstance(reply, str):
            return [{"role": "user", "content": reply}]
        if isinstance(reply, Mapping):
            return [dict(reply)]
        return [dict(m) for m in reply]

    async def _end(self, messages: list[dict[str, Any]], *, truncated: bool = False, info: Any = None) -> EnvStep:
        score = None
        if self.reward is not None:
            score = self.reward(copy.deepcopy(self.messages))
            if inspect.isawaitable(score):
                score = await score
        return EnvStep(messages=messages, reward=score, done=not truncated, truncated=truncated, info=dict(info or {}))
