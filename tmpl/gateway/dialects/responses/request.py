"""A Responses request read: its fields (:data:`FIELDS`: read, ignored or refused), its tools (functions, namespaces
flattened, custom tools as one-string functions, hosted tools left out), its input items as canonical messages,
and the gateway's reasoning references."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ....errors import GatewayRequestError
from ...canonical import ROLES, canonical_message, tool_call
from ...service import CallParams
from ...vision import image_part

#: between a namespace and its function's name in the name the template renders (``multi_agent_v1__spawn``)
NAMESPACE_SEP = "__"


#: the prefix of the ``encrypted_content`` the gateway writes in its reasoning items
REFERENCE_PREFIX = "tmpl1."


#: every request field of the Responses API, and what the gateway does with it (docs/gateway.md's table)
FIELDS: dict[str, str] = {
    "model": "read (echoed; the gateway serves its one model)",
    "input": "read",
    "instructions": "read (a system message first)",
    "tools": "read (function, namespace, custom; hosted tools left out and noted)",
    "tool_choice": "read (auto; required taken as auto: decoding is never constrained); others refused",
    "max_output_tokens": "read",
    "temperature": "read",
    "top_p": "read",
    "stream": "read",
    "include": "read (reasoning.encrypted_content: reasoning items carry the gateway's reference); others ignored",
    "reasoning": "read (summary: the reasoning text as its summary); effort ignored",
    "store": "ignored (nothing is stored; echoed false)",
    "parallel_tool_calls": "ignored (echoed; the template's parser reads every call the model wrote)",
    "max_tool_calls": "ignored (the gateway runs no tools)",
    "metadata": "ignored (echoed)",
    "prompt_cache_key": "ignored (a session's heads are its cache)",
    "prompt_cache_retention": "ignored",
    "prompt_cache_options": "ignored",
    "client_metadata": "ignored (Codex's turn metadata)",
    "user": "ignored",
    "safety_identifier": "ignored",
    "service_tier": "ignored (echoed as default)",
    "truncation": "ignored (echoed; a prompt over the context limit is refused, never truncated)",
    "text": "read (format text; verbosity ignored); json_schema and json_object refused",
    "stream_options": "ignored",
    "top_logprobs": "refused above 0",
    "previous_response_id": "refused (no response store: send the whole input)",
    "conversation": "refused (no conversation store)",
    "prompt": "refused (no stored prompt templates)",
    "background": "refused when true (no response store)",
    "background_options": "ignored",
    "context_management": "ignored and noted (no server-side compaction)",
    "moderation": "ignored",
    "image": "ignored",
    "access_programs": "ignored",
}


#: input item types that only a hosted tool or a response store produces: refused with a 400 naming them
_HOSTED_ITEMS = (
    "web_search_call",
    "file_search_call",
    "code_interpreter_call",
    "image_generation_call",
    "computer_call",
    "computer_call_output",
    "local_shell_call",
    "local_shell_call_output",
    "shell_call",
    "shell_call_output",
    "apply_patch_call",
    "apply_patch_call_output",
    "mcp_call",
    "mcp_list_tools",
    "mcp_approval_request",
    "mcp_approval_response",
    "tool_search_call",
    "tool_search_output",
    "item_reference",
    "compaction",
)


@dataclass(frozen=True)
class ToolName:
    """What a rendered tool name stands for: its kind (``function`` or ``custom``), its namespace, its own name."""

    kind: str
    name: str
    namespace: str | None = None


@dataclass(frozen=True)
class ResponsesRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    params: CallParams
    stream: bool
    model: str | None
    echo: dict[str, Any]
    #: rendered tool name -> what it stands for (namespace and custom tools: their calls are mapped back)
    names: dict[str, ToolName] = field(default_factory=dict)
    #: what the gateway left out or ignored of this request (hosted tools...), kept in the session's notes
    notes: tuple[str, ...] = ()
    #: reasoning items carry the gateway's reference (``include: ["reasoning.encrypted_content"]``)
    encrypted: bool = False
    #: reasoning items carry the reasoning as their summary (``reasoning.summary`` set)
    summary: bool = False


def reasoning_reference(call: str, text: str) -> str:
    """The ``encrypted_content`` of a reasoning item the gateway returns: the call and its reasoning text.

    >>> read_reference(reasoning_reference("gw1-0", "think"))
    'think'
    """
    data = json.dumps({"call": call, "text": text}, ensure_ascii=False).encode("utf-8")
    return REFERENCE_PREFIX + base64.urlsafe_b64encode(data).decode("ascii")


def read_reference(value: Any) -> str | None:
    """The reasoning text a :func:`reasoning_reference` holds, or None (another server's opaque content).

    >>> read_reference("gAAAAB...") is None
    True
    """
    if not isinstance(value, str) or not value.startswith(REFERENCE_PREFIX):
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(value[len(REFERENCE_PREFIX) :].encode("ascii")))
    except (ValueError, binascii.Error, UnicodeError):
        return None
    text = data.get("text") if isinstance(data, dict) else None
    return text if isinstance(text, str) else None


def custom_as_function(tool: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A ``custom`` tool as the function the template renders: one required string parameter ``input``
    (its description says the tool takes free text; a grammar format is named there, not enforced).

    >>> custom_as_function({"type": "custom", "name": "apply_patch", "description": "Patch files."}, "apply_patch")
    ... # doctest: +NORMALIZE_WHITESPACE
    {'name': 'apply_patch', 'description': 'Patch files.', 'parameters': {'type': 'object', 'properties':
    {'input': {'type': 'string', 'description': 'The raw input of the tool (free text).'}}, 'required': ['input']}}
    """
    fn: dict[str, Any] = {"name": name}
    if isinstance(tool.get("description"), str):
        fn["description"] = tool["description"]
    described = "The raw input of the tool (free text)."
    fmt = tool.get("format")
    if isinstance(fmt, Mapping) and fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str):
        described += f" It follows this {fmt.get('syntax', 'grammar')} grammar:\n{fmt['definition']}"
    fn["parameters"] = {
        "type": "object",
        "properties": {"input": {"type": "string", "description": described}},
        "required": ["input"],
    }
    return fn


def _function(tool: Mapping[str, Any], name: str) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name}
    if isinstance(tool.get("description"), str):
        fn["description"] = tool["description"]
    fn["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
    return fn


def _tools(raw: Any, notes: list[str]) -> tuple[list[dict[str, Any]] | None, dict[str, ToolName]]:
    """The request's tools as the template's function list, and what each rendered name stands for."""
    if not raw:
        return None, {}
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)):
        raise GatewayRequestError(None, "tools must be a list", param="tools")
    out: list[dict[str, Any]] = []
    names: dict[str, ToolName] = {}

    def add(tool: Any, where: str, namespace: str | None) -> None:
        if not isinstance(tool, Mapping) or not isinstance(tool.get("type"), str):
            raise GatewayRequestError(None, f"{where} must be a tool object with a type", param="tools")
        kind = tool["type"]
        if kind in ("function", "custom"):
            if not isinstance(tool.get("name"), str) or not tool["name"]:
                raise GatewayRequestError(None, f"{where}: a {kind} tool needs a name", param="tools")
            shown = f"{namespace}{NAMESPACE_SEP}{tool['name']}" if namespace else tool["name"]
            if shown in names:
                raise GatewayRequestError(None, f"{where}: the tool name {shown!r} is given twice", param="tools")
            fn = _function(tool, shown) if kind == "function" else custom_as_function(tool, shown)
            out.append({"type": "function", "function": fn})
            names[shown] = ToolName(kind, tool["name"], namespace)
        elif kind == "namespace" and namespace is None:
            if not isinstance(tool.get("name"), str) or not tool["name"]:
                raise GatewayRequestError(None, f"{where}: a namespace tool needs a name", param="tools")
            inner = tool.get("tools")
            if not isinstance(inner, Sequence) or isinstance(inner, (str, bytes)):
                raise GatewayRequestError(None, f"{where}.tools must be a list", param="tools")
            for k, t in enumerate(inner):
                add(t, f"{where}.tools[{k}]", tool["name"])
        elif kind == "namespace":
            raise GatewayRequestError(None, f"{where}: namespaces do not nest", param="tools")
        else:
            notes.append(
                f"{where}: the hosted tool {kind!r} is left out of the prompt (the gateway runs no hosted tools)"
            )

    for k, tool in enumerate(raw):
        add(tool, f"tools[{k}]", None)
    return out or None, names


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


def _input_content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A user, system or developer message's content, or a tool output: text as :func:`_output_text`, and
    ``input_image`` parts with a data: URL as image parts in order (the content then a list of parts)."""
    if not isinstance(content, Sequence) or isinstance(content, str):
        return _output_text(content, where)
    kinds = [p.get("type") if isinstance(p, Mapping) else None for p in content]
    if "input_image" not in kinds:
        return _output_text(content, where)
    parts: list[dict[str, Any]] = []
    for k, part in enumerate(content):
        if kinds[k] == "input_image":
            parts.append(image_part(part.get("image_url"), f"{where}.content[{k}]"))
        else:
            text = _output_text([part], f"{where}.content[{k}]")
            if text:
                parts.append({"type": "text", "text": text})
    return parts


def _reasoning(item: Mapping[str, Any], where: str) -> str:
    """A reasoning item's text: the gateway's reference where it holds one, else its content, else its summary."""
    text = read_reference(item.get("encrypted_content"))
    if text is not None:
        return text
    return _output_text(item.get("content") or item.get("summary") or [], where)


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

    def call_id(item: Mapping[str, Any], where: str, kind: str) -> str:
        if not isinstance(item.get("call_id"), str):
            raise GatewayRequestError(None, f"{where}: a {kind} item needs a call_id", param="input")
        return str(item["call_id"])

    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise GatewayRequestError(None, f"{where} must be an object", param="input")
        kind = item.get("type", "message")
        if kind == "reasoning":
            if turn is not None:
                close()
            reasoning.append(_reasoning(item, where))
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
                out.append(canonical_message({"role": role, "content": _input_content(item.get("content"), where)}, i))
        elif kind in ("function_call", "custom_tool_call"):
            cid = call_id(item, where, kind)
            if not isinstance(item.get("name"), str):
                raise GatewayRequestError(None, f"{where}: a {kind} item needs a name", param="input")
            ns = item.get("namespace")
            name = f"{ns}{NAMESPACE_SEP}{item['name']}" if isinstance(ns, str) and ns else item["name"]
            if kind == "function_call":
                args: Any = item.get("arguments")
            else:
                if not isinstance(item.get("input"), str):
                    raise GatewayRequestError(None, f"{where}: a custom_tool_call needs a string input", param="input")
                args = {"input": item["input"]}
            turn = turn or {"role": "assistant", "content": ""}
            turn.setdefault("tool_calls", []).append(tool_call(cid, name, args))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            close()
            cid = call_id(item, where, kind)
            output = item.get("output")
            body = output if isinstance(output, str) else _input_content(output or [], f"{where}.output")
            out.append({"role": "tool", "tool_call_id": cid, "content": body})
        elif kind in _HOSTED_ITEMS:
            raise GatewayRequestError(
                None,
                f"{where}: {kind!r} items are not served (the gateway runs no hosted tools and keeps no response store)",
                param="input",
            )
        else:
            raise GatewayRequestError(None, f"{where}: {kind!r} items are not served", param="input")
    close()
    return out


def _refuse(body: Mapping[str, Any]) -> None:
    """A 400 for a field the gateway cannot honour (docs/gateway.md's table)."""
    for key in ("previous_response_id", "conversation"):
        if body.get(key):
            raise GatewayRequestError(
                None, f"{key} is not served: the gateway keeps no response store (send the whole input)", param=key
            )
    if body.get("prompt"):
        raise GatewayRequestError(None, "prompt (a stored prompt template) is not served: send input", param="prompt")
    if body.get("background"):
        raise GatewayRequestError(None, "background responses are not served (no response store)", param="background")
    top = body.get("top_logprobs")
    if top not in (None, 0):
        raise GatewayRequestError(None, "top_logprobs is not served", param="top_logprobs")
    fmt = body.get("text", {}).get("format") if isinstance(body.get("text"), Mapping) else None
    if isinstance(fmt, Mapping) and fmt.get("type", "text") != "text":
        raise GatewayRequestError(
            None, f"text.format {fmt.get('type')!r} is not served (decoding is never constrained)", param="text"
        )
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "required"):
        raise GatewayRequestError(
            None, "tool_choice other than auto or required is not served (decoding is never constrained)",
            param="tool_choice",
        )  # fmt: skip


def parse(body: Any) -> ResponsesRequest:
    """A Responses request body as canonical messages, tools and call parameters."""
    if not isinstance(body, Mapping):
        raise GatewayRequestError(None, "the request body must be a JSON object")
    _refuse(body)
    notes: list[str] = []
    raw = body.get("input")
    if isinstance(raw, str):
        messages = [{"role": "user", "content": raw}]
    elif isinstance(raw, Sequence) and raw:
        messages = _items(raw)
    else:
        raise GatewayRequestError(None, "input must be a string or a non-empty list of items", param="input")
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    tools, names = _tools(body.get("tools"), notes)
    if body.get("context_management"):
        notes.append("context_management is ignored: the gateway compacts nothing (the client's input is the prompt)")
    limit = body.get("max_output_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise GatewayRequestError(None, "max_output_tokens must be a positive integer", param="max_output_tokens")
    temperature, top_p = body.get("temperature"), body.get("top_p")
    reasoning: Mapping[str, Any] = body["reasoning"] if isinstance(body.get("reasoning"), Mapping) else {}
    include: Sequence[Any] = body["include"] if isinstance(body.get("include"), list) else []
    echo = {
        "instructions": body.get("instructions"),
        "tools": list(body.get("tools") or []),
        "temperature": temperature,
        "top_p": top_p,
        "max_output_tokens": limit,
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "truncation": body.get("truncation") or "disabled",
        "reasoning": dict(reasoning) or None,
        "tool_choice": body.get("tool_choice") or "auto",
        "prompt_cache_key": body.get("prompt_cache_key"),
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
        names,
        tuple(notes),
        "reasoning.encrypted_content" in include,
        reasoning.get("summary") not in (None, "none") or bool(reasoning.get("generate_summary")),
    )
