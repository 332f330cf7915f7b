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
   or names that read a "last ..." variable (``ns.last_query_index``, ``user_messages[-1]``)
   (:mod:`.analyze`, walking the AST with :mod:`.visitor`).
2. A copy of the template with each atom wrapped in a recording call is rendered on randomized
   probe conversations as they grow (:mod:`.probes`: prompt, assistant turn last, tool results
   appended, a new user turn appended). An atom whose value for a message changes once later
   messages are appended makes that message's render position-dependent. Its value while the
   message was the last one (the branch the last turn takes) must be the same in every case; the
   atom's text in the condition is then replaced by that constant (:mod:`.rewrite`: a span edit of
   the source, at the exact place the lexer located; the result is parsed again).
3. ``strftime_now`` calls that no kwarg pins are wrapped as ``(date_string if date_string is
   defined else strftime_now(...))``; ``{% generation %}`` markers are added around exactly what
   the model generated (:func:`.rewrite.add_generation_markers`), when the mask they give is exact.
4. The proof (:mod:`.prove`): the template's report on the result (tool loop must be ``SAFE``),
   the last turn and the generation prompt identical to the original's on the probe
   conversations (full renders, compared as text), suffixes equal to full renders, the date
   pinned by the kwarg. Anything unproven raises :class:`~tmpl.errors.TemplateFixError` with the
   reason.

>>> fixed = make_training_safe(tpl)                  # doctest: +SKIP
>>> for change in fixed.changes: print(change)       # doctest: +SKIP
line 48: `loop.last` -> `true` (...)
>>> fixed.template.render(messages)                  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import jinja2

from ...chat_template import ChatTemplate
from ...errors import TemplateEditError, TemplateFixError
from .. import jinja_source as js
from ..api import check
from ..report import SAFE, SAFE_WITH, UNSUPPORTED, TemplateReport, Verdict
from .prove import assistant_mask_step, prove, tool_loop_counterexample, where
from .rewrite import add_generation_markers, has_generation_markers, pin_date, pin_positions
from .types import Change, FixResult, ProofStep


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


@dataclass
class _Draft:
    """The rewrite so far: its source and changes, the atoms it could not pin, notes, the date kwarg."""

    source: str
    changes: list[Change]
    unresolved: list[str]
    notes: list[str]
    date_kwarg: str | None = None


def _make(tpl: ChatTemplate) -> FixResult:
    """Check, rewrite, mark, prove: the result, or a refusal raised at the first step that cannot go on."""
    report = check(tpl)
    tool_loop = _fixable_tool_loop(tpl, report)
    draft = _rewrite(tpl, report, tool_loop)
    fixed, mask = _mark_generation(tpl, draft)
    proof, after = prove(tpl, fixed, report.max_parallel_calls, draft.date_kwarg, mask)
    failed = [p for p in proof if not p.ok]
    if failed:
        err = _refuse(
            tpl,
            "; ".join(f"{p.name} fails ({p.detail})" for p in failed) + _also(draft.unresolved),
            draft.changes,
            after,
        )
        err.source = fixed.template
        raise err
    return FixResult(
        name=tpl.name,
        source=fixed.template,
        original=tpl.template,
        changes=sorted(draft.changes, key=lambda c: c.line),
        proof=proof,
        verdicts_before={use: v.label for use, v in report.verdicts.items()},
        verdicts_after={use: v.label for use, v in after.verdicts.items()},
        template=fixed,
        notes=draft.notes,
    )


def _fixable_tool_loop(tpl: ChatTemplate, report: TemplateReport) -> Verdict:
    """The template's own tool-loop verdict; refuses when no rewrite of the template can help."""
    tool_loop = _own_verdict(report.verdicts["tool_loop"])
    if report.splice_detail is not None:
        raise _refuse(
            tpl,
            f"the turn close is not a single token of this tokenizer ({report.splice_detail}); no rewrite of the "
            "template makes a stop token of it",
        )
    if tool_loop.level == UNSUPPORTED:
        raise _refuse(tpl, f"the template does not render a usable tool conversation ({tool_loop.reason})")
    return tool_loop


def _own_verdict(verdict: Verdict) -> Verdict:
    """The template's own verdict under a ``SAFE WITH tmpl TEMPLATE`` one (which keeps it as its reason)."""
    if verdict.level != SAFE_WITH:
        return verdict
    level, _, reason = verdict.reason.partition(" (")
    return Verdict(level, reason.removesuffix(")"))


def _rewrite(tpl: ChatTemplate, report: TemplateReport, tool_loop: Verdict) -> _Draft:
    """Position atoms pinned, then the date; refuses an unsafe tool loop that no edit touches."""
    env = js.environment()
    try:
        env.parse(tpl.template)
        source, changes, unresolved = pin_positions(env, tpl, tpl.template, report.max_parallel_calls)
    except (jinja2.TemplateError, TemplateEditError) as exc:
        raise _refuse(tpl, f"cannot edit the template's source: {exc}") from exc
    draft = _Draft(source, changes, unresolved, notes=list(unresolved))
    if report.date_injected:
        draft.source, dated, draft.date_kwarg = pin_date(env, tpl, draft.source)
        draft.changes += dated
    if tool_loop.level != SAFE and not draft.changes:
        raise _refuse(
            tpl,
            f"the tool loop is unsafe ({tool_loop.reason}) and no if-test reading a message's position is the "
            f"cause (pinning one changes nothing); {where(report)}" + _also(unresolved),
            report=report,
        )
    return draft


def _mark_generation(tpl: ChatTemplate, draft: _Draft) -> tuple[ChatTemplate, ProofStep | None]:
    """The fixed template, with ``{% generation %}`` markers around what the model generated where the mask
    they give is right, and the mask's proof step (None when the result has no markers)."""
    if has_generation_markers(draft.source):
        fixed = _fixed(tpl, draft.source)
        return fixed, assistant_mask_step(fixed)
    unmarked = _fixed(tpl, draft.source)
    marked, marker_changes, why = add_generation_markers(js.environment(), unmarked)
    if why is not None:
        draft.notes.append(f"no {{% generation %}} markers added: {why}")
        return unmarked, None
    fixed = _fixed(tpl, marked)
    mask = assistant_mask_step(fixed)
    if not mask.ok:
        draft.notes.append(f"no {{% generation %}} markers added: {mask.detail}")
        return unmarked, None
    draft.changes += marker_changes
    return fixed, mask


def _fixed(tpl: ChatTemplate, source: str) -> ChatTemplate:
    """``source`` as a template on ``tpl``'s tokenizer, stop tokens and kwargs."""
    return ChatTemplate(
        tpl.tokenizer,
        source,
        name=f"{tpl.name} (training-safe)",
        extra_stop_token_ids=tpl.extra_stop_token_ids,
        **tpl.template_kwargs,
    )


def _also(unresolved: Sequence[str]) -> str:
    """The atoms left unpinned, appended to a refusal's reason."""
    return f"; {'; '.join(unresolved)}" if unresolved else ""


def _refuse(
    tpl: ChatTemplate, reason: str, changes: Sequence[Change] = (), report: TemplateReport | None = None
) -> TemplateFixError:
    """The refusal, with the tool-loop counterexample of ``report`` (the original's or the rewrite's)."""
    err = TemplateFixError(tpl.name, reason, tuple(str(c) for c in changes))
    found = tool_loop_counterexample(report) if report is not None else None
    err.counterexample = found[1] if found else None
    return err


__all__ = ["Change", "FixResult", "ProofStep", "make_training_safe"]
