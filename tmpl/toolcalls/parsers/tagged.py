"""Calls between an open and a close tag, each body JSON: Hermes / Qwen2.5 / Qwen3 and kin.

``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` (Hermes, Qwen2.5, Qwen3, QwQ, MiMo,
Granite 4.1, Bielik), ``<tool_calls>[...]</tool_calls>`` (Apriel; MiniMax-M1 writes one object
per line), ``<TOOLCALL>[...]</TOOLCALL>`` (Nemotron Nano 2), ``<|tool_call|>[...]<|/tool_call|>``
(Phi-4-mini). Forgiven: a missing close tag (the body runs to the next open tag or the end),
several objects in one tag, a list in a tag, trailing text, Python-literal bodies.

>>> parser = get_parser("hermes", codec)  # doctest: +SKIP
>>> parser.parse(codec.encode('<tool_call>\\n{"name": "f", "arguments": {}}\\n</tool_call>')).tool_calls[0].name  # doctest: +SKIP
'f'
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, ClassVar

from ..tokentext import TokenText
from ..types import ParsedCompletion
from .base import TRUNCATED, RawCall, ToolParser, blocks
from .jsoncalls import calls_in_json
from .tokencalls import TokenDelimitedCalls


class TaggedJsonParser(ToolParser):
    """Base of the ``OPEN json CLOSE`` formats; subclasses set ``open_tag`` and ``close_tag``."""

    open_tag: ClassVar[str] = ""
    close_tag: ClassVar[str] = ""

    def compile(self) -> None:
        self._open = re.compile(self.p(self.open_tag))
        self._close = re.compile(self.p(self.close_tag))
        #: the clean case read straight from the IDs (None: the tags are text here, or no byte table)
        self._by_ids = TokenDelimitedCalls.for_parser(self, self.open_tag, self.close_tag)

    def parse(self, completion_ids: Sequence[int], *, tools: Any = None) -> ParsedCompletion:
        """As :meth:`ToolParser.parse`; a completion of the clean shape is read from its IDs."""
        if self._by_ids is not None:
            parsed = self._by_ids.parse(completion_ids, tools)
            if parsed is not None:
                return parsed
        return super().parse(completion_ids, tools=tools)

    def find_calls(self, view: TokenText, start: int, end: int) -> list[RawCall]:
        out: list[RawCall] = []
        for block in blocks(view.text, self._open, self._close, start, end, self.stops):
            if block.truncated:
                out.append(RawCall(block.start, block.end, error=TRUNCATED, error_kind="truncated"))
                continue
            found = calls_in_json(view.text, block.body_start, block.body_end)
            if not found:
                out.append(RawCall(block.start, block.end, error="empty tool call", error_kind="malformed"))
                continue
            found[0].start = block.start
            if block.closed:
                found[-1].end = block.end
            else:  # what follows the last readable call is content again
                for call in found:
                    if call.error is None:
                        call.repairs.append("missing close tag")
            out.extend(found)
        return out


class HermesParser(TaggedJsonParser):
    name = "hermes"
    description = "<tool_call>{json}</tool_call> (Hermes, Qwen2.5, Qwen3, QwQ, Granite 4.1, MiMo)"
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"
    delimiters = (open_tag, close_tag)
    signature = (open_tag, close_tag)


class ToolCallsTagParser(TaggedJsonParser):
    name = "tool_calls_tag"
    description = "<tool_calls>[json, ...]</tool_calls> (Apriel; MiniMax-M1 with one object per line)"
    open_tag = "<tool_calls>"
    close_tag = "</tool_calls>"
    delimiters = (open_tag, close_tag)


class NemotronParser(TaggedJsonParser):
    name = "nemotron"
    description = "<TOOLCALL>[json, ...]</TOOLCALL> (Nemotron Nano 2)"
    open_tag = "<TOOLCALL>"
    close_tag = "</TOOLCALL>"
    delimiters = (open_tag, close_tag)
    signature = (open_tag, close_tag)


class Phi4Parser(TaggedJsonParser):
    name = "phi4"
    description = "<|tool_call|>[json, ...]<|/tool_call|> (Phi-4-mini)"
    open_tag = "<|tool_call|>"
    close_tag = "<|/tool_call|>"
    delimiters = (open_tag, close_tag)
    signature = (open_tag, close_tag)
