"""Llama 3.x calls: bare JSON ``{"name": ..., "parameters": ...}``, or after ``<|python_tag|>``.

The reply is a call when (outside reasoning) it starts with a JSON object that has a
``"name"``, or when it contains ``<|python_tag|>``: the text after the tag holds the calls
(JSON objects separated by ``;`` or newlines, or a built-in tool call written as
``brave_search.call(query="...")``). Any other reply is content: text that merely mentions
JSON later on is not a call.

>>> get_parser("llama3_json", codec).parse(codec.encode('{"name": "f", "parameters": {"x": 1}}')).tool_calls[0].arguments  # doctest: +SKIP
{'x': 1}
"""

from __future__ import annotations

import re

from ..tokentext import TokenText
from .base import RawCall, ToolParser
from .jsoncalls import calls_in_json
from .pythonic import calls_in_python

_STARTS_CALL = re.compile(r"\s*\{\s*[\"']name[\"']\s*:")


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    description = 'bare {"name": ..., "parameters": ...} JSON, or after <|python_tag|> (Llama 3.1/3.2/3.3)'
    delimiters = ("<|python_tag|>",)
    signature = ("<|python_tag|>",)

    def compile(self) -> None:
        self._tag = re.compile(self.p("<|python_tag|>"))

    def find_calls(self, view: TokenText, start: int, end: int) -> list[RawCall]:
        text = view.text
        tag = self._tag.search(text, start, end)
        if tag is not None:
            body = tag.end()
            stop = self._first_stop(text, body, end)
            if re.match(r"\s*[\[{]", text[body:stop]):
                calls = calls_in_json(text, body, stop, at_end=stop == len(text))
            else:
                calls = calls_in_python(text, body, stop, builtin=True)
            if not calls:
                return [RawCall(tag.start(), stop, error="nothing follows <|python_tag|>", error_kind="malformed")]
            calls[0].start = tag.start()
            return calls
        if not _STARTS_CALL.match(text, start, end):
            return []
        stop = self._first_stop(text, start, end)
        lead = len(text[start:stop]) - len(text[start:stop].lstrip())
        return calls_in_json(text, start + lead, stop, at_end=stop == len(text))

    def _first_stop(self, text: str, start: int, end: int) -> int:
        """Position of the first turn-ending marker (``<|eot_id|>``, ``<|eom_id|>``) in the span."""
        for i in range(start, end):
            if text[i] in self.stops:
                return i
        return end
