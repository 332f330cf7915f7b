"""``{% generation %}`` markers added around what the model generated, placed by rendering the template with each
message-loop statement instrumented, and proven by the mask they give."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import jinja2
from jinja2 import nodes

from ....chat_template import ChatTemplate
from ....errors import TemplateEditError, TmplError
from ... import jinja_source as js
from ...report import _GENERATION_TAG
from ...space import SPACE_TOOLS
from ..prove import generated, mask_conversations, mask_difference
from ..types import Change

#: the recording call of the probe source (each output statement reports its operands)
SEEN = "tmpl_fix_seen"


#: sentinels the probe source writes around each output statement and between its operands
_BEGIN, _ID_END, _SPLIT, _END = "\ue000", "\ue001", "\ue002", "\ue003"


#: a cut point of an output statement: (operand index, characters into it); (n, 0) is its end
Cut = tuple[int, int]


def has_generation_markers(source: str) -> bool:
    """Whether the source already has ``{% generation %}`` markers."""
    return _GENERATION_TAG.search(source) is not None


def _operands(node: nodes.Node) -> list[nodes.Node]:
    """The operands of a ``+``/``~`` chain, left to right (the node itself when it is none)."""
    if isinstance(node, nodes.Add):
        return _operands(node.left) + _operands(node.right)
    if isinstance(node, nodes.Concat):
        return [x for n in node.nodes for x in _operands(n)]
    return [node]


@dataclass
class _Statement:
    """One ``{{ ... }}`` of the source: where, its operands (printed; string constants by value)."""

    span: js.Span
    text: str
    operands: list[str]
    consts: list[str | None]
    #: the item of the innermost loop over ``messages`` around it (None outside one)
    item: str | None = None


_FOR = re.compile(r"^\{%[-+]?\s*for\s+(\w+)\s+in\s+(.*?)[-+]?%\}$", re.DOTALL)


#: the kwargs key under which a rendering records the role of the message it belongs to
ROLE = "\x00role"


def _message_loops(env: jinja2.Environment, source: str) -> list[tuple[int, int, str]]:
    """``(start, end, item)`` of each ``{% for item in messages... %}`` loop's source."""
    stack: list[tuple[int, str | None]] = []
    out = []
    for t in js.block_tags(env, source):
        if t.keyword == "for":
            m = _FOR.match(source[t.tag_start : t.tag_end])
            stack.append((t.tag_end, m.group(1) if m and "messages" in m.group(2) else None))
        elif t.keyword == "endfor" and stack:
            start, item = stack.pop()
            if item is not None:
                out.append((start, t.tag_start, item))
    return out


def _statements(env: jinja2.Environment, source: str) -> list[_Statement]:
    out = []
    loops = _message_loops(env, source)
    for span in js.output_spans(env, source):
        around = [(b - a, item) for a, b, item in loops if a <= span.tag_start < b]
        item = min(around)[1] if around else None
        text = source[span.start : span.end]
        body = env.parse("{{ " + text + " }}").body[0]
        expr = body.nodes[0] if isinstance(body, nodes.Output) and len(body.nodes) == 1 else None
        ops = _operands(expr) if expr is not None else []
        try:
            printed = [js.expr_source(o) for o in ops] if len(ops) > 1 else [text] * len(ops)
        except TemplateEditError:
            printed = []
        if printed:
            consts = [o.value if isinstance(o, nodes.Const) and isinstance(o.value, str) else None for o in ops]
            out.append(_Statement(span, text, printed, consts, item))
        else:
            out.append(_Statement(span, text, [text], [None], item))
    return out


def _probe_source(source: str, statements: Sequence[_Statement]) -> str:
    """``source`` with each statement reporting its whole value and its operands."""
    edits = []
    for i, st in enumerate(statements):
        ops = ", ".join(st.operands) if len(st.operands) > 1 else "(" + st.text + ")"
        item = f", {st.item}" if st.item else ""
        edits.append((st.span.start, st.span.end, f"{SEEN}({i}, ({st.text}), [{ops}]{item})"))
    return js.apply_edits(source, edits)


def _seen(i: int, whole: Any, ops: list[Any], item: Any = None) -> str:
    role = item.get("role") if isinstance(item, dict) else None
    text = str(whole)
    parts = [str(o) for o in ops]
    if "".join(parts) != text:
        parts = [text]  # not a concatenation of strings (``1 + 2``): one operand
    return f"{_BEGIN}{i}:{role if isinstance(role, str) else ''}{_ID_END}" + _SPLIT.join(parts) + _END


def _parse_probe(text: str) -> tuple[str, list[tuple[int, list[int], str]]]:
    """The clean text of a probe render, and each statement it ran with its operand boundaries and the
    role of its message ('' outside the messages loop)."""
    clean: list[str] = []
    pos = 0
    found: list[tuple[int, list[int], str]] = []
    at = 0
    while True:
        b = text.find(_BEGIN, at)
        if b < 0:
            clean.append(text[at:])
            break
        clean.append(text[at:b])
        pos += b - at
        e = text.index(_ID_END, b)
        sid, _, role = text[b + 1 : e].partition(":")
        i = int(sid)
        end = text.index(_END, e)
        bounds = [pos]
        for part in text[e + 1 : end].split(_SPLIT):
            clean.append(part)
            pos += len(part)
            bounds.append(pos)
        found.append((i, bounds, role))
        at = end + 1
    return "".join(clean), found


def _cuts(st: _Statement, bounds: list[int], p: int) -> set[Cut]:
    """The cut points of ``st`` that fall at clean offset ``p`` in one rendering of it (a string
    constant may be cut anywhere; another operand only at its edges)."""
    out: set[Cut] = set()
    for k in range(len(bounds) - 1):
        if bounds[k] == p:
            out.add((k, 0))
        elif bounds[k] < p < bounds[k + 1] and st.consts[k] is not None:
            out.add((k, p - bounds[k]))
    if bounds[-1] == p:
        out.add((len(bounds) - 1, 0))
    return out


def _at(bounds: list[int], cut: Cut) -> int:
    return bounds[cut[0]] + cut[1] if cut[0] < len(bounds) - 1 else bounds[-1]


@dataclass(frozen=True)
class _Placement:
    """Where a statement's marked part starts and ends, under a kwarg setting (None: any other)."""

    start: Cut
    end: Cut
    when: tuple[str, Any] | None = None


#: the placement that marks nothing
NOTHING = _Placement((0, 0), (0, 0))


def _solve(
    st: _Statement, seen: Sequence[tuple[list[int], tuple[int, int] | None]]
) -> _Placement | None | Literal[False]:
    """The one placement of marks that gives each rendering of ``st`` its marked part (``(a, b)``
    clean offsets, None for nothing marked); False when none does, None when nothing is ever marked."""
    ref = next(((b, m) for b, m in seen if m is not None and m[0] < m[1]), None)
    if ref is None:
        return None
    bounds, (a, b) = ref
    n = len(bounds) - 1
    starts = sorted(_cuts(st, bounds, a), key=lambda c: (c != (0, 0), c))
    ends = sorted(_cuts(st, bounds, b), key=lambda c: (c != (n, 0), c))
    for start in starts:
        for end in ends:
            if end <= start:
                continue
            ok = True
            for bs, m in seen:
                if len(bs) != len(bounds):
                    return False
                x, y = _at(bs, start), _at(bs, end)
                if (m is None and x != y) or (m is not None and (x, y) != m):
                    ok = False
                    break
            if ok:
                return _Placement(start, end)
    return False


def _piece(st: _Statement, frm: Cut, to: Cut) -> str:
    """Jinja source of the operands of ``st`` from cut ``frm`` to cut ``to`` ('' when none)."""
    parts = []
    n = len(st.operands)
    for k in range(n):
        if (k, 0) >= to or (k + 1, 0) <= frm:
            continue
        lo = frm[1] if k == frm[0] else 0
        const = st.consts[k]
        if const is None:
            parts.append(st.operands[k] if n > 1 else st.text)
            continue
        hi = to[1] if k == to[0] else len(const)
        if const[lo:hi]:
            parts.append(js.literal(const[lo:hi]))
    return " ~ ".join(parts)


def _emit(st: _Statement, p: _Placement, opener: str, closer: str) -> str:
    """The statement written with ``{% generation %}`` around its marked part; ``opener``/``closer``
    the whitespace control of the whole (``-`` strips, ``+`` keeps)."""
    n = len(st.operands)
    if p.start == p.end:  # nothing marked
        return ("{{" + opener + " " + st.text + " " + closer + "}}").replace("{{+", "{{").replace("+}}", "}}")
    if p.start == (0, 0) and p.end == (n, 0):
        pre, mid, post = "", st.text, ""
    else:
        pre, mid, post = _piece(st, (0, 0), p.start), _piece(st, p.start, p.end), _piece(st, p.end, (n, 0))
    out = "{{" + opener + " " + pre + " }}" if pre else ""
    out += ("{%" + (opener if not pre else "")) + " generation %}"
    out += "{{ " + mid + " }}"
    out += "{% endgeneration " + (closer if not post else "") + "%}"
    out += "{{ " + post + " " + closer + "}}" if post else ""
    return out.replace("{{+", "{{").replace("+}}", "}}")


def _is_whole(st: _Statement, p: _Placement) -> bool:
    return p.start == (0, 0) and p.end == (len(st.operands), 0)


def _adjacent(source: str, a: _Statement, b: _Statement) -> bool:
    """Whether statement ``b`` follows ``a`` with only whitespace between that a ``-`` strips."""
    gap = source[a.span.tag_end : b.span.tag_start]
    return not gap.strip() and (a.span.closer.startswith("-") or b.span.opener.endswith("-") or not gap)


def _control(span: js.Span) -> tuple[str, str]:
    """The whitespace control the statement's tag has: ``-`` to strip, ``+`` to keep (block tags
    strip a newline and indentation of their own unless told ``+``)."""
    return ("-" if span.opener.endswith("-") else "+"), ("-" if span.closer.startswith("-") else "+")


def add_generation_markers(env: jinja2.Environment, tpl: ChatTemplate) -> tuple[str, list[Change], str | None]:
    """``tpl``'s source with ``{% generation %}`` around exactly what the model generated, decided by
    rendering the search's conversations; the changes; and why no markers were added (None when added).

    Each ``{{ ... }}`` statement reports what it writes (a probe copy of the source); the tokens each
    assistant turn generated (after the generation prompt through the first stop token) give each
    rendering its marked part. A statement marked whole in every rendering is wrapped; one whose
    marked part starts or ends inside it (the role header and the reasoning in one ``+`` expression,
    ``'<|im_end|>\n'``) is split at an operand or a character of a string constant, the same one in
    every rendering, or one for assistant messages when it writes every role's turn (under
    ``{% if message.role == 'assistant' %}``), or one per value of a kwarg that moves it (such as
    ``enable_thinking``). A statement no conversation renders, between two marked whole, is marked
    whole. The result is kept only when ``return_assistant_tokens_mask`` then equals the generated
    tokens on every conversation.
    """
    from transformers.utils.chat_template_utils import _compile_jinja_template

    source = tpl.template
    statements = _statements(env, source)
    probe = ChatTemplate(tpl.tokenizer, _probe_source(source, statements), name=tpl.name, **tpl.template_kwargs)
    convs = [g for m, k in mask_conversations(tpl) if (g := generated(tpl, m, k)) is not None]
    if not convs:
        return source, [], "no conversation of the search renders with its generated tokens"
    per: list[list[tuple[list[int], tuple[int, int] | None, tuple[tuple[str, Any], ...]]]] = [[] for _ in statements]
    for g in convs:
        # transformers turns callables in kwargs into text: the recorder goes into the (cached) template's globals
        _compile_jinja_template(probe.template).globals[SEEN] = _seen
        try:
            raw = probe.renderer.text(g.messages, tools=SPACE_TOOLS, add_generation_prompt=False, **g.kwargs)
        except TmplError:
            return source, [], "the template's output statements cannot be watched (a probe copy fails to render)"
        clean, found = _parse_probe(raw)
        if clean != g.text:
            return source, [], "the template rewrites its own output (a probe copy renders other text)"
        key = tuple(sorted(g.kwargs.items()))
        for i, bounds, role in found:
            s, e = bounds[0], bounds[-1]
            hit = [(max(s, a), min(e, b)) for a, b in g.spans if a < e and s < b]
            if len(hit) > 1:
                return source, [], f"line {statements[i].span.line}: one statement writes two turns' generated text"
            per[i].append((bounds, hit[0] if hit else None, key + (((ROLE, role),) if role else ())))
    decided: list[list[_Placement] | None] = []
    for i, st in enumerate(statements):
        seen = per[i]
        if any(len(b) != len(seen[0][0]) for b, _, _ in seen):  # a rendering that is not a concatenation
            statements[i] = st = _Statement(st.span, st.text, [st.text], [None])
            seen = [([b[0], b[-1]], m, k) for b, m, k in seen]
        placements = _placements(st, seen)
        if placements is False:
            return (
                source,
                [],
                (
                    f"line {st.span.line}: `{{{{ {' '.join(st.text.split())} }}}}` writes text the model generated in "
                    "some renders and text it did not in others, and no one place in it parts the two in every "
                    "rendering (nor one per message role, nor one per value of a kwarg)"
                ),
            )
        decided.append(placements)
    whole = [p is not None and len(p) == 1 and _is_whole(statements[i], p[0]) for i, p in enumerate(decided)]
    # a statement no conversation renders, between two marked whole (a call's arguments given as a string):
    # it writes generated text too
    rendered = [i for i in range(len(statements)) if per[i]]
    unrendered = []
    for i in range(len(statements)):
        before = [j for j in rendered if j < i]
        after = [j for j in rendered if j > i]
        if not per[i] and before and after and whole[before[-1]] and whole[after[0]]:
            whole[i] = True
            unrendered.append(i)
    edits: list[tuple[int, int, str]] = []
    changes = []
    i = 0
    while i < len(statements):
        if whole[i]:
            j = i
            while j + 1 < len(statements) and whole[j + 1] and _adjacent(source, statements[j], statements[j + 1]):
                j += 1
            first, last = statements[i].span, statements[j].span
            opener, closer = _control(first)[0], _control(last)[1]
            open_tag, close_tag = "{%" + opener + " generation %}", "{% endgeneration " + closer + "%}"
            edits.append((first.tag_start, first.tag_start + len(first.opener), open_tag + "{{"))
            edits.append((last.tag_end - len(last.closer), last.tag_end, "}}" + close_tag))
            text = open_tag + "{{ " + statements[i].text + " }}"
            text += (" ... {{ " + statements[j].text + " }}" if i != j else "") + close_tag
            changes.append(
                Change(
                    first.line,
                    " ".join(source[first.tag_start : first.tag_end].split()),
                    text,
                    "marks what the model generates for return_assistant_tokens_mask"
                    + (f" (through line {last.line})" if i != j else "")
                    + (
                        "; includes statements no conversation renders"
                        if any(k in unrendered for k in range(i, j + 1))
                        else ""
                    ),
                )
            )
            i = j + 1
            continue
        placements = decided[i]
        st = statements[i]
        i += 1
        if placements is None:
            continue
        opener, closer = _control(st.span)
        where = ""
        if len(placements) == 1:
            text = _emit(st, placements[0], opener, closer)
        else:
            cond, other = placements
            assert cond.when is not None
            name, value = cond.when
            if name == ROLE:
                test = f"{st.item}.role == {js.literal(value)}"
                where = f"for {value} messages only"
            else:
                test = f"{name} is defined and {name} == {js.literal(value)}"
                where = f"where {name} is {js.literal(value)}, at another place"
            text = (
                "{%"
                + opener
                + f" if {test} %}}"
                + _emit(st, cond, "", "")
                + "{% else %}"
                + _emit(st, other, "", "")
                + "{% endif "
                + closer
                + "%}"
            )
        lines = source.count("\n", st.span.tag_start, st.span.tag_end)
        cut = min(x for x in (text.find("}}"), text.find("%}")) if x >= 0) + 2  # after the first tag: no trimming
        padded = text[:cut] + ("{#" + "\n" * lines + "#}" if lines else "") + text[cut:]
        edits.append((st.span.tag_start, st.span.tag_end, padded))
        changes.append(
            Change(
                st.span.line,
                " ".join(source[st.span.tag_start : st.span.tag_end].split()),
                text,
                "marks what the model generates for return_assistant_tokens_mask, not the turn header before it "
                "or the text after the stop token" + (f" ({where})" if where else ""),
            )
        )
    if not edits:
        return source, [], "no output statement writes the generated tokens"
    marked = source
    for start, end, text in sorted(edits, reverse=True):  # exact: multi-line statements keep their lines in a comment
        marked = marked[:start] + text + marked[end:]
    env.parse(marked)
    check = ChatTemplate(tpl.tokenizer, marked, name=tpl.name, **tpl.template_kwargs)
    for g in convs:
        diff = mask_difference(check, g)
        if diff is not None:
            return source, [], f"with markers at the only places the renders allow, {diff}"
    return marked, changes, None


def _placements(
    st: _Statement, seen: Sequence[tuple[list[int], tuple[int, int] | None, tuple[tuple[str, Any], ...]]]
) -> list[_Placement] | None | Literal[False]:
    """The placement for every rendering of ``st`` (one), or per value of one kwarg (two: under it,
    otherwise); None when nothing is marked; False when no placement fits."""
    one = _solve(st, [(b, m) for b, m, _ in seen])
    if one is None or isinstance(one, _Placement):
        return None if one is None else [one]
    settings = sorted({kv for _, _, key in seen for kv in key}, key=repr)
    for kv in settings:
        under = _solve(st, [(b, m) for b, m, key in seen if kv in key])
        other = _solve(st, [(b, m) for b, m, key in seen if kv not in key])
        if under is False or other is False or (under is None and other is None):
            continue
        return [
            _Placement(under.start, under.end, kv) if under is not None else _Placement((0, 0), (0, 0), kv),
            other if other is not None else NOTHING,
        ]
    return False
