"""What a chat template reads, found in its Jinja AST: reasoning fields and rendering kwargs.

The probe space (:mod:`tmpl.report.space`) must send reasoning under the field a template reads
(``reasoning_content`` for Qwen3, ``thinking`` for gpt-oss, ...) and try the kwargs a template
branches on (``enable_thinking``, ``reasoning_effort``, ...): a verdict proven without them
says nothing about the conversations real models produce.

>>> reads = template_reads("{% for m in messages %}{{ m.reasoning_content }}{% endfor %}"
...                        "{% if enable_thinking is false %}x{% endif %}")
>>> reads.reasoning_fields, reads.kwargs
(('reasoning_content',), {'enable_thinking': (True, False)})
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import jinja2
from jinja2 import meta, nodes

#: fields under which models and trainers pass an assistant turn's reasoning
KNOWN_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
#: names every chat template gets from transformers (or defines itself): never a kwarg to vary
CONTEXT_NAMES = frozenset(
    {
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "bos_token",
        "eos_token",
        "pad_token",
        "unk_token",
        "sep_token",
        "cls_token",
        "mask_token",
        "additional_special_tokens",
        "raise_exception",
        "strftime_now",
        "range",
        "namespace",
        "dict",
        "lipsum",
        "cycler",
        "joiner",
        "true",
        "false",
        "none",
        "True",
        "False",
        "None",
        "date_string",
        "custom_tools",
        "tools_in_user_message",
        "builtin_tools",
        "xml_tools",
        "python_tools",
        "model_identity",
        "system_message",
        "continue_final_message",
    }
)
#: how many distinct string values of one kwarg are tried at most
MAX_VALUES = 4


@dataclass(frozen=True)
class TemplateReads:
    """Reasoning fields and rendering kwargs one template reads (each kwarg with the values to try)."""

    reasoning_fields: tuple[str, ...] = ()
    kwargs: dict[str, tuple[Any, ...]] = field(default_factory=dict)


def _is_reasoning_name(name: str) -> bool:
    low = name.lower()
    return name in KNOWN_REASONING_FIELDS or any(w in low for w in ("reason", "think", "thought"))


def _field_names(tree: nodes.Template) -> set[str]:
    """Every ``x.name`` and ``x['name']`` the template reads."""
    out = {n.attr for n in tree.find_all(nodes.Getattr)}
    for n in tree.find_all(nodes.Getitem):
        arg = getattr(n, "arg", None)
        if isinstance(arg, nodes.Const) and isinstance(arg.value, str):
            out.add(arg.value)
    # ``'reasoning_content' in message`` and ``message.get('thinking')``
    for const in tree.find_all(nodes.Const):
        if isinstance(const.value, str) and const.value in KNOWN_REASONING_FIELDS:
            out.add(const.value)
    return out


def _compared_constants(tree: nodes.Template, name: str) -> list[Any]:
    """String constants ``name`` is compared with (``reasoning_effort == 'high'``, ``in ['low', ...]``)."""
    found: list[Any] = []
    for cmp in tree.find_all(nodes.Compare):
        operands = [cmp.expr] + [op.expr for op in cmp.ops]
        if not any(isinstance(o, nodes.Name) and o.name == name for o in operands):
            continue
        for o in operands:
            if isinstance(o, nodes.Const) and isinstance(o.value, str):
                found.append(o.value)
            elif isinstance(o, (nodes.List, nodes.Tuple)):
                found += [i.value for i in o.items if isinstance(i, nodes.Const) and isinstance(i.value, str)]
    return list(dict.fromkeys(found))[:MAX_VALUES]


def template_reads(source: str, env: jinja2.Environment | None = None) -> TemplateReads:
    """The reasoning fields and kwargs ``source`` reads (empty when it does not parse)."""
    if env is None:
        from .jinja_source import environment

        env = environment()
    try:
        tree = env.parse(source)
    except jinja2.TemplateSyntaxError:
        return TemplateReads()
    names = _field_names(tree)
    reasoning = tuple(sorted((n for n in names if _is_reasoning_name(n)), key=_reasoning_order))
    kwargs: dict[str, tuple[Any, ...]] = {}
    for name in sorted(_free_names(tree) - CONTEXT_NAMES):
        if name.endswith("_token") or name.startswith("_"):
            continue
        values = _compared_constants(tree, name)
        if not values and "effort" in name:
            values = ["low", "medium", "high"]
        kwargs[name] = tuple(values) if values else (True, False)
    return TemplateReads(reasoning, kwargs)


def _free_names(tree: nodes.Template) -> set[str]:
    """Names the caller may pass: read and never assigned, or tested with ``is defined``; never a
    loop variable or a macro argument."""
    tested = {
        t.node.name
        for t in tree.find_all(nodes.Test)
        if t.name in ("defined", "undefined") and isinstance(t.node, nodes.Name)
    }
    targets: list[nodes.Node] = [a.target for a in tree.find_all(nodes.Assign)]
    targets += [a.target for a in tree.find_all(nodes.AssignBlock)]
    assigned = {n.name for t in targets for n in t.find_all(nodes.Name)}
    assigned |= {t.name for t in targets if isinstance(t, nodes.Name)}
    names = (set(meta.find_undeclared_variables(tree)) - assigned) | tested
    bound: set[str] = set()
    for loop in tree.find_all(nodes.For):
        target: nodes.Node = loop.target
        bound |= {n.name for n in target.find_all(nodes.Name)} | (
            {target.name} if isinstance(target, nodes.Name) else set()
        )
    for m in tree.find_all(nodes.Macro):
        bound |= {a.name for a in m.args}
    for c in tree.find_all(nodes.CallBlock):
        bound |= {a.name for a in c.args}
    return names - bound


def _reasoning_order(name: str) -> tuple[int, str]:
    return (KNOWN_REASONING_FIELDS.index(name) if name in KNOWN_REASONING_FIELDS else len(KNOWN_REASONING_FIELDS), name)


__all__ = ["KNOWN_REASONING_FIELDS", "TemplateReads", "template_reads"]
