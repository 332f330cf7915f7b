"""OpenAI Responses (``POST /v1/responses``): input items in, a response object and its stream events out.

Read: ``input`` (a string, or items: messages with text parts, ``function_call``,
``function_call_output``, ``custom_tool_call``, ``custom_tool_call_output`` and ``reasoning`` items),
``instructions`` (a system message first), ``tools``, ``tool_choice`` (``auto``; ``required`` taken as
``auto``), ``max_output_tokens``, ``temperature``, ``top_p``, ``stream``, ``include``
(``reasoning.encrypted_content``), ``reasoning.summary``. An assistant message, the reasoning before it
and the calls after it are one assistant turn. Every other field the API defines is ignored (echoed
where the response object has it) or refused with a 400: :data:`FIELDS` says which, and docs/gateway.md
has the table.

Tools as the template sees them:

- ``function`` tools as they are;
- ``namespace`` tools flattened: each function ``f`` of namespace ``ns`` is rendered as the function
  ``ns__f`` (:data:`NAMESPACE_SEP`); a call of ``ns__f`` goes back as a ``function_call`` item named
  ``f`` with ``namespace: "ns"``, and such an item in the input is the call ``ns__f`` again;
- ``custom`` (freeform) tools, such as Codex's ``apply_patch``: a function of one string parameter
  ``input`` (:func:`custom_as_function`); a call goes back as a ``custom_tool_call`` item whose
  ``input`` is that string;
- hosted tools (``web_search``, ``file_search``, ``code_interpreter``, ``image_generation``,
  ``computer_use_preview``, ``mcp``, ``local_shell``...: every other type) are left out of the prompt
  (the gateway runs none of them) and named in the request's ``notes``, which the session keeps.

A reply's reasoning goes back as a ``reasoning`` item with its text; when the request includes
``reasoning.encrypted_content`` the item also carries ``encrypted_content``, ``tmpl1.`` and the
URL-safe base64 of ``{"call", "text"}`` (:func:`reasoning_reference`): a client that keeps only the
opaque field (Codex sends back no reasoning text) still names the exact reasoning, so the next call
continues the reply's sampled IDs.

>>> req = parse({"model": "m", "instructions": "Be brief.", "input": "Hi"})
>>> req.messages
[{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi'}]
>>> parse({"input": "Hi", "tools": [{"type": "web_search"}]}).notes
("tools[0]: the hosted tool 'web_search' is left out of the prompt (the gateway runs no hosted tools)",)

:mod:`.request` reads a request, :mod:`.reply` writes the answer.
"""

from __future__ import annotations

from .reply import error_body, events, response
from .request import (
    FIELDS,
    NAMESPACE_SEP,
    REFERENCE_PREFIX,
    ResponsesRequest,
    ToolName,
    custom_as_function,
    parse,
    read_reference,
    reasoning_reference,
)

__all__ = [
    "FIELDS",
    "NAMESPACE_SEP",
    "REFERENCE_PREFIX",
    "ResponsesRequest",
    "ToolName",
    "custom_as_function",
    "error_body",
    "events",
    "parse",
    "read_reference",
    "reasoning_reference",
    "response",
]
