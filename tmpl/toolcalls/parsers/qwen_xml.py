"""Qwen3-Coder / Qwen3.5 XML calls.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Values are text (the template writes one newline on each side, which is removed); objects and
lists are JSON. Values are coerced to the tool's schema; without one, a value that is a JSON
number/boolean/null/list/object is read as one. Forgiven: missing ``</parameter>``,
``</function>`` or ``</tool_call>``.

>>> get_parser("qwen3_xml", codec).parse(ids).tool_calls[0].arguments  # doctest: +SKIP
{'city': 'Paris'}
"""

from __future__ import annotations

import re

from ..tokentext import TokenText
from .base import RawCall, ToolParser


class QwenXmlParser(ToolParser):
    name = "qwen3_xml"
    description = "<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call> (Qwen3-Coder, Qwen3.5)"
    delimiters = ("<tool_call>", "</tool_call>")

    def compile(self) -> None:
        self._open = re.compile(self.p("<tool_call>"))
        self._close = re.compile(self.p("</tool_call>"))
        self._function = re.compile(r"\s*<function=([^>\n]*)>")
        self._end_function = re.compile(r"</function>")
        self._param = re.compile(r"<parameter=([^>\n]*)>")
        self._end_param = re.compile(r"</parameter>")

    def find_calls(self, view: TokenText, start: int, end: int) -> list[RawCall]:
        return self.calls_per_block(view, start, end)

    def _call(self, text: str, a: int, b: int) -> RawCall:
        f = self._function.match(text, a, b)
        if f is None:
            return RawCall(a, b, error="expected <function=NAME> inside <tool_call>", error_kind="malformed")
        name = f.group(1).strip()
        fe = self._end_function.search(text, f.end(), b)
        body_end = fe.start() if fe else b
        repairs = [] if fe else ["missing </function>"]
        args: dict[str, str] = {}
        p = self._param.search(text, f.end(), body_end)
        if p is None and text[f.end() : body_end].strip():
            return RawCall(
                a, b, name=name, error="expected <parameter=KEY> inside <function=...>", error_kind="malformed"
            )
        while p is not None:
            nxt = self._param.search(text, p.end(), body_end)
            limit = nxt.start() if nxt else body_end
            close = self._end_param.search(text, p.end(), limit)
            value = text[p.end() : close.start() if close else limit]
            if close is None:
                repairs.append("missing </parameter>")
                value = value.rstrip("\n")  # what precedes the next tag is layout, not value
            if value.startswith("\n"):
                value = value[1:]
            if value.endswith("\n"):
                value = value[:-1]
            args[p.group(1).strip()] = value
            p = nxt
        return RawCall(a, b, name=name, arguments=args, repairs=repairs, text_values=True)
