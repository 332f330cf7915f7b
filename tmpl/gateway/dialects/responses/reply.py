"""A Responses reply written: output items (reasoning with its reference, message, function and custom tool calls
mapped back to their namespace), the response object, its events, and errors in OpenAI's shape."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

from ....errors import GatewayError
from ...session import Plan, Reply
from .request import ResponsesRequest, ToolName, reasoning_reference


def _call_item(reply: Reply, j: int, call: Mapping[str, Any], names: Mapping[str, ToolName]) -> dict[str, Any]:
    """One parsed call as the item the client expects: a function_call (its namespace mapped back) or a
    custom_tool_call (its ``input`` string)."""
    fn = call["function"]
    meant = names.get(fn["name"])
    args = fn["arguments"]
    if meant is not None and meant.kind == "custom":
        if isinstance(args, Mapping) and set(args) == {"input"} and isinstance(args["input"], str):
            text = args["input"]
        else:
            text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        item: dict[str, Any] = {
            "type": "custom_tool_call",
            "id": f"ctc_{reply.call}_{j}",
            "call_id": call["id"],
            "name": meant.name,
            "input": text,
            "status": "completed",
        }
    else:
        item = {
            "type": "function_call",
            "id": f"fc_{reply.call}_{j}",
            "call_id": call["id"],
            "name": meant.name if meant is not None else fn["name"],
            "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
            "status": "completed",
        }
    if meant is not None and meant.namespace:
        item["namespace"] = meant.namespace
    return item


def _output(reply: Reply, request: ResponsesRequest | None) -> list[dict[str, Any]]:
    m = reply.message
    names = request.names if request is not None else {}
    out: list[dict[str, Any]] = []
    if m.get("reasoning_content"):
        text = m["reasoning_content"]
        item: dict[str, Any] = {
            "type": "reasoning",
            "id": f"rs_{reply.call}",
            "summary": [{"type": "summary_text", "text": text}] if request is not None and request.summary else [],
            "content": [{"type": "reasoning_text", "text": text}],
        }
        if request is not None and request.encrypted:
            item["encrypted_content"] = reasoning_reference(reply.call, text)
        out.append(item)
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
        out.append(_call_item(reply, j, c, names))
    return out


def response(
    session: str,
    plan: Plan,
    reply: Reply,
    *,
    model: str,
    echo: Mapping[str, Any],
    request: ResponsesRequest | None = None,
) -> dict[str, Any]:
    """The ``response`` object of a call's reply (``request``: its names, include and summary settings)."""
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
        "output": _output(reply, request),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "previous_response_id": None,
        "reasoning": None,
        "store": False,
        "service_tier": "default",
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
        "tmpl": _tmpl(session, plan, reply, request),
    }


def _tmpl(session: str, plan: Plan, reply: Reply, request: ResponsesRequest | None) -> dict[str, Any]:
    """The reply's ``tmpl`` object: session, call, sequence, how the prompt was made, how its system and
    developer turns were placed (``roles``) and what of the request was left out (``left_out``)."""
    out: dict[str, Any] = {"session": session, "call": reply.call, "sequence": reply.sequence, "prompt": plan.mode}
    roles = getattr(plan, "roles", None)
    if roles:
        out["roles"] = dict(roles)
    if request is not None and request.notes:
        out["left_out"] = list(request.notes)
    return out


def events(
    session: str,
    plan: Plan,
    reply: Reply,
    *,
    model: str,
    echo: Mapping[str, Any],
    request: ResponsesRequest | None = None,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(event, data)`` pairs of a streamed response, in the order the Responses API sends them."""
    full = response(session, plan, reply, model=model, echo=echo, request=request)
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
        elif item["type"] == "custom_tool_call":
            yield ev("response.output_item.added", output_index=k, item={**item, "status": "in_progress", "input": ""})
            text = item["input"]
            yield ev("response.custom_tool_call_input.delta", item_id=item["id"], output_index=k, delta=text)
            yield ev("response.custom_tool_call_input.done", item_id=item["id"], output_index=k, input=text)
        else:
            yield ev("response.output_item.added", output_index=k, item={**item, "summary": [], "content": []})
            for s, part in enumerate(item.get("summary", ())):
                yield ev(
                    "response.reasoning_summary_part.added",
                    item_id=item["id"],
                    output_index=k,
                    summary_index=s,
                    part={"type": "summary_text", "text": ""},
                )
                yield ev(
                    "response.reasoning_summary_text.delta",
                    item_id=item["id"],
                    output_index=k,
                    summary_index=s,
                    delta=part["text"],
                )
                yield ev(
                    "response.reasoning_summary_text.done",
                    item_id=item["id"],
                    output_index=k,
                    summary_index=s,
                    text=part["text"],
                )
                yield ev(
                    "response.reasoning_summary_part.done",
                    item_id=item["id"],
                    output_index=k,
                    summary_index=s,
                    part=part,
                )
        yield ev("response.output_item.done", output_index=k, item=item)
    yield ev("response.incomplete" if full["status"] == "incomplete" else "response.completed", response=full)


def error_body(exc: GatewayError) -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": str(exc), "type": exc.kind, "param": exc.param, "code": exc.status}}
