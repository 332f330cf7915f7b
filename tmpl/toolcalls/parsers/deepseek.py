"""DeepSeek V3 / R1 / V3.1 calls between ``<｜tool▁call▁begin｜>`` and ``<｜tool▁call▁end｜>``.

    V3, R1:  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
             ```json
             {"city": "Paris"}
             ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
    V3.1:    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>...

Both forms are read by the same parser: the part after ``<｜tool▁sep｜>`` starts with the
arguments in V3.1 and with the name in V3. Forgiven: a missing ``<｜tool▁call▁end｜>``, a
missing code fence, trailing text.

>>> get_parser("deepseek_v3", codec).parse(ids).tool_calls[0].name  # doctest: +SKIP
'get_weather'
"""

from __future__ import annotations

import re

from ..tokentext import TokenText
from .base import NAME, TRUNCATED, RawCall, ToolParser, blocks

BEGIN_ALL = "<｜tool▁calls▁begin｜>"
END_ALL = "<｜tool▁calls▁end｜>"
BEGIN = "<｜tool▁call▁begin｜>"
END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"

_V3_HEAD = re.compile(r"\s*(" + NAME + r")[ \t]*\n")
_FENCE = re.compile(r"\s*```[A-Za-z]*[ \t]*\n?(.*?)\n?[ \t]*```", re.S)


class DeepSeekParser(ToolParser):
    name = "deepseek_v3"
    description = "<｜tool▁call▁begin｜>[function<｜tool▁sep｜>]NAME ... <｜tool▁call▁end｜> (DeepSeek V3, R1, V3.1)"
    delimiters = (BEGIN_ALL, END_ALL, BEGIN, END, SEP)
    signature = (BEGIN_ALL, BEGIN, SEP)

    def compile(self) -> None:
        self._begin = re.compile(self.p(BEGIN))
        self._end = re.compile(self.p(END))
        self._sep = re.compile(self.p(SEP))
        self._end_all = re.compile(self.p(END_ALL))

    def find_calls(self, view: TokenText, start: int, end: int) -> list[RawCall]:
        text = view.text
        out: list[RawCall] = []
        for block in blocks(text, self._begin, self._end, start, end, self.stops):
            body_end = block.body_end
            if not block.closed:  # the list's end or a turn end also ends an unclosed call
                m = self._end_all.search(text, block.body_start, body_end)
                if m is not None:
                    body_end = m.start()
                if block.truncated:
                    out.append(RawCall(block.start, block.end, error=TRUNCATED, error_kind="truncated"))
                    continue
                for i in range(block.body_start, body_end):
                    if text[i] in self.stops:
                        body_end = i
                        break
            call = self._call(text, block.body_start, body_end)
            call.start, call.end = block.start, (block.end if block.closed else body_end)
            if not block.closed and call.error is None:
                call.repairs.append("missing close tag")
            out.append(call)
        return out

    def _call(self, text: str, a: int, b: int) -> RawCall:
        sep = self._sep.search(text, a, b)
        if sep is None:
            return RawCall(a, b, error=f"no {SEP} between the call's name and arguments", error_kind="malformed")
        head, tail = text[a : sep.start()].strip(), text[sep.end() : b]
        repairs: list[str] = []
        if not tail.lstrip().startswith(("{", "`", "[")):
            m = _V3_HEAD.match(tail)  # V3 / R1: "function<sep>NAME\n```json ...```"
            if m is None:
                return RawCall(
                    a, b, error="expected NAME and a ```json block after the separator", error_kind="malformed"
                )
            name, args_text = m.group(1), tail[m.end() :]
        else:  # V3.1: "NAME<sep>{...}"
            name, args_text = head, tail
        fence = _FENCE.match(args_text)
        if fence is not None:
            if args_text[fence.end() :].strip():
                repairs.append("trailing text")
            args_text = fence.group(1)
        elif "```" in args_text:
            args_text = args_text.replace("```json", "").replace("```", "")
            repairs.append("unbalanced code fence")
        return RawCall(a, b, name=name, arguments=args_text, repairs=repairs)
