"""The documented mapping of an OpenAI Responses request to the chat the template renders, written here
from docs/gateway.md ("OpenAI Responses: fields, tools, reasoning"), not from tmpl's code: the gateway
tests and the harness tests compare every prompt with ``apply_chat_template`` of what this returns.

- ``instructions``, then the input items in order; a string input is one user message;
- a leading run of system and developer turns is one system turn, their texts joined by a blank line
  (the templates tested have no developer role of their own); a later developer turn is a system turn;
- an assistant turn gathers the reasoning items before it (their text: the gateway's
  ``encrypted_content`` ``tmpl1.<base64url {"call", "text"}>`` where present, else ``content``, else
  ``summary``), its message text and the calls after it; a reasoning item after an open turn starts
  the next one;
- a ``function_call`` is the call of ``namespace + "__" + name`` (``name`` without a namespace), its
  arguments the JSON object; a ``custom_tool_call`` the call ``{"input": <its input>}``; a
  ``function_call_output`` / ``custom_tool_call_output`` a tool message of its text;
- tools: a function as ``{name, description, parameters}``; a namespace's functions named
  ``namespace__name``; a custom tool a function of one required string ``input`` (described as below);
  hosted tools left out.
"""

from __future__ import annotations

import base64
import json
from typing import Any

#: the description of a custom tool's one parameter (docs/gateway.md)
CUSTOM_INPUT = "The raw input of the tool (free text)."


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if p.get("type") != "refusal")


def _reasoning(item: dict) -> str:
    enc = item.get("encrypted_content")
    if isinstance(enc, str) and enc.startswith("tmpl1."):
        return json.loads(base64.urlsafe_b64decode(enc[len("tmpl1.") :]))["text"]
    return _text(item.get("content") or item.get("summary") or [])


def _tool(t: dict, name: str) -> dict:
    fn: dict[str, Any] = {"name": name}
    if "description" in t:
        fn["description"] = t["description"]
    if t["type"] == "custom":
        described = CUSTOM_INPUT
        fmt = t.get("format") or {}
        if fmt.get("type") == "grammar":
            described += f" It follows this {fmt.get('syntax', 'grammar')} grammar:\n{fmt['definition']}"
        fn["parameters"] = {
            "type": "object",
            "properties": {"input": {"type": "string", "description": described}},
            "required": ["input"],
        }
    else:
        fn["parameters"] = t.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "function", "function": fn}


def responses_tools(body: dict) -> list[dict] | None:
    out = []
    for t in body.get("tools") or []:
        if t["type"] in ("function", "custom"):
            out.append(_tool(t, t["name"]))
        elif t["type"] == "namespace":
            out += [_tool(f, f"{t['name']}__{f['name']}") for f in t["tools"]]
    return out or None


def _place_roles(messages: list[dict]) -> list[dict]:
    """Leading system/developer turns joined into one system turn; later developer turns as system."""
    k = 0
    while k < len(messages) and messages[k]["role"] in ("system", "developer"):
        k += 1
    head = [{"role": "system", "content": "\n\n".join(m["content"] for m in messages[:k] if m["content"])}] if k else []
    rest = [{**m, "role": "system"} if m["role"] == "developer" else m for m in messages[k:]]
    return head + rest


def responses_messages(body: dict) -> tuple[list[dict], list[dict] | None]:
    """A raw Responses request body as the messages and tools the template renders."""
    out: list[dict] = []
    if body.get("instructions"):
        out.append({"role": "system", "content": body["instructions"]})
    items = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
    turn: dict | None = None
    reasoning: list[str] = []

    def close() -> None:
        nonlocal turn, reasoning
        if turn is None and reasoning:
            turn = {"role": "assistant", "content": ""}
        if turn is not None:
            if reasoning:
                turn["reasoning_content"] = "".join(reasoning)
            out.append(turn)
        turn, reasoning = None, []

    for item in items:
        kind = item.get("type", "message")
        if kind == "reasoning":
            if turn is not None:
                close()
            reasoning.append(_reasoning(item))
        elif kind == "message" and item["role"] == "assistant":
            if turn is not None and (turn.get("tool_calls") or turn["content"]):
                close()
            turn = turn or {"role": "assistant", "content": ""}
            turn["content"] += _text(item["content"])
        elif kind == "message":
            close()
            out.append({"role": item["role"], "content": _text(item["content"])})
        elif kind in ("function_call", "custom_tool_call"):
            name = f"{item['namespace']}__{item['name']}" if item.get("namespace") else item["name"]
            if kind == "function_call":
                args = json.loads(item["arguments"]) if item["arguments"].strip() else {}
            else:
                args = {"input": item["input"]}
            turn = turn or {"role": "assistant", "content": ""}
            call = {"id": item["call_id"], "type": "function", "function": {"name": name, "arguments": args}}
            turn.setdefault("tool_calls", []).append(call)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            close()
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": _text(item["output"])})
        else:
            raise ValueError(f"not in the mapping: {kind}")
    close()
    return _place_roles(out), responses_tools(body)
