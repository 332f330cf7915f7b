"""Kimi K2 calls: ``<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|>``.

The call id is the model's ``functions.NAME:IDX`` (kept as written).

>>> get_parser("kimi_k2", codec).parse(ids).tool_calls[0].id  # doctest: +SKIP
'functions.get_weather:0'
"""

from __future__ import annotations

import re

from ..tokentext import TokenText
from .base import TRUNCATED, RawCall, ToolParser, blocks

_ID = re.compile(r"\s*(?:functions\.)?([A-Za-z_][\w.\-/]*?)(?::(\d+))?\s*\Z")


class KimiK2Parser(ToolParser):
    name = "kimi_k2"
    description = "<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|> (Kimi K2)"
    delimiters = (
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
    )
    signature = ("<|tool_calls_section_begin|>", "<|tool_call_begin|>")

    def compile(self) -> None:
        self._begin = re.compile(self.p("<|tool_call_begin|>"))
        self._end = re.compile(self.p("<|tool_call_end|>"))
        self._args = re.compile(self.p("<|tool_call_argument_begin|>"))
        self._section_end = re.compile(self.p("<|tool_calls_section_end|>"))

    def find_calls(self, view: TokenText, start: int, end: int) -> list[RawCall]:
        text = view.text
        out: list[RawCall] = []
        for block in blocks(text, self._begin, self._end, start, end, self.stops):
            if block.truncated:
                out.append(RawCall(block.start, block.end, error=TRUNCATED, error_kind="truncated"))
                continue
            body_end = block.body_end
            if not block.closed:
                m = self._section_end.search(text, block.body_start, body_end)
                body_end = m.start() if m else body_end
            a = self._args.search(text, block.body_start, body_end)
            if a is None:
                out.append(
                    RawCall(block.start, block.end, error="no <|tool_call_argument_begin|>", error_kind="malformed")
                )
                continue
            head = text[block.body_start : a.start()]
            m = _ID.match(head)
            if m is None:
                out.append(
                    RawCall(
                        block.start,
                        block.end,
                        error=f"{head.strip()[:40]!r} is not functions.NAME:IDX",
                        error_kind="missing_name",
                    )
                )
                continue
            repairs = [] if block.closed else ["missing close tag"]
            out.append(
                RawCall(
                    block.start,
                    block.end if block.closed else body_end,
                    name=m.group(1),
                    arguments=text[a.end() : body_end],
                    id=head.strip(),
                    repairs=repairs,
                )
            )
        return out
