"""Jinja source surgery for :mod:`tmpl.report.fix`: where a node's text is, span edits, an expression printer.

jinja2 parses a template into an AST but cannot print one back. The fixer therefore decides on
the AST and edits the SOURCE TEXT: the lexer's token stream (with character offsets rebuilt
from its values) locates the text of each ``{% if %}``/``{% elif %}`` condition and of each
``strftime_now(...)`` call, and :func:`expr_source` prints a (rewritten) test expression that
parses back to the same node.

>>> env = environment()
>>> src = "{% for m in messages %}{% if loop.last %}L{% endif %}{% endfor %}"
>>> [(t.keyword, src[t.start:t.end]) for t in condition_spans(env, src)]
[('if', 'loop.last')]
>>> expr_source(env.parse("{{ a.b[0] ~ 'x' if not c else none }}").body[0].nodes[0])
"((a.b[0] ~ 'x') if (not c) else none)"
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2 import nodes

from ..errors import TemplateEditError

SOURCE = "<jinja source>"


def environment() -> jinja2.Environment:
    """The environment transformers renders chat templates with (its ``generation`` tag included)."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    env: jinja2.Environment = _compile_jinja_template("").environment
    return env


@dataclass(frozen=True)
class Token:
    """One lexer token with its character span in the source."""

    line: int
    kind: str
    value: str
    start: int
    end: int


def tokens(env: jinja2.Environment, source: str) -> list[Token]:
    """The lexer's tokens of ``source`` with character offsets.

    The raw token stream leaves out only whitespace that ``-`` or ``trim_blocks`` strips, so each
    token's value is found at or after the end of the previous one.
    """
    out, cursor = [], 0
    for line, kind, value in env.lex(source):
        at = source.find(value, cursor) if value else cursor
        if at < 0:
            raise TemplateEditError(SOURCE, f"lexer token {value!r} on line {line} not found in the source")
        out.append(Token(line, kind, value, at, at + len(value)))
        cursor = at + len(value)
    return out


@dataclass(frozen=True)
class Span:
    """Where a tag's expression is: ``source[start:end]``; ``keyword`` is ``if``/``elif``/``call``."""

    keyword: str
    line: int
    start: int
    end: int
    #: the tag's opening ``{%`` or ``{%-`` and closing ``%}``/``-%}`` (for inserting tags next to it)
    opener: str = ""
    closer: str = ""
    tag_start: int = 0
    tag_end: int = 0


def _tags(toks: list[Token]) -> Iterator[tuple[int, int, list[Token]]]:
    """Block tags as (index of ``{%``, index of ``%}``, meaningful tokens in between)."""
    i = 0
    while i < len(toks):
        if toks[i].kind == "block_begin":
            j = i + 1
            while j < len(toks) and toks[j].kind != "block_end":
                j += 1
            yield i, j, [t for t in toks[i + 1 : j] if t.kind != "whitespace"]
            i = j
        i += 1


def _closer(tok: Token) -> str:
    return "-%}" if tok.value.startswith("-") else ("+%}" if tok.value.startswith("+") else "%}")


def condition_spans(env: jinja2.Environment, source: str) -> list[Span]:
    """The condition text of every ``{% if %}`` and ``{% elif %}`` tag, in source order."""
    toks = tokens(env, source)
    out = []
    for i, j, inner in _tags(toks):
        if inner and inner[0].kind == "name" and inner[0].value in ("if", "elif") and len(inner) > 1:
            out.append(
                Span(
                    inner[0].value,
                    inner[1].line,
                    inner[1].start,
                    inner[-1].end,
                    opener=toks[i].value,
                    closer=_closer(toks[j]),
                    tag_start=toks[i].start,
                    tag_end=toks[j].start + len(_closer(toks[j])),
                )
            )
    return out


def block_tags(env: jinja2.Environment, source: str) -> list[Span]:
    """Every block tag as a span of its whole text; ``keyword`` is its first name (``if``, ``endfor``...)."""
    toks = tokens(env, source)
    out = []
    for i, j, inner in _tags(toks):
        keyword = inner[0].value if inner and inner[0].kind == "name" else ""
        out.append(
            Span(
                keyword,
                toks[i].line,
                toks[i].start,
                toks[j].start + len(_closer(toks[j])),
                opener=toks[i].value,
                closer=_closer(toks[j]),
                tag_start=toks[i].start,
                tag_end=toks[j].start + len(_closer(toks[j])),
            )
        )
    return out


def output_spans(env: jinja2.Environment, source: str) -> list[Span]:
    """Every output statement ``{{ ... }}``: ``start``/``end`` its expression's text, ``opener``/``closer``
    the tag's ``{{``/``{{-`` and ``}}``/``-}}``, ``tag_start``/``tag_end`` the whole tag (``keyword`` is
    ``output``).

    >>> src = "a{{- x + 'y' }}b"
    >>> [(src[s.start:s.end], s.opener, s.closer) for s in output_spans(environment(), src)]
    [("x + 'y'", '{{-', '}}')]
    """
    toks = tokens(env, source)
    out = []
    i = 0
    while i < len(toks):
        if toks[i].kind == "variable_begin":
            j = i + 1
            while j < len(toks) and toks[j].kind != "variable_end":
                j += 1
            inner = [t for t in toks[i + 1 : j] if t.kind != "whitespace"]
            if inner and j < len(toks):
                out.append(
                    Span(
                        "output",
                        toks[i].line,
                        inner[0].start,
                        inner[-1].end,
                        opener=toks[i].value,
                        closer=toks[j].value,
                        tag_start=toks[i].start,
                        tag_end=toks[j].end,
                    )
                )
            i = j
        i += 1
    return out


def call_spans(env: jinja2.Environment, source: str, function: str) -> list[Span]:
    """The text of every call ``function(...)`` (name through the closing parenthesis)."""
    toks = [t for t in tokens(env, source) if t.kind != "whitespace"]
    out = []
    for i, tok in enumerate(toks[:-1]):
        if tok.kind == "name" and tok.value == function and toks[i + 1].value == "(":
            depth = 0
            for t in toks[i + 1 :]:
                if t.value in ("(", "[", "{"):
                    depth += 1
                elif t.value in (")", "]", "}"):
                    depth -= 1
                    if depth == 0:
                        out.append(Span("call", tok.line, tok.start, t.end))
                        break
    return out


def apply_edits(source: str, edits: Sequence[tuple[int, int, str]]) -> str:
    """Replace ``source[start:end]`` by text for each ``(start, end, text)``; the number of lines is kept.

    >>> apply_edits("{% if loop.last %}", [(6, 15, "true")])
    '{% if true %}'
    """
    out = source
    for start, end, text in sorted(edits, reverse=True):
        out = out[:start] + text + "\n" * source.count("\n", start, end) + out[end:]
    return out


# -- printing expressions ------------------------------------------------------------------------

_BIN = {
    nodes.Add: "+",
    nodes.Sub: "-",
    nodes.Mul: "*",
    nodes.Div: "/",
    nodes.FloorDiv: "//",
    nodes.Mod: "%",
    nodes.Pow: "**",
}
_CMP = {"eq": "==", "ne": "!=", "gt": ">", "gteq": ">=", "lt": "<", "lteq": "<=", "in": "in", "notin": "not in"}


def literal(value: Any) -> str:
    """Jinja source for a constant (``true``, ``none``, ``3``, ``'text'``)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return repr(value)
    raise TemplateEditError(SOURCE, f"no literal for {type(value).__name__}")


def _args(node: nodes.Call | nodes.Filter | nodes.Test, show: Callable[[nodes.Node], str]) -> list[str]:
    parts = [show(a) for a in node.args]
    parts += [f"{k.key}={show(k.value)}" for k in node.kwargs]
    if node.dyn_args is not None:
        parts.append("*" + show(node.dyn_args))
    if node.dyn_kwargs is not None:
        parts.append("**" + show(node.dyn_kwargs))
    return parts


def expr_source(node: nodes.Node, replace: Callable[[nodes.Node], str | None] | None = None) -> str:
    """Jinja source for an expression node, fully parenthesized; ``replace(n)`` may substitute
    text for any sub-node (return None to print it as it is)."""

    def show(n: nodes.Node) -> str:
        if replace is not None:
            sub = replace(n)
            if sub is not None:
                return sub
        if isinstance(n, nodes.Const):
            return literal(n.value)
        if isinstance(n, nodes.Name):
            return str(n.name)
        if isinstance(n, nodes.NSRef):
            return f"{n.name}.{n.attr}"
        if isinstance(n, nodes.Getattr):
            return f"{show(n.node)}.{n.attr}"
        if isinstance(n, nodes.Getitem):
            return f"{show(n.node)}[{show(n.arg)}]"
        if isinstance(n, nodes.Slice):
            parts = ["" if p is None else show(p) for p in (n.start, n.stop)]
            return ":".join(parts) + ("" if n.step is None else ":" + show(n.step))
        if isinstance(n, nodes.Compare):
            return "(" + " ".join([show(n.expr)] + [f"{_CMP[o.op]} {show(o.expr)}" for o in n.ops]) + ")"
        if isinstance(n, nodes.And):
            return f"({show(n.left)} and {show(n.right)})"
        if isinstance(n, nodes.Or):
            return f"({show(n.left)} or {show(n.right)})"
        if isinstance(n, nodes.Not):
            return f"(not {show(n.node)})"
        if isinstance(n, nodes.Neg):
            return f"(-{show(n.node)})"
        if isinstance(n, nodes.Pos):
            return f"(+{show(n.node)})"
        if type(n) in _BIN:
            assert isinstance(n, nodes.BinExpr)
            return f"({show(n.left)} {_BIN[type(n)]} {show(n.right)})"
        if isinstance(n, nodes.Concat):
            return "(" + " ~ ".join(show(x) for x in n.nodes) + ")"
        if isinstance(n, nodes.CondExpr):
            tail = "" if n.expr2 is None else f" else {show(n.expr2)}"
            return f"({show(n.expr1)} if {show(n.test)}{tail})"
        if isinstance(n, nodes.Test):
            args = _args(n, show)
            return f"({show(n.node)} is {n.name}" + (f"({', '.join(args)})" if args else "") + ")"
        if isinstance(n, nodes.Filter):
            if n.node is None:
                raise TemplateEditError(SOURCE, "a filter block")
            args = _args(n, show)
            return f"({show(n.node)}|{n.name}" + (f"({', '.join(args)})" if args else "") + ")"
        if isinstance(n, nodes.Call):
            return f"{show(n.node)}({', '.join(_args(n, show))})"
        if isinstance(n, nodes.List):
            return "[" + ", ".join(show(x) for x in n.items) + "]"
        if isinstance(n, nodes.Tuple):
            items = [show(x) for x in n.items]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        if isinstance(n, nodes.Dict):
            return "{" + ", ".join(f"{show(p.key)}: {show(p.value)}" for p in n.items) + "}"
        raise TemplateEditError(SOURCE, f"no printer for {type(n).__name__}")

    return show(node)


def parse_test(env: jinja2.Environment, text: str) -> nodes.Node:
    """Parse ``text`` as an ``{% if %}`` condition and return the test node."""
    body = env.parse("{% if " + text + " %}{% endif %}").body[0]
    assert isinstance(body, nodes.If)
    return body.test
