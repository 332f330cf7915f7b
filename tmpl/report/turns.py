"""Turns that are not tool results: can the template take a user, system or developer turn after an
assistant turn, as an environment or a simulated user appends one?

The search plays generated conversations (:mod:`tmpl.report.space`, seeded) in which an exchange after the
first opens with a ``user``, ``system`` or ``developer`` message, right after an assistant's answer or right
after the tool results of its calls, through :func:`tmpl.report.search.run_case` (token-in/token-out
against full renders). Each is compared with its *control*: the same conversation with that turn a plain
user turn after an answer (the shape the ``multi_user`` verdict covers). A role is

- ``UNSUPPORTED`` where the template raises on such a turn and not on the control, or renders the
  conversation without the turn's text (the environment's message would never reach the model);
- ``UNSAFE`` where it renders but the token-in/token-out stream breaks and the control's does not (or the
  control breaks too: then the reason is the control's, which ``tool_loop``/``multi_user`` already report);
- ``SAFE`` otherwise, with the appends checked.

The verdict ``env_turns`` judges ``user`` and ``system`` turns (what environments and simulated users
append); ``developer`` turns are reported per role (many templates render no developer role).

>>> found = search_turns(tpl, probed.space)           # doctest: +SKIP
>>> found.verdict().label, found.roles["developer"].label   # doctest: +SKIP
('SAFE', 'UNSUPPORTED (a developer turn after an answer is not rendered)')
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import TmplError
from .search import SHRINK_STEPS, CaseResult, _Case, shrink
from .space import SPACE_TOOLS, Exchange, Space, Spec, Turn, _turn, messages_of, with_reasoning
from .verdict import SAFE, UNSAFE, UNSUPPORTED, Verdict

#: roles an environment may append after an assistant turn besides tool results
ROLES = ("user", "system", "developer")
#: the roles whose verdicts make ``env_turns``
GATED = ("user", "system")
#: where the turn goes: after an assistant's answer, or after the tool results of its calls
AFTER = ("answer", "results")
#: conversations generated (at least one per role and place), and the most simulations shrinking one
CASES = 8
SHRINK = SHRINK_STEPS // 4


@dataclass
class TurnsResult:
    """What the search found: per role a verdict, its counterexample (JSON-able) and the cases run."""

    roles: dict[str, Verdict] = field(default_factory=dict)
    counterexamples: dict[str, dict[str, Any]] = field(default_factory=dict)
    cases: int = 0
    places: list[str] = field(default_factory=list)

    def verdict(self) -> Verdict:
        """``env_turns``: the worst of the gated roles (UNSUPPORTED, then UNSAFE), else SAFE."""
        for level in (UNSUPPORTED, UNSAFE):
            for role in GATED:
                v = self.roles.get(role)
                if v is not None and v.level == level:
                    return Verdict(level, v.reason)
        return Verdict(SAFE, cases=sum(self.roles[r].cases for r in GATED if r in self.roles))

    def to_dict(self) -> dict[str, Any]:
        return {
            "roles": {
                r: {"level": v.level, "reason": v.reason, "label": v.label, "cases": v.cases}
                for r, v in self.roles.items()
            },
            "counterexamples": self.counterexamples,
            "cases": self.cases,
            "places": self.places,
        }


def _place(spec: Spec) -> tuple[str, str, int] | None:
    """The (role, after, exchange index) of the first exchange opened after an assistant turn (None: the
    spec has one exchange, so it checks nothing of this)."""
    for e in range(1, len(spec.exchanges)):
        ex, before = spec.exchanges[e], spec.exchanges[e - 1]
        after = "results" if before.final is None else "answer"
        return ex.opener, after, e
    return None


def control(spec: Spec) -> Spec:
    """``spec`` with every such turn a plain user turn after an answer (the shape ``multi_user`` checks)."""
    exs = []
    for e, ex in enumerate(spec.exchanges):
        last = e == len(spec.exchanges) - 1
        exs.append(replace(ex, opener="user", final=ex.final if ex.final is not None or last else Turn()))
    return replace(spec, exchanges=tuple(exs))


def generate_turns(space: Space, *, calls: bool, seed: int = 0, n: int = CASES) -> list[Spec]:
    """``n`` conversations with a user/system/developer turn after an assistant turn (every role and place
    at least once; after tool results only when ``calls``: the template renders tool calls)."""
    rng = random.Random(seed)
    places = [(role, after) for role in ROLES for after in AFTER if calls or after == "answer"]
    out = []
    for i in range(max(n, len(places))):
        role, after = places[i] if i < len(places) else (rng.choice(ROLES), rng.choice(AFTER if calls else ("answer",)))
        rounds = (1,) if after == "results" else ((rng.choice((0, 1)),) if calls else (0,))
        first = Exchange(
            tuple(_turn(space, rng, True, {}) for _ in range(rounds[0])), None if after == "results" else Turn()
        )
        second_rounds = rng.choice((0, 1)) if calls else 0
        second = Exchange(tuple(_turn(space, rng, True, {}) for _ in range(second_rounds)), Turn(), opener=role)
        exchanges = [first, second]
        if rng.random() < 0.3:  # and a user turn after it
            exchanges.append(Exchange((), Turn()))
        if space.thinking({}) == "closed":
            exchanges = [with_reasoning(ex, None) for ex in exchanges]
        out.append(Spec(tuple(exchanges), system=rng.random() < 0.5))
    return out


class _Played:
    """Cases played once each (a spec and its control are often played several times)."""

    def __init__(self, tpl: Any, space: Space) -> None:
        self.tpl, self.space = tpl, space
        self.done: dict[Spec, tuple[CaseResult, str | None]] = {}

    def __call__(self, spec: Spec) -> tuple[CaseResult, str | None]:
        """The case's result, and the full render of its conversation (None when it raises)."""
        if spec not in self.done:
            case = _Case(self.tpl, spec, self.space)
            result = case.run()
            try:
                text: str | None = self.tpl.renderer.text(case.msgs, tools=SPACE_TOOLS, add_generation_prompt=True)
            except TmplError:
                text = None
            self.done[spec] = (result, text)
        return self.done[spec]


def _problem(played: _Played, spec: Spec) -> tuple[str, str, dict[str, Any]] | None:
    """``(level, reason, details)`` where ``spec``'s turn after an assistant turn fails and its control
    does not (a template error, a turn not rendered, a broken stream); None when it holds."""
    place = _place(spec)
    if place is None:
        return None
    role, after, e = place
    where = f"a {role} turn after {'tool results' if after == 'results' else 'an answer'}"
    result, text = played(spec)
    base, _ = played(control(spec))
    if result.status == "refused":
        if base.status == "refused":
            return None  # the template refuses the conversation whatever the turn is: not this check's
        return UNSUPPORTED, f"{where} raises: {result.detail}", {"error": result.detail}
    if text is not None:
        marker = f"TmPlUsEr{e}" if role == "user" else f"TmPlTuRn{e}"
        if marker not in text:
            return UNSUPPORTED, f"{where} is not rendered", {"render": text[-600:]}
    if result.failure is not None:
        failure = result.failure
        if base.failure is not None:  # not this turn's doing: tool_loop / multi_user report it
            reason = f"{failure.reason}, as without it: see tool_loop / multi_user"
            return UNSAFE, reason, {"failure": failure.counterexample, "shared": True}
        return UNSAFE, f"{where}: {failure.reason}", {"failure": failure.counterexample}
    return None


def search_turns(tpl: Any, space: Space, *, calls: bool = True, seed: int = 0, n: int = CASES) -> TurnsResult:
    """Play :func:`generate_turns` on ``tpl``; per role the first problem, shrunk to a small conversation."""
    played = _Played(tpl, space)
    out = TurnsResult()
    first: dict[str, Spec] = {}
    checked: dict[str, int] = {r: 0 for r in ROLES}
    places: dict[str, None] = {}
    for spec in generate_turns(space, calls=calls, seed=seed, n=n):
        out.cases += 1
        place = _place(spec)
        assert place is not None
        role, after, _ = place
        places[f"{role} after {'tool results' if after == 'results' else 'an answer'}"] = None
        problem = _problem(played, spec)
        if problem is not None:
            if role not in first or (problem[0] == UNSUPPORTED and _problem(played, first[role])[0] != UNSUPPORTED):  # type: ignore[index]
                first[role] = spec  # a refusal outranks a broken stream
        elif played(spec)[0].status == "ok":
            checked[role] += sum(played(spec)[0].steps.values())
    out.places = list(places)
    for role in ROLES:
        if role not in first:
            out.roles[role] = Verdict(SAFE, cases=checked[role])
            continue
        found = _problem(played, first[role])
        assert found is not None
        level = found[0]

        def still(s: Spec, role: str = role, level: str = level) -> bool:
            place = _place(s)
            if place is None or place[0] != role or s.exchanges[0].opener != "user":
                return False
            p = _problem(played, s)
            return p is not None and p[0] == level

        # shrunk only where the turn is at fault (a failure the control shares is shown as found)
        small = first[role] if found[2].get("shared") else shrink(first[role], space, still, steps=SHRINK)
        level, reason, details = _problem(played, small) or found
        out.roles[role] = Verdict(level, reason)
        out.counterexamples[role] = {
            "role": role,
            "reason": reason,
            "messages": messages_of(small),
            **details,
        }
    return out


def counterexample_lines(ce: dict[str, Any]) -> list[str]:
    """A counterexample as ``tmpl check`` prints it: the conversation, then the error or the render."""
    import json

    lines = [f"counterexample ({ce['reason']}):", "messages = ["]
    lines += [f"  {json.dumps(m, ensure_ascii=False)}," for m in ce["messages"]]
    lines.append("]")
    if "error" in ce:
        lines.append(f"apply_chat_template raises: {ce['error']}")
    if "render" in ce:
        lines += ["the template's render (its end):", "  " + json.dumps(ce["render"], ensure_ascii=False)]
    if "failure" in ce:
        f = ce["failure"]
        lines += [
            "token-in/token-out, from the first difference's context:",
            "  " + json.dumps(f["stream_render"], ensure_ascii=False),
            f"the template's render of the first {f['longer']['messages']} messages:",
            "  " + json.dumps(f["longer_render"], ensure_ascii=False),
        ]
    return lines


def verdict_of(found: dict[str, Any]) -> Verdict:
    """The ``env_turns`` verdict from :meth:`TurnsResult.to_dict` (what a report keeps)."""
    roles = {r: Verdict(d["level"], d["reason"], cases=d["cases"]) for r, d in found.get("roles", {}).items()}
    return TurnsResult(roles=roles).verdict()


def roles_line(roles: dict[str, Verdict], order: Sequence[str] = ROLES) -> str:
    return "; ".join(f"{r}: {roles[r].label}" for r in order if r in roles)


__all__ = [
    "AFTER",
    "CASES",
    "GATED",
    "ROLES",
    "TurnsResult",
    "control",
    "counterexample_lines",
    "generate_turns",
    "search_turns",
    "verdict_of",
]
