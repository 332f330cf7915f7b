"""One walk over a Jinja AST for the fixer: every ``{% if %}``/``{% elif %}`` with the loops around it.

Subclass :class:`IfVisitor` and override :meth:`IfVisitor.on_if`; :meth:`IfVisitor.walk` calls it for
each ``if`` and ``elif`` in source order (an ``if`` before its body, its body before its ``elif``
branches, those before the ``else`` block).

>>> import jinja2
>>> class Lines(IfVisitor):
...     def __init__(self) -> None:
...         self.seen: list[tuple[str, int, int]] = []
...     def on_if(self, node, where):
...         self.seen.append((where.keyword, node.lineno, len(where.loops)))
...         return True
>>> v = Lines()
>>> v.walk(jinja2.Environment().parse("{% for m in ms %}{% if a %}{% elif b %}{% endif %}{% endfor %}"))
>>> v.seen
[('if', 1, 1), ('elif', 1, 1)]
"""

from __future__ import annotations

from dataclasses import dataclass

from jinja2 import nodes

#: enclosing ``{% for %}`` loops, outermost first
Loops = tuple[nodes.For, ...]


@dataclass(frozen=True)
class Where:
    """Where an ``If`` stands.

    - ``keyword``: ``"if"``, or ``"elif"`` for a branch of an earlier ``if``.
    - ``loops``: the ``For`` loops whose body (or ``if`` filter) holds it, outermost first; a macro
      body starts afresh, since a ``loop`` there is not the caller's. These are the loops a
      ``loop.*`` in the test can mean.
    - ``in_for``: whether any ``For`` encloses it at all (its iterable, body, ``else`` block or
      filter), a macro defined inside a loop included: a looser "inside a loop".
    """

    keyword: str
    loops: Loops
    in_for: bool


class IfVisitor:
    """Walks a ``jinja2.nodes`` tree and calls :meth:`on_if` for every ``if`` and ``elif`` test."""

    def walk(self, tree: nodes.Node) -> None:
        """Visit ``tree`` and everything below it."""
        self._visit(tree, (), False)

    def on_if(self, node: nodes.If, where: Where) -> bool:
        """Called for each ``If``; return False to leave its body unvisited (its ``elif`` branches and
        ``else`` block are visited either way)."""
        raise NotImplementedError

    def _visit(self, n: nodes.Node, loops: Loops, in_for: bool, keyword: str = "if") -> None:
        if isinstance(n, nodes.If):
            into_body = self.on_if(n, Where(keyword, loops, in_for))
            self._visit(n.test, loops, in_for)
            if into_body:
                for c in n.body:
                    self._visit(c, loops, in_for)
            for e in n.elif_:
                self._visit(e, loops, in_for, "elif")
            for c in n.else_:
                self._visit(c, loops, in_for)
            return
        if isinstance(n, nodes.For):
            self._visit(n.iter, loops, True)
            for c in n.body:
                self._visit(c, loops + (n,), True)
            for c in n.else_:
                self._visit(c, loops, True)
            if n.test is not None:
                self._visit(n.test, loops + (n,), True)
            return
        if isinstance(n, nodes.Macro):
            for c in n.body:
                self._visit(c, (), in_for)
            return
        for c in n.iter_child_nodes():
            self._visit(c, loops, in_for)
