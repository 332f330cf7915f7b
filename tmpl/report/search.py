"""Search the probe space for a conversation that breaks token-in/token-out, and shrink it.

One case (:func:`run_case`) plays a conversation through the way a rollout builds it: the
prompt before the first assistant turn is the template's render with the generation prompt;
each assistant turn adds what the model generated (its render when last, after the prompt,
through the first stop token); each append (tool results, the final answer, a new user turn)
adds the template's suffix. Every step is checked against a full render through
``apply_chat_template``: the token stream built so far must be a prefix of the render of the
longer conversation, and the generation prompt a prefix of the turn's own render. The first
step that fails is the counterexample.

A case ends in one of four ways: ``ok`` (every step checked), ``broken`` (a step fails: which
use it breaks, why, where), ``refused`` (the template raises on this shape: listed, never
counted as a pass) or ``unproven`` (a step could not be checked: the turn's render has no stop
token). :func:`search` runs the seeded specs of :mod:`tmpl.report.space` and shrinks the first
failure of each use, and the first refusal of each kind, to a minimal spec.

>>> result = search(tpl, space_for(tpl), n=24, seed=0)    # doctest: +SKIP
>>> result.failures["tool_loop"].counterexample["messages"]  # doctest: +SKIP
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import _compat
from ..errors import TmplError
from .space import (
    CALL_CONTENTS,
    SPACE_TOOLS,
    Space,
    Spec,
    describe,
    generate,
    messages_of,
    size,
    smaller,
    turn_shape,
)

#: checks by use: the tool loop (appends within one user turn) and several user turns
USES = {"tool_loop": ("tool_append", "assistant_kept"), "multi_user": ("user_append",)}
PREFILL = "the generation prompt prefills text the turn's own render leaves out"
GENERIC = "earlier turns render differently when messages are appended"
EMPTY_THINK = "empty thinking block rendered only when the assistant turn is last"
BPE_MERGE = "the text is a prefix but its tokens are not (a BPE merge across the boundary)"
#: at most this many simulations while shrinking one failure
SHRINK_STEPS = 60
#: kinds of refusal shrunk to a minimal shape (the rest are listed with their first spec)
SHRUNK_REFUSALS = 3


@dataclass
class Failure:
    """A step that fails: the use it breaks, the check, why, and the counterexample (JSON-able)."""

    use: str
    check: str
    reason: str
    counterexample: dict[str, Any]


@dataclass
class CaseResult:
    """What one conversation showed (see the module docstring)."""

    status: str
    steps: dict[str, int] = field(default_factory=dict)
    failure: Failure | None = None
    detail: str = ""
    #: whether a render showed the reasoning of an assistant turn
    reasoning_rendered: bool = False
    #: the first failure of each use
    failures: dict[str, Failure] = field(default_factory=dict)


@dataclass
class Refusal:
    """A shape the template refuses (raises on), with the smallest conversation found that shows it."""

    error: str
    shape: list[str]
    messages: list[dict[str, Any]]
    kwargs: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.error, "shape": self.shape, "messages": self.messages, "kwargs": self.kwargs}


@dataclass
class SearchResult:
    """Everything a search found: per use the failure (or None), steps checked, cases and coverage."""

    cases: int = 0
    checked_cases: int = 0
    steps: dict[str, int] = field(default_factory=lambda: {c: 0 for cs in USES.values() for c in cs})
    failures: dict[str, Failure] = field(default_factory=dict)
    refusals: list[Refusal] = field(default_factory=list)
    unproven: list[str] = field(default_factory=list)
    shapes: list[str] = field(default_factory=list)
    reasoning_rendered: bool = False
    seconds: float = 0.0


def _divergence(a: Sequence[int], b: Sequence[int]) -> int:
    return int(_compat.ids.common_prefix_len(list(a), list(b)))


class _Case:
    """One conversation played through (renders cached by (messages upto, generation prompt))."""

    def __init__(self, tpl: Any, spec: Spec, space: Space) -> None:
        self.tpl = tpl
        self.spec = spec
        self.msgs = messages_of(spec, space)
        self.kwargs = dict(spec.kwargs)
        self.stops = tpl.stop_token_ids
        self.renders: dict[tuple[int, bool], tuple[str, list[int]]] = {}

    def render(self, upto: int, gen: bool) -> tuple[str, list[int]]:
        key = (upto, gen)
        if key not in self.renders:
            text = self.tpl.renderer.text(self.msgs[:upto], tools=SPACE_TOOLS, add_generation_prompt=gen, **self.kwargs)
            self.renders[key] = (text, self.tpl.codec.encode_reference(text))
        return self.renders[key]

    def run(self) -> CaseResult:
        try:
            out = self._run()
        except TmplError as exc:
            return CaseResult("refused", detail=_first_line(str(exc)))
        out.reasoning_rendered = any("TmPlReAsOnInG" in text for text, _ in self.renders.values())
        return out

    def _run(self) -> CaseResult:
        """Play the conversation through; after a failing step the stream restarts from the template's
        render, so one conversation can show a failure of each use."""
        steps = {c: 0 for cs in USES.values() for c in cs}
        failures: dict[str, Failure] = {}

        def found(f: Failure | None) -> bool:
            if f is not None:
                failures.setdefault(f.use, f)
            return f is not None

        assistants = [i for i, m in enumerate(self.msgs) if m["role"] == "assistant"]
        stream: list[int] | None = None
        spans: list[tuple[int, int, int]] = []  # (start, end, message index) of each completion in the stream
        prev = -1
        for i in assistants:
            _, prompt = self.render(i, True)
            if stream is not None:
                found(self._compare(stream, prompt, spans, prev, (i, True), steps))
            _, own = self.render(i + 1, False)
            at = _divergence(prompt, own)
            if at < len(prompt):
                found(self._own_failure(prompt, own, at, spans, i))
                stream, spans = None, []
                continue
            stop = next((t for t in range(len(prompt), len(own)) if own[t] in self.stops), None)
            if stop is None:  # the failures found before this turn still count
                return CaseResult(
                    "unproven",
                    steps,
                    next(iter(failures.values()), None),
                    detail=f"assistant message {i} renders no stop token when last (the model's turn has no end)",
                    failures=failures,
                )
            spans = [s for s in spans if s[1] <= len(prompt)] + [(len(prompt), stop + 1, i)]
            stream, prev = own[: stop + 1], i
        if stream is not None and prev < len(self.msgs) - 1:
            _, longer = self.render(len(self.msgs), True)
            found(self._compare(stream, longer, spans, prev, (len(self.msgs), True), steps))
        if failures:
            return CaseResult("broken", steps, next(iter(failures.values())), failures=failures)
        return CaseResult("ok", steps)

    # -- failures -----------------------------------------------------------------------------

    def _use(self, start: int, end: int) -> str:
        return "multi_user" if any(m["role"] == "user" for m in self.msgs[start:end]) else "tool_loop"

    def _compare(
        self,
        stream: list[int],
        longer: list[int],
        spans: list[tuple[int, int, int]],
        prev: int,
        longer_key: tuple[int, bool],
        steps: dict[str, int],
    ) -> Failure | None:
        """The stream (through assistant ``prev``'s completion) must be a prefix of ``longer``."""
        use = self._use(prev + 1, longer_key[0])
        for check in USES[use]:
            steps[check] += 1
        at = _divergence(stream, longer)
        if at == len(stream):
            return None
        inside = next((s for s in spans if s[0] <= at < s[1]), None)
        check = "user_append" if use == "multi_user" else ("assistant_kept" if inside else "tool_append")
        return self._failure(use, check, stream, (prev, True), longer, longer_key, at, inside)

    def _own_failure(
        self, prompt: list[int], own: list[int], at: int, spans: list[tuple[int, int, int]], i: int
    ) -> Failure:
        """The generation prompt before assistant ``i`` is not a prefix of the turn's own render."""
        inside = next((s for s in spans if s[0] <= at < s[1]), None)
        if inside is not None:  # an earlier turn renders differently once this one follows it
            use = self._use(inside[2] + 1, i + 1)
            check = "user_append" if use == "multi_user" else "assistant_kept"
        else:
            m = self.msgs[i]
            use = "tool_loop" if m.get("tool_calls") or self.msgs[i - 1]["role"] == "tool" else "multi_user"
            check = "user_append" if use == "multi_user" else "tool_append"
        fail = self._failure(use, check, prompt, (i, False), own, (i + 1, False), at, inside)
        if inside is None and at >= len(prompt) - 8 and fail.reason in (GENERIC, EMPTY_THINK):
            fail.reason = fail.counterexample["reason"] = PREFILL
        return fail

    def _failure(
        self,
        use: str,
        check: str,
        short: list[int],
        short_key: tuple[int, bool],
        long: list[int],
        long_key: tuple[int, bool],
        at: int,
        inside: tuple[int, int, int] | None,
    ) -> Failure:
        codec = self.tpl.codec
        short_text, long_text = codec.decode(short), codec.decode(long)
        reason = classify(short_text, long_text, at, inside)
        upto, completion = short_key
        ce = {
            "check": check,
            "use": use,
            "reason": reason,
            "messages": self.msgs[: long_key[0]],
            "kwargs": self.kwargs,
            "stream": {"prompt_messages": upto, "completion_of": upto if completion else None},
            "longer": {"messages": long_key[0], "add_generation_prompt": long_key[1]},
            "diverges_at_token": at,
            **around(codec.decode(short[:at]), short_text, long_text),
        }
        return Failure(use, check, reason, ce)


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= 300 else line[:299] + "…"


def around(before: str, short_text: str, long_text: str, width: int = 80) -> dict[str, str]:
    """Both renders around their first difference (``width`` characters of context each side)."""
    at = len(before)
    while at > 0 and short_text[:at] != long_text[:at]:
        at -= 1
    lo = max(at - width, 0)
    return {
        "stream_render": short_text[lo : at + width],
        "longer_render": long_text[lo : at + width],
        "diverges_at_char": str(at),
    }


def classify(short: str, long: str, at: int, inside: tuple[int, int, int] | None) -> str:
    """Why the token-in/token-out stream is not a prefix of the longer render (best explanation)."""

    def dropped(marker: str) -> bool:
        return short.count(marker) > long.count(marker)

    if dropped("TmPlReAsOnInG"):
        return "thinking stripped from earlier turns"
    if "TmPlSyStEm" in short and short.find("TmPlSyStEm") != long.find("TmPlSyStEm"):
        return "system prompt moved"
    if "Current weather in a city." in short and short.find("Current weather") != long.find("Current weather"):
        return "tool definitions moved"
    if dropped("TmPlCoNtEnT") or short.find("TmPlCoNtEnT") not in (-1, long.find("TmPlCoNtEnT")):
        return "the content of a tool-call turn is dropped or moved once later messages follow"
    if dropped("TmPlArG"):
        return "tool calls of earlier turns dropped"
    if dropped("<think>") or dropped("</think>"):
        return EMPTY_THINK
    if inside is not None and at == inside[1] - 1:
        return "the turn's closing token changes once messages follow it"
    if long.startswith(short):
        return BPE_MERGE
    return GENERIC


# -- the space one template gets -----------------------------------------------------------------


def _renders(tpl: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str | None:
    try:
        return str(tpl.renderer.text(messages, tools=SPACE_TOOLS, add_generation_prompt=True, **kwargs))
    except TmplError:
        return None


@dataclass
class Probed:
    """The space for one template, and the shapes it refuses or does not render, in words."""

    space: Space
    refused: list[Refusal]
    call_content_note: str


def _error(tpl: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str | None:
    """The first line of the template's error on ``messages`` (None when it renders)."""
    try:
        tpl.renderer.text(messages, tools=SPACE_TOOLS, add_generation_prompt=True, **kwargs)
    except TmplError as exc:
        return _first_line(str(exc))
    return None


_THINK_CLOSE = re.compile(r"</\w*(think|thought|reason)\w*>\s*$", re.IGNORECASE)
_THINK_OPEN = re.compile(r"<\w*(think|thought|reason)\w*>\s*$", re.IGNORECASE)


def _thinking_mode(prompt: str | None) -> str:
    """How a generation prompt leaves thinking: "closed" (an empty block prefilled: the model writes no
    reasoning), "open" (a block opened: the model must write reasoning) or "" (free)."""
    if prompt is None:
        return ""
    if _THINK_CLOSE.search(prompt):
        return "closed"
    return "open" if _THINK_OPEN.search(prompt) else ""


def space_for(tpl: Any, max_calls: int = 3) -> Probed:
    """Probe which message shapes ``tpl`` renders calls with, what it reads and which kwargs matter."""
    from .reads import template_reads
    from .space import Call, Exchange, Turn

    reads = template_reads(tpl.template)
    refused: list[Refusal] = []

    def one_round(turn: Turn) -> Spec:
        return Spec((Exchange((turn,), Turn()),))

    contents = []
    for content in CALL_CONTENTS:
        spec = one_round(Turn((Call(0),), content))
        msgs = messages_of(spec)[:-1]
        text = _renders(tpl, msgs)
        err = _error(tpl, msgs) if text is None else (None if "TmPlArG" in text else "the tool calls are not rendered")
        if err is None:
            contents.append(content)
        else:
            refused.append(Refusal(err, [turn_shape(spec.exchanges[0].rounds[0])], msgs, {}))
    content = contents[0] if contents else "text"
    calls = 1
    for k in range(2, max_calls + 1):
        spec = one_round(Turn(tuple(Call(i % 2) for i in range(k)), content))
        err = _error(tpl, messages_of(spec)[:-1])
        if err is not None:
            refused.append(Refusal(err, [turn_shape(spec.exchanges[0].rounds[0])], messages_of(spec)[:-1], {}))
            break
        calls = k
    field = reads.reasoning_fields[0] if reads.reasoning_fields else None
    base = messages_of(one_round(Turn((Call(0),), content, field)))
    plain = _renders(tpl, base)
    header = _renders(tpl, base[:1])
    kwargs: dict[str, tuple[Any, ...]] = {}
    thinking_off: list[tuple[str, Any]] = []
    for name, values in reads.kwargs.items():
        if name in tpl.template_kwargs:
            continue
        changed = tuple(v for v in values if (r := _renders(tpl, base, **{name: v})) is not None and r != plain)
        if changed:
            kwargs[name] = changed
        for v in changed:
            if _thinking_mode(_renders(tpl, base[:1], **{name: v})) == "closed":
                thinking_off.append((name, v))
    note = (
        "tool-call turns render their calls with content " + ", ".join(_CONTENT_WORDS[c] for c in contents)
        if contents
        else "no content shape renders the tool calls"
    )
    errors = {r.shape[0]: r.error for r in refused}
    none, absent = errors.get(turn_shape(Turn((Call(0),), "none"))), errors.get(turn_shape(Turn((Call(0),), "absent")))
    if none is not None and none == absent:
        note += (
            " (content None fails exactly as a missing content key: transformers drops `content: None` before "
            "rendering, so a template that renders calls only for None never sees it)"
        )
    space = Space(
        reasoning_fields=reads.reasoning_fields,
        call_contents=tuple(contents) or ("text",),
        kwargs=kwargs,
        max_calls=calls,
        thinking_off=tuple(thinking_off),
        thinking_closed=_thinking_mode(header) == "closed",
    )
    return Probed(space, refused, note)


_CONTENT_WORDS = {"text": "text", "none": "None", "empty": '""', "absent": "absent (no key)"}


# -- the search ------------------------------------------------------------------------------------


def run_case(tpl: Any, spec: Spec, space: Space) -> CaseResult:
    """Play one conversation through (see the module docstring)."""
    return _Case(tpl, spec, space).run()


def shrink(spec: Spec, space: Space, still: Callable[[Spec], bool], steps: int = SHRINK_STEPS) -> Spec:
    """A smaller spec for which ``still`` holds (greedy: the first smaller one that does, repeated)."""
    budget = steps
    improved = True
    while improved and budget > 0:
        improved = False
        for candidate in smaller(spec, space):
            if size(candidate) >= size(spec):
                continue
            budget -= 1
            if still(candidate):
                spec, improved = candidate, True
                break
            if budget <= 0:
                break
    return spec


def search(tpl: Any, probed: Probed, *, n: int = 24, seed: int = 0) -> SearchResult:
    """Run ``n`` seeded cases of ``probed.space`` on ``tpl``; shrink the first failure of each use."""
    start = time.perf_counter()
    space = probed.space
    result = SearchResult(refusals=list(probed.refused))
    specs = generate(space, seed=seed, n=n)
    broken: dict[str, Spec] = {}
    refused: dict[str, Spec] = {}
    checked: list[Spec] = []
    for spec in specs:
        r = run_case(tpl, spec, space)
        result.cases += 1
        result.reasoning_rendered |= r.reasoning_rendered
        for k, v in r.steps.items():
            result.steps[k] += v
        if r.status == "ok":
            checked.append(spec)
        elif r.status == "broken":
            for use in r.failures:
                broken.setdefault(use, spec)
            checked.append(spec)
        elif r.status == "refused":
            refused.setdefault(r.detail, spec)
        elif r.status == "unproven":
            for use in r.failures:  # a failure before the step that could not be checked
                broken.setdefault(use, spec)
            if r.detail not in result.unproven:
                result.unproven.append(r.detail)
    result.checked_cases = len(checked)
    result.shapes = describe(checked)
    for use, spec in broken.items():

        def still(s: Spec, use: str = use) -> bool:
            return use in run_case(tpl, s, space).failures

        small = shrink(spec, space, still)
        result.failures[use] = run_case(tpl, small, space).failures[use]
    for n_kind, (error, spec) in enumerate(refused.items()):
        if n_kind < SHRUNK_REFUSALS:

            def same(s: Spec, error: str = error) -> bool:
                r = run_case(tpl, s, space)
                return r.status == "refused" and r.detail == error

            spec = shrink(spec, space, same, steps=SHRINK_STEPS // 2)
        result.refusals.append(Refusal(error, spec.features(), messages_of(spec), dict(spec.kwargs)))
    result.seconds = time.perf_counter() - start
    return result


def counterexample_text(ce: dict[str, Any]) -> str:
    """A counterexample as the CLI prints it: the messages (JSON), kwargs, both renders at the difference."""
    stream = ce["stream"]
    what = (
        f"the prompt before message {stream['prompt_messages']} plus that turn as generated"
        if stream["completion_of"] is not None
        else f"the generation prompt after the first {stream['prompt_messages']} message(s)"
    )
    longer = ce["longer"]
    lines = [
        f"counterexample ({ce['check']}: {ce['reason']}):",
        "messages = [",
        *(f"  {json.dumps(m, ensure_ascii=False)}," for m in ce["messages"]),
        "]",
    ]
    if ce.get("kwargs"):
        lines.append("template kwargs = " + json.dumps(ce["kwargs"], ensure_ascii=False))
    lines += [
        f"token-in/token-out ({what}), from the first difference's context:",
        "  " + json.dumps(ce["stream_render"], ensure_ascii=False),
        f"the template's render of the first {longer['messages']} messages"
        f" (add_generation_prompt={longer['add_generation_prompt']}):",
        "  " + json.dumps(ce["longer_render"], ensure_ascii=False),
        f"first difference at token {ce['diverges_at_token']}",
    ]
    return "\n".join(lines)


__all__ = [
    "USES",
    "CaseResult",
    "Failure",
    "Probed",
    "Refusal",
    "SearchResult",
    "counterexample_text",
    "run_case",
    "search",
    "shrink",
    "space_for",
]
