"""Each dialect's live event stream from a :class:`~.live.LiveText`: chat completion chunks, Anthropic's message
events, Responses' events, Gemini's chunks; the end read from each dialect's own whole answer."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from ..dialects import anthropic, openai_chat

if TYPE_CHECKING:
    pass
from .live import Final, LiveText


def _data(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _event(kind: str, obj: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps(obj)}\n\n"


def _prompt_tokens(live: LiveText) -> int:
    return 0 if live.request is None else len(live.request.prompt_ids)


# -- OpenAI Chat Completions ----------------------------------------------------------------
async def chat_sse(
    live: LiveText, events: AsyncIterator[tuple[str, Any]], final: Final, *, model: str, include_usage: bool
) -> AsyncIterator[str]:
    """``chat.completion.chunk`` lines of one choice as they come: the role, content deltas, then the
    reasoning, the rest of the content, the tool calls (each whole), the finish reason (with the logprobs
    when asked), the usage when asked, ``[DONE]``; ``: ping`` comments while nothing else goes out. The end
    is read from ``final(completion)``, the call's ``chat.completion`` object. A call that fails
    mid-stream sends an error object."""
    base = {"id": f"chatcmpl-{live.call_id}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model}  # fmt: skip

    def chunk(delta: Mapping[str, Any], finish: str | None = None, logprobs: Any = None) -> str:
        choice = {"index": 0, "delta": dict(delta), "finish_reason": finish, "logprobs": logprobs}
        return _data({**base, "choices": [choice]})

    yield chunk({"role": "assistant", "content": ""})
    async for kind, value in events:
        if kind == "ping":
            yield ": ping\n\n"
        elif kind == "content":
            yield chunk({"content": value})
        elif kind == "reasoning":
            yield chunk({"reasoning_content": value})
        elif kind == "error":
            yield _data(openai_chat.error_body(value))
            return
        else:
            body = final(value)
            choice = body["choices"][0]
            message = choice["message"]
            thought = live.rest_reasoning(message.get("reasoning_content") or "")
            if thought:
                yield chunk({"reasoning_content": thought})
            rest = live.rest(message.get("content") or "")
            if rest:
                yield chunk({"content": rest})
            for j, call in enumerate(message.get("tool_calls") or ()):
                yield chunk({"tool_calls": [{"index": j, **call}]})
            yield chunk({}, choice["finish_reason"], choice.get("logprobs"))
            if include_usage:
                yield _data({**base, "choices": [], "usage": body["usage"], "tmpl": body.get("tmpl")})
            yield "data: [DONE]\n\n"


# -- Anthropic Messages ---------------------------------------------------------------------
async def anthropic_sse(
    session: str, live: LiveText, events: AsyncIterator[tuple[str, Any]], final: Final, *, model: str
) -> AsyncIterator[str]:
    """A streamed message as it comes: ``message_start``, a text block whose deltas are sent live, then
    the rest of the text, the thinking and tool-use blocks, ``message_delta`` (stop reason, usage) and
    ``message_stop``; ``ping`` events while nothing else goes out. The end is read from
    ``final(completion)``, the call's ``message`` object. A failure mid-stream: an ``error`` event."""
    start: dict[str, Any] = {
        "id": f"msg_{live.call_id}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": _prompt_tokens(live), "output_tokens": 0},
        "tmpl": {"session": session, "call": live.call_id},
    }
    yield _event("message_start", {"type": "message_start", "message": start})
    opened: list[str] = []  # the blocks sent live, in order ("thinking", "text"); the last one may be open
    closed = 0

    def stop_block(k: int) -> str:
        return _event("content_block_stop", {"type": "content_block_stop", "index": k})

    async for kind, value in events:
        if kind == "ping":
            yield _event("ping", {"type": "ping"})
        elif kind in ("content", "reasoning"):
            block = "text" if kind == "content" else "thinking"
            if not opened or opened[-1] != block:
                if len(opened) > closed:
                    yield stop_block(closed)
                    closed += 1
                opened.append(block)
                empty = {"type": "text", "text": ""} if block == "text" else {"type": "thinking", "thinking": "",
                                                                             "signature": ""}  # fmt: skip
                yield _event("content_block_start", {"type": "content_block_start", "index": len(opened) - 1,
                                                     "content_block": empty})  # fmt: skip
            piece = {"type": "text_delta", "text": value} if block == "text" else {"type": "thinking_delta",
                                                                                   "thinking": value}  # fmt: skip
            yield _event("content_block_delta", {"type": "content_block_delta", "index": len(opened) - 1,
                                                 "delta": piece})  # fmt: skip
        elif kind == "error":
            yield _event("error", anthropic.error_body(value))
            return
        else:
            body = final(value)
            blocks = list(body["content"])
            if len(opened) > closed:  # the open block: the rest of its text, then its stop
                k = len(opened) - 1
                if opened[k] == "text":
                    text = next((b["text"] for b in blocks if b["type"] == "text"), "")
                    rest, piece = live.rest(text), {"type": "text_delta"}
                    piece["text"] = rest
                else:
                    text = next((b["thinking"] for b in blocks if b["type"] == "thinking"), "")
                    rest, piece = live.rest_reasoning(text), {"type": "thinking_delta"}
                    piece["thinking"] = rest
                if rest:
                    yield _event("content_block_delta", {"type": "content_block_delta", "index": k, "delta": piece})
                yield stop_block(k)
            blocks = [b for b in blocks if b["type"] not in opened]
            for k, block in enumerate(blocks, start=len(opened)):
                for name, data in _anthropic_block(k, block):
                    yield _event(name, data)
            stop = {"stop_reason": body["stop_reason"], "stop_sequence": body.get("stop_sequence")}
            usage = {"output_tokens": body["usage"]["output_tokens"]}
            yield _event("message_delta", {"type": "message_delta", "delta": stop, "usage": usage})
            yield _event("message_stop", {"type": "message_stop"})


def _anthropic_block(k: int, block: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The start, delta and stop events of one whole content block at index ``k``."""
    if block["type"] == "text":
        empty: dict[str, Any] = {"type": "text", "text": ""}
        delta: dict[str, Any] = {"type": "text_delta", "text": block["text"]}
    elif block["type"] == "thinking":
        empty = {"type": "thinking", "thinking": "", "signature": ""}
        delta = {"type": "thinking_delta", "thinking": block["thinking"]}
    else:
        empty = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
    return [
        ("content_block_start", {"type": "content_block_start", "index": k, "content_block": empty}),
        ("content_block_delta", {"type": "content_block_delta", "index": k, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": k}),
    ]


# -- OpenAI Responses -----------------------------------------------------------------------
async def responses_sse(
    session: str,
    live: LiveText,
    events: AsyncIterator[tuple[str, Any]],
    final: Final,
    *,
    model: str,
    echo: Mapping[str, Any],
) -> AsyncIterator[str]:
    """A streamed response as it comes: ``response.created``, ``response.in_progress``, the message item
    with its ``response.output_text.delta`` events sent live, then the rest of the text, the reasoning and
    function-call items, ``response.completed`` (or ``response.incomplete``); ``: ping`` comments while
    nothing else goes out. The end is read from ``final(completion)``, the call's ``response`` object. A
    failure mid-stream: an ``error`` event, then ``response.failed``."""
    seq = iter(range(1 << 30))

    def ev(kind: str, **data: Any) -> str:
        return _event(kind, {"type": kind, "sequence_number": next(seq), **data})

    shell = {
        "id": f"resp_{live.call_id}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "model": model,
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "previous_response_id": None,
        "reasoning": None,
        "store": False,
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        **echo,
        "usage": None,
        "tmpl": {"session": session, "call": live.call_id},
    }
    yield ev("response.created", response=shell)
    yield ev("response.in_progress", response=shell)
    ids = {"message": f"msg_{live.call_id}", "reasoning": f"rs_{live.call_id}"}
    opened: list[str] = []  # the items sent live, in order ("reasoning", "message"); the last one may be open
    closed = 0

    def start_item(kind: str) -> list[str]:
        k, item_id = len(opened) - 1, ids[kind]
        if kind == "message":
            item = {"type": "message", "id": item_id, "status": "in_progress", "role": "assistant", "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        else:
            item = {"type": "reasoning", "id": item_id, "summary": [], "content": []}
            part = {"type": "reasoning_text", "text": ""}
        return [ev("response.output_item.added", output_index=k, item=item),
                ev("response.content_part.added", item_id=item_id, output_index=k, content_index=0, part=part)]  # fmt: skip

    def delta(kind: str, k: int, text: str) -> str:
        if kind == "message":
            return ev("response.output_text.delta", item_id=ids[kind], output_index=k, content_index=0, delta=text,
                      logprobs=[])  # fmt: skip
        return ev("response.reasoning_text.delta", item_id=ids[kind], output_index=k, content_index=0, delta=text)

    def stop_item(kind: str, k: int, item: Mapping[str, Any]) -> list[str]:
        where = {"item_id": ids[kind], "output_index": k, "content_index": 0}
        part = item["content"][0]
        if kind == "message":
            done = ev("response.output_text.done", **where, text=part["text"], logprobs=[])
        else:
            done = ev("response.reasoning_text.done", **where, text=part["text"])
        return [done, ev("response.content_part.done", **where, part=part),
                ev("response.output_item.done", output_index=k, item=item)]  # fmt: skip

    def live_item(kind: str) -> dict[str, Any]:  # an item as sent so far (its final form when decided)
        if kind == "message":
            part = {"type": "output_text", "text": live.sent, "annotations": [], "logprobs": []}
            return {"type": "message", "id": ids[kind], "status": "completed", "role": "assistant", "content": [part]}
        part = {"type": "reasoning_text", "text": live.reasoning_sent}
        return {"type": "reasoning", "id": ids[kind], "summary": [], "content": [part]}

    async for kind, value in events:
        if kind == "ping":
            yield ": ping\n\n"
        elif kind in ("content", "reasoning"):
            item_kind = "message" if kind == "content" else "reasoning"
            if not opened or opened[-1] != item_kind:
                if len(opened) > closed:  # the reasoning, decided: its close marker came
                    for line in stop_item(opened[closed], closed, live_item(opened[closed])):
                        yield line
                    closed += 1
                opened.append(item_kind)
                for line in start_item(item_kind):
                    yield line
            yield delta(item_kind, len(opened) - 1, value)
        elif kind == "error":
            err = value
            yield ev("error", code=str(err.status), message=str(err), param=err.param)
            failed = {**shell, "status": "failed", "error": {"code": err.kind, "message": str(err)}}
            yield ev("response.failed", response=failed)
            return
        else:
            full = final(value)
            items = full["output"]
            streamed = []
            for k, kind_sent in enumerate(opened):  # the items sent live keep their output indices
                found = next((i for i in items if i["type"] == kind_sent), None)
                if found is None:  # cannot happen: text was sent, so the reply has it
                    found = live_item(kind_sent)
                else:
                    items.remove(found)
                streamed.append(found)
                if k >= closed:  # the open item: the rest of its text, then its end
                    text = found["content"][0]["text"]
                    rest = live.rest(text) if kind_sent == "message" else live.rest_reasoning(text)
                    if rest:
                        yield delta(kind_sent, k, rest)
                    for line in stop_item(kind_sent, k, found):
                        yield line
            items[:0] = streamed
            for k, item in enumerate(items[len(streamed) :], start=len(streamed)):
                for name, data in _responses_item(k, item):
                    yield ev(name, **data)
            end = "response.incomplete" if full["status"] == "incomplete" else "response.completed"
            yield ev(end, response=full)


def _responses_item(k: int, item: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The events of one whole output item at index ``k``, from ``output_item.added`` to ``.done``."""
    out: list[tuple[str, dict[str, Any]]] = []
    if item["type"] == "message":
        text = item["content"][0]["text"]
        out.append(("response.output_item.added", {"output_index": k, "item": {**item, "status": "in_progress",
                                                                               "content": []}}))  # fmt: skip
        empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        where = {"item_id": item["id"], "output_index": k, "content_index": 0}
        out.append(("response.content_part.added", {**where, "part": empty}))
        out.append(("response.output_text.delta", {**where, "delta": text, "logprobs": []}))
        out.append(("response.output_text.done", {**where, "text": text, "logprobs": []}))
        out.append(("response.content_part.done", {**where, "part": item["content"][0]}))
    elif item["type"] == "function_call":
        added = {**item, "status": "in_progress", "arguments": ""}
        out.append(("response.output_item.added", {"output_index": k, "item": added}))
        where = {"item_id": item["id"], "output_index": k}
        out.append(("response.function_call_arguments.delta", {**where, "delta": item["arguments"]}))
        done = {**where, "arguments": item["arguments"], "name": item["name"]}
        out.append(("response.function_call_arguments.done", done))
    else:
        out.append(("response.output_item.added", {"output_index": k, "item": {**item, "content": []}}))
    out.append(("response.output_item.done", {"output_index": k, "item": item}))
    return out


# -- Gemini streamGenerateContent -----------------------------------------------------------
async def gemini_stream(
    live: LiveText, events: AsyncIterator[tuple[str, Any]], final: Final, *, model: str, sse: bool
) -> AsyncIterator[str]:
    """Gemini's stream of ``GenerateContentResponse`` chunks as they come: one per live text piece (a
    model content of one text part), then one with the rest: the thought, the rest of the text (with
    the thought's signature where the whole answer has it there), the function calls, ``finishReason``,
    ``usageMetadata``. ``sse``: ``data:`` events (``?alt=sse``), else one JSON array sent as it is made;
    either way a keep-alive is a blank line (no event in SSE, whitespace in JSON), the one form that both
    google-genai SDKs' parsers (Python, JavaScript) skip: Python's reads a ``:`` comment line as JSON. The end is read from ``final(completion)``, the
    call's whole response. A failure mid-stream: a chunk holding Gemini's error object."""
    from ..dialects import gemini

    count = 0

    def out(chunk: Mapping[str, Any]) -> str:
        nonlocal count
        count += 1
        if sse:
            return f"data: {json.dumps(chunk)}\r\n\r\n"
        return ("[" if count == 1 else ",\r\n") + json.dumps(chunk)

    head = {"modelVersion": model, "responseId": live.call_id}
    whole = False
    async for kind, value in events:
        if kind == "ping":  # a blank line: google-genai's parser reads a comment line as JSON and fails
            yield "\r\n"
        elif kind == "reasoning" or (kind == "content" and whole):  # a thought goes whole at the end (one part)
            whole = True
        elif kind == "content":
            parts: list[dict[str, Any]] = [{"text": value}]
            yield out({"candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}], **head})
        elif kind == "error":
            yield out(gemini.error_body(value))
            break
        else:
            body = final(value)
            if whole:
                yield out(body)
                continue
            candidate = dict(body["candidates"][0])
            parts = []
            for part in candidate["content"]["parts"]:
                if "text" in part and part.get("thought"):
                    rest = {**part, "text": live.rest_reasoning(part["text"])}
                    if rest["text"]:
                        parts.append(rest)
                elif "text" in part:
                    rest = {**part, "text": live.rest(part["text"])}
                    if rest["text"] or len(rest) > 1:  # the rest of the text, or the part carrying the signature
                        parts.append(rest)
                else:
                    parts.append(part)
            candidate["content"] = {**candidate["content"], "parts": parts}
            yield out({**body, "candidates": [candidate]})
    if not sse:
        yield "[]" if count == 0 else "]"
