"""The documented mapping of an OpenAI chat request to the chat messages and tools a template renders
(docs/gateway.md, "What each API gets"), written here from the documentation, not from tmpl's code: the
gateway and harness tests compare every prompt with ``apply_chat_template`` of what this returns.

- the messages in order, each with its role; ``content`` a string, or its text parts joined as written
  (``None`` or absent: ``""``);
- an assistant turn keeps its ``tool_calls`` (arguments as sent: tests/gateway_util.py reads a JSON
  string as the object it holds) and its reasoning: the first non-empty of ``reasoning_content``,
  ``reasoning``, ``thinking`` as ``reasoning_content``;
- a tool message keeps its ``tool_call_id`` (and ``name`` when sent); ``tools`` as sent.

>>> chat_messages({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]})
([{'role': 'user', 'content': 'Hi'}], None)
"""

from __future__ import annotations

from typing import Any

REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content)
    return content or ""


def chat_messages(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """A chat request's messages and tools as the template takes them, read from the raw body."""
    out = []
    for m in body["messages"]:
        turn: dict[str, Any] = {"role": m["role"], "content": _text(m.get("content"))}
        if m["role"] == "assistant":
            reasoning = next((m[k] for k in REASONING_KEYS if isinstance(m.get(k), str) and m[k]), None)
            if reasoning:
                turn["reasoning_content"] = reasoning
            if m.get("tool_calls"):
                turn["tool_calls"] = m["tool_calls"]
        elif m["role"] == "tool":
            turn["tool_call_id"] = m["tool_call_id"]
            if isinstance(m.get("name"), str):
                turn["name"] = m["name"]
        out.append(turn)
    return out, body.get("tools")
