"""The conversations the fixer renders: the one place that generates them.

The rewrite is decided on :func:`watch_chains`; the proof renders :func:`proof_chains` and
:func:`proof_tool_rounds`. All three come from :func:`~tmpl.report.stability.conversations`
(seeded, so every call gives the same conversations); the date probe is a fixed one-message
conversation rendered on two frozen days (:func:`renders_on`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ...chat_template import ChatTemplate
from ...errors import TmplError
from ..stability import PROBE_TOOLSET, REASONING, conversations, frozen_date

#: probe conversations watched to decide the edits; the proof renders all of them (6) and the report its own
WATCH_CASES = 4
#: the two days a date probe renders on
DAYS = ((2024, 1, 2), (2031, 7, 19))

#: a conversation as it grows: each render's messages and its ``add_generation_prompt``
Chain = list[tuple[list[dict[str, Any]], bool]]


def watch_chains(max_calls: int) -> Iterator[tuple[Chain, dict[int, int]]]:
    """The growing conversations the rewrite watches its atoms on (and scores its edits with)."""
    return _growth_chains(max_calls, n=WATCH_CASES)


def proof_chains(max_calls: int) -> Iterator[tuple[Chain, dict[int, int]]]:
    """The growing conversations the proof compares the fixed template's newest turn on."""
    return _growth_chains(max_calls)


def proof_tool_rounds(max_calls: int) -> list[dict[str, Any]]:
    """The tool rounds (``history``, ``assistant``, ``results``) the proof checks suffixes on."""
    return conversations(max(max_calls, 1))


def alias_reasoning(msg: dict[str, Any]) -> dict[str, Any]:
    """What transformers shows templates: reasoning also under ``thinking`` and ``reasoning_content``."""
    if msg.get("reasoning_content") is not None:
        return {"thinking": msg["reasoning_content"], **msg}
    return msg


def units(messages: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """How a conversation grows: a system message with the next one, tool results of a round together,
    every other message alone."""
    out: list[list[dict[str, Any]]] = []
    pending: list[dict[str, Any]] = []
    for m in messages:
        if m.get("role") == "tool" and out and out[-1][-1].get("role") == "tool" and not pending:
            out[-1].append(m)
        elif m.get("role") in ("system", "developer") and not out:
            pending.append(m)
        else:
            out.append(pending + [m])
            pending = []
    return out + ([pending] if pending else [])


def _growth_chains(max_calls: int, n: int = 6) -> Iterator[tuple[Chain, dict[int, int]]]:
    """Conversations as they grow unit by unit: the renders, and for each message (by id) the
    index of the render in which it is last."""
    for case in conversations(max(max_calls, 1), n=n):
        history = [alias_reasoning(m) for m in case["history"]]
        a = alias_reasoning(case["assistant"])
        reply = alias_reasoning(
            {"role": "assistant", "content": "Here is the answer."}
            | ({"reasoning_content": f"{REASONING} reply"} if case["reasoning"] else {})
        )
        follow = {"role": "user", "content": "TmPlFoLlOwUp?"}
        final = {"role": "assistant", "content": "TmPlFiNaL answer."}
        for conversation in (history + [a] + list(case["results"]) + [final], history + [reply, follow]):
            chain: Chain = []
            home: dict[int, int] = {}
            so_far: list[dict[str, Any]] = []
            for unit in units(conversation):
                so_far = so_far + unit
                for m in unit:
                    home[id(m)] = len(chain)
                chain.append((so_far, unit[-1].get("role") != "assistant"))
            yield chain, home


def renders_on(tpl: ChatTemplate, day: tuple[int, int, int], **kwargs: Any) -> str | None:
    """The date probe: one user question with the generation prompt, rendered on ``day`` (None: it raises)."""
    messages = [{"role": "user", "content": "What day is it?"}]
    try:
        with frozen_date(*day):
            return tpl.renderer.text(messages, tools=PROBE_TOOLSET, add_generation_prompt=True, **kwargs)
    except TmplError:
        return None
