"""Helpers of the gateway tests: the app served on 127.0.0.1 by uvicorn in a thread, and the full
render a request's messages should tokenize to (written here from the template, not from tmpl)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def served(app: Any, limit: float = 20.0) -> Iterator[str]:
    """``app`` served by uvicorn on a free port of 127.0.0.1 (in a thread); yields its base URL; stopped after."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + limit
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the gateway's server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(limit)


def streamed_message(chunks: Any) -> dict[str, Any]:
    """The assistant message a client assembles from a streamed chat completion's chunks (choice 0):
    content, ``reasoning_content`` and tool calls whose argument pieces are joined by index."""
    content, reasoning, calls = "", "", {}
    for chunk in chunks:
        for choice in chunk.choices[:1]:
            delta = choice.delta
            content += delta.content or ""
            reasoning += getattr(delta, "reasoning_content", None) or ""
            for tc in delta.tool_calls or []:
                entry = calls.setdefault(
                    tc.index, {"id": tc.id, "type": "function", "function": {"name": tc.function.name, "arguments": ""}}
                )
                entry["function"]["arguments"] += tc.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = list(calls.values())
    return message


def as_rendered(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-shaped messages as templates take them: call arguments as dicts, no ``None`` content."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None}
        m.setdefault("content", "")
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                if isinstance(c["function"]["arguments"], str)
                else c
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


def full_render_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: Any) -> list[int]:
    """``apply_chat_template`` of the whole conversation with the generation prompt, tokenized."""
    out = tokenizer.apply_chat_template(as_rendered(messages), tools=tools, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)
