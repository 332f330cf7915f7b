"""Functionary v3.2 calls: ``>>>RECIPIENT\\nBODY`` segments; the recipient ``all`` is content.

    >>>all
    Sure, checking.>>>get_weather
    {"city": "Paris"}<|eot_id|>

The generation prompt ends with the first ``>>>``, so a completion starts with a recipient.
Text with no recipient line is content.

>>> get_parser("functionary_v3", codec).parse(codec.encode('get_time\\n{}')).tool_calls[0].name  # doctest: +SKIP
'get_time'
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..tokentext import TokenText
from ..types import ParsedCompletion
from .base import NAME, RawCall, ToolParser

_HEAD = re.compile(r"(" + NAME + r")[ \t]*\n")
SEP = ">>>"


class FunctionaryV3Parser(ToolParser):
    name = "functionary_v3"
    description = ">>>NAME\\n{json} segments, >>>all for text (Functionary v3.2)"
    delimiters = ()

    def segments(self, view: TokenText, start: int, end: int) -> tuple[list[RawCall], list[str]]:
        """(calls, content pieces) of a region."""
        text = view.text
        stop = next((i for i in range(start, end) if text[i] in self.stops), end)
        heads = [start] + [m.end() for m in re.finditer(re.escape(SEP), text[start:stop])]
        heads = [heads[0]] + [start + h for h in heads[1:]]
        calls: list[RawCall] = []
        content: list[str] = []
        for k, a in enumerate(heads):
            b = heads[k + 1] - len(SEP) if k + 1 < len(heads) else stop
            m = _HEAD.match(text, a, b)
            if m is None:
                content.append(view.clean(a, b))
            elif m.group(1) == "all":
                content.append(view.clean(m.end(), b))
            else:
                calls.append(RawCall(a - len(SEP) if k else a, b, name=m.group(1), arguments=text[m.end() : b]))
        return calls, content

    def find_calls(self, view: TokenText, start: int, end: int) -> list[RawCall]:
        return self.segments(view, start, end)[0]

    def parse(self, completion_ids: Sequence[int], *, tools: Any = None) -> ParsedCompletion:
        view = TokenText(self.table, completion_ids)
        reasoning_spans, regions = self.split_reasoning(view)
        raws: list[RawCall] = []
        content: list[str] = []
        for a, b in regions:
            calls, pieces = self.segments(view, a, b)
            raws += calls
            content += pieces
        return self.finish(view, raws, "".join(content).strip(), self.reasoning_text(view, reasoning_spans), tools)
