"""``make_training_safe(tpl)``: rewrite any chat template so earlier turns render as they did when last.

Many chat templates render a message differently once more messages follow it: Qwen3 writes the
``<think>`` block only while the assistant turn is last (``loop.last``) or after the last user
query (``loop.index0 > ns.last_query_index``), Mistral Nemo prepends the system prompt to the
user message only while it is last, gpt-oss ends a final answer with ``<|return|>`` only when it
is last. Token-in/token-out training needs the opposite: a turn must render exactly as the model
generated it, wherever it stands.

How the fix works (no string patterns for known families):

1. The template is parsed (jinja2's AST). In every ``{% if %}``/``{% elif %}`` test, the
   *position atoms* are found: ``loop.last``/``loop.index``/``loop.length``/... and comparisons
   or names that read a "last ..." variable (``ns.last_query_index``, ``user_messages[-1]``).
2. A copy of the template with each atom wrapped in a recording call is rendered on randomized
   probe conversations as they grow (prompt, assistant turn last, tool results appended, a new
   user turn appended). An atom whose value for a message changes once later messages are
   appended makes that message's render position-dependent. Its value while the message was
   the last one (the branch the last turn takes) must be the same in every case; the atom's
   text in the condition is then replaced by that constant (a span edit of the source, at the
   exact place the lexer located; the result is parsed again).
3. ``strftime_now`` calls that no kwarg pins are wrapped as ``(date_string if date_string is
   defined else strftime_now(...))``; ``{% generation %}`` markers are added around the
   assistant branch when the assistant mask they give covers the generated tokens.
4. The proof: the template's report on the result (tool loop must be ``SAFE``), the last turn
   and the generation prompt identical to the original's on the probe conversations (full
   renders, compared as text), suffixes equal to full renders, the date pinned by the kwarg.
   Anything unproven raises :class:`~tmpl.errors.TemplateFixError` with the reason.

>>> fixed = make_training_safe(tpl)                  # doctest: +SKIP
>>> for change in fixed.changes: print(change)       # doctest: +SKIP
line 48: `loop.last` -> `true` (...)
>>> fixed.template.render(messages)                  # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import jinja2
from jinja2 import nodes

from ..chat_template import ChatTemplate
from ..errors import TemplateEditError, TemplateFixError, TmplError
from . import jinja_source as js
from .api import check
from .report import SAFE, SAFE_WITH, UNSUPPORTED, TemplateReport, Verdict, build_report
from .stability import PROBE_TOOLSET, REASONING, conversations, frozen_date

#: ``loop`` attributes whose value depends on where the message stands in the conversation
LOOP_ATTRS = frozenset({"last", "index", "index0", "revindex", "revindex0", "length", "nextitem"})
MARK = "tmpl_fix_mark"
#: probe conversations (of :func:`~tmpl.report.stability.conversations`) watched to decide the edits;
#: the proof renders all of them (6) and the report its own
WATCH_CASES = 4
_OPAQUE = "<not a constant>"
_UNDEFINED = "<undefined>"


@dataclass(frozen=True)
class Change:
    """One edit of the template: where (line of the original), the text before and after, and why."""

    line: int
    before: str
    after: str
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: `{self.before}` -> `{self.after}` ({self.reason})"


@dataclass(frozen=True)
class ProofStep:
    """One check run on the fixed template, and what it found."""

    name: str
    ok: bool
    detail: str

    def __str__(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'} {self.name}: {self.detail}"


@dataclass
class FixResult:
    """A training-safe rewrite of a template, with its changes and the proof that it is one."""

    name: str
    source: str
    original: str
    changes: list[Change]
    proof: list[ProofStep]
    verdicts_before: dict[str, str]
    verdicts_after: dict[str, str]
    template: ChatTemplate
    notes: list[str] = field(default_factory=list)

    def to_text(self) -> str:
        """The changes line by line, then the proof (what ``tmpl fix`` prints)."""
        lines = [f"# {self.name}: training-safe rewrite", ""]
        lines += [f"tool loop: {self.verdicts_before['tool_loop']} -> {self.verdicts_after['tool_loop']}"]
        lines += [f"several user turns: {self.verdicts_before['multi_user']} -> {self.verdicts_after['multi_user']}"]
        lines += ["", f"## Changes ({len(self.changes)})"] + [f"- {c}" for c in self.changes]
        lines += ["", "## Proof"] + [f"- {p}" for p in self.proof]
        if self.notes:
            lines += ["", "## Notes"] + [f"- {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


# -- finding position atoms in the AST ------------------------------------------------------------


def _is_position_ref(n: nodes.Node, state: frozenset[str] = frozenset()) -> bool:
    """Whether ``n`` reads where a message stands: ``loop.last``/``loop.index0``/..., a "last ..." name,
    ``xs[-1]``, or an attribute of a ``namespace()`` the template fills while looping (``state``)."""
    if isinstance(n, nodes.Getattr) and isinstance(n.node, nodes.Name) and n.node.name == "loop":
        return n.attr in LOOP_ATTRS
    if isinstance(n, nodes.Name):
        return "last" in n.name.lower()
    if isinstance(n, nodes.Getattr):
        return "last" in n.attr.lower() or (isinstance(n.node, nodes.Name) and n.node.name in state)
    if isinstance(n, nodes.Getitem):
        arg = n.arg
        return (isinstance(arg, nodes.Const) and arg.value == -1) or (
            isinstance(arg, nodes.Neg) and isinstance(arg.node, nodes.Const) and arg.node.value == 1
        )
    return False


def _mentions_position(n: nodes.Node, state: frozenset[str]) -> bool:
    return _is_position_ref(n, state) or any(_mentions_position(c, state) for c in n.iter_child_nodes())


def _only_loop_refs(n: nodes.Node) -> bool:
    refs = [x for x in itertools.chain([n], n.find_all(nodes.Expr)) if _is_position_ref(x)]
    return all(isinstance(x, nodes.Getattr) and isinstance(x.node, nodes.Name) and x.node.name == "loop" for x in refs)


def _atoms(test: nodes.Node, state: frozenset[str], top: bool = True) -> list[nodes.Node]:
    """The maximal sub-expressions of ``test`` that read a message's position.

    ``add_generation_prompt`` counts as one in a test that reads a position too (gpt-oss writes
    ``<|return|>`` only for ``loop.last and not add_generation_prompt``).
    """
    if isinstance(test, (nodes.Compare, nodes.Test)) and _mentions_position(test, state):
        return [test]
    if _is_position_ref(test, state):
        return [test]
    found = [a for c in test.iter_child_nodes() for a in _atoms(c, state, False)]
    if top and found:
        found += [n for n in test.find_all(nodes.Name) if n.name == "add_generation_prompt" and n not in found]
    return found


def _namespaces(tree: nodes.Template) -> frozenset[str]:
    """Names bound to ``namespace(...)``: state the template carries from message to message."""
    out = set()
    for a in tree.find_all(nodes.Assign):
        call = a.node
        if isinstance(call, nodes.Call) and isinstance(call.node, nodes.Name) and call.node.name == "namespace":
            if isinstance(a.target, nodes.Name):
                out.add(a.target.name)
    return frozenset(out)


@dataclass
class _Cond:
    """One ``if``/``elif`` test: its node, its source span, the loop item it runs for, its atoms."""

    node: nodes.If
    keyword: str
    span: js.Span | None
    item: str
    atoms: list[nodes.Node]


def _conditions(env: jinja2.Environment, source: str) -> list[_Cond]:
    """Every if/elif test with position atoms, matched to its condition text by (keyword, line, order)."""
    tree = env.parse(source)
    state = _namespaces(tree)
    found: list[tuple[str, nodes.If, str]] = []
    nested: dict[int, bool] = {}  # the test's ``loop`` is an inner loop's (tool calls, tools), not the messages'

    def walk(n: nodes.Node, fors: tuple[nodes.For, ...], keyword: str = "if") -> None:
        if isinstance(n, nodes.If):
            outer = fors[0].target if fors else None
            item = outer.name if isinstance(outer, nodes.Name) else "none"
            found.append((keyword, n, item))
            nested[id(n)] = len(fors) > 1
            walk(n.test, fors)
            for c in n.body:
                walk(c, fors)
            for e in n.elif_:
                walk(e, fors, "elif")
            for c in n.else_:
                walk(c, fors)
            return
        if isinstance(n, nodes.For):
            walk(n.iter, fors)
            for c in n.body:
                walk(c, fors + (n,))
            for c in n.else_:
                walk(c, fors)
            if n.test is not None:
                walk(n.test, fors + (n,))
            return
        if isinstance(n, nodes.Macro):
            for c in n.body:
                walk(c, ())
            return
        for c in n.iter_child_nodes():
            walk(c, fors)

    walk(tree, ())
    spans: dict[tuple[str, int], list[js.Span]] = {}
    for s in js.condition_spans(env, source):
        spans.setdefault((s.keyword, s.line), []).append(s)
    seen: dict[tuple[str, int], int] = {}
    out = []
    for keyword, node, item in sorted(found, key=lambda f: f[1].lineno):
        key = (keyword, node.lineno)
        k = seen.get(key, 0)
        seen[key] = k + 1
        atoms = [a for a in _atoms(node.test, state) if not (nested[id(node)] and _only_loop_refs(a))]
        if not atoms:
            continue
        candidates = spans.get(key, [])
        span = candidates[k] if k < len(candidates) and len(candidates) == _count(found, key) else None
        if span is not None and js.parse_test(env, source[span.start : span.end]) != node.test:
            span = None
        out.append(_Cond(node, keyword, span, item, atoms))
    return out


def _count(found: Sequence[tuple[str, nodes.If, str]], key: tuple[str, int]) -> int:
    return sum(1 for kw, n, _ in found if (kw, n.lineno) == key)


# -- watching the atoms while conversations grow --------------------------------------------------


def _constant(value: Any) -> Any:
    if isinstance(value, jinja2.Undefined):
        return _UNDEFINED
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return _OPAQUE


class _Recorder:
    """Collects (atom, item) -> values evaluated during one render."""

    def __init__(self) -> None:
        self.values: dict[tuple[int, int], list[Any]] = {}

    def __call__(self, atom: int, value: Any, item: Any) -> Any:
        if item is not None and not isinstance(item, jinja2.Undefined):
            self.values.setdefault((atom, id(item)), []).append(bool(value) if atom < 0 else _constant(value))
        return value


def _instrumented(source: str, conds: Sequence[_Cond]) -> tuple[str, list[nodes.Node]]:
    """``source`` with each test and each of its atoms wrapped in a recording call.

    Atom ``i`` records under ``i``; the test holding it records under ``-1 - (index of the test)``.
    """
    atoms: list[nodes.Node] = []
    edits = []
    for t, c in enumerate(conds):
        if c.span is None:
            continue
        ids = {}
        for a in c.atoms:
            ids[id(a)] = len(atoms)
            atoms.append(a)

        def wrap(n: nodes.Node, ids: dict[int, int] = ids, item: str = c.item) -> str | None:
            if id(n) in ids:
                return f"{MARK}({ids[id(n)]}, {js.expr_source(n)}, {item})"
            return None

        try:
            test = js.expr_source(c.node.test, wrap)
        except TemplateEditError:
            continue  # an expression tmpl cannot print: this test is left as it is (and unwatched)
        edits.append((c.span.start, c.span.end, f"{MARK}({-1 - t}, {test}, {c.item})"))
    return _apply(source, edits), atoms


def _apply(source: str, edits: Sequence[tuple[int, int, str]]) -> str:
    """Replace ``source[start:end]`` by text for each edit; the number of lines is kept."""
    out = source
    for start, end, text in sorted(edits, reverse=True):
        out = out[:start] + text + "\n" * source.count("\n", start, end) + out[end:]
    return out


def _alias_reasoning(msg: dict[str, Any]) -> dict[str, Any]:
    """What transformers shows templates: reasoning also under ``thinking`` and ``reasoning_content``."""
    if msg.get("reasoning_content") is not None:
        return {"thinking": msg["reasoning_content"], **msg}
    return msg


def _units(messages: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """How a conversation grows: a system message with the next one, tool results of a round together,
    every other message alone."""
    units: list[list[dict[str, Any]]] = []
    pending: list[dict[str, Any]] = []
    for m in messages:
        if m.get("role") == "tool" and units and units[-1][-1].get("role") == "tool" and not pending:
            units[-1].append(m)
        elif m.get("role") in ("system", "developer") and not units:
            pending.append(m)
        else:
            units.append(pending + [m])
            pending = []
    return units + ([pending] if pending else [])


Chain = list[tuple[list[dict[str, Any]], bool]]


def _growth_chains(max_calls: int, n: int = 6) -> Iterator[tuple[Chain, dict[int, int]]]:
    """Conversations as they grow unit by unit: the renders, and for each message (by id) the
    index of the render in which it is last."""
    for case in conversations(max(max_calls, 1), n=n):
        history = [_alias_reasoning(m) for m in case["history"]]
        a = _alias_reasoning(case["assistant"])
        reply = _alias_reasoning(
            {"role": "assistant", "content": "Here is the answer."}
            | ({"reasoning_content": f"{REASONING} reply"} if case["reasoning"] else {})
        )
        follow = {"role": "user", "content": "TmPlFoLlOwUp?"}
        final = {"role": "assistant", "content": "TmPlFiNaL answer."}
        for conversation in (history + [a] + list(case["results"]) + [final], history + [reply, follow]):
            chain: Chain = []
            home: dict[int, int] = {}
            so_far: list[dict[str, Any]] = []
            for unit in _units(conversation):
                so_far = so_far + unit
                for m in unit:
                    home[id(m)] = len(chain)
                chain.append((so_far, unit[-1].get("role") != "assistant"))
            yield chain, home


@dataclass
class _Finding:
    """What was seen of one atom: the values it had while its message was last."""

    last_values: set[Any] = field(default_factory=set)
    moved: int = 0


def _watch(
    tpl: ChatTemplate, source: str, atoms: Sequence[nodes.Node], conds: Sequence[_Cond], max_calls: int
) -> dict[int, _Finding]:
    """Render growing conversations with the instrumented ``source``: the atoms whose value for a
    message changes once later messages are appended, in tests whose outcome changes with them."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    compiled = _compile_jinja_template(source)
    base = {**dict(getattr(tpl.tokenizer, "special_tokens_map", {})), **tpl.template_kwargs}
    test_of = {}
    for t, c in enumerate(conds):
        for a in c.atoms:
            test_of[id(a)] = -1 - t
    findings: dict[int, _Finding] = {}
    for chain, home in _growth_chains(max_calls, n=WATCH_CASES):
        seen: list[dict[tuple[int, int], list[Any]] | None] = []
        for messages, gen in chain:
            rec = _Recorder()
            try:
                compiled.render(
                    messages=messages, tools=PROBE_TOOLSET, add_generation_prompt=gen, **base, **{MARK: rec}
                )
            except Exception:  # noqa: BLE001 - a shape the template refuses is no evidence either way
                seen.append(None)
                continue
            seen.append(rec.values)
        for item, at in home.items():
            ref = seen[at]
            if ref is None:
                continue
            for later in seen[at + 1 :]:
                if later is None:
                    continue
                for aid, atom in enumerate(atoms):
                    want, got = ref.get((aid, item)), later.get((aid, item))
                    if not want or got == want:
                        continue
                    test = test_of[id(atom)]
                    before, after = ref.get((test, item)), later.get((test, item))
                    if not before or not after or before == after:
                        continue  # the test is not reached in one render (an outer branch decides), or unmoved
                    f = findings.setdefault(aid, _Finding())
                    f.last_values.update(want)
                    f.moved += 1
    return findings


# -- the rewrite ----------------------------------------------------------------------------------


def _describe(atom: nodes.Node, value: Any) -> str:
    text = js.expr_source(atom)
    return (
        f"`{text}` changes once later messages are appended; pinned to {js.literal(value)}, "
        "the branch the message takes while it is the last one"
    )


def _rewrite_positions(
    env: jinja2.Environment, tpl: ChatTemplate, source: str, max_calls: int
) -> tuple[str, list[Change], list[str]]:
    """Pin position atoms to their last-turn value until no atom moves (a few rounds at most)."""
    original = source
    changes: list[Change] = []
    unresolved: list[str] = []
    for _ in range(4):
        conds = _conditions(env, source)
        text, atoms = _instrumented(source, conds)
        if not atoms:
            break
        findings = _watch(tpl, text, atoms, conds, max_calls)
        pins: dict[int, Any] = {}
        for aid, f in findings.items():
            values = f.last_values - {_UNDEFINED}
            if len(values) == 1 and _OPAQUE not in values:
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
        proposed: list[tuple[tuple[int, int, str], Change]] = []
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
        source = _apply(source, [edit for edit, _ in kept])
        env.parse(source)  # still valid Jinja
    return source, changes, unresolved


def _fewest(
    tpl: ChatTemplate,
    source: str,
    original: str,
    proposed: list[tuple[tuple[int, int, str], Change]],
    max_calls: int,
) -> list[tuple[tuple[int, int, str], Change]]:
    """The proposed edits minus those that fix nothing: an edit is dropped when the growing
    conversations render no worse without it (a branch whose outcome moved but whose text did not)."""
    breaks = _Breaks(tpl, original, max_calls)
    kept = list(proposed)
    best = breaks(_apply(source, [e for e, _ in kept]))
    for candidate in proposed:
        trial = [k for k in kept if k is not candidate]
        score = breaks(_apply(source, [e for e, _ in trial]))
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
        self.chains = [chain for chain, _ in _growth_chains(max_calls, n=WATCH_CASES)]
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
            bad += sum(d is not None for d in _newest_differs(chain, texts, wants))
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


def _renders_on(tpl: ChatTemplate, day: tuple[int, int, int], **kwargs: Any) -> str | None:
    messages = [{"role": "user", "content": "What day is it?"}]
    try:
        with frozen_date(*day):
            return tpl.renderer.text(messages, tools=PROBE_TOOLSET, add_generation_prompt=True, **kwargs)
    except TmplError:
        return None


DAYS = ((2024, 1, 2), (2031, 7, 19))


def _pin_date(env: jinja2.Environment, tpl: ChatTemplate, source: str) -> tuple[str, list[Change], str | None]:
    """Source whose date a kwarg pins; the kwarg's name (None when the date needs no pin)."""
    taken = {"strftime_now", "messages", "tools", "documents", "add_generation_prompt", *tpl.template_kwargs}
    taken |= set(getattr(tpl.tokenizer, "special_tokens_map", {}))
    candidates = [n for n in _defined_names(env, source) if n not in taken]
    for name in candidates:
        pinned = [_renders_on(tpl, d, **{name: "TmPlDaTe"}) for d in DAYS]
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
    return _apply(source, edits), changes, kwarg if spans else None


# -- generation markers ---------------------------------------------------------------------------


_OTHER_ROLES = frozenset({"user", "system", "tool", "ipython", "developer", "function"})


def _selects_assistant(test: nodes.Node) -> bool:
    """Whether an if-test picks assistant messages only: it compares the role with ``'assistant'``
    (not negated) or reads ``tool_calls``, and names no other role."""
    exprs = list(itertools.chain([test], test.find_all(nodes.Expr)))
    consts = {x.value for x in exprs if isinstance(x, nodes.Const) and isinstance(x.value, str)}
    if consts & _OTHER_ROLES:
        return False
    negated = {
        id(x) for n in exprs if isinstance(n, nodes.Not) for x in itertools.chain([n.node], n.node.find_all(nodes.Expr))
    }
    for c in exprs:
        if not isinstance(c, nodes.Compare) or id(c) in negated:
            continue
        operands = [c.expr] + [o.expr for o in c.ops]
        ops = {o.op for o in c.ops}
        if "eq" in ops and any(isinstance(x, nodes.Const) and x.value == "assistant" for x in operands):
            return True
        if "in" in ops and any(
            isinstance(x, (nodes.List, nodes.Tuple))
            and any(isinstance(i, nodes.Const) and i.value == "assistant" for i in x.items)
            for x in operands
        ):
            return True
    return any(
        (isinstance(x, nodes.Getattr) and x.attr == "tool_calls")
        or (isinstance(x, nodes.Getitem) and isinstance(x.arg, nodes.Const) and x.arg.value == "tool_calls")
        for x in exprs
        if id(x) not in negated
    )


_OPENERS = {"if", "for", "macro", "call", "filter", "with", "block", "generation", "raw"}


def _add_generation_markers(env: jinja2.Environment, source: str) -> tuple[str, list[Change]]:
    """Wrap the body of each outermost assistant branch (inside a loop) in ``{% generation %}``."""
    tree = env.parse(source)
    branches: list[tuple[str, int]] = []

    def walk(n: nodes.Node, in_loop: bool, keyword: str = "if") -> None:
        if isinstance(n, nodes.If):
            if in_loop and _selects_assistant(n.test):
                branches.append((keyword, n.lineno))
                for e in n.elif_:
                    walk(e, in_loop, "elif")
                for c in n.else_:
                    walk(c, in_loop)
                return
            for c in n.body:
                walk(c, in_loop)
            for e in n.elif_:
                walk(e, in_loop, "elif")
            for c in n.else_:
                walk(c, in_loop)
            return
        for c in n.iter_child_nodes():
            walk(c, in_loop or isinstance(n, nodes.For))

    walk(tree, False)
    tags = js.block_tags(env, source)
    edits, changes = [], []
    for keyword, line in branches:
        here = [i for i, t in enumerate(tags) if t.keyword == keyword and t.line <= line]
        here = [i for i in here if tags[i].line == max(tags[j].line for j in here)] if here else []
        if len(here) != 1:
            continue
        i = here[0]
        depth, end = 0, None
        for j in range(i + 1, len(tags)):
            kw = tags[j].keyword
            if kw in _OPENERS:
                depth += 1
            elif kw.startswith("end") and kw[3:] in _OPENERS:
                if depth == 0:
                    end = j
                    break
                depth -= 1
            elif kw in ("elif", "else") and depth == 0:
                end = j
                break
        if end is None:
            continue
        open_tag = "{% generation " + tags[i].closer
        close_tag = tags[end].opener + " endgeneration %}"
        edits.append((tags[i].tag_end, tags[i].tag_end, open_tag))
        edits.append((tags[end].tag_start, tags[end].tag_start, close_tag))
        changes.append(
            Change(
                tags[i].line,
                source[tags[i].tag_start : tags[i].tag_end],
                source[tags[i].tag_start : tags[i].tag_end] + open_tag + " ... " + close_tag,
                f"marks the assistant branch (through line {tags[end].line}) for return_assistant_tokens_mask",
            )
        )
    return _apply(source, edits), changes


# -- the proof ------------------------------------------------------------------------------------


def _tail(text: str, anchor: str) -> str | None:
    at = text.rfind(anchor)
    return text[at + len(anchor) :] if at >= 0 else None


def _anchors(message: dict[str, Any]) -> list[str]:
    """Strings of a message that its render shows verbatim (content, call argument values)."""
    out = [message["content"]] if isinstance(message.get("content"), str) and message["content"].strip() else []
    for call in message.get("tool_calls") or []:
        out += [str(v) for v in call["function"]["arguments"].values()]
    return out


def _last_unit_tail(text: str, messages: Sequence[dict[str, Any]]) -> str | None:
    """The render of the last unit of ``messages`` (and the generation prompt): ``text`` after the last
    verbatim string of the messages before that unit that the render shows (all of ``text`` when
    there are none; None when none of them is found, e.g. a template that escapes them)."""
    units = _units(messages)
    earlier = [a for m in messages[: len(messages) - len(units[-1])] for a in _anchors(m)] if units else []
    if not earlier:
        return text
    for anchor in reversed(earlier):
        at = text.rfind(anchor)
        if at >= 0:
            return text[at + len(anchor) :]
    return None


def _newest_differs(chain: Chain, mine: Sequence[str | None], theirs: Sequence[str | None]) -> list[str | None]:
    """For each render of a growing conversation: how the newest unit (and the generation prompt) renders
    differently from the original's (None: identical, or nothing to compare).

    After the last verbatim string before the newest unit, the fixed render must read: the previous
    render's text from there (the previous message as it rendered when it was last), then a text
    that ends the original's render too (the newest unit, identically).
    """
    out: list[str | None] = []
    for j, (messages, _) in enumerate(chain):
        a, b = theirs[j], mine[j]
        if a is None:
            out.append(None)
            continue
        if b is None:
            out.append("the fixed template raises")
            continue
        if j == 0:
            out.append(None if a == b else f"renders {b[:160]!r}, the original {a[:160]!r}")
            continue
        want, got = _last_unit_tail(a, messages), _last_unit_tail(b, messages)
        prev = mine[j - 1]
        before = _last_unit_tail(prev, messages) if prev is not None else None
        if want is None or got is None or before is None:
            out.append(None)
            continue
        newest = got[len(before) :] if got.startswith(before) else got
        out.append(None if want.endswith(newest) else f"renders {newest[:160]!r}, the original {want[:160]!r}")
    return out


def _same_last_turn(original: ChatTemplate, fixed: ChatTemplate, max_calls: int) -> ProofStep:
    """Each newest message (and the generation prompt) renders as in the original, on the growing
    probe conversations (full renders through transformers, compared as text)."""

    def texts(tpl: ChatTemplate, chain: Chain) -> list[str | None]:
        out: list[str | None] = []
        for messages, gen in chain:
            try:
                out.append(tpl.renderer.text(messages, tools=PROBE_TOOLSET, add_generation_prompt=gen))
            except TmplError:
                out.append(None)
        return out

    compared = 0
    for chain, _ in _growth_chains(max_calls):
        theirs = texts(original, chain)
        diffs = _newest_differs(chain, texts(fixed, chain), theirs)
        for (messages, _), diff in zip(chain, diffs):
            if diff is not None:
                return ProofStep(
                    "last turn as the original", False, f"the newest {messages[-1]['role']} message {diff}"
                )
        compared += sum(1 for t in theirs if t is not None)
    if not compared:
        return ProofStep("last turn as the original", False, "the original renders none of the probe conversations")
    return ProofStep(
        "last turn as the original", True, f"{compared} renders: the newest message and generation prompt identical"
    )


def _suffix_contract(fixed: ChatTemplate, max_calls: int) -> ProofStep:
    """``prompt + completion + suffix`` equals the full render's tokens on every probe tool round."""
    checked = 0
    for case in conversations(max(max_calls, 1)):
        history, a, results = case["history"], case["assistant"], case["results"]
        try:
            text = fixed.renderer.text(history + [a] + results, tools=PROBE_TOOLSET, add_generation_prompt=True)
            prompt = fixed.prompt_ids(history, tools=PROBE_TOOLSET)
        except TmplError:
            continue
        full, offsets = fixed.codec.encode_with_offsets(text)
        if full[: len(prompt)] != prompt:
            return ProofStep("suffix contract", False, "the prompt is not a prefix of the full render")
        last_arg = max(
            text.rfind(str(v)) + len(str(v)) for c in a["tool_calls"] for v in c["function"]["arguments"].values()
        )
        j = next(
            (t for t in range(len(prompt), len(full)) if offsets[t][0] >= last_arg and full[t] in fixed.stop_token_ids),
            None,
        )
        if j is None:
            return ProofStep("suffix contract", False, "no stop token closes the assistant turn in the full render")
        try:
            suffix = fixed.suffix_ids(
                results, completion_ids=full[len(prompt) : j + 1], tools=PROBE_TOOLSET, history=history
            )
        except TmplError as exc:
            return ProofStep("suffix contract", False, str(exc))
        if suffix != full[j + 1 :]:
            return ProofStep(
                "suffix contract",
                False,
                f"suffix {fixed.codec.decode(suffix)!r} != {fixed.codec.decode(full[j + 1 :])!r}",
            )
        checked += 1
    if not checked:
        return ProofStep("suffix contract", False, "no probe tool round renders")
    return ProofStep("suffix contract", True, f"{checked} tool rounds: prompt + completion + suffix == full render")


def _date_step(original: ChatTemplate, fixed: ChatTemplate, kwarg: str) -> ProofStep:
    pinned = [_renders_on(fixed, d, **{kwarg: "TmPlDaTe"}) for d in DAYS]
    if pinned[0] is None or pinned[0] != pinned[1]:
        return ProofStep("date pinned", False, f"renders on two dates still differ with {kwarg}= given")
    same = all(_renders_on(fixed, d) == _renders_on(original, d) for d in DAYS)
    if not same:
        return ProofStep("date pinned", False, f"without {kwarg}= the render differs from the original's")
    return ProofStep(
        "date pinned", True, f"{kwarg}= makes renders on different days identical; without it, as the original"
    )


def assistant_mask_step(fixed: ChatTemplate) -> ProofStep:
    """What ``return_assistant_tokens_mask=True`` marks on the fixed template, against the generated
    tokens of a plain answer and of a tool-call turn (both must be marked)."""
    history = [{"role": "user", "content": "TmPlUsEr: weather in Paris?"}]
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "TmPlCiTy"}}}
    plain = _mask_of(fixed, history, {"role": "assistant", "content": "TmPlMaSkEd answer."})
    calls = _mask_of(fixed, history, {"role": "assistant", "content": "", "tool_calls": [{"id": "c00000001", **call}]})
    if not plain.ok or not calls.ok:
        bad = plain if not plain.ok else calls
        return ProofStep(bad.name, False, f"{bad.detail} ({'an answer' if bad is plain else 'a tool-call turn'})")
    return ProofStep(plain.name, True, f"{plain.detail} (answers and tool-call turns)")


def _mask_of(fixed: ChatTemplate, history: list[dict[str, Any]], reply: dict[str, Any]) -> ProofStep:
    try:
        out = fixed.tokenizer.apply_chat_template(
            history + [reply],
            tools=PROBE_TOOLSET,
            chat_template=fixed.template,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            **fixed.template_kwargs,
        )
        prompt = fixed.prompt_ids(history, tools=PROBE_TOOLSET)
    except Exception as exc:  # noqa: BLE001 - any failure means no usable mask
        return ProofStep("assistant mask", False, f"rendering with the mask fails: {exc}")
    ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
    stop = next((t for t in range(len(prompt), len(ids)) if ids[t] in fixed.stop_token_ids), None)
    if ids[: len(prompt)] != prompt or stop is None:
        return ProofStep("assistant mask", False, "the reply does not follow the prompt up to a stop token")
    generated = set(range(len(prompt), stop + 1))
    marked = {t for t, m in enumerate(mask) if m}
    if not generated <= marked:
        return ProofStep("assistant mask", False, "some generated tokens are not marked")
    extra = sorted(marked - generated)
    before = [t for t in extra if t < len(prompt)]
    if marked == generated:
        return ProofStep("assistant mask", True, "marks exactly the generated tokens (through the stop token)")
    lead = fixed.codec.decode([ids[t] for t in before])
    trail = fixed.codec.decode([ids[t] for t in extra if t > stop])
    if any(t < len(prompt) - len(before) for t in before) or lead.count("TmPlUsEr"):
        return ProofStep("assistant mask", False, "it marks tokens of other messages")
    return ProofStep(
        "assistant mask",
        True,
        f"marks the generated tokens, plus the turn header {lead!r} and {trail!r} after the stop token",
    )


# -- entry point ----------------------------------------------------------------------------------


def _where(report: TemplateReport) -> str:
    """The first tool-loop counterexample of a report, in words."""
    for name in ("tool_append", "assistant_kept"):
        c = report.stability[name]
        if not c.ok and c.counterexample:
            ce = c.counterexample
            short, long = ce["prefix_render"], ce["longer_render"]
            if long.startswith(short.rstrip()) and short != long:
                return (
                    f"{name}: the shorter render's text {short!r} is a prefix of the longer one's {long!r}, but "
                    "its tokens are not (a BPE merge across the end of the prompt), which no rewrite of the "
                    "template's branches changes"
                )
            common = len(os.path.commonprefix([short, long]))
            if name == "tool_append" and common < len(short):
                return (
                    f"{name}: the generation prompt ends with {short[common:]!r}, which the assistant turn does not "
                    f"render once tool results follow it ({long[common : common + 40]!r}...): the prompt prefills "
                    "text the turn's own render leaves out, which no if-test on position decides"
                )
            return (
                f"{name}: {c.reason}; the shorter render reads {ce['prefix_render']!r} where the longer one reads "
                f"{ce['longer_render']!r}"
            )
    return report.verdicts["tool_loop"].label


def _refuse(
    tpl: ChatTemplate, reason: str, changes: Sequence[Change] = (), source: str | None = None
) -> TemplateFixError:
    err = TemplateFixError(tpl.name, reason, tuple(str(c) for c in changes))
    err.source = source
    return err


def make_training_safe(tpl: ChatTemplate) -> FixResult:
    """A rewrite of ``tpl``'s template that renders earlier turns as they rendered when last, proven.

    The result (or the refusal) is kept per template fingerprint. Raises
    :class:`~tmpl.errors.TemplateFixError` (naming the template and the reason) when the
    result cannot be proven: the template does not render tool conversations, its turn close is
    not a stop token of this tokenizer, the position dependence is not in an ``if`` test, or a
    proof step fails.

    >>> result = make_training_safe(tmpl.ChatTemplate(tokenizer))   # doctest: +SKIP
    >>> result.verdicts_after["tool_loop"], len(result.changes)      # doctest: +SKIP
    ('SAFE', 2)
    """
    outcome = tpl.engine.state.memo(f"training_safe_rewrite:{tpl.name}", lambda: _attempt(tpl))  # names it
    if isinstance(outcome, TemplateFixError):
        raise outcome
    return outcome


def _attempt(tpl: ChatTemplate) -> FixResult | TemplateFixError:
    try:
        return _make(tpl)
    except TemplateFixError as exc:
        return exc


def _own_verdict(verdict: Verdict) -> Verdict:
    """The template's own verdict under a ``SAFE WITH tmpl TEMPLATE`` one (which keeps it as its reason)."""
    if verdict.level != SAFE_WITH:
        return verdict
    level, _, reason = verdict.reason.partition(" (")
    return Verdict(level, reason.removesuffix(")"))


def _make(tpl: ChatTemplate) -> FixResult:
    report = check(tpl)
    before = {use: v.label for use, v in report.verdicts.items()}
    tool_loop = _own_verdict(report.verdicts["tool_loop"])
    if report.splice_detail is not None:
        raise _refuse(
            tpl,
            f"the turn close is not a single token of this tokenizer ({report.splice_detail}); no rewrite of the "
            "template makes a stop token of it",
        )
    if tool_loop.level == UNSUPPORTED:
        raise _refuse(tpl, f"the template does not render a usable tool conversation ({tool_loop.reason})")
    env = js.environment()
    try:
        env.parse(tpl.template)
        source, changes, unresolved = _rewrite_positions(env, tpl, tpl.template, report.max_parallel_calls)
    except (jinja2.TemplateError, TemplateEditError) as exc:
        raise _refuse(tpl, f"cannot edit the template's source: {exc}") from exc
    notes: list[str] = list(unresolved)
    kwarg = None
    if report.date_injected:
        source, dated, kwarg = _pin_date(env, tpl, source)
        changes += dated
    if tool_loop.level != SAFE and not changes:
        raise _refuse(
            tpl,
            f"the tool loop is unsafe ({tool_loop.reason}) and no if-test reading a message's position is the "
            f"cause (pinning one changes nothing); {_where(report)}"
            + (f"; {'; '.join(unresolved)}" if unresolved else ""),
        )
    marked = source
    marker_changes: list[Change] = []
    if not js_has_generation(source):
        marked, marker_changes = _add_generation_markers(env, source)
    fixed = _fixed(tpl, marked)
    mask = assistant_mask_step(fixed) if marker_changes or js_has_generation(source) else None
    if not js_has_generation(source) and not marker_changes:
        notes.append(
            "no {% generation %} markers added: no if-branch inside the messages loop selects the assistant role"
        )
    elif marker_changes and (mask is None or not mask.ok):
        notes.append(
            f"no {{% generation %}} markers added: around the assistant branch {mask.detail if mask else 'they fail'}"
            " (the template renders some assistant messages in another branch)"
        )
        fixed, mask = _fixed(tpl, source), None
    else:
        changes += marker_changes
    proof = [ProofStep("valid Jinja", True, "the rewritten source parses")]
    after = build_report(fixed, shipped=False)
    after_labels = {use: v.label for use, v in after.verdicts.items()}
    proof.append(
        ProofStep(
            "prefix stability (report)",
            after.verdicts["tool_loop"].level == SAFE,
            f"tool loop {after_labels['tool_loop']}; "
            + ", ".join(
                f"{n} {'stable' if c.ok else 'NOT stable'} ({c.cases} cases)" for n, c in after.stability.items()
            )
            + ("" if after.verdicts["tool_loop"].level == SAFE else f"; {_where(after)}"),
        )
    )
    proof.append(_same_last_turn(tpl, fixed, report.max_parallel_calls))
    proof.append(_suffix_contract(fixed, report.max_parallel_calls))
    if kwarg is not None:
        proof.append(_date_step(tpl, fixed, kwarg))
    if mask is not None:
        proof.append(mask)
    failed = [p for p in proof if not p.ok]
    if failed:
        raise _refuse(
            tpl,
            "; ".join(f"{p.name} fails ({p.detail})" for p in failed)
            + (f"; {'; '.join(unresolved)}" if unresolved else ""),
            changes,
        )
    return FixResult(
        name=tpl.name,
        source=fixed.template,
        original=tpl.template,
        changes=sorted(changes, key=lambda c: c.line),
        proof=proof,
        verdicts_before=before,
        verdicts_after=after_labels,
        template=fixed,
        notes=notes,
    )


def js_has_generation(source: str) -> bool:
    """Whether the source already has ``{% generation %}`` markers."""
    from .report import _GENERATION_TAG

    return _GENERATION_TAG.search(source) is not None


def _fixed(tpl: ChatTemplate, source: str) -> ChatTemplate:
    return ChatTemplate(
        tpl.tokenizer,
        source,
        name=f"{tpl.name} (training-safe)",
        extra_stop_token_ids=tpl.extra_stop_token_ids,
        **tpl.template_kwargs,
    )


__all__ = ["Change", "FixResult", "ProofStep", "make_training_safe"]
