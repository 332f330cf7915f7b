"""Which if-tests read a message's position, and which of those atoms move as a conversation grows.

:func:`conditions` finds the *position atoms* of every ``{% if %}``/``{% elif %}`` test in the AST
(``loop.last``, ``ns.last_query_index``, ``xs[-1]``...); :func:`instrumented` wraps each test and
atom of the source in a recording call; :func:`watch` renders that copy on growing probe
conversations and reports the atoms whose value for a message changes once later messages follow.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jinja2
from jinja2 import nodes

from ...chat_template import ChatTemplate
from ...errors import TemplateEditError
from .. import jinja_source as js
from ..stability import PROBE_TOOLSET
from .probes import watch_chains
from .visitor import IfVisitor, Where

#: ``loop`` attributes whose value depends on where the message stands in the conversation
LOOP_ATTRS = frozenset({"last", "index", "index0", "revindex", "revindex0", "length", "nextitem"})
#: the name of the recording call in the instrumented source
MARK = "tmpl_fix_mark"
#: recorded for an atom whose value is not a constant (nothing to pin it to)
OPAQUE = "<not a constant>"
#: recorded for an undefined atom
UNDEFINED = "<undefined>"


# -- position atoms in the AST ---------------------------------------------------------------------


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
class Condition:
    """One ``if``/``elif`` test: its node, its source span, the loop item it runs for, its atoms."""

    node: nodes.If
    keyword: str
    span: js.Span | None
    item: str
    atoms: list[nodes.Node]


@dataclass(frozen=True)
class _Test:
    """An ``If`` as the walk met it: ``if`` or ``elif``, the outermost loop's item, inside an inner loop."""

    keyword: str
    node: nodes.If
    item: str
    nested: bool  # the test's ``loop`` is an inner loop's (tool calls, tools), not the messages'


class _AllTests(IfVisitor):
    """Every ``If`` of a template, with the item of its outermost loop."""

    def __init__(self) -> None:
        self.found: list[_Test] = []

    def on_if(self, node: nodes.If, where: Where) -> bool:
        outer = where.loops[0].target if where.loops else None
        item = outer.name if isinstance(outer, nodes.Name) else "none"
        self.found.append(_Test(where.keyword, node, item, len(where.loops) > 1))
        return True


def conditions(env: jinja2.Environment, source: str) -> list[Condition]:
    """Every if/elif test with position atoms, matched to its condition text by (keyword, line, order)."""
    tree = env.parse(source)
    state = _namespaces(tree)
    walk = _AllTests()
    walk.walk(tree)
    found = walk.found
    spans: dict[tuple[str, int], list[js.Span]] = {}
    for s in js.condition_spans(env, source):
        spans.setdefault((s.keyword, s.line), []).append(s)
    seen: dict[tuple[str, int], int] = {}
    out = []
    for t in sorted(found, key=lambda f: f.node.lineno):
        key = (t.keyword, t.node.lineno)
        k = seen.get(key, 0)
        seen[key] = k + 1
        atoms = [a for a in _atoms(t.node.test, state) if not (t.nested and _only_loop_refs(a))]
        if not atoms:
            continue
        candidates = spans.get(key, [])
        span = candidates[k] if k < len(candidates) and len(candidates) == _count(found, key) else None
        if span is not None and js.parse_test(env, source[span.start : span.end]) != t.node.test:
            span = None
        out.append(Condition(t.node, t.keyword, span, t.item, atoms))
    return out


def _count(found: Sequence[_Test], key: tuple[str, int]) -> int:
    return sum(1 for t in found if (t.keyword, t.node.lineno) == key)


# -- the instrumented source and its recorder ------------------------------------------------------


def _constant(value: Any) -> Any:
    if isinstance(value, jinja2.Undefined):
        return UNDEFINED
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return OPAQUE


class _Recorder:
    """Collects (atom, item) -> values evaluated during one render."""

    def __init__(self) -> None:
        self.values: dict[tuple[int, int], list[Any]] = {}

    def __call__(self, atom: int, value: Any, item: Any) -> Any:
        if item is not None and not isinstance(item, jinja2.Undefined):
            self.values.setdefault((atom, id(item)), []).append(bool(value) if atom < 0 else _constant(value))
        return value


def instrumented(source: str, conds: Sequence[Condition]) -> tuple[str, list[nodes.Node]]:
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
    return js.apply_edits(source, edits), atoms


# -- watching the atoms while conversations grow ---------------------------------------------------


@dataclass
class Finding:
    """What was seen of one atom: the values it had while its message was last."""

    last_values: set[Any] = field(default_factory=set)
    moved: int = 0


def watch(
    tpl: ChatTemplate, source: str, atoms: Sequence[nodes.Node], conds: Sequence[Condition], max_calls: int
) -> dict[int, Finding]:
    """Render growing conversations with the instrumented ``source``: the atoms whose value for a
    message changes once later messages are appended, in tests whose outcome changes with them."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    compiled = _compile_jinja_template(source)
    base = {**dict(getattr(tpl.tokenizer, "special_tokens_map", {})), **tpl.template_kwargs}
    test_of = {}
    for t, c in enumerate(conds):
        for a in c.atoms:
            test_of[id(a)] = -1 - t
    findings: dict[int, Finding] = {}
    for chain, home in watch_chains(max_calls):
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
                    f = findings.setdefault(aid, Finding())
                    f.last_values.update(want)
                    f.moved += 1
    return findings
