"""Gemini API ``generateContent`` (``POST /v1beta/models/{model}:generateContent`` and
``:streamGenerateContent``): contents and parts in, candidates out, errors in Gemini's shape.

How a request becomes the conversation the template renders (tests/mapping_gemini.py writes the same
mapping independently):

- ``systemInstruction`` (a string or a content; its text parts joined) is a system message first;
- each ``contents`` entry, in order: a ``model`` content is one assistant turn, its ``thought: true``
  text parts its ``reasoning_content`` (none: the reasoning the first gateway ``thoughtSignature`` of
  its parts holds), its other text parts its content, its ``functionCall`` parts
  its calls (``id`` the part's, or ``call_<content>_<part>`` where it has none); a ``user`` (or
  ``function``) content gives its ``functionResponse`` parts as tool messages, in order (each answers
  the call of its ``id``, else the first unanswered call of its ``name``), then its text as a user
  message when it has text; a user content's ``inlineData`` parts of an image ``mimeType`` are image parts
  of that message, in order among its text (a vision template's; a text template answers 400 naming the
  part). A ``functionResponse``'s content is ``response["output"]`` when the
  response is exactly ``{"output": <string>}``, else the response as JSON;
- ``tools[].functionDeclarations``: functions of ``name``, ``description`` and
  ``parametersJsonSchema`` as sent, or ``parameters`` (Gemini's OpenAPI schema) with every ``type``
  lowercased (``"OBJECT"`` -> ``"object"``); other tools (``googleSearch``, ``codeExecution``,
  ``urlContext``...) are hosted: left out of the prompt and named in ``notes``;
- ``generationConfig``: ``temperature``, ``topP``, ``maxOutputTokens``, ``stopSequences`` (the chat
  dialect's ``stop``), ``candidateCount`` (``n``), ``seed`` read; :data:`FIELDS` and
  docs/gateway.md's table say what is ignored or refused.

A reply is a candidate whose content holds a ``thought`` part (the reasoning), a text part and a
``functionCall`` part per call (its ``id`` the gateway's call id); the part after the thought carries a
``thoughtSignature`` that holds the reasoning (:func:`thought_signature`). A client that sends the
content back as it came, or without its thought parts but with the signature (Gemini CLI), continues
the reply's sampled IDs: a model content without thought text takes its reasoning from such a signature.

>>> req = parse({"systemInstruction": {"parts": [{"text": "Be brief."}]},
...              "contents": [{"role": "user", "parts": [{"text": "Hi"}]}]}, model="m", stream=False)
>>> req.messages
[{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi'}]
>>> error_body(GatewayRequestError(None, "contents is required"))["error"]["status"]
'INVALID_ARGUMENT'
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import GatewayError, GatewayRequestError
from ..canonical import tool_call
from ..service import CallParams
from ..session import Plan, Reply
from ..vision import data_url, image_part

__all__ = [
    "FIELDS",
    "GeminiRequest",
    "count_body",
    "error_body",
    "gemini_schema",
    "model_object",
    "parse",
    "read_signature",
    "response",
    "stream_chunks",
    "thought_signature",
]

#: the bytes a thoughtSignature the gateway wrote begins with
SIGNATURE_PREFIX = b"tmpl1."

#: every field of a GenerateContentRequest (and of its generationConfig), and what the gateway does with it
FIELDS: dict[str, str] = {
    "contents": "read",
    "systemInstruction": "read (a system message first)",
    "tools": "read (functionDeclarations; other tools are hosted: left out and noted)",
    "toolConfig": "read (functionCallingConfig mode AUTO, or ANY taken as AUTO: decoding is never constrained); "
    "NONE and allowedFunctionNames refused",
    "generationConfig": "read (below)",
    "safetySettings": "ignored",
    "cachedContent": "refused (no content cache: send the contents)",
    "labels": "ignored",
    "model": "read from the path (echoed as modelVersion)",
    "generationConfig.temperature": "read",
    "generationConfig.topP": "read",
    "generationConfig.maxOutputTokens": "read",
    "generationConfig.stopSequences": "read (a reply ends at the first; the string left out)",
    "generationConfig.candidateCount": "read (n candidates)",
    "generationConfig.seed": "read",
    "generationConfig.topK": "ignored (the gateway's sampling has no top-k)",
    "generationConfig.thinkingConfig": "ignored (thought parts are always returned when the model wrote reasoning)",
    "generationConfig.presencePenalty": "ignored",
    "generationConfig.frequencyPenalty": "ignored",
    "generationConfig.responseMimeType": "read (text/plain); others refused",
    "generationConfig.responseSchema": "refused (decoding is never constrained)",
    "generationConfig.responseJsonSchema": "refused (decoding is never constrained)",
    "generationConfig.responseModalities": "read (TEXT); others refused",
    "generationConfig.responseLogprobs": "refused (logprobs are in the session's episode)",
    "generationConfig.logprobs": "refused",
    "generationConfig.enableEnhancedCivicAnswers": "ignored",
    "generationConfig.speechConfig": "ignored",
    "generationConfig.imageConfig": "ignored",
    "generationConfig.mediaResolution": "ignored",
}

#: Gemini's status names by HTTP status (google.rpc.Code)
_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}

#: part fields other than text, functionCall, functionResponse and thought that the gateway cannot render
_MEDIA = ("inlineData", "fileData", "executableCode", "codeExecutionResult", "videoMetadata")

_FINISH = {"stop": "STOP", "length": "MAX_TOKENS", "abort": "OTHER", "error": "OTHER"}


@dataclass(frozen=True)
class GeminiRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    params: CallParams
    stream: bool
    model: str | None
    #: what the gateway left out of this request (hosted tools), kept in the session's notes
    notes: tuple[str, ...] = ()


def thought_signature(call: str, text: str) -> str:
    """The ``thoughtSignature`` the gateway puts on the part after a reply's thought: base64 of ``tmpl1.``
    and the JSON ``{"call", "text"}``. Clients keep signatures where they drop thought parts (Gemini CLI
    sends no thought back), so the reasoning, and the reply's sampled IDs, are found again.

    >>> read_signature(thought_signature("gw1-0", "think"))
    'think'
    """
    data = json.dumps({"call": call, "text": text}, ensure_ascii=False).encode("utf-8")
    return base64.b64encode(SIGNATURE_PREFIX + data).decode("ascii")


def read_signature(value: Any) -> str | None:
    """The reasoning a :func:`thought_signature` holds (standard or URL-safe base64), or None for any other
    signature (Gemini's own, Gemini CLI's ``skip_thought_signature_validator``).

    >>> read_signature("skip_thought_signature_validator") is None
    True
    """
    if not isinstance(value, str):
        return None
    try:
        raw = base64.b64decode(value.replace("-", "+").replace("_", "/"), validate=True)
        if not raw.startswith(SIGNATURE_PREFIX):
            return None
        data = json.loads(raw[len(SIGNATURE_PREFIX) :].decode("utf-8"))
    except (ValueError, binascii.Error, UnicodeError):
        return None
    text = data.get("text") if isinstance(data, dict) else None
    return text if isinstance(text, str) else None


def _bad(reason: str, param: str | None = None) -> GatewayRequestError:
    return GatewayRequestError(None, reason, param=param)


def gemini_schema(schema: Any) -> Any:
    """A Gemini ``parameters`` schema as JSON Schema: every ``type`` lowercased, the rest as sent.

    >>> gemini_schema({"type": "OBJECT", "properties": {"city": {"type": "STRING"}}, "required": ["city"]})
    {'type': 'object', 'properties': {'city': {'type': 'string'}}, 'required': ['city']}
    """
    if isinstance(schema, Mapping):
        out: dict[str, Any] = {}
        for key, value in schema.items():
            if key == "type" and isinstance(value, str):
                out[key] = value.lower()
            elif key == "properties" and isinstance(value, Mapping):
                out[key] = {name: gemini_schema(sub) for name, sub in value.items()}
            elif key in ("items", "anyOf", "oneOf", "allOf", "prefixItems", "additionalProperties", "not"):
                out[key] = gemini_schema(value)
            else:
                out[key] = value
        return out
    if isinstance(schema, list):
        return [gemini_schema(s) for s in schema]
    return schema


def _tools(raw: Any, notes: list[str]) -> list[dict[str, Any]] | None:
    if not raw:
        return None
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)):
        raise _bad("tools must be a list", "tools")
    out: list[dict[str, Any]] = []
    for k, tool in enumerate(raw):
        if not isinstance(tool, Mapping):
            raise _bad(f"tools[{k}] must be an object", "tools")
        for key, value in tool.items():
            if key != "functionDeclarations":
                notes.append(
                    f"tools[{k}].{key}: a hosted tool, left out of the prompt (the gateway runs no hosted tools)"
                )
                continue
            if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
                raise _bad(f"tools[{k}].functionDeclarations must be a list", "tools")
            for j, decl in enumerate(value):
                where = f"tools[{k}].functionDeclarations[{j}]"
                if not isinstance(decl, Mapping) or not isinstance(decl.get("name"), str) or not decl["name"]:
                    raise _bad(f"{where}: a function declaration needs a name", "tools")
                fn: dict[str, Any] = {"name": decl["name"]}
                if isinstance(decl.get("description"), str):
                    fn["description"] = decl["description"]
                if decl.get("parametersJsonSchema") is not None:
                    fn["parameters"] = decl["parametersJsonSchema"]
                elif decl.get("parameters") is not None:
                    fn["parameters"] = gemini_schema(decl["parameters"])
                else:
                    fn["parameters"] = {"type": "object", "properties": {}}
                out.append({"type": "function", "function": fn})
    return out or None


def _text_of(content: Any, where: str) -> str:
    """The text of a system instruction: a string, or a content's text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, Mapping) or not isinstance(content.get("parts"), Sequence):
        raise _bad(f"{where} must be a string or a content with parts", where)
    out = []
    for k, part in enumerate(content["parts"]):
        if not isinstance(part, Mapping) or not isinstance(part.get("text"), str):
            raise _bad(f"{where}.parts[{k}]: only text parts are served here", where)
        out.append(part["text"])
    return "".join(out)


def _result(response: Any) -> str:
    """A functionResponse's ``response`` as a tool message's text."""
    if isinstance(response, Mapping) and set(response) == {"output"} and isinstance(response["output"], str):
        return str(response["output"])
    return json.dumps(response, ensure_ascii=False)


def _contents(contents: Any) -> list[dict[str, Any]]:
    if not isinstance(contents, Sequence) or isinstance(contents, (str, bytes)) or not contents:
        raise _bad("contents must be a non-empty list", "contents")
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (id, name) of the last model turn's calls not yet answered
    for i, content in enumerate(contents):
        where = f"contents[{i}]"
        if not isinstance(content, Mapping):
            raise _bad(f"{where} must be an object", "contents")
        role = content.get("role") or "user"
        parts = content.get("parts")
        if not isinstance(parts, Sequence) or isinstance(parts, (str, bytes)):
            raise _bad(f"{where}.parts must be a list", "contents")
        if role not in ("user", "model", "function"):
            raise _bad(f"{where}.role must be 'user' or 'model', not {role!r}", "contents")
        texts: list[str] = []
        ordered: list[dict[str, Any]] = []  # a user content's text and image parts, in order
        thoughts: list[str] = []
        signed: str | None = None  # the reasoning a gateway's thoughtSignature holds
        calls: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for j, part in enumerate(parts):
            pw = f"{where}.parts[{j}]"
            if not isinstance(part, Mapping):
                raise _bad(f"{pw} must be an object", "contents")
            if signed is None and "thoughtSignature" in part:
                signed = read_signature(part["thoughtSignature"])
            media = [key for key in _MEDIA if key in part]
            if media == ["inlineData"] and role == "user" and isinstance(part["inlineData"], Mapping):
                blob = part["inlineData"]
                ordered.append(image_part(data_url(blob.get("mimeType"), blob.get("data"), f"{pw}.inlineData"), pw))
                continue
            if media:
                raise _bad(f"{pw}: {media[0]} parts are not served (text and function parts only)", "contents")
            if "functionCall" in part:
                fc = part["functionCall"]
                if role != "model" or not isinstance(fc, Mapping) or not isinstance(fc.get("name"), str):
                    raise _bad(f"{pw}: a functionCall with a name belongs to a model content", "contents")
                cid = str(fc["id"]) if isinstance(fc.get("id"), str) and fc["id"] else f"call_{i}_{j}"
                calls.append(tool_call(cid, fc["name"], fc.get("args") or {}))
            elif "functionResponse" in part:
                fr = part["functionResponse"]
                if role == "model" or not isinstance(fr, Mapping) or not isinstance(fr.get("name"), str):
                    raise _bad(f"{pw}: a functionResponse with a name belongs to a user content", "contents")
                rid = fr.get("id") if isinstance(fr.get("id"), str) and fr.get("id") else None
                match = next((p for p in pending if p[0] == rid), None) if rid else None
                if match is None and rid is None:
                    match = next((p for p in pending if p[1] == fr["name"]), None)
                if match is not None:
                    pending.remove(match)
                cid = rid or (match[0] if match else f"call_{i}_{j}")
                results.append(
                    {"role": "tool", "tool_call_id": cid, "name": fr["name"], "content": _result(fr.get("response"))}
                )
            elif isinstance(part.get("text"), str):
                (thoughts if part.get("thought") is True else texts).append(part["text"])
                if part.get("thought") is not True:
                    ordered.append({"type": "text", "text": part["text"]})
            elif part.get("thought") is True or "thoughtSignature" in part:
                continue  # a thought with no text (a signature only): nothing the template renders
            else:
                raise _bad(f"{pw}: a part needs text, functionCall or functionResponse", "contents")
        if role == "model":
            turn: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
            if thoughts or signed:
                turn["reasoning_content"] = "".join(thoughts) if thoughts else signed
            if calls:
                turn["tool_calls"] = calls
            out.append(turn)
            pending = [(c["id"], c["function"]["name"]) for c in calls]
        else:
            out += results
            if len(ordered) > len(texts):  # images among its parts
                out.append({"role": "user", "content": ordered})
            elif texts or not results:
                out.append({"role": "user", "content": "".join(texts)})
    return out


def _config(body: Mapping[str, Any]) -> CallParams:
    config = body.get("generationConfig") or {}
    if not isinstance(config, Mapping):
        raise _bad("generationConfig must be an object", "generationConfig")
    for key in ("responseSchema", "responseJsonSchema", "responseLogprobs", "logprobs"):
        if config.get(key):
            raise _bad(f"generationConfig.{key} is not served (decoding is never constrained)", "generationConfig")
    mime = config.get("responseMimeType")
    if mime not in (None, "", "text/plain"):
        raise _bad(f"generationConfig.responseMimeType {mime!r} is not served (text/plain only)", "generationConfig")
    modalities = config.get("responseModalities") or ["TEXT"]
    if any(str(m).upper() != "TEXT" for m in modalities):
        raise _bad("generationConfig.responseModalities: TEXT only", "generationConfig")

    def number(key: str, kind: type) -> Any:
        value = config.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
            raise _bad(f"generationConfig.{key} must be a {kind.__name__}", "generationConfig")
        return kind(value)

    limit, n = number("maxOutputTokens", int), number("candidateCount", int)
    if limit is not None and limit < 1:
        raise _bad("generationConfig.maxOutputTokens must be at least 1", "generationConfig")
    stops = config.get("stopSequences") or ()
    if not isinstance(stops, Sequence) or isinstance(stops, str) or not all(isinstance(s, str) for s in stops):
        raise _bad("generationConfig.stopSequences must be a list of strings", "generationConfig")
    return CallParams(
        max_tokens=limit,
        temperature=number("temperature", float),
        top_p=number("topP", float),
        n=1 if n is None else n,
        seed=number("seed", int),
        stop=tuple(s for s in stops if s),
    )


def _tool_config(body: Mapping[str, Any]) -> None:
    config = body.get("toolConfig")
    calling = config.get("functionCallingConfig") if isinstance(config, Mapping) else None
    if not isinstance(calling, Mapping):
        return
    mode = str(calling.get("mode") or "AUTO").upper()
    if mode not in ("AUTO", "ANY", "MODE_UNSPECIFIED", "VALIDATED") or calling.get("allowedFunctionNames"):
        raise _bad(
            f"toolConfig.functionCallingConfig: mode {mode} and allowedFunctionNames are not served "
            "(decoding is never constrained)",
            "toolConfig",
        )


def parse(body: Any, *, model: str | None, stream: bool, count: bool = False) -> GeminiRequest:
    """A GenerateContentRequest as canonical messages, tools and call parameters (``model`` and
    ``stream`` come from the path). ``count``: a countTokens body, ``contents`` or a
    ``generateContentRequest``."""
    if not isinstance(body, Mapping):
        raise _bad("the request body must be a JSON object")
    if count and isinstance(body.get("generateContentRequest"), Mapping):
        body = body["generateContentRequest"]
    if body.get("cachedContent"):
        raise _bad(
            "cachedContent is not served: the gateway keeps no content cache (send the contents)", "cachedContent"
        )
    notes: list[str] = []
    messages = _contents(body.get("contents"))
    if body.get("systemInstruction") is not None:
        system = _text_of(body["systemInstruction"], "systemInstruction")
        messages.insert(0, {"role": "system", "content": system})
    tools = _tools(body.get("tools"), notes)
    _tool_config(body)
    params = CallParams() if count else _config(body)
    return GeminiRequest(messages, tools, params, stream, model, tuple(notes))


def _parts(reply: Reply) -> list[dict[str, Any]]:
    m = reply.message
    parts: list[dict[str, Any]] = []
    thought = m.get("reasoning_content")
    if thought:
        parts.append({"text": thought, "thought": True})
    if m.get("content") or not m.get("tool_calls"):
        parts.append({"text": m.get("content") or ""})
    for c in m.get("tool_calls", ()):
        args = c["function"]["arguments"]
        parts.append(
            {
                "functionCall": {
                    "id": c["id"],
                    "name": c["function"]["name"],
                    "args": args if isinstance(args, Mapping) else {"value": args},
                }
            }
        )
    if thought:  # on the first part after the thought: the one clients keep
        parts[1]["thoughtSignature"] = thought_signature(reply.call, thought)
    return parts


def _candidate(reply: Reply, index: int) -> dict[str, Any]:
    finish = reply.result.finish_reason
    if finish == "length" and reply.message.get("tool_calls"):
        finish = "stop"  # the calls were read whole: the client runs them
    return {
        "content": {"role": "model", "parts": _parts(reply)},
        "finishReason": _FINISH.get(finish, "STOP"),
        "index": index,
    }


def _usage(plan: Plan, replies: Sequence[Reply]) -> dict[str, Any]:
    sampled = sum(len(r.result.token_ids) for r in replies)
    return {
        "promptTokenCount": len(plan.prompt_ids),
        "candidatesTokenCount": sampled,
        "totalTokenCount": len(plan.prompt_ids) + sampled,
    }


def _tmpl(session: str, plan: Plan, replies: Sequence[Reply], notes: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "session": session,
        "calls": [r.call for r in replies],
        "sequences": [r.sequence for r in replies],
        "prompt": plan.mode,
    }
    roles = getattr(plan, "roles", None)
    if roles:
        out["roles"] = dict(roles)
    if notes:
        out["left_out"] = list(notes)
    return out


def response(
    session: str, plan: Plan, replies: Sequence[Reply], *, model: str, notes: Sequence[str] = ()
) -> dict[str, Any]:
    """A GenerateContentResponse: one candidate per reply, usage, the model, the ``tmpl`` object."""
    return {
        "candidates": [_candidate(r, k) for k, r in enumerate(replies)],
        "usageMetadata": _usage(plan, replies),
        "modelVersion": model,
        "responseId": replies[0].call,
        "tmpl": _tmpl(session, plan, replies, notes),
    }


def stream_chunks(
    session: str, plan: Plan, replies: Sequence[Reply], *, model: str, notes: Sequence[str] = ()
) -> Iterator[dict[str, Any]]:
    """The chunks of a streamed response: one per candidate's parts (the whole turn: the engine has
    finished it), the last one with its finishReason and the usage."""
    for k, reply in enumerate(replies):
        last = k == len(replies) - 1
        chunk: dict[str, Any] = {
            "candidates": [_candidate(reply, k)],
            "modelVersion": model,
            "responseId": replies[0].call,
        }
        if last:
            chunk["usageMetadata"] = _usage(plan, replies)
            chunk["tmpl"] = _tmpl(session, plan, replies, notes)
        yield chunk


def count_body(tokens: int) -> dict[str, Any]:
    """countTokens' answer.

    >>> count_body(12)
    {'totalTokens': 12}
    """
    return {"totalTokens": tokens}


def model_object(model: str, *, context: int = 32_768, output: int = 1024) -> dict[str, Any]:
    """A Model resource for ``GET /v1beta/models/{model}``: the gateway serves its one model under any name.

    >>> model_object("gemini-2.5-flash")["name"]
    'models/gemini-2.5-flash'
    """
    name = model if model.startswith("models/") else f"models/{model}"
    return {
        "name": name,
        "baseModelId": name.removeprefix("models/"),
        "version": "tmpl",
        "displayName": name.removeprefix("models/"),
        "description": "served by the tmpl gateway",
        "inputTokenLimit": context,
        "outputTokenLimit": output,
        "supportedGenerationMethods": ["generateContent", "streamGenerateContent", "countTokens"],
        "thinking": True,
    }


def error_body(exc: GatewayError) -> dict[str, Any]:
    """Gemini's error object: ``{"error": {"code", "message", "status"}}``."""
    return {"error": {"code": exc.status, "message": str(exc), "status": _STATUS.get(exc.status, "UNKNOWN")}}
