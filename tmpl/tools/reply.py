"""``ToolReply``: what a tool returns when a plain value cannot say it all.

A tool's return value becomes its tool message's content (text as is, the rest as JSON). A tool that
speaks for something else (an MCP server: :mod:`.mcp`) needs more: text for a text template and
content parts with images for a vision template, the raw result kept for reward functions, and a
failure that counts as one (the server said ``isError``, or it crashed) without raising. The
:class:`~tmpl.tools.Toolbox` turns a returned ``ToolReply`` into the call's
:class:`~tmpl.tools.metrics.CallOutcome` with :meth:`ToolReply.outcome`.

>>> ToolReply("It is 10:00.", value={"time": "10:00"}).outcome("c1", "get_time", 0.01).output
{'time': '10:00'}
>>> failed = ToolReply("Error: get_time failed: unknown zone", failure="exception").outcome("c2", "get_time", 0.01)
>>> failed.error, failed.content, failed.output
('exception', 'Error: get_time failed: unknown zone', None)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ToolboxError
from .metrics import FAILURE_KINDS, CallOutcome
from .outputs import cut_chars


@dataclass(frozen=True, slots=True)
class ToolReply:
    """A tool's answer: ``content`` (the tool message's text), ``parts`` (content parts with images for a
    vision template's rollout, None when text only), ``value`` (the raw result, the call's ``output``)
    and ``failure`` (a kind of :data:`~tmpl.tools.metrics.FAILURE_KINDS`: the call counts as failed)."""

    content: str
    parts: list[Any] | None = None
    value: Any = None
    failure: str | None = None

    def __post_init__(self) -> None:
        if self.failure is not None and self.failure not in FAILURE_KINDS:
            raise ToolboxError(f"ToolReply.failure must be one of {FAILURE_KINDS}, not {self.failure!r}")

    def outcome(self, call_id: str, name: str, latency: float | None, max_chars: int | None = None) -> CallOutcome:
        """The call's outcome: the content cut to ``max_chars`` (with the marker the model reads); the
        ``output`` is the parts when there are images (the vision path reads them from it), else the value."""
        content, chars = self.content, None
        if max_chars is not None and len(content) > max_chars:
            content, chars = cut_chars(content, max_chars), len(self.content)
        if self.failure is not None:
            return CallOutcome(call_id, name, self.failure, content, latency, None, chars=chars)
        output = self.parts if self.parts is not None else self.value
        return CallOutcome(call_id, name, None, content, latency, output, chars=chars)
