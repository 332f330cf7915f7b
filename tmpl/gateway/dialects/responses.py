"""OpenAI Responses (``POST /v1/responses``): input items in, a response object and its stream events out.

Read: ``input`` (a string, or items: messages with text parts, ``function_call``,
``function_call_output`` and ``reasoning`` items), ``instructions`` (a system message first), function
``tools``, ``tool_choice`` (``auto`` only), ``max_output_tokens``, ``temperature``, ``top_p``,
``stream``. An assistant message, the reasoning before it and the function calls after it are one
assistant turn. Refused with a 400: ``previous_response_id`` and ``conversation`` (the gateway keeps
no response store: send the whole input, as harnesses do), tools other than functions, image parts.

>>> req = parse({"model": "m", "instructions": "Be brief.", "input": "Hi"})
>>> req.messages
[{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi'}]
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import GatewayError, GatewayRequestError
from ..canonical import ROLES, canonical_message, tool_call
from ..service import CallParams
from ..session import Plan, Reply

__all__ = ["ResponsesRequest", "error_body", "events", "parse", "response"]


@dataclass(frozen=True)
class ResponsesRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    params: CallParams
    stream: bool
    model: str | None
    echo: dict[str, Any]


def _output_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, Sequence):
        raise GatewayRequestError(None, f"{where}.content must be a string or a list of parts", param="input")
    out = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            out.append(str(part.get("text", "")))
        elif kind != "refusal":
            raise GatewayRequestError(
                None, f"{where}.content[{k}]: {kind!r} parts are not served (text only)", param="input"
            )
    return "".join(out)


def _items(items: Sequence[Any]) -> list[dict[str, Any]]:
    """Input items as canonical messages: an assistant turn gathers its reasoning, text and calls."""
    out: list[dict[str, Any]] = []
    reasoning: list[str] = []
    turn: dict[str, Any] | None = None  # the assistant turn being gathered

    def close() -> None:
        nonlocal turn, reasoning
        if turn is None and reasoning:
            turn = {"role": "assistant", "content": ""}
        if turn is not None:
            if reasoning:
                turn["reasoning_content"] = "".join(reasoning)
            out.append(turn)
        turn, reasoning = None, []

    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise GatewayRequestError(None, f"{where} must be an object", param="input")
        kind = item.get("type", "message")
        if kind == "reasoning":
            if turn is not None:
                close()
            parts = item.get("content") or item.get("summary") or []
            reasoning.append(_output_text(parts, where))
        elif kind == "message":
            role = item.get("role")
            if role not in ROLES or role == "tool":
                raise GatewayRequestError(
                    None, f"{where}.role must be user, assistant, system or developer", param="input"
                )
            if role == "assistant":
                if turn is not None and (turn.get("tool_calls") or turn["content"]):
                    close()
                text = _output_text(item.get("content"), where)
                turn = turn or {"role": "assistant", "content": ""}
                turn["content"] += text
            else:
                close()
                out.append(canonical_message({"role": role, "content": _output_text(item.get("content"), where)}, i))
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(item.get("call_id"), str):
                raise GatewayRequestError(None, f"{where}: a function_call needs a call_id and a name", param="input")
            turn = turn or {"role": "assistant", "content": ""}
            turn.setdefault("tool_calls", []).append(tool_call(item["call_id"], item["name"], item.get("arguments")))
        elif kind == "function_call_output":
            close()
            if not isinstance(item.get("call_id"), str):
                raise GatewayRequestError(None, f"{where}: a function_call_output needs a call_id", param="input")
            output = item.get("output")
            text = output if isinstance(output, str) else _output_text(output or [], where)
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        else:
            raise GatewayRequestError(None, f"{where}: {kind!r} items are not served", param="input")
    close()
    return out


def parse(body: Any) -> ResponsesRequest:
    """A Responses request body as canonical messages, tools and call parameters."""
    if not isinstance(body, Mapping):
        raise GatewayRequestError(None, "the request body must be a JSON object")
    for key in ("previous_response_id", "conversation"):
        if body.get(key):
            raise GatewayRequestError(
                None, f"{key} is not served: the gateway keeps no response store (send the whole input)", param=key
            )
    choice = body.get("tool_choice")
    if choice not in (None, "auto"):
        raise GatewayRequestError(None, "tool_choice other than auto is not served", param="tool_choice")
    raw = body.get("input")
    if isinstance(raw, str):
        messages = [{"role": "user", "content": raw}]
    elif isinstance(raw, Sequence) and raw:
        messages = _items(raw)
    else:
        raise GatewayRequestError(None, "input must be a string or a non-empty list of items", param="input")
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    tools = None
    if body.get("tools"):
        tools = []
        for k, t in enumerate(body["tools"]):
            if not isinstance(t, Mapping) or t.get("type") != "function" or not isinstance(t.get("name"), str):
                raise GatewayRequestError(
                    None, f"tools[{k}]: only function tools with a name are served", param="tools"
                )
            fn: dict[str, Any] = {"name": t["name"]}
            if isinstance(t.get("description"), str):
                fn["description"] = t["description"]
            fn["parameters"] = t.get("parameters") or {"type": "object", "properties": {}}
            tools.append({"type": "function", "function": fn})
    limit = body.get("max_output_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise GatewayRequestError(None, "max_output_tokens must be a positive integer", param="max_output_tokens")
    temperature, top_p = body.get("temperature"), body.get("top_p")
    echo = {
        "instructions": body.get("instructions"),
        "tools": list(body.get("tools") or []),
        "temperature": temperature,
        "top_p": top_p,
        "max_output_tokens": limit,
        "metadata": body.get("metadata") or {},
    }
    return ResponsesRequest(
        messages,
        tools,
        CallParams(
            max_tokens=limit,
            temperature=float(temperature) if isinstance(temperature, (int, float)) else None,
            top_p=float(top_p) if isinstance(top_p, (int, float)) else None,
        ),
        bool(body.get("stream")),
        body.get("model") if isinstance(body.get("model"), str) else None,
        echo,
    )


def _output(reply: Reply) -> list[dict[str, Any]]:
    m = reply.message
    out: list[dict[str, Any]] = []
    if m.get("reasoning_content"):
        out.append(
            {
                "type": "reasoning",
                "id": f"rs_{reply.call}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": m["reasoning_content"]}],
            }
        )
    if m.get("content") or not m.get("tool_calls"):
        out.append(
            {
                "type": "message",
                "id": f"msg_{reply.call}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": m.get("content") or "", "annotations": [], "logprobs": []}],
            }
        )
    for j, c in enumerate(m.get("tool_calls", ())):
        out.append(
            {
                "type": "function_call",
                "id": f"fc_{reply.call}_{j}",
                "call_id": c["id"],
                "name": c["function"]["name"],
                "arguments": json.dumps(c["function"]["arguments"]),
                "status": "completed",
            }
        )
    return out


def response(session: str, plan: Plan, reply: Reply, *, model: str, echo: Mapping[str, Any]) -> dict[str, Any]:
    """The ``response`` object of a call's reply."""
    cut = reply.result.finish_reason == "length" and not reply.message.get("tool_calls")
    sampled = len(reply.result.token_ids)
    return {
        "id": f"resp_{reply.call}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "model": model,
        "output": _output(reply),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "previous_response_id": None,
        "reasoning": None,
        "store": False,
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        **echo,
        "usage": {
            "input_tokens": len(plan.prompt_ids),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": sampled,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": len(plan.prompt_ids) + sampled,
        },
        "tmpl": {"session": session, "call": reply.call, "sequence": reply.sequence, "prompt": plan.mode},
    }


def events(
    session: str, plan: Plan, reply: Reply, *, model: str, echo: Mapping[str, Any]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(event, data)`` pairs of a streamed response, in the order the Responses API sends them."""
    full = response(session, plan, reply, model=model, echo=echo)
    seq = iter(range(1 << 30))

    def ev(kind: str, **data: Any) -> tuple[str, dict[str, Any]]:
        return kind, {"type": kind, "sequence_number": next(seq), **data}

    yield ev("response.created", response={**full, "status": "in_progress", "output": [], "usage": None})
    yield ev("response.in_progress", response={**full, "status": "in_progress", "output": [], "usage": None})
    for k, item in enumerate(full["output"]):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            yield ev(
                "response.output_item.added", output_index=k, item={**item, "status": "in_progress", "content": []}
            )
            empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            yield ev("response.content_part.added", item_id=item["id"], output_index=k, content_index=0, part=empty)
            yield ev(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=k,
                content_index=0,
                delta=text,
                logprobs=[],
            )
            yield ev(
                "response.output_text.done", item_id=item["id"], output_index=k, content_index=0, text=text, logprobs=[]
            )
            yield ev(
                "response.content_part.done",
                item_id=item["id"],
                output_index=k,
                content_index=0,
                part=item["content"][0],
            )
        elif item["type"] == "function_call":
            yield ev(
                "response.output_item.added", output_index=k, item={**item, "status": "in_progress", "arguments": ""}
            )
            args = item["arguments"]
            yield ev("response.function_call_arguments.delta", item_id=item["id"], output_index=k, delta=args)
            yield ev(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=k,
                arguments=args,
                name=item["name"],
            )
        else:
            yield ev("response.output_item.added", output_index=k, item={**item, "content": []})
        yield ev("response.output_item.done", output_index=k, item=item)
    yield ev("response.incomplete" if full["status"] == "incomplete" else "response.completed", response=full)


def error_body(exc: GatewayError) -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": str(exc), "type": exc.kind, "param": exc.param, "code": exc.status}}
