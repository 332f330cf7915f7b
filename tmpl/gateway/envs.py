"""Environments on the gateway's sessions (``Gateway(env_factory=...)``): one :class:`tmpl.env.Env` per
session, for harnesses that run their own loop.

The harness asks the session's environment for the opening conversation and its tools (``reset``),
sends every reply it got from the gateway to the environment (``step``) and gets back what follows:
tool results, user, system or developer turns, a reward and whether the episode is done. The harness
appends those messages and calls the model again, through the gateway, which tokenizes them exactly as
it does any history (a suffix after the reply it returned, else the template's render with the sampled
IDs spliced back). Rewards are summed into the session's episode; an environment that ends the
episode finishes the session (its episode queued for the trainer). The environment is closed once on
every end of its session: done, finished by the trainer, expired, closed to make room, a failing
``reset``/``step``, the gateway shutting down.

Over HTTP (tmpl.gateway.app): ``POST /s/{session}/env/reset`` ``{"task": ...}`` and
``POST /s/{session}/env/step`` ``{"message": <the assistant message>}``.

>>> gateway = Gateway(tpl, backend, env_factory=ShopEnv)                          # doctest: +SKIP
>>> opening = await gateway.env_reset("ep-1", task={"item": "lamp"})            # doctest: +SKIP
>>> step = await gateway.env_step("ep-1", reply_message)                         # doctest: +SKIP
>>> step.messages, step.reward, step.done                                         # doctest: +SKIP
([{'role': 'tool', ...}], 0.0, False)
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from ..env.checks import check_reset, check_step
from ..env.protocol import EnvReset, EnvStep, call_env
from ..errors import EnvError, GatewayRequestError

log = logging.getLogger("tmpl.gateway")

__all__ = ["SessionEnv", "assistant_for_env", "close_env", "make_env", "reset", "step"]

#: async closes scheduled by a session's end inside the event loop, kept until they finish
_CLOSING: set[asyncio.Task[Any]] = set()


class SessionEnv:
    """A session's environment and what it gave: its name, state, summed reward, info, error, and whether
    it was closed (once)."""

    __slots__ = ("env", "name", "state", "reward", "info", "error", "closed", "steps")

    def __init__(self, env: Any) -> None:
        self.env = env
        self.name = type(env).__name__
        self.state: Any = None
        self.reward: float | None = None
        self.info: dict[str, Any] = {}
        self.error: str | None = None
        self.closed = False
        self.steps = 0

    def add_reward(self, value: float | None) -> None:
        if value is not None:
            self.reward = (self.reward or 0.0) + float(value)


def make_env(factory: Callable[[], Any], key: str) -> SessionEnv:
    """Make a session's environment with ``factory`` (EnvError, naming the session, when it raises)."""
    try:
        env = factory()
    except Exception as exc:  # noqa: BLE001 - the environment's own code: named on the session
        raise EnvError(key, f"the factory raised {type(exc).__name__}: {exc}", env="env_factory", phase="make") from exc
    return SessionEnv(env)


async def reset(held: SessionEnv, key: str, task: Any) -> EnvReset:
    """``reset(task)`` on the session's environment, checked (EnvError, naming the session, when it fails)."""
    try:
        out = await call_env(held.env, "reset", task)
    except Exception as exc:  # noqa: BLE001
        raise EnvError(key, f"raised {type(exc).__name__}: {exc}", env=held.name, phase="reset") from exc
    checked = check_reset(out, sample=key, env=held.name)
    held.state = checked.state
    return checked


async def step(held: SessionEnv, key: str, assistant: dict[str, Any]) -> EnvStep:
    """``step(assistant)`` on the session's environment, checked; its reward summed into ``held``."""
    calls = len(assistant.get("tool_calls") or [])
    try:
        out = await call_env(held.env, "step", assistant)
    except Exception as exc:  # noqa: BLE001
        raise EnvError(key, f"raised {type(exc).__name__}: {exc}", env=held.name, phase="step") from exc
    checked = check_step(out, sample=key, env=held.name, calls=calls)
    held.steps += 1
    held.add_reward(checked.reward)
    held.info.update(checked.info)
    return checked


def assistant_for_env(message: Mapping[str, Any], key: str) -> dict[str, Any]:
    """The assistant message a client sends back, in the shape ``Rollout`` gives ``step``: tool call
    arguments as a dict where they are a JSON object in a string (OpenAI clients send strings).

    >>> assistant_for_env({"role": "assistant", "content": None, "tool_calls": [
    ...     {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]}, "s")["tool_calls"]
    [{'id': 'c1', 'type': 'function', 'function': {'name': 'f', 'arguments': {'x': 1}}}]
    """
    if not isinstance(message, Mapping) or message.get("role") != "assistant":
        raise GatewayRequestError(key, "the body's 'message' must be the assistant message the gateway returned")
    out = dict(message)
    calls = []
    for call in out.get("tool_calls") or []:
        if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
            raise GatewayRequestError(key, "each tool call needs a 'function' with 'name' and 'arguments'")
        fn = dict(call["function"])
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                parsed = json.loads(args)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                fn["arguments"] = parsed
        calls.append({**call, "function": fn})
    if calls:
        out["tool_calls"] = calls
    return out


def close_env(held: SessionEnv | None, reason: str) -> None:
    """Close a session's environment once, wherever its session ends: a sync ``close`` now, an async one
    on the running loop (or a loop of its own outside one). An error is logged and kept on ``held``."""
    if held is None or held.closed:
        return
    held.closed = True

    def failed(exc: BaseException) -> None:
        held.error = held.error or f"{held.name}.close raised {type(exc).__name__}: {exc}"
        log.warning("environment of a session ended (%s): %s", reason, held.error)

    try:
        out = held.env.close()
    except Exception as exc:  # noqa: BLE001
        failed(exc)
        return
    if not asyncio.iscoroutine(out):
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None

    async def finish() -> None:
        try:
            await out
        except Exception as exc:  # noqa: BLE001
            failed(exc)

    if loop is None:
        asyncio.run(finish())
        return
    task = loop.create_task(finish())
    _CLOSING.add(task)
    task.add_done_callback(_CLOSING.discard)
