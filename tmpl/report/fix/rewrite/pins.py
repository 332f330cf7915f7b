"""Pinning a template's position atoms (``loop.first``, ``loop.index``, negative indexes...) and its date to what the
training conversation needs, each edit the fewest that keep every probe's render."""

from __future__ import annotations

from typing import Any

import jinja2
from jinja2 import nodes

from ....chat_template import ChatTemplate
from ....errors import TemplateEditError
from ... import jinja_source as js
from ...stability import PROBE_TOOLSET
from ..analyze import OPAQUE, UNDEFINED, conditions, instrumented, watch
from ..probes import DAYS, renders_on, watch_chains
from ..prove import newest_differs
from ..types import Change

#: a span edit ``(start, end, text)`` with the change it makes
Edit = tuple[tuple[int, int, str], Change]


def _describe(atom: nodes.Node, value: Any) -> str:
    text = js.expr_source(atom)
    return (
        f"`{text}` changes once later messages are appended; pinned to {js.literal(value)}, "
        "the branch the message takes while it is the last one"
    )


def pin_positions(
    env: jinja2.Environment, tpl: ChatTemplate, source: str, max_calls: int
) -> tuple[str, list[Change], list[str]]:
    """Pin position atoms to their last-turn value until no atom moves (a few rounds at most): the
    source, its changes, and why some atoms stay (unresolved)."""
    original = source
    changes: list[Change] = []
    unresolved: list[str] = []
    for _ in range(4):
        conds = conditions(env, source)
        text, atoms = instrumented(source, conds)
        if not atoms:
            break
        findings = watch(tpl, text, atoms, conds, max_calls)
        pins: dict[int, Any] = {}
        for aid, f in findings.items():
            values = f.last_values - {UNDEFINED}
            if len(values) == 1 and OPAQUE not in values:
                pins[aid] = next(iter(values))
            else:
                shown = ", ".join(sorted(str(v) for v in f.last_values))
                unresolved.append(
                    f"`{js.expr_source(atoms[aid])}` (line {atoms[aid].lineno}) takes several values while its "
                    f"message is last ({shown}): no single branch to keep"
                )
        if not pins:
            break
        by_id = {id(a): aid for aid, a in enumerate(atoms)}
        proposed: list[Edit] = []
        for c in conds:
            hit = [a for a in c.atoms if by_id.get(id(a)) in pins]
            if not hit:
                continue
            if c.span is None:
                unresolved.append(f"the {c.keyword} test on line {c.node.lineno} could not be located in the source")
                continue

            def pin(n: nodes.Node, by_id: dict[int, int] = by_id, pins: dict[int, Any] = pins) -> str | None:
                aid = by_id.get(id(n))
                return js.literal(pins[aid]) if aid is not None and aid in pins else None

            try:
                after = js.expr_source(c.node.test, pin)
            except TemplateEditError as exc:
                unresolved.append(f"the {c.keyword} test on line {c.node.lineno}: {exc.reason}")
                continue
            before = source[c.span.start : c.span.end]
            reason = "; ".join(_describe(a, pins[by_id[id(a)]]) for a in hit)
            proposed.append(
                ((c.span.start, c.span.end, after), Change(c.span.line, " ".join(before.split()), after, reason))
            )
        kept = _fewest(tpl, source, original, proposed, max_calls)
        if not kept:
            break
        for _, change in kept:
            _merge(changes, change)
        source = js.apply_edits(source, [edit for edit, _ in kept])
        env.parse(source)  # still valid Jinja
    return source, changes, unresolved


def _fewest(tpl: ChatTemplate, source: str, original: str, proposed: list[Edit], max_calls: int) -> list[Edit]:
    """The proposed edits minus those that fix nothing: an edit is dropped when the growing
    conversations render no worse without it (a branch whose outcome moved but whose text did not)."""
    breaks = _Breaks(tpl, original, max_calls)
    kept = list(proposed)
    best = breaks(js.apply_edits(source, [e for e, _ in kept]))
    for candidate in proposed:
        trial = [k for k in kept if k is not candidate]
        score = breaks(js.apply_edits(source, [e for e, _ in trial]))
        if score <= best:
            kept, best = trial, score
    return kept


class _Breaks:
    """How often a growing conversation's render is not a prefix of the next one, plus how often the
    newest message renders differently from the original (text; a cheap stand-in for the proof)."""

    def __init__(self, tpl: ChatTemplate, original: str, max_calls: int) -> None:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        self.compile = _compile_jinja_template
        self.base = {**dict(getattr(tpl.tokenizer, "special_tokens_map", {})), **tpl.template_kwargs}
        self.chains = [chain for chain, _ in watch_chains(max_calls)]
        theirs = self.compile(original)
        self.want = [[self._render(theirs, m, g) for m, g in chain] for chain in self.chains]

    def _render(self, compiled: Any, messages: list[dict[str, Any]], gen: bool) -> str | None:
        try:
            return str(compiled.render(messages=messages, tools=PROBE_TOOLSET, add_generation_prompt=gen, **self.base))
        except Exception:  # noqa: BLE001 - a refused shape is no evidence
            return None

    def __call__(self, source: str) -> int:
        mine = self.compile(source)
        bad = 0
        for chain, wants in zip(self.chains, self.want):
            texts = [self._render(mine, m, g) for m, g in chain]
            for a, b in zip(texts, texts[1:]):
                bad += a is not None and b is not None and not b.startswith(a)
            bad += sum(d is not None for d in newest_differs(chain, texts, wants))
        return bad


def _merge(changes: list[Change], new: Change) -> None:
    """Add ``new``, folding it into an earlier change of the same text (a later round of the rewrite)."""
    for i, old in enumerate(changes):
        if old.line == new.line and old.after == new.before:
            changes[i] = Change(old.line, old.before, new.after, f"{old.reason}; {new.reason}")
            return
    changes.append(new)


def _defined_names(env: jinja2.Environment, source: str) -> list[str]:
    """Names the template tests with ``is defined`` (kwargs it lets the caller set)."""
    names = []
    for t in env.parse(source).find_all(nodes.Test):
        if t.name in ("defined", "undefined") and isinstance(t.node, nodes.Name) and t.node.name not in names:
            names.append(t.node.name)
    return names


def pin_date(env: jinja2.Environment, tpl: ChatTemplate, source: str) -> tuple[str, list[Change], str | None]:
    """Source whose date a kwarg pins; the kwarg's name (None when the date needs no pin)."""
    taken = {"strftime_now", "messages", "tools", "documents", "add_generation_prompt", *tpl.template_kwargs}
    taken |= set(getattr(tpl.tokenizer, "special_tokens_map", {}))
    candidates = [n for n in _defined_names(env, source) if n not in taken]
    for name in candidates:
        pinned = [renders_on(tpl, d, **{name: "TmPlDaTe"}) for d in DAYS]
        if pinned[0] is not None and pinned[0] == pinned[1]:
            return source, [], name
    kwarg = "date_string" if "date_string" not in candidates else "tmpl_date_string"
    spans = js.call_spans(env, source, "strftime_now")
    edits, changes = [], []
    for s in spans:
        call = source[s.start : s.end]
        after = f"({kwarg} if {kwarg} is defined else {call})"
        edits.append((s.start, s.end, after))
        changes.append(
            Change(
                s.line,
                call,
                after,
                f"today's date changes between renders; the `{kwarg}` kwarg pins it (default: the original call)",
            )
        )
    return js.apply_edits(source, edits), changes, kwarg if spans else None
