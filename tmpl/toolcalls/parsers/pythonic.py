"""Pythonic calls ``[get_weather(city='Paris'), get_time(tz="UTC")]`` (LFM2.5, Llama built-ins).

The text is parsed with :func:`ast.parse` (syntax only: nothing is evaluated) and each
keyword argument is read from its syntax tree by :func:`node_value`, which accepts literals
only (strings, numbers, booleans, None, lists, tuples, dicts, and JSON's true/false/null).

>>> [(c.name, c.arguments) for c in calls_in_python("[f(a='x', b=[1, True]), g()]", 0, 29)]
[('f', {'a': 'x', 'b': [1, True]}), ('g', {})]
"""

from __future__ import annotations

import ast
import re
from typing import Any

from ..literal import MAX_DEPTH, WORDS
from ..tokentext import TokenText
from .base import TRUNCATED, RawCall, ToolParser, blocks

MAX_CHARS = 200_000


class NotLiteral(ValueError):
    """A syntax-tree node is not a literal value."""


def node_value(node: ast.AST, depth: int = 0) -> Any:
    """The literal value of a syntax-tree node; raises :class:`NotLiteral` for anything else."""
    if depth > MAX_DEPTH:
        raise NotLiteral("nested too deeply")
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        return node.value
    if isinstance(node, ast.Name) and node.id in WORDS:
        return WORDS[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = node_value(node.operand, depth + 1)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [node_value(x, depth + 1) for x in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            if k is None:
                raise NotLiteral("'**' in a dict")
            key = node_value(k, depth + 1)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise NotLiteral("a dict key must be a scalar")
            out[key if isinstance(key, str) else str(key)] = node_value(v, depth + 1)
        return out
    raise NotLiteral(f"{type(node).__name__} is not a literal")


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def calls_in_python(text: str, start: int, end: int, *, builtin: bool = False) -> list[RawCall]:
    """Calls in ``text[start:end]`` written as Python calls (a list of them, or one).

    With ``builtin`` (Llama's ``brave_search.call(query=...)``), a trailing ``.call`` is dropped
    from the name.
    """
    source = text[start:end].strip()
    if not source:
        return []
    if len(source) > MAX_CHARS:
        return [RawCall(start, end, error="call text too long to read", error_kind="malformed")]
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return [RawCall(start, end, error=f"not a Python call list ({type(exc).__name__})", error_kind="malformed")]
    body = tree.body
    nodes = body.elts if isinstance(body, (ast.List, ast.Tuple)) else [body]
    out: list[RawCall] = []
    for node in nodes:
        if not isinstance(node, ast.Call):
            out.append(RawCall(start, end, error=f"expected a call, got {type(node).__name__}", error_kind="malformed"))
            continue
        name = _dotted(node.func)
        if builtin and name and name.endswith(".call"):
            name = name[: -len(".call")]
        if name is None:
            out.append(RawCall(start, end, error="the called thing is not a name", error_kind="missing_name"))
            continue
        try:
            if node.args:
                raise NotLiteral("positional arguments are not allowed; use name=value")
            args = {kw.arg: node_value(kw.value) for kw in node.keywords if kw.arg is not None}
            if any(kw.arg is None for kw in node.keywords):
                raise NotLiteral("'**' arguments are not allowed")
        except (NotLiteral, RecursionError) as exc:
            out.append(RawCall(start, end, name=name, error=f"arguments: {exc}", error_kind="bad_json"))
            continue
        out.append(RawCall(start, end, name=name, arguments=args))
    _split_spans(text, start, end, out, nodes)
    return out


def _split_spans(text: str, start: int, end: int, calls: list[RawCall], nodes: list[ast.AST]) -> None:
    """Give each call of a list its own character span (the list's brackets go to the first/last)."""
    if len(calls) < 2:
        return
    lead = len(text[start:end]) - len(text[start:end].lstrip())
    base = start + lead
    source = text[start:end].strip()
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    def pos(lineno: int | None, col: int | None) -> int | None:
        if lineno is None or col is None or lineno - 1 >= len(lines):
            return None
        # col_offset counts UTF-8 bytes
        line = lines[lineno - 1].encode("utf-8")[:col].decode("utf-8", "ignore")
        return base + offsets[lineno - 1] + len(line)

    bounds = []
    for node in nodes:
        a = pos(getattr(node, "lineno", None), getattr(node, "col_offset", None))
        b = pos(getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None))
        if a is None or b is None:
            return
        bounds.append((a, b))
    for k, call in enumerate(calls):  # contiguous: brackets and separators belong to the calls
        call.start = start if k == 0 else bounds[k - 1][1]
        call.end = end if k == len(calls) - 1 else bounds[k][1]


class PythonicParser(ToolParser):
    name = "pythonic"
    description = "<|tool_call_start|>[f(a=1), g(b='x')]<|tool_call_end|> (LFM2.5)"
    delimiters = ("<|tool_call_start|>", "<|tool_call_end|>")
    signature = delimiters

    def compile(self) -> None:
        self._open = re.compile(self.p("<|tool_call_start|>"))
        self._close = re.compile(self.p("<|tool_call_end|>"))

    def find_calls(self, view: TokenText, start: int, end: int) -> list[RawCall]:
        out: list[RawCall] = []
        for block in blocks(view.text, self._open, self._close, start, end, self.stops):
            if block.truncated:
                out.append(RawCall(block.start, block.end, error=TRUNCATED, error_kind="truncated"))
                continue
            stop = block.body_end
            for i in range(block.body_start, block.body_end):  # an unclosed block ends at a turn end
                if view.text[i] in self.stops:
                    stop = i
                    break
            calls = calls_in_python(view.text, block.body_start, stop)
            if not calls:
                out.append(RawCall(block.start, block.end, error="empty tool call", error_kind="malformed"))
                continue
            calls[0].start = block.start
            calls[-1].end = block.end if block.closed else stop
            if not block.closed:
                for call in calls:
                    call.repairs.append("missing close tag")
            out.extend(calls)
        return out
