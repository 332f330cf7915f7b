"""Prefix stability of a chat template, checked on randomized conversations.

Token-in/token-out training builds each next prompt as ``prompt + completion + suffix``. That
sequence equals what the template renders only if the template is *prefix-stable*: appending
messages never changes how earlier ones render. Three appends are checked:

- ``tool_append``: tool results after an assistant turn with calls (a tool round);
- ``assistant_kept``: the assistant turn renders the same when it is last (what the model
  is trained to generate) as when more messages follow it;
- ``user_append``: a new user message after an assistant reply (several user turns).

A failure keeps a counterexample (the messages and where the token streams diverge) and a
reason: thinking stripped from earlier turns, system prompt moved, call arguments
re-serialized, or something else. Date injection (``strftime_now``) is detected separately by
rendering on two different dates.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import TmplError

REASONING = "TmPlReAsOnInG about the weather"
SYSTEM = "TmPlSyStEm: you are a careful assistant."
ARG_VALUE = "TmPlCiTy"

PROBE_TOOLSET = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_web",
            "description": "Search the web.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "Query"}},
                "required": ["query"],
            },
        },
    },
]

CONTENT_POOL = (
    "Paris is sunny, 21 C.",
    'Result: {"temp": 21.5, "ok": true}',
    "  spaced out  \n",
    "Zürich — 雨 🌧",
    "line one\nline two",
)


@dataclass
class Check:
    """Outcome of one stability check over the randomized conversations."""

    ok: bool
    cases: int = 0
    reason: str = ""
    counterexample: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "cases": self.cases, "reason": self.reason, "counterexample": self.counterexample}


@dataclass
class StabilityResult:
    checks: dict[str, Check] = field(default_factory=dict)
    date_injected: bool = False
    reasoning_rendered: bool = False


@contextlib.contextmanager
def frozen_date(year: int, month: int, day: int) -> Iterator[None]:
    """Make ``strftime_now`` in chat templates see a fixed date."""
    from transformers.utils import chat_template_utils as ctu

    real = ctu.datetime

    class _Fixed(real):  # type: ignore[misc, valid-type]
        @classmethod
        def now(cls, tz=None):  # noqa: ARG003 - signature of datetime.now
            return real(year, month, day, 9, 30, 0)

    ctu.datetime = _Fixed
    try:
        yield
    finally:
        ctu.datetime = real


def _call(i: int, round_: int, rng: random.Random) -> dict:
    tool = PROBE_TOOLSET[(i + round_) % len(PROBE_TOOLSET)]["function"]
    key = next(iter(tool["parameters"]["properties"]))
    return {
        "id": f"s{round_}{i}{rng.randrange(10**6):06d}"[:9].ljust(9, "x"),
        "type": "function",
        "function": {"name": tool["name"], "arguments": {key: f"{ARG_VALUE}{round_}{i}"}},
    }


def _assistant(k: int, round_: int, rng: random.Random, reasoning: bool, content: str = "") -> dict:
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if k:
        msg["tool_calls"] = [_call(i, round_, rng) for i in range(k)]
    if reasoning:
        msg["reasoning_content"] = f"{REASONING} {round_}"
    return msg


def _results(assistant: dict, rng: random.Random) -> list[dict]:
    return [
        {"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"], "content": rng.choice(CONTENT_POOL)}
        for c in assistant["tool_calls"]
    ]


def conversations(max_calls: int, seed: int = 0, n: int = 6) -> list[dict[str, Any]]:
    """Randomized (history, assistant, tool results) cases for the checks."""
    rng = random.Random(seed)
    cases = []
    for j in range(n):
        history: list[dict] = []
        if j % 2:
            history.append({"role": "system", "content": SYSTEM})
        history.append({"role": "user", "content": f"TmPlUsEr{j}: weather in Paris?"})
        if j % 3 == 2:
            history += [
                _assistant(0, 9, rng, reasoning=True, content="Earlier answer."),
                {"role": "user", "content": "TmPlUsErAgAiN: and now?"},
            ]
        reasoning = j % 2 == 0
        k = max(1, min(max_calls, 1 + j % 3))
        first = _assistant(k, 0, rng, reasoning)
        cases.append({"history": history, "assistant": first, "results": _results(first, rng), "reasoning": reasoning})
        if j % 2 == 0:  # a second tool round on top of the first
            later = history + [first] + _results(first, rng)
            second = _assistant(1, 1, rng, reasoning)
            cases.append(
                {"history": later, "assistant": second, "results": _results(second, rng), "reasoning": reasoning}
            )
    return cases


def _divergence(short: Sequence[int], long: Sequence[int]) -> int:
    n = min(len(short), len(long))
    i = 0
    while i < n and short[i] == long[i]:
        i += 1
    return i


def _classify(short_text: str, long_text: str, messages: Sequence[Mapping[str, Any]]) -> str:  # noqa: ARG001
    """Why a shorter render is not a prefix of a longer one (best explanation)."""
    if REASONING in short_text and short_text.count(REASONING) > long_text.count(REASONING):
        return "thinking stripped from earlier turns"
    if SYSTEM in short_text and (SYSTEM not in long_text or short_text.find(SYSTEM) != long_text.find(SYSTEM)):
        return "system prompt moved"
    tools_text = PROBE_TOOLSET[0]["function"]["description"]
    if tools_text in short_text and short_text.find(tools_text) != long_text.find(tools_text):
        return "tool definitions moved"
    if ARG_VALUE in short_text and short_text.count(ARG_VALUE) > long_text.count(ARG_VALUE):
        return "tool calls of earlier turns dropped"
    if "<think>" in short_text and short_text.count("<think>") > long_text.count("<think>"):
        return "empty thinking block rendered only when the assistant turn is last"
    return "earlier turns render differently when messages are appended"


def _counterexample(codec, messages, short_ids, long_ids, at: int, what: str) -> dict[str, Any]:
    lo = max(at - 8, 0)
    return {
        "check": what,
        "messages": [dict(m) for m in messages],
        "diverges_at_token": at,
        "prefix_render": codec.decode(short_ids[lo : at + 12]),
        "longer_render": codec.decode(long_ids[lo : at + 12]),
    }


class StabilityProber:
    """Runs the three append checks for one template (``tpl`` is a ChatTemplate)."""

    def __init__(self, tpl, tools: Sequence[Any] | None = None) -> None:
        self.tpl = tpl
        self.codec = tpl.codec
        self.tools = list(tools) if tools is not None else PROBE_TOOLSET
        self.stops = tpl.stop_token_ids

    def _ids(self, messages, gen: bool) -> tuple[str, list[int]]:
        text = self.tpl.renderer.text(messages, tools=self.tools, add_generation_prompt=gen)
        return text, self.codec.encode(text)

    def _assistant_span(self, history, assistant) -> list[int] | None:
        """The assistant turn as the template renders it when last, through its first stop token."""
        _, prompt = self._ids(history, True)
        _, alone = self._ids(list(history) + [assistant], False)
        start = _divergence(prompt, alone)
        for t in range(max(start, len(prompt)), len(alone)):
            if alone[t] in self.stops:
                return alone[len(prompt) : t + 1] if start == len(prompt) else None
        return None

    def run(self, max_calls: int) -> StabilityResult:
        result = StabilityResult()
        result.date_injected = self._date_injected()
        checks = {name: Check(ok=True) for name in ("tool_append", "assistant_kept", "user_append")}
        for case in conversations(max(max_calls, 1)):
            history, assistant, results = case["history"], case["assistant"], case["results"]
            try:
                self._one(case, history, assistant, results, checks, result)
            except TmplError:
                continue  # the template refuses this shape (e.g. reasoning + content): not a stability question
        result.checks = checks
        return result

    def _one(self, case, history, assistant, results, checks, result) -> None:
        p_text, prompt = self._ids(history, True)
        f_text, full = self._ids(list(history) + [assistant] + list(results), True)
        if case["reasoning"] and REASONING in f_text:
            result.reasoning_rendered = True
        c = checks["tool_append"]
        c.cases += 1
        at = _divergence(prompt, full)
        if c.ok and at < len(prompt):
            c.ok = False
            c.reason = _classify(p_text, f_text, history)
            c.counterexample = _counterexample(
                self.codec, list(history) + [assistant] + list(results), prompt, full, at, "tool_append"
            )
        span = self._assistant_span(history, assistant)
        c = checks["assistant_kept"]
        c.cases += 1
        if c.ok and at == len(prompt) and span is not None and full[len(prompt) : len(prompt) + len(span)] != span:
            a_text, alone = self._ids(list(history) + [assistant], False)
            c.ok = False
            c.reason = _classify(a_text, f_text, [assistant])
            at2 = len(prompt) + _divergence(span, full[len(prompt) :])
            c.counterexample = _counterexample(
                self.codec, list(history) + [assistant] + list(results), alone, full, at2, "assistant_kept"
            )
        # a new user turn after a plain reply (with reasoning where the template renders it)
        reply = {"role": "assistant", "content": "Here is the answer."}
        if case["reasoning"]:
            reply["reasoning_content"] = f"{REASONING} reply"
        span = self._assistant_span(history, reply)
        c = checks["user_append"]
        c.cases += 1
        if span is None or not c.ok:
            return
        u_text, longer = self._ids(list(history) + [reply, {"role": "user", "content": "TmPlFoLlOwUp?"}], True)
        sequence = prompt + span
        at = _divergence(sequence, longer)
        if at < len(sequence):
            c.ok = False
            c.reason = _classify(self.codec.decode(sequence), u_text, history)
            c.counterexample = _counterexample(self.codec, list(history) + [reply], sequence, longer, at, "user_append")

    def _date_injected(self) -> bool:
        messages = [{"role": "user", "content": "What day is it?"}]
        try:
            with frozen_date(2024, 1, 2):
                a = self.tpl.renderer.text(messages, tools=self.tools, add_generation_prompt=True)
            with frozen_date(2031, 7, 19):
                b = self.tpl.renderer.text(messages, tools=self.tools, add_generation_prompt=True)
        except TmplError:
            return False
        return a != b
