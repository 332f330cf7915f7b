"""gpt-oss (harmony) calls: messages with a recipient ``to=functions.NAME``.

A completion is a series of messages ``[<|start|>assistant]HEADER<|message|>BODY<|end|>``
(the first one's ``<|start|>assistant`` is in the prompt). The template writes a call as
``<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{args}<|call|>``
while the model writes ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>...``;
the recipient is read wherever it is in the header. The ``analysis`` channel is reasoning:
a recipient there is a thought, never a call. ``final`` and plain ``commentary`` are content.
A call's arguments end at ``<|call|>``; as ``<|call|>`` is also the stop token (which a
generation engine may leave out), a call without it is accepted when its JSON is complete.

>>> get_parser("harmony", codec).parse(ids).tool_calls[0].name  # doctest: +SKIP
'get_weather'
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..tokentext import TokenText
from ..types import ParsedCompletion
from .base import TRUNCATED, RawCall, ToolParser, json_objects

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"


class HarmonyParser(ToolParser):
    name = "harmony"
    description = "<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{json}<|call|> (gpt-oss)"
    delimiters = (START, CHANNEL, MESSAGE, CONSTRAIN, END, CALL, RETURN)
    think = None
    signature = (CHANNEL, MESSAGE, CALL)
    reasoning_key = "thinking"

    def compile(self) -> None:
        self._start = re.compile(self.p(START))
        self._message = re.compile(self.p(MESSAGE))
        self._term = re.compile("|".join(self.p(t) for t in (END, CALL, RETURN)))
        self._channel = re.compile(self.p(CHANNEL) + r"\s*(\w+)")
        self._recipient = re.compile(r"(?<![\w.])to=([^\s<>\U000f0000-\U0010ffff]+)")

    def find_calls(self, view: TokenText, start: int, end: int) -> list[RawCall]:  # noqa: ARG002 - pragma: no cover - parse() is overridden
        return []

    def parse(self, completion_ids: Sequence[int], *, tools: Any = None) -> ParsedCompletion:
        view = TokenText(self.table, completion_ids)
        text = view.text
        bounds = [0, *(m.start() for m in self._start.finditer(text)), len(text)]
        raws: list[RawCall] = []
        content: list[str] = []
        reasoning: list[str] = []
        for a, b in zip(bounds, bounds[1:]):
            if a == b:
                continue
            msg = self._message.search(text, a, b)
            if msg is None:  # a header with no body, or plain text with no harmony structure
                rc = self._recipient.search(text, a, b)
                if rc is not None:
                    raws.append(RawCall(a, b, name=_tool_name(rc.group(1)), error=TRUNCATED, error_kind="truncated"))
                elif self._channel.search(text, a, b) is None and view.clean(a, b).strip():
                    content.append(view.clean(a, b).strip())
                continue
            header = text[a : msg.start()]
            term = self._term.search(text, msg.end(), b)
            body_end = term.start() if term else b
            ch = self._channel.search(header)
            channel = ch.group(1) if ch else ""
            rc = self._recipient.search(header)
            if channel == "analysis":
                reasoning.append(view.clean(msg.end(), body_end).strip())
            elif rc is not None:
                raws.append(self._call(view, a, msg.end(), body_end, term, rc.group(1)))
            elif view.clean(msg.end(), body_end).strip():
                content.append(view.clean(msg.end(), body_end).strip())
        return self.finish(view, raws, "\n".join(content), "\n".join(reasoning) if reasoning else None, tools)

    def _call(
        self, view: TokenText, a: int, body: int, body_end: int, term: re.Match | None, recipient: str
    ) -> RawCall:
        text = view.text
        name = _tool_name(recipient)
        args = view.clean(body, body_end)
        if term is not None:
            return RawCall(a, term.end(), name=name, arguments=args)
        found = json_objects(text, body, body_end)
        if not found or found[0].error is not None:
            return RawCall(a, body_end, name=name, error=TRUNCATED, error_kind="truncated")
        return RawCall(a, body_end, name=name, arguments=args, repairs=[f"no {CALL} after the arguments"])


def _tool_name(recipient: str) -> str:
    return recipient[len("functions.") :] if recipient.startswith("functions.") else recipient
