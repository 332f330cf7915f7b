"""Functionary v3.1 / Llama 3.1 custom-tool calls: ``<function=NAME>{json}</function>``.

>>> get_parser("functionary", codec).parse(codec.encode('<function=f>{"x": 1}</function>')).tool_calls[0].arguments  # doctest: +SKIP
{'x': 1}
"""

from __future__ import annotations

import re

from ..tokentext import TokenText
from .base import NAME, TRUNCATED, RawCall, ToolParser, blocks, json_objects


class FunctionaryParser(ToolParser):
    name = "functionary"
    description = "<function=NAME>{json}</function> (Functionary v3.1, Llama 3.1 custom tools)"
    delimiters = ()

    def compile(self) -> None:
        self._open = re.compile(r"<function=(" + NAME + r")>")
        self._close = re.compile(r"</function>")

    def find_calls(self, view: TokenText, start: int, end: int) -> list[RawCall]:
        text = view.text
        out: list[RawCall] = []
        for block in blocks(text, self._open, self._close, start, end, self.stops):
            name = self._open.match(text, block.start).group(1)
            if block.truncated:
                out.append(RawCall(block.start, block.end, name=name, error=TRUNCATED, error_kind="truncated"))
                continue
            body = text[block.body_start : block.body_end]
            if not body.strip() or all(ch in self.stops for ch in body.strip()):
                out.append(RawCall(block.start, block.end, name=name, arguments=None))
                continue
            found = json_objects(text, block.body_start, block.body_end)
            if not found or found[0].error is not None:
                out.append(
                    RawCall(
                        block.start,
                        block.end,
                        name=name,
                        error="arguments are not a JSON object",
                        error_kind="bad_json",
                    )
                )
                continue
            args_end, value = found[0].end, found[0].value
            rest = text[args_end : block.body_end].strip()
            repairs = [] if block.closed else ["missing close tag"]
            if found[0].lenient:
                repairs.append("python literal")
            if rest and not all(ch in self.stops for ch in rest):
                repairs.append("trailing text")
            out.append(
                RawCall(
                    block.start, block.end if block.closed else args_end, name=name, arguments=value, repairs=repairs
                )
            )
        return out
