"""What an environment returns, checked before anything of it goes into a sample.

``reset`` must give an :class:`EnvReset` whose messages are a conversation; ``step`` an :class:`EnvStep`
whose messages are tool results or user / system / developer turns, with a finite reward (or None).
Anything else raises a typed error naming the sample, the environment, the method and the message.

>>> check_step(EnvStep(messages=[{"role": "robot", "content": "hi"}]), sample="0/0", env="Shop")
Traceback (most recent call last):
...
tmpl.errors.EnvMessageError: sample '0/0': Shop.step messages[0]: role 'robot' cannot follow an assistant turn (expected one of: developer, system, tool, user)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import EnvError, EnvMessageError, EnvRewardError, MessageError
from ..messages import TOOL_ROLES, validate_messages
from .protocol import STEP_ROLES, EnvReset, EnvStep

#: roles ``step`` may append: tool results (any tool role the templates know) and non-tool turns
APPENDABLE = STEP_ROLES | TOOL_ROLES


def check_reset(out: Any, *, sample: object, env: str) -> EnvReset:
    """``out`` as an :class:`EnvReset` whose messages are a valid opening conversation.

    A dict with ``messages`` (and ``tools``, ``state``) is accepted as well, and a bare list of messages.

    >>> check_reset([{"role": "user", "content": "Hi"}], sample="0/0", env="E").messages[0]["role"]
    'user'
    """
    if isinstance(out, Mapping) and "messages" in out:
        out = EnvReset(messages=out["messages"], tools=out.get("tools"), state=out.get("state"))
    elif isinstance(out, Sequence) and not isinstance(out, (str, bytes)):
        out = EnvReset(messages=list(out))
    if not isinstance(out, EnvReset):
        raise EnvError(sample, f"returned {type(out).__name__}, not an EnvReset", env=env, phase="reset")
    messages = _message_list(out.messages, sample=sample, env=env, phase="reset")
    try:
        validate_messages(messages, where="messages")
    except MessageError as exc:
        raise EnvMessageError(sample, str(exc), env=env, phase="reset", index=exc.index) from None
    if messages[-1]["role"] == "assistant":
        raise EnvMessageError(
            sample,
            f"messages[{len(messages) - 1}]: the opening conversation ends with an assistant turn; the model "
            "answers a user, system, developer or tool turn",
            env=env,
            phase="reset",
            index=len(messages) - 1,
        )
    out.messages = messages
    return out


def check_step(out: Any, *, sample: object, env: str, calls: int = 0) -> EnvStep:
    """``out`` as an :class:`EnvStep`: messages of appendable roles with content, a finite reward.

    ``calls``: the assistant turn's tool calls; tool results may answer at most that many of them.

    >>> check_step(EnvStep(messages=[], reward=float("inf")), sample="0/0", env="E")
    Traceback (most recent call last):
    ...
    tmpl.errors.EnvRewardError: sample '0/0': E.step reward inf is not a finite number
    """
    if not isinstance(out, EnvStep):
        raise EnvError(sample, f"returned {type(out).__name__}, not an EnvStep", env=env, phase="step")
    messages = _message_list(out.messages, sample=sample, env=env, phase="step")
    tools = 0
    for i, m in enumerate(messages):
        role = m.get("role")
        if role not in APPENDABLE:
            raise EnvMessageError(
                sample,
                f"messages[{i}]: role {role!r} cannot follow an assistant turn (expected one of: "
                f"{', '.join(sorted(STEP_ROLES))})",
                env=env,
                phase="step",
                index=i,
            )
        content = m.get("content")
        if not isinstance(content, (str, list)):
            raise EnvMessageError(
                sample,
                f"messages[{i}]: a {role} message needs 'content' (a string or content parts), got "
                f"{type(content).__name__}",
                env=env,
                phase="step",
                index=i,
            )
        if "tool_calls" in m:
            raise EnvMessageError(
                sample, f"messages[{i}]: only the model makes tool calls", env=env, phase="step", index=i
            )
        if role in TOOL_ROLES:
            if i > tools:
                raise EnvMessageError(
                    sample,
                    f"messages[{i}]: a tool result after a {messages[i - 1]['role']} turn answers no call "
                    "(tool results come first, right after the assistant turn)",
                    env=env,
                    phase="step",
                    index=i,
                )
            tools += 1
    ended = out.done or out.truncated
    if tools > calls or (calls and not ended and tools != calls):
        raise EnvMessageError(
            sample,
            f"{tools} tool result(s) for an assistant turn with {calls} tool call(s) (each call is answered, "
            "in order, before any other turn)",
            env=env,
            phase="step",
            index=calls,
        )
    if out.reward is not None:
        r = out.reward
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r):
            raise EnvRewardError(sample, f"reward {r!r} is not a finite number", env=env, phase="step")
    if not isinstance(out.info, Mapping):
        raise EnvError(sample, f"info is {type(out.info).__name__}, not a dict", env=env, phase="step")
    out.messages = messages
    return out


def _message_list(messages: Any, *, sample: object, env: str, phase: str) -> list[dict[str, Any]]:
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise EnvMessageError(
            sample, f"messages is {type(messages).__name__}, not a list of messages", env=env, phase=phase
        )
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise EnvMessageError(
                sample, f"messages[{i}] is {type(m).__name__}, not a dict", env=env, phase=phase, index=i
            )
        out.append(dict(m))
    return out
