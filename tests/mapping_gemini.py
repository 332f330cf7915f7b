"""The documented mapping of a Gemini ``generateContent`` request to the chat the template renders, written
here from docs/gateway.md ("Gemini generateContent"), not from tmpl's code: the gateway tests and the
harness tests compare every prompt with ``apply_chat_template`` of what this returns.

- ``systemInstruction`` (its text parts joined) is the system message first;
- a ``model`` content is an assistant turn: ``thought`` text parts its ``reasoning_content`` (without
  them: the first ``thoughtSignature`` that is base64 of ``tmpl1.`` and JSON ``{"call", "text"}`` gives
  the text), other text
  its content, ``functionCall`` parts its calls (id: the part's ``id``, else ``call_<i>_<j>``);
- a ``user`` content: its ``functionResponse`` parts as tool messages in order (content
  ``response["output"]`` when the response is exactly ``{"output": <string>}``, else the response as
  JSON with ``ensure_ascii=False``; the message names the function), then its text parts joined as a
  user message (when it has text, or no function responses);
- ``functionDeclarations``: ``{name, description, parameters}``, the parameters ``parametersJsonSchema``
  as sent or ``parameters`` with every ``type`` lowercased; other tools (hosted) left out.
"""

from __future__ import annotations

import base64
import json
from typing import Any


def _lower(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {}
        for k, v in schema.items():
            if k == "type" and isinstance(v, str):
                out[k] = v.lower()
            elif k == "properties":
                out[k] = {name: _lower(s) for name, s in v.items()}
            elif k in ("items", "anyOf", "oneOf", "allOf", "prefixItems", "additionalProperties", "not"):
                out[k] = _lower(v)
            else:
                out[k] = v
        return out
    if isinstance(schema, list):
        return [_lower(s) for s in schema]
    return schema


def gemini_tools(body: dict) -> list[dict] | None:
    out = []
    for tool in body.get("tools") or []:
        for decl in tool.get("functionDeclarations") or []:
            fn: dict[str, Any] = {"name": decl["name"]}
            if "description" in decl:
                fn["description"] = decl["description"]
            if decl.get("parametersJsonSchema") is not None:
                fn["parameters"] = decl["parametersJsonSchema"]
            elif decl.get("parameters") is not None:
                fn["parameters"] = _lower(decl["parameters"])
            else:
                fn["parameters"] = {"type": "object", "properties": {}}
            out.append({"type": "function", "function": fn})
    return out or None


def _signed(signature: Any) -> str | None:
    """The text of a gateway's thoughtSignature (base64, standard or URL-safe, of tmpl1.{json})."""
    if not isinstance(signature, str):
        return None
    try:
        raw = base64.b64decode(signature.replace("-", "+").replace("_", "/"), validate=True)
    except ValueError:
        return None
    return json.loads(raw[6:])["text"] if raw.startswith(b"tmpl1.") else None


def _output(response: Any) -> str:
    if isinstance(response, dict) and list(response) == ["output"] and isinstance(response["output"], str):
        return response["output"]
    return json.dumps(response, ensure_ascii=False)


def gemini_messages(body: dict) -> tuple[list[dict], list[dict] | None]:
    """A raw GenerateContentRequest body as the messages and tools the template renders."""
    out: list[dict] = []
    system = body.get("systemInstruction")
    if system is not None:
        text = system if isinstance(system, str) else "".join(p["text"] for p in system["parts"])
        out.append({"role": "system", "content": text})
    for i, content in enumerate(body["contents"]):
        parts = content["parts"]
        if content.get("role") == "model":
            turn: dict[str, Any] = {
                "role": "assistant",
                "content": "".join(p["text"] for p in parts if "text" in p and not p.get("thought")),
            }
            thoughts = "".join(p["text"] for p in parts if "text" in p and p.get("thought"))
            if not thoughts:
                thoughts = next(filter(None, (_signed(p.get("thoughtSignature")) for p in parts)), "")
            if thoughts:
                turn["reasoning_content"] = thoughts
            calls = [
                {
                    "id": p["functionCall"].get("id") or f"call_{i}_{j}",
                    "type": "function",
                    "function": {"name": p["functionCall"]["name"], "arguments": p["functionCall"].get("args") or {}},
                }
                for j, p in enumerate(parts)
                if "functionCall" in p
            ]
            if calls:
                turn["tool_calls"] = calls
            out.append(turn)
        else:
            results = [p["functionResponse"] for p in parts if "functionResponse" in p]
            for r in results:
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": r.get("id") or "",
                        "name": r["name"],
                        "content": _output(r["response"]),
                    }
                )
            texts = [p["text"] for p in parts if "text" in p]
            if texts or not results:
                out.append({"role": "user", "content": "".join(texts)})
    return out, gemini_tools(body)
