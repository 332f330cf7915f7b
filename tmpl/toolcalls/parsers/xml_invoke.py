"""XML ``invoke`` calls: DeepSeek V4 (DSML), MiniMax-M2 and MiniCPM5.

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

    <function name="get_weather"><param name="city">Paris</param></function>     (MiniCPM5)

A parameter marked ``string="true"`` is text as written; ``string="false"`` is JSON (or a
Python literal). Without the attribute a value is text, coerced to the tool's schema (and
without one, read as a JSON literal when it is one). ``<![CDATA[...]]>`` is unwrapped. The
``tool_calls`` wrapper belongs to the calls. Forgiven: a missing ``</parameter>`` or
``</invoke>`` (up to the next tag or the turn end).

>>> get_parser("xml_invoke", codec).parse(ids).tool_calls[0].arguments  # doctest: +SKIP
{'city': 'Paris', 'days': 3}
"""

from __future__ import annotations

import re
from typing import Any

from ..tokentext import TokenText
from .base import NAME, TRUNCATED, RawCall, ToolParser, json_objects

_P = r"(?P<p>(?:｜DSML｜|minimax:)?)"
_OPEN = re.compile(r"<" + _P + r"(?P<tag>invoke|function) name=\"(?P<name>" + NAME + r")\">")
_PARAM = r"<{p}(?:parameter|param) name=\"(?P<key>[^\"<>]+)\"(?: string=\"(?P<string>true|false)\")?>"
_CDATA = re.compile(r"\s*<!\[CDATA\[(.*)\]\]>\s*\Z", re.S)


class XmlInvokeParser(ToolParser):
    name = "xml_invoke"
    description = (
        '<invoke name="NAME"><parameter name="K">V</parameter></invoke> (DeepSeek V4 DSML, MiniMax-M2, MiniCPM5)'
    )
    delimiters = ()

    def find_calls(self, view: TokenText, start: int, end: int) -> list[RawCall]:
        text = view.text
        stop = next((i for i in range(start, end) if text[i] in self.stops), end)
        opens = list(_OPEN.finditer(text, start, stop))
        out: list[RawCall] = []
        for k, m in enumerate(opens):
            limit = opens[k + 1].start() if k + 1 < len(opens) else stop
            prefix, tag = m.group("p"), m.group("tag")
            close = re.compile(re.escape(f"</{prefix}{tag}>")).search(text, m.end(), limit)
            if close is None and stop == len(text) and k + 1 == len(opens):
                out.append(RawCall(m.start(), limit, name=m.group("name"), error=TRUNCATED, error_kind="truncated"))
                continue
            body_end = close.start() if close else limit
            call = self._call(text, m, prefix, body_end)
            call.end = close.end() if close else body_end
            if close is None:
                call.repairs.append(f"missing </{prefix}{tag}>")
            out.append(call)
        self._take_wrappers(text, out, start, stop)
        return out

    def _call(self, text: str, m: re.Match, prefix: str, end: int) -> RawCall:
        param = re.compile(_PARAM.format(p=re.escape(prefix)))
        param_close = re.compile(r"</" + re.escape(prefix) + r"(?:parameter|param)>")
        args: dict[str, Any] = {}
        repairs: list[str] = []
        typed = False
        p = param.search(text, m.end(), end)
        if p is None and text[m.end() : end].strip():
            return RawCall(
                m.start(),
                end,
                name=m.group("name"),
                error="expected <parameter name=...> inside the call",
                error_kind="malformed",
            )
        while p is not None:
            nxt = param.search(text, p.end(), end)
            limit = nxt.start() if nxt else end
            c = param_close.search(text, p.end(), limit)
            value = text[p.end() : c.start() if c else limit]
            if c is None:
                repairs.append("missing </parameter>")
                value = value.rstrip()
            cdata = _CDATA.match(value)
            if cdata:
                value = cdata.group(1)
            key = p.group("key")
            if p.group("string") is not None:
                typed = True
                args[key] = value if p.group("string") == "true" else _json_value(value)
            else:
                args[key] = value
            p = nxt
        return RawCall(m.start(), end, name=m.group("name"), arguments=args, repairs=repairs, text_values=not typed)

    @staticmethod
    def _take_wrappers(text: str, calls: list[RawCall], start: int, stop: int) -> None:
        """Extend the first and last call over a ``<PREFIXtool_calls>`` wrapper around them."""
        if not calls:
            return
        head = re.search(r"<(?:｜DSML｜)?(?:tool_calls|minimax:tool_call)>\s*\Z", text[start : calls[0].start])
        if head:
            calls[0].start = start + head.start()
        tail = re.match(r"\s*</(?:｜DSML｜)?(?:tool_calls|minimax:tool_call)>", text[calls[-1].end : stop])
        if tail:
            calls[-1].end += tail.end()


def _json_value(text: str) -> Any:
    found = json_objects(text.strip())
    if len(found) == 1 and found[0].error is None:
        return found[0].value
    return text
