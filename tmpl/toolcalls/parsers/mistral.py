"""Mistral calls after ``[TOOL_CALLS]``: a JSON list, or ``NAME[ARGS]{json}`` per call.

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1B2c3D4e"}]</s>
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}</s>
    [TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris"}</s>

The first is Mistral Nemo / Small 3.1, the others newer templates (Devstral, Small 3.2).
Text before the first ``[TOOL_CALLS]`` is content. Forgiven: calls glued without a second
``[TOOL_CALLS]``, trailing text, Python-literal arguments.

>>> get_parser("mistral", codec).parse(ids).tool_calls[0].id  # doctest: +SKIP
'a1B2c3D4e'
"""

from __future__ import annotations

import re

from ..tokentext import TokenText
from .base import NAME, TRUNCATED, RawCall, ToolParser, json_objects
from .jsoncalls import calls_in_json


class MistralParser(ToolParser):
    name = "mistral"
    description = "[TOOL_CALLS][{json}, ...] or [TOOL_CALLS]NAME[ARGS]{json} (Mistral Nemo, Small, Devstral)"
    delimiters = ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")
    signature = ("[TOOL_CALLS]",)

    def compile(self) -> None:
        self._calls = re.compile(self.p("[TOOL_CALLS]"))
        self._named = re.compile(
            r"\s*(" + NAME + r")\s*(?:" + self.p("[CALL_ID]") + r"\s*([^\s\[\]{}]*?)\s*)?" + self.p("[ARGS]") + r"\s*"
        )

    def find_calls(self, view: TokenText, start: int, end: int) -> list[RawCall]:
        text = view.text
        tags = [m for m in self._calls.finditer(text, start, end)]
        out: list[RawCall] = []
        for k, tag in enumerate(tags):
            seg_end = tags[k + 1].start() if k + 1 < len(tags) else end
            stop = seg_end
            for i in range(tag.end(), seg_end):
                if text[i] in self.stops:
                    stop = i
                    break
            cut = stop == len(text)  # no </s>: the completion was cut off
            body = text[tag.end() : stop]
            if body.lstrip().startswith(("[", "{")):
                found = calls_in_json(text, tag.end(), stop, at_end=cut)
            else:
                found = self._named_calls(text, tag.end(), stop, cut)
            if not found:
                out.append(
                    RawCall(tag.start(), stop, error="nothing readable after [TOOL_CALLS]", error_kind="malformed")
                )
                continue
            found[0].start = tag.start()
            out.extend(found)
        return out

    def _named_calls(self, text: str, start: int, stop: int, cut: bool) -> list[RawCall]:
        out: list[RawCall] = []
        pos = start
        while pos < stop and text[pos:stop].strip():
            m = self._named.match(text, pos, stop)
            if m is None:
                if out:  # text after a readable call
                    out[-1].repairs.append("trailing text")
                    out[-1].end = stop
                    break
                out.append(
                    RawCall(pos, stop, error="expected NAME[ARGS]{...} after [TOOL_CALLS]", error_kind="malformed")
                )
                break
            found = json_objects(text, m.end(), stop)
            if not found or found[0].error is not None:
                kind, why = (
                    ("truncated", TRUNCATED) if cut else ("bad_json", "arguments after [ARGS] are not a JSON object")
                )
                out.append(RawCall(pos, stop, name=m.group(1), error=why, error_kind=kind))
                break
            b, value = found[0].end, found[0].value
            out.append(
                RawCall(
                    pos,
                    b,
                    name=m.group(1),
                    arguments=value,
                    id=m.group(2) or None,
                    repairs=["python literal"] if found[0].lenient else [],
                )
            )
            pos = b
        return out
