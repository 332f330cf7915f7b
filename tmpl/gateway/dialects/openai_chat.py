"""OpenAI Chat Completions (``POST /v1/chat/completions``): requests in, responses and SSE chunks out.

Read: ``messages``, ``tools`` (function tools), ``tool_choice`` (``auto``; ``required`` is taken as
``auto``: the gateway samples the policy as it is and never constrains decoding), ``n``, ``max_tokens``
/ ``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``, ``logprobs`` (the sampled token's),
``stream``, ``stream_options.include_usage``, and ``stop`` strings (a reply ends with the token that
completes one; the string is left out of its content). Refused with a 400 naming the field:
``top_logprobs`` above 0, a non-text ``response_format``, image parts.
Each response carries a ``tmpl`` object (session, call ids, sequence index, how the prompt was made).

>>> body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
>>> request = parse(body)
>>> request.messages, request.params.max_tokens, request.stream
([{'role': 'user', 'content': 'Hi'}], 8, False)
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import GatewayError, GatewayRequestError
from ..canonical import canonical_message, canonical_tools
from ..service import CallParams
from ..session import Plan, Reply

__all__ = ["ChatRequest", "chunks", "error_body", "parse", "response"]

FINISH = {"stop": "stop", "length": "length", "abort": "stop"}


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    params: CallParams
    stream: bool
    include_usage: bool
    logprobs: bool
    model: str | None


def _int(body: Mapping[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise GatewayRequestError(None, f"{key} must be an integer, got {value!r}", param=key)
    return value


def _float(body: Mapping[str, Any], key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GatewayRequestError(None, f"{key} must be a number, got {value!r}", param=key)
    return float(value)


def parse(body: Any) -> ChatRequest:
    """A Chat Completions request body as canonical messages, tools and call parameters."""
    if not isinstance(body, Mapping):
        raise GatewayRequestError(None, "the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise GatewayRequestError(None, "messages must be a non-empty list", param="messages")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "required"):
        raise GatewayRequestError(
            None,
            f"tool_choice {choice!r} is not served: the gateway does not constrain decoding (use 'auto'; "
            "'required' is taken as 'auto')",
            param="tool_choice",
        )
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, (str, list)):
        raise GatewayRequestError(None, "stop must be a string or a list of strings", param="stop")
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stops) > 4 or not all(isinstance(x, str) and 0 < len(x) <= 256 for x in stops):
        raise GatewayRequestError(None, "stop must be a string or up to 4 strings of 1-256 characters", param="stop")
    if _int(body, "top_logprobs"):
        raise GatewayRequestError(
            None, "top_logprobs is not served (the sampled token's logprob is)", param="top_logprobs"
        )
    fmt = body.get("response_format")
    if isinstance(fmt, Mapping) and fmt.get("type") not in (None, "text"):
        raise GatewayRequestError(None, f"response_format {fmt.get('type')!r} is not served", param="response_format")
    n = _int(body, "n")
    max_tokens = _int(body, "max_completion_tokens") or _int(body, "max_tokens")
    options = body.get("stream_options") or {}
    return ChatRequest(
        [canonical_message(m, i) for i, m in enumerate(messages)],
        canonical_tools(body.get("tools")),
        CallParams(
            max_tokens=max_tokens,
            temperature=_float(body, "temperature"),
            top_p=_float(body, "top_p"),
            n=1 if n is None else n,
            seed=_int(body, "seed"),
            stop=stops,
        ),
        bool(body.get("stream")),
        bool(isinstance(options, Mapping) and options.get("include_usage")),
        bool(body.get("logprobs")),
        body.get("model") if isinstance(body.get("model"), str) else None,
    )


def _message(reply: Reply) -> dict[str, Any]:
    m = reply.message
    out: dict[str, Any] = {"role": "assistant", "content": m.get("content") or None}
    if m.get("reasoning_content"):
        out["reasoning_content"] = m["reasoning_content"]
    if m.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])},
            }
            for c in m["tool_calls"]
        ]
    else:
        out["content"] = m.get("content") or ""
    return out


def _finish(reply: Reply) -> str:
    if reply.message.get("tool_calls"):
        return "tool_calls"
    return FINISH.get(reply.result.finish_reason, "stop")


def _logprobs(reply: Reply, tpl: Any) -> dict[str, Any]:
    ids = reply.result.token_ids
    lps = reply.result.logprobs or [0.0] * len(ids)
    out = []
    for tid, lp in zip(ids, lps):
        text = tpl.codec.decode([tid])
        out.append({"token": text, "logprob": lp, "bytes": list(text.encode("utf-8")), "top_logprobs": []})
    return {"content": out}


def _tmpl(session: str, plan: Plan, replies: Sequence[Reply]) -> dict[str, Any]:
    return {
        "session": session,
        "calls": [r.call for r in replies],
        "sequences": [r.sequence for r in replies],
        "prompt": plan.mode,
        "prompt_tokens_encoded": plan.encoded,
        **({"roles": dict(plan.roles)} if plan.roles else {}),
    }


def response(
    session: str, plan: Plan, replies: Sequence[Reply], *, model: str, logprobs: bool, tpl: Any
) -> dict[str, Any]:
    """The ``chat.completion`` object of a call's replies."""
    completion = sum(len(r.result.token_ids) for r in replies)
    return {
        "id": f"chatcmpl-{replies[0].call}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": k,
                "message": _message(r),
                "finish_reason": _finish(r),
                "logprobs": _logprobs(r, tpl) if logprobs else None,
            }
            for k, r in enumerate(replies)
        ],
        "usage": {
            "prompt_tokens": len(plan.prompt_ids),
            "completion_tokens": completion,
            "total_tokens": len(plan.prompt_ids) + completion,
        },
        "tmpl": _tmpl(session, plan, replies),
    }


def chunks(
    session: str, plan: Plan, replies: Sequence[Reply], *, model: str, include_usage: bool, logprobs: bool, tpl: Any
) -> Iterator[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a call's replies, as a stream sends them (then ``[DONE]``)."""
    base = {
        "id": f"chatcmpl-{replies[0].call}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }
    for k, r in enumerate(replies):
        message = _message(r)
        yield {
            **base,
            "choices": [
                {"index": k, "delta": {"role": "assistant", "content": ""}, "finish_reason": None, "logprobs": None}
            ],
        }
        if message.get("reasoning_content"):
            yield {
                **base,
                "choices": [
                    {
                        "index": k,
                        "delta": {"reasoning_content": message["reasoning_content"]},
                        "finish_reason": None,
                        "logprobs": None,
                    }
                ],
            }
        if message.get("content"):
            yield {
                **base,
                "choices": [
                    {
                        "index": k,
                        "delta": {"content": message["content"]},
                        "finish_reason": None,
                        "logprobs": _logprobs(r, tpl) if logprobs else None,
                    }
                ],
            }
        for j, call in enumerate(message.get("tool_calls", ())):
            delta = {"tool_calls": [{"index": j, "id": call["id"], "type": "function", "function": call["function"]}]}
            yield {**base, "choices": [{"index": k, "delta": delta, "finish_reason": None, "logprobs": None}]}
        yield {**base, "choices": [{"index": k, "delta": {}, "finish_reason": _finish(r), "logprobs": None}]}
    if include_usage:
        completion = sum(len(r.result.token_ids) for r in replies)
        yield {
            **base,
            "choices": [],
            "usage": {
                "prompt_tokens": len(plan.prompt_ids),
                "completion_tokens": completion,
                "total_tokens": len(plan.prompt_ids) + completion,
            },
            "tmpl": _tmpl(session, plan, replies),
        }


def error_body(exc: GatewayError) -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": str(exc), "type": exc.kind, "param": exc.param, "code": exc.status}}
