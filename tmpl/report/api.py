"""``check`` (a template's report, kept per fingerprint; templates tmpl did not ship are checked under a
budget, see :mod:`tmpl.report.budget`) and ``training_safe`` (a shipped variant)."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from functools import lru_cache
from typing import Any

from .. import templates
from ..chat_template import ChatTemplate
from ..errors import BudgetExceededError, TemplateError
from .budget import DEFAULT_BUDGET, Budget, in_worker, run_budgeted, worker_crashed
from .report import UNPROVEN, TemplateReport, Verdict, build_report


@lru_cache(maxsize=1)
def _shipped_texts() -> frozenset[str]:
    return frozenset(templates.load(info.name) for info in templates.available())


def is_shipped(tpl: ChatTemplate) -> bool:
    """Whether ``tpl``'s template text is one tmpl ships (trusted: checked without a budget by default)."""
    return tpl.template in _shipped_texts()


_MISSING = object()


def _missing() -> Any:
    raise KeyError(_MISSING)


def _known(tpl: ChatTemplate, key: str) -> Any:
    """The value memoized under ``key`` for ``tpl``'s fingerprint, or None (computes nothing)."""
    try:
        return tpl.engine.state.memo(key, _missing)
    except KeyError as exc:
        if exc.args != (_MISSING,):
            raise
        return None


#: reports that ran out of a budget, per (fingerprint, budget): the same budget is not tried twice
_EXCEEDED: OrderedDict[tuple[str, Budget], TemplateReport] = OrderedDict()


def check(tpl: ChatTemplate, budget: Budget | None = None) -> TemplateReport:
    """Probe ``tpl`` and judge it for token-in/token-out training (kept per template fingerprint).

    A template tmpl does not ship is checked in a worker process under ``budget`` (default
    :data:`~tmpl.report.budget.DEFAULT_BUDGET`: 60 s, 4 GB, 10M characters per render); a shipped one
    in this process unless a ``budget`` is given. When the budget runs out, the report's verdicts are
    ``UNPROVEN (budget exceeded: ...)`` and its notes say which budget and its limit; a larger budget
    checks again. A template that raises or hits Jinja's sandbox gets its usual report.

    >>> print(check(tpl).to_markdown())                         # doctest: +SKIP
    >>> check(tpl, budget=Budget.parse("5s,1GB")).verdicts       # doctest: +SKIP
    """
    report = _check(tpl, budget)
    # kept per fingerprint: another template with the same text (and tokenizer) gets its own name
    return report if report.name == tpl.name else dataclasses.replace(report, name=tpl.name)


def _check(tpl: ChatTemplate, budget: Budget | None) -> TemplateReport:
    if budget is None and (in_worker() or is_shipped(tpl)):
        return tpl.engine.state.memo("report", lambda: build_report(tpl))
    found = _known(tpl, "report")
    if found is not None:
        return found  # type: ignore[no-any-return]
    budget = budget or DEFAULT_BUDGET
    key = (tpl.fingerprint, budget)
    if key in _EXCEEDED:
        return _EXCEEDED[key]
    try:
        report = run_budgeted(build_report, tpl, budget=budget, name=tpl.name)
    except BudgetExceededError as exc:
        report = exceeded_report(tpl, exc)
        _EXCEEDED[key] = report
        while len(_EXCEEDED) > 256:
            _EXCEEDED.popitem(last=False)
        return report
    except TemplateError as exc:
        if not worker_crashed(exc):
            raise
        return exceeded_report(tpl, exc)  # the worker crashed (native code): nothing was proven
    return tpl.engine.state.memo("report", lambda: report)


def template_info(tpl: ChatTemplate) -> tuple[str, str, str]:
    """``(name, fingerprint, tokenizer)`` of ``tpl``: what a report says about a template it could not check."""
    return tpl.name, tpl.fingerprint, str(getattr(tpl.tokenizer, "name_or_path", "") or type(tpl.tokenizer).__name__)


def exceeded_report(tpl: ChatTemplate, error: TemplateError) -> TemplateReport:
    """The report of a template whose check did not finish (``error``: a
    :class:`~tmpl.errors.BudgetExceededError` or a crashed worker): every verdict ``UNPROVEN``, with why."""
    return unproven_report(*template_info(tpl), error)


def unproven_report(name: str, fingerprint: str, tokenizer: str, error: TemplateError) -> TemplateReport:
    """:func:`exceeded_report` from the template's ``name``, ``fingerprint`` and ``tokenizer`` alone."""
    reason = error.reason
    verdict = Verdict(UNPROVEN, reason)
    return TemplateReport(
        name=name,
        fingerprint=fingerprint,
        tokenizer=tokenizer,
        plain_renders=None,  # not found out: "n/a", not "no"
        plain_error=None,
        tool_renders=None,
        tool_error=None,
        calls_visible=None,
        results_visible=None,
        max_parallel_calls=0,
        parser=None,
        plain_close=None,
        tool_close=None,
        close_is_eos=None,
        after_close=None,
        generation_prompt=None,
        generation_prompt_ids=[],
        stop_tokens=[],
        stability={},
        date_injected=None,
        reasoning_rendered=None,
        fast_path={},
        per_call_classes=[],
        history_dependence=None,
        splice_safe=None,
        splice_detail=None,
        assistant_mask=None,
        verdicts={
            "tool_loop": verdict,
            "multi_user": dataclasses.replace(verdict),
            "env_turns": dataclasses.replace(verdict),
        },
        notes=[f"the check did not finish: {reason}; nothing below was found out"],
    )


def training_safe(tpl: ChatTemplate, use: str = "tool_loop") -> ChatTemplate:
    """The training-safe template tmpl ships for ``tpl``, or ``tpl`` itself when it needs none.

    When :func:`check` says ``SAFE WITH tmpl TEMPLATE X`` for ``use`` (``"tool_loop"`` or
    ``"multi_user"``), the shipped template X (which renders the last turn exactly as the
    original does) is returned on the same tokenizer, with the same stop tokens and kwargs.
    """
    verdict = check(tpl).verdicts[use]
    if verdict.template is None:
        return tpl
    return ChatTemplate(
        tpl.tokenizer,
        templates.load(verdict.template),
        name=verdict.template,
        extra_stop_token_ids=tpl.extra_stop_token_ids,
        **tpl.template_kwargs,
    )
