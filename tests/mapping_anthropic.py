"""The documented mapping of an Anthropic Messages request to the chat messages and tools a template
renders (docs/gateway.md, "Anthropic Messages"), written here from the documentation, not from tmpl's
code: tests compare the gateway's prompts with ``apply_chat_template`` of what this returns.

- ``system`` (a string or text blocks, joined as written) is the first message, a system turn;
- a ``system`` turn inside ``messages`` stays a system turn where it is (``fold=False``), or, for a
  template that refuses such turns (``fold=True``), is folded: appended to the user turn right before
  it (a blank line between), or, after an assistant turn, a user turn of its own joined before the user
  turn that follows it; a leading system text the template refuses (``fold_leading=True``) goes before
  the first user turn's text;
- a user turn: its ``tool_result`` blocks as tool messages in order, then its text blocks (joined as
  written) as a user message; an assistant turn: text blocks as content, ``thinking`` blocks as
  ``reasoning_content``, ``tool_use`` blocks as calls (arguments as objects); ``redacted_thinking`` left out;
- tools: custom tools (no ``type`` or ``"custom"``) as functions (``input_schema`` as ``parameters``);
  server tools left out.

>>> anthropic_messages({"system": "S", "messages": [{"role": "user", "content": "Hi"}]})
([{'role': 'system', 'content': 'S'}, {'role': 'user', 'content': 'Hi'}], None)
"""

from __future__ import annotations

from typing import Any


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b["text"] for b in content or [] if b["type"] == "text")


def _turns(message: dict[str, Any]) -> list[dict[str, Any]]:
    role, content = message["role"], message["content"]
    if role == "system":
        return [{"role": "system", "content": _text(content)}]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    if role == "assistant":
        turn: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(b["text"] for b in blocks if b["type"] == "text"),
        }
        thinking = "".join(b["thinking"] for b in blocks if b["type"] == "thinking")
        if thinking:
            turn["reasoning_content"] = thinking
        calls = [b for b in blocks if b["type"] == "tool_use"]
        if calls:
            turn["tool_calls"] = [
                {"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": b["input"]}}
                for b in calls
            ]
        return [turn]
    out: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": b["tool_use_id"], "content": _text(b.get("content"))}
        for b in blocks
        if b["type"] == "tool_result"
    ]
    text = "".join(b["text"] for b in blocks if b["type"] == "text")
    if text.strip():
        out.append({"role": "user", "content": text})
    return out or [{"role": "user", "content": ""}]


def _folded(messages: list[dict[str, Any]], fold_leading: bool) -> list[dict[str, Any]]:
    """The fallback for a template without later (and, with ``fold_leading``, leading) system turns."""
    out: list[dict[str, Any]] = []
    waiting: list[str] = []  # folded texts for the next user turn
    for i, m in enumerate(messages):
        if m["role"] == "system" and i == 0:
            if fold_leading:
                waiting.append(m["content"])
            else:
                out.append(m)
        elif m["role"] == "system":
            if out and out[-1]["role"] == "user" and not waiting:
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n\n" + m["content"]}
            else:
                waiting.append(m["content"])
        elif m["role"] == "user":
            out.append({**m, "content": "\n\n".join([*waiting, m["content"]])})
            waiting = []
        else:
            if waiting:
                out.append({"role": "user", "content": "\n\n".join(waiting)})
                waiting = []
            out.append(m)
    if waiting:
        out.append({"role": "user", "content": "\n\n".join(waiting)})
    return out


def anthropic_messages(
    body: dict[str, Any], *, fold: bool = False, fold_leading: bool = False
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The chat messages and tools of a Messages request body, as the gateway's template renders them."""
    messages: list[dict[str, Any]] = []
    if body.get("system"):
        messages.append({"role": "system", "content": _text(body["system"])})
    for m in body["messages"]:
        messages += _turns(m)
    if fold or fold_leading:
        messages = _folded(messages, fold_leading)
    tools = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                **({"description": t["description"]} if "description" in t else {}),
                "parameters": t.get("input_schema") or {"type": "object", "properties": {}},
            },
        }
        for t in body.get("tools") or []
        if t.get("type") in (None, "custom")
    ]
    return messages, tools or None
