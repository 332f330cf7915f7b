"""Drift explained: where and why re-rendering a sample's text would change its token IDs.

A rollout keeps the IDs the model generated. A trainer that decodes them to messages and
re-renders them with the chat template gets other IDs when the template or the tokenizer does
not round-trip; :func:`explain_drift` finds the first differing token span, decodes it on both
sides and names a cause from a fixed set (:class:`DriftCause`).

>>> d = explain_drift(tpl, ours_ids, rendered_ids)          # doctest: +SKIP
>>> d.cause.value, d.ours, d.rendered                        # doctest: +SKIP
('reasoning_stripped', '<think>\\nLet me add.\\n</think>\\n\\n', '')
"""

from __future__ import annotations

import difflib
import enum
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from .. import _compat

#: default share of samples whose drift a rollout measures (one render + tokenization each)
DRIFT_FRACTION = 0.0625
#: tokens of context decoded around a span when deciding its cause
_CONTEXT = 64
#: tokens compared after the first difference to find where the two sides agree again
_WINDOW = 256

_REASONING_MARKERS = (
    "<think>",
    "</think>",
    "<|channel|>analysis",
    "<|start_thinking|>",
    "<|channel>thought",
    "[THINK]",
    "<reasoning>",
)
_DATE = re.compile(
    r"\b(\d{4}-\d{2}-\d{2}|\d{1,2} (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* \d{4}|"
    r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* \d{1,2},? \d{4})\b"
)


class DriftCause(str, enum.Enum):
    """Why re-rendering a sample would change its IDs (``RolloutResult.drift_detail.cause``)."""

    #: the same text, tokenized differently: a BPE merge across a turn or segment boundary
    BPE_MERGE = "bpe_merge"
    #: the template drops reasoning (``<think>``, an analysis channel) of earlier turns
    REASONING_STRIPPED = "reasoning_stripped"
    #: tool-call arguments re-serialized (key order, spacing, quoting) by the template
    JSON_RESERIALIZED = "json_reserialized"
    #: the same text up to whitespace (stripped or normalized by the template)
    WHITESPACE = "whitespace"
    #: a different end-of-turn token (``<|return|>`` / ``<|end|>``, a dropped stop token)
    TURN_CLOSE = "turn_close"
    #: a date or other value the template computes at render time
    RENDER_TIME_VALUE = "render_time_value"
    #: none of the above
    OTHER = "other"


@dataclass(frozen=True)
class DriftDetail:
    """The first place where re-rendering differs: token position, both spans decoded, the cause.

    ``position`` indexes prompt + completion IDs; ``ours`` / ``rendered`` are the decoded
    differing spans (the sample's own, the re-render's).
    """

    cause: DriftCause
    position: int
    ours: str
    rendered: str

    def to_dict(self) -> dict[str, Any]:
        return {"cause": self.cause.value, "position": self.position, "ours": self.ours, "rendered": self.rendered}

    @classmethod
    def from_dict(cls, data: Any) -> DriftDetail | None:
        if not data:
            return None
        return cls(DriftCause(data["cause"]), int(data["position"]), data["ours"], data["rendered"])


def first_difference(ours: list[int], rendered: list[int]) -> int | None:
    """Index of the first token where ``rendered`` does not continue ``ours`` (None: no drift).

    The re-render may go on after the sample's IDs (a generation prompt): only ``ours``' length
    is compared; a re-render that ends early differs at its end.
    """
    n = min(len(ours), len(rendered))
    k = _compat.ids.common_prefix_len(ours, rendered)
    if k < n:
        return k
    return None if len(rendered) >= len(ours) else n


def explain_drift(tpl: Any, ours: list[int], rendered: list[int]) -> DriftDetail | None:
    """Where and why ``rendered`` (the IDs of a re-render) differs from ``ours``; None if it does not.

    >>> explain_drift(tpl, [1, 2, 3], [1, 2, 3, 4]) is None     # doctest: +SKIP
    True
    """
    p = first_difference(ours, rendered)
    if p is None:
        return None
    a, b = ours[p : p + _WINDOW], rendered[p : p + _WINDOW]
    match = next(
        (
            m
            for m in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks()
            if m.size >= 3 or m.size == 0
        ),
        None,
    )
    i, j = (match.a, match.b) if match is not None and match.size else (len(a), len(b))
    decode = tpl.codec.decode
    span_a, span_b = a[:i], b[:j]
    ours_text, rendered_text = decode(span_a), decode(span_b)
    start = max(0, p - _CONTEXT)
    before = decode(ours[start:p])
    objects = _same_json(
        before,
        ours_text,
        decode(ours[p + i : p + i + _CONTEXT]),
        rendered_text,
        decode(rendered[p + j : p + j + _CONTEXT]),
    )
    if objects is not None:  # show the whole object on both sides: a reordered key alone says little
        return DriftDetail(DriftCause.JSON_RESERIALIZED, p, *objects)
    cause = _cause(tpl, span_a, span_b, ours_text, rendered_text, before)
    return DriftDetail(cause, p, ours_text, rendered_text)


def _in_date(before: str, text: str) -> bool:
    """Whether ``text`` (a differing span) is part of a date: a date match that overlaps it, read with
    the text before it (two dates of the same day differ only after the day: ``26 Jul 2024`` vs
    ``26 Nov 2026``)."""
    tail = before[-12:]
    return any(m.end() > len(tail) and m.start() < len(tail) + len(text) for m in _DATE.finditer(tail + text))


def _cause(tpl: Any, span_a: list[int], span_b: list[int], a: str, b: str, before: str = "") -> DriftCause:
    stops = tpl.stop_token_ids
    if {t for t in span_a if t in stops} != {t for t in span_b if t in stops}:
        return DriftCause.TURN_CLOSE
    if any(m in a and m not in b for m in _REASONING_MARKERS):
        return DriftCause.REASONING_STRIPPED
    if a == b:
        return DriftCause.BPE_MERGE
    if _in_date(before, a) or _in_date(before, b):
        return DriftCause.RENDER_TIME_VALUE
    if "".join(a.split()) == "".join(b.split()):
        return DriftCause.WHITESPACE
    return DriftCause.OTHER


def _same_json(before: str, ours: str, ours_after: str, rendered: str, rendered_after: str) -> tuple[str, str] | None:
    """Both texts of the JSON value that encloses the difference, when it is the same value written differently."""
    a = _enclosing_json(before + ours + ours_after, len(before))
    b = _enclosing_json(before + rendered + rendered_after, len(before))
    if a is not None and b is not None and a[0] == b[0] and a[1] != b[1]:
        return a[1], b[1]
    return None


def _enclosing_json(text: str, offset: int) -> tuple[Any, str] | None:
    """The outermost JSON object of ``text`` that starts before ``offset`` and ends after it."""
    decoder = json.JSONDecoder()
    k = text.find("{")
    while 0 <= k <= offset:
        try:
            value, end = decoder.raw_decode(text, k)
        except ValueError:
            k = text.find("{", k + 1)
            continue
        if end > offset:
            return value, text[k:end]
        k = text.find("{", end)
    return None


def rerender_drift(
    tpl: Any, messages: list[dict[str, Any]], ids: list[int], tools: Any = None
) -> tuple[bool | None, DriftDetail | None]:
    """Re-render ``messages`` with the template and explain how the result differs from ``ids``.

    Returns ``(drift, detail)``: ``(None, None)`` when the template cannot render the messages.

    >>> drift, detail = rerender_drift(tpl, r.messages, r.prompt_ids.tolist() + r.completion_ids.tolist(),
    ...                                tools=schemas)           # doctest: +SKIP
    """
    from ..errors import TmplError

    try:
        gen = messages[-1]["role"] != "assistant"
        text = tpl.renderer.text(messages, tools=tools, add_generation_prompt=gen)
    except TmplError:
        return None, None
    detail = explain_drift(tpl, ids, tpl.codec.encode_reference(text))  # the tokenizer's own IDs
    return detail is not None, detail


def chosen(fraction: float | bool, index: int, sample: int) -> bool:
    """Whether the sample (conversation ``index``, sample ``sample``) is measured at ``fraction``.

    Deterministic (a hash of both numbers): the same samples are chosen in every run.

    >>> chosen(True, 3, 0), chosen(False, 3, 0), chosen(1.0, 3, 0)
    (True, False, True)
    >>> sum(chosen(0.25, i, 0) for i in range(4000)) / 4000    # doctest: +ELLIPSIS
    0.2...
    """
    if fraction is True:
        return True
    if not fraction:
        return False
    digest = hashlib.blake2b(f"{index}:{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < float(fraction)


def check_fraction(value: Any) -> float | bool:
    """Validate ``measure_drift``: True, False/0, or a fraction in (0, 1]."""
    if isinstance(value, bool):
        return value
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"measure_drift must be True, False or a fraction in (0, 1], got {value!r}") from None
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"measure_drift must be True, False or a fraction in (0, 1], got {value!r}")
    return f
