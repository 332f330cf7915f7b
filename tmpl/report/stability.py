"""The probe's fixed vocabulary for reports and rewrites: tools, sentinels, the fixed probe
conversations (:func:`conversations`, used by :mod:`tmpl.report.fix` to decide and prove its
edits), a frozen date for ``strftime_now``, and :class:`Check`, one check's outcome.

Verdicts are decided by the search over the probe space (:mod:`tmpl.report.search`), which
plays generated conversations through token-in/token-out and checks every append against a
full render. Date injection (``strftime_now``) is detected separately by rendering on two
different dates (:func:`date_injected`).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import TmplError
from ..sentinels import ARG_VALUE, CONTENT_POOL, PROBE_TOOLSET, REASONING, SYSTEM


@dataclass
class Check:
    """Outcome of one stability check over the randomized conversations."""

    ok: bool
    cases: int = 0
    reason: str = ""
    counterexample: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "cases": self.cases, "reason": self.reason, "counterexample": self.counterexample}


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


def date_injected(tpl) -> bool:
    """Whether ``tpl`` renders today's date (``strftime_now``): a prompt rendered on two dates differs."""
    messages = [{"role": "user", "content": "What day is it?"}]
    try:
        with frozen_date(2024, 1, 2):
            a = tpl.renderer.text(messages, tools=PROBE_TOOLSET, add_generation_prompt=True)
        with frozen_date(2031, 7, 19):
            b = tpl.renderer.text(messages, tools=PROBE_TOOLSET, add_generation_prompt=True)
    except TmplError:
        return False
    return bool(a != b)


__all__ = [
    "ARG_VALUE",
    "CONTENT_POOL",
    "PROBE_TOOLSET",
    "REASONING",
    "SYSTEM",
    "Check",
    "conversations",
    "date_injected",
    "frozen_date",
]
