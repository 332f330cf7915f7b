"""GLM-4.5/4.6 calls (also Ling, Laguna, Spark): name, then key/value tag pairs.

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

Values are text exactly as written (the template writes strings as they are and other values as
JSON); they are coerced to the tool's schema, and without one a JSON number/boolean/null/list/
object is read as one. Forgiven: a missing ``</arg_value>`` or ``</tool_call>``.

>>> get_parser("glm4", codec).parse(ids).tool_calls[0].arguments  # doctest: +SKIP
{'city': 'Paris'}
"""

from __future__ import annotations

import re

from ..tokentext import TokenText
from .base import RawCall, ToolParser


class Glm4Parser(ToolParser):
    name = "glm4"
    description = "<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call> (GLM-4.5/4.6, Ling, Laguna)"
    delimiters = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")

    def compile(self) -> None:
        self._open = re.compile(self.p("<tool_call>"))
        self._close = re.compile(self.p("</tool_call>"))
        self._key = re.compile(self.p("<arg_key>"))
        self._key_end = re.compile(self.p("</arg_key>"))
        self._value = re.compile(r"\s*" + self.p("<arg_value>"))
        self._value_end = re.compile(self.p("</arg_value>"))

    def find_calls(self, view: TokenText, start: int, end: int) -> list[RawCall]:
        return self.calls_per_block(view, start, end)

    def _call(self, text: str, a: int, b: int) -> RawCall:
        k = self._key.search(text, a, b)
        name = text[a : k.start() if k else b].strip()
        args: dict[str, str] = {}
        repairs: list[str] = []
        while k is not None:
            ke = self._key_end.search(text, k.end(), b)
            if ke is None:
                return RawCall(a, b, name=name, error="<arg_key> is not closed", error_kind="malformed")
            key = text[k.end() : ke.start()].strip()
            v = self._value.match(text, ke.end(), b)
            if v is None:
                return RawCall(
                    a, b, name=name, error=f"<arg_key>{key}</arg_key> has no <arg_value>", error_kind="malformed"
                )
            nxt = self._key.search(text, v.end(), b)
            limit = nxt.start() if nxt else b
            ve = self._value_end.search(text, v.end(), limit)
            if ve is None:
                repairs.append("missing </arg_value>")
                value = text[v.end() : limit].rstrip("\n")
            else:
                value = text[v.end() : ve.start()]
            args[key] = value
            k = nxt
        return RawCall(a, b, name=name, arguments=args, repairs=repairs, text_values=True)
