"""OpenEnv environments as tmpl environments: :class:`OpenEnvEnv`.

OpenEnv (``openenv-core``, checked with 0.3) has a Gym-style server side, ``Environment`` (``reset(seed=None,
episode_id=None, **kwargs) -> Observation``, ``step(action) -> Observation``, ``state``, ``close``; an
``Observation`` is a pydantic model with ``done``, ``reward``, ``metadata`` and the environment's own
fields), served by ``create_app`` over HTTP/WebSocket, and clients (``EnvClient``: async ``reset`` /
``step`` returning ``StepResult(observation, reward, done)``; ``.sync()`` for a blocking one;
``GenericEnvClient`` with plain dicts). ``MCPEnvironment`` exposes tools: ``ListToolsAction`` answers with
their schemas, ``CallToolAction(tool_name, arguments)`` with the result (``MCPToolClient`` on the client
side has ``list_tools()`` / ``call_tool()``).

:class:`OpenEnvEnv` drives any of these as a tmpl :class:`~tmpl.env.AsyncEnv`, in one of two modes:

- **tools** (an ``MCPEnvironment``, an ``MCPToolClient``, or ``tools=True``): the tools are listed at reset
  and rendered into the prompt; each assistant call becomes a ``CallToolAction`` and its result a
  ``tool`` message (an error a tool message that says so); no call ends the episode.
- **actions** (``action=``): each assistant turn becomes an action, ``action(assistant_message)`` (a
  function returning an ``Action`` or a dict), or an ``Action`` class with one required string field,
  filled with the assistant's content; the observation comes back as a turn of ``role`` ("user" by
  default) whose text is ``observe(observation)``, by default its one string field (else its fields as
  JSON: :func:`observation_text`).

The observation's ``reward`` is the step's reward and its ``done`` ends the episode. What the environment
says reaches the model as the chat template renders it: the loop appends each message with the template's
exact suffix, like a tool result.

>>> env = OpenEnvEnv(EchoEnvironment(), action=EchoAction)                       # doctest: +SKIP
>>> Rollout(tpl, backend, env_factory=lambda: OpenEnvEnv(EchoEnvironment(), action=EchoAction))  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import EnvAdapterError
from .protocol import EnvReset, EnvStep

#: observation fields that are the protocol's, never the text shown to the model
PROTOCOL_FIELDS = frozenset({"done", "reward", "metadata"})


def _require_openenv() -> Any:
    try:
        from openenv.core.env_server import mcp_types
    except ImportError as exc:  # pragma: no cover - the extra is installed where this is tested
        raise EnvAdapterError(
            "OpenEnvEnv", f"needs openenv-core, which is not installed: pip install 'tmpl[openenv]' ({exc})"
        ) from None
    return mcp_types


def _fields(observation: Any) -> dict[str, Any]:
    """An observation's own fields (a pydantic model or a dict), protocol fields left out."""
    if isinstance(observation, Mapping):
        data = dict(observation)
    elif hasattr(observation, "model_dump"):
        data = {k: getattr(observation, k) for k in type(observation).model_fields}
    else:
        return {"value": observation}
    return {k: v for k, v in data.items() if k not in PROTOCOL_FIELDS}


def observation_text(observation: Any) -> str:
    """The text of an observation shown to the model: its string field when it has exactly one (numbers
    beside it, like the echo's ``message_length``, are left out), else its fields as JSON.

    >>> observation_text({"echoed_message": "hi", "message_length": 2, "done": False, "reward": 0.1})
    'hi'
    >>> observation_text({"board": "x.o", "player": "x", "turn": 2})
    '{"board": "x.o", "player": "x", "turn": 2}'
    """
    if isinstance(observation, str):
        return observation
    fields = _fields(observation)
    texts = [v for v in fields.values() if isinstance(v, str)]
    if len(texts) == 1:
        return texts[0]
    return json.dumps(fields, ensure_ascii=False, default=str)


def result_text(result: Any) -> str:
    """The text of an MCP tool result: its text content parts joined, else its data, else JSON."""
    content = result.get("content") if isinstance(result, Mapping) else getattr(result, "content", None)
    if isinstance(content, Sequence) and not isinstance(content, str):
        texts = [p.get("text") if isinstance(p, Mapping) else getattr(p, "text", None) for p in content]
        if texts and all(isinstance(t, str) for t in texts):
            return "\n".join(t for t in texts if t is not None)
    data = result.get("data") if isinstance(result, Mapping) else getattr(result, "data", None)
    if data is not None:
        return data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, default=str)
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)


def _unpack(out: Any) -> tuple[Any, float | None, bool]:
    """``(observation, reward, done)`` of what ``reset``/``step`` returned (an Observation or a StepResult)."""
    if hasattr(out, "observation") and not hasattr(out, "model_fields"):  # a client's StepResult
        obs, reward, done = out.observation, out.reward, out.done
    elif isinstance(out, Mapping):
        obs, reward, done = out, out.get("reward"), out.get("done", False)
    else:
        obs, reward, done = out, getattr(out, "reward", None), getattr(out, "done", False)
    if isinstance(reward, bool):
        reward = float(reward)
    return obs, (None if reward is None else float(reward)), bool(done)


def _text_field(action_cls: type) -> str:
    """The one required string field of an Action class (what the assistant's content fills)."""
    fields = getattr(action_cls, "model_fields", {})
    required = [n for n, f in fields.items() if f.is_required()]
    if len(required) == 1 and fields[required[0]].annotation is str:
        return str(required[0])
    raise EnvAdapterError(
        "OpenEnvEnv",
        f"{action_cls.__name__} has required fields {required}: only an Action with one required string field "
        "is filled from the assistant's content; pass action=a function of the assistant message instead",
    )


class OpenEnvEnv:
    """A tmpl :class:`~tmpl.env.AsyncEnv` over one OpenEnv environment or client (see the module docstring).

    ``env``: an ``Environment`` (run in this process), an ``EnvClient`` (async) or its ``.sync()`` client.
    ``action``: a function ``assistant message -> Action | dict`` or an Action class (actions mode).
    ``tools``: True for tools mode (default: when ``env`` is an ``MCPEnvironment`` or ``MCPToolClient``).
    ``observe``: observation -> text (default :func:`observation_text`). ``role``: the role of the turn
    an observation becomes. ``reset_kwargs``: passed to every ``reset`` (with the task's own, see
    :meth:`reset`). ``prompt``: messages put before the first observation when the task has none
    (e.g. a system message). ``close_env``: close ``env`` at close (default True).
    """

    def __init__(
        self,
        env: Any,
        *,
        action: Callable[[dict[str, Any]], Any] | type | None = None,
        tools: bool | None = None,
        observe: Callable[[Any], str] = observation_text,
        role: str = "user",
        reset_kwargs: Mapping[str, Any] | None = None,
        prompt: Sequence[Mapping[str, Any]] = (),
        close_env: bool = True,
    ) -> None:
        mcp_types = _require_openenv()
        if tools is None:
            tools = _is_mcp(env)
        if not tools and action is None:
            raise EnvAdapterError(
                "OpenEnvEnv",
                f"{type(env).__name__} is not an MCP environment: pass action= (an Action class with one string "
                "field, or a function of the assistant message returning an action), or tools=True",
            )
        if role not in ("user", "system", "developer"):
            raise EnvAdapterError("OpenEnvEnv", f"observations become user, system or developer turns, not {role!r}")
        if isinstance(action, type):
            cls, field = action, _text_field(action)
            self.action: Callable[[dict[str, Any]], Any] | None = lambda m: cls(**{field: m.get("content") or ""})
        else:
            self.action = action
        self.env = env
        self.tools = bool(tools)
        self.observe = observe
        self.role = role
        self.reset_kwargs = dict(reset_kwargs or {})
        self.prompt = [dict(m) for m in prompt]
        self.close_env = close_env
        self._mcp = mcp_types
        self.observations: list[Any] = []
        self.total_reward = 0.0

    # -- calling the environment, whatever it is -------------------------------------------------
    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        fn = getattr(self.env, method)
        if _is_sync_client(self.env):  # a blocking client: keep the rollout's event loop free
            return await asyncio.to_thread(fn, *args, **kwargs)
        if inspect.iscoroutinefunction(fn):  # EnvClient
            return await fn(*args, **kwargs)
        async_fn = getattr(self.env, f"{method}_async", None)  # Environment: reset_async / step_async
        if async_fn is not None:
            return await async_fn(*args, **kwargs)
        out = fn(*args, **kwargs)
        return await out if inspect.isawaitable(out) else out

    async def _list_tools(self) -> list[dict[str, Any]]:
        if callable(getattr(self.env, "list_tools", None)):  # MCPToolClient
            listed = self.env.list_tools()
            listed = await listed if inspect.isawaitable(listed) else listed
        else:
            obs, _, _ = _unpack(await self._call("step", self._mcp.ListToolsAction()))
            listed = obs.get("tools") if isinstance(obs, Mapping) else getattr(obs, "tools", None)
        if not listed:
            raise EnvAdapterError("OpenEnvEnv", f"{type(self.env).__name__} lists no tools")
        return [_schema(t) for t in listed]

    async def _call_tool(self, name: str, arguments: dict[str, Any]) -> tuple[str, float | None, bool]:
        if callable(getattr(self.env, "call_tool", None)):  # MCPToolClient
            try:
                out = self.env.call_tool(name, **arguments)
                result = await out if inspect.isawaitable(out) else out
            except Exception as exc:  # noqa: BLE001 - the model is told, the episode goes on
                return f"error: {exc}", None, False
            return result_text(result), None, False
        obs, reward, done = _unpack(
            await self._call("step", self._mcp.CallToolAction(tool_name=name, arguments=arguments))
        )
        error = obs.get("error") if isinstance(obs, Mapping) else getattr(obs, "error", None)
        if error is not None:
            message = error.get("message") if isinstance(error, Mapping) else getattr(error, "message", error)
            return f"error: {message}", reward, done
        result = obs.get("result") if isinstance(obs, Mapping) else getattr(obs, "result", None)
        if getattr(result, "is_error", False) or (isinstance(result, Mapping) and result.get("is_error")):
            return f"error: {result_text(result)}", reward, done
        return result_text(result), reward, done

    # -- the tmpl protocol ----------------------------------------------------------------------------
    async def reset(self, task: Any) -> EnvReset:
        """``task``: None, reset keywords (a mapping: ``seed``, ``episode_id``, the environment's own; a
        ``prompt`` key, a conversation, goes before the first observation and is not passed on), or a
        conversation. The first observation is appended as a ``role`` turn (in tools mode, only when it
        has text)."""
        kwargs = dict(self.reset_kwargs)
        prompt = list(self.prompt)
        if isinstance(task, Mapping):
            task = dict(task)
            if "prompt" in task:
                prompt = [dict(m) for m in task.pop("prompt")]
            kwargs.update(task)
        elif isinstance(task, Sequence) and not isinstance(task, str):
            prompt = [dict(m) for m in task]
        elif task is not None:
            raise EnvAdapterError(
                "OpenEnvEnv", f"a task is None, reset keywords or a conversation, not {type(task).__name__}"
            )
        obs, reward, _ = _unpack(await self._call("reset", **kwargs))
        self.observations = [obs]
        self.total_reward = reward or 0.0
        text = self.observe(obs)
        messages = prompt + ([{"role": self.role, "content": text}] if text and _shows(obs, self.tools) else [])
        if not messages:
            raise EnvAdapterError(
                "OpenEnvEnv", "the first observation has no text and the task no prompt: nothing to show the model"
            )
        schemas = await self._list_tools() if self.tools else None
        return EnvReset(messages=messages, tools=schemas, state=self)

    async def step(self, assistant: dict[str, Any]) -> EnvStep:
        if self.tools:
            calls = assistant.get("tool_calls") or []
            if not calls:
                return EnvStep(messages=[], done=True)
            messages, total, done = [], None, False
            for call in calls:
                function = call.get("function") or {}
                arguments = function.get("arguments") or {}
                if not isinstance(arguments, Mapping):
                    text, reward, ended = f"error: the arguments are not an object: {arguments!r}", None, False
                else:
                    text, reward, ended = await self._call_tool(function.get("name", ""), dict(arguments))
                message = {"role": "tool", "name": function.get("name", ""), "content": text}
                if call.get("id"):
                    message["tool_call_id"] = call["id"]
                messages.append(message)
                total = reward if total is None else total + (reward or 0.0)
                done = done or ended
            self.total_reward += total or 0.0
            return EnvStep(messages=messages, reward=total, done=done)
        assert self.action is not None
        obs, reward, done = _unpack(await self._call("step", self.action(assistant)))
        self.observations.append(obs)
        self.total_reward += reward or 0.0
        text = self.observe(obs)
        messages = [{"role": self.role, "content": text}] if text and not done else []
        return EnvStep(messages=messages, reward=reward, done=done, info={"observation": _fields(obs)})

    async def close(self) -> None:
        if not self.close_env:
            return
        close = getattr(self.env, "close", None)
        if close is None:
            return
        if _is_sync_client(self.env):
            await asyncio.to_thread(close)
            return
        out = close()
        if inspect.isawaitable(out):
            await out


def _shows(obs: Any, tools: bool) -> bool:
    """Whether the first observation is shown: always in actions mode; in tools mode when it has fields."""
    return not tools or bool(_fields(obs))


def _schema(tool: Any) -> dict[str, Any]:
    """An OpenAI-style function schema from an MCP tool (OpenEnv's ``Tool``, an MCP SDK tool or a dict)."""
    get = tool.get if isinstance(tool, Mapping) else lambda k, d=None: getattr(tool, k, d)
    parameters = get("input_schema") or get("inputSchema") or {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {"name": get("name"), "description": get("description") or "", "parameters": dict(parameters)},
    }


def _is_mcp(env: Any) -> bool:
    names = {c.__name__ for c in type(env).__mro__}
    return bool(names & {"MCPEnvironment", "MCPToolClient", "MCPClientBase"})


def _is_sync_client(env: Any) -> bool:
    return any(c.__name__ == "SyncEnvClient" for c in type(env).__mro__)


__all__ = ["PROTOCOL_FIELDS", "OpenEnvEnv", "observation_text", "result_text"]
