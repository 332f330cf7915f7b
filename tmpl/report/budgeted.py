"""Budgeted forms of the report layer's entry points that sit above :mod:`tmpl.report.fix`:
``make_training_safe_budgeted`` (what ``tmpl fix`` runs on a template tmpl did not ship).

``check`` takes its ``budget=`` in :mod:`tmpl.report.api`; the fixer calls ``check``, so the budgeted
fixer lives here, above both, to keep the imports free of cycles.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..chat_template import ChatTemplate
from .budget import DEFAULT_BUDGET, Budget, in_worker, run_budgeted
from .fix import FixResult, make_training_safe


def _fix_in_worker(tpl: ChatTemplate) -> Any:
    result = make_training_safe(tpl)
    return dataclasses.replace(result, template=None)  # type: ignore[arg-type]  # rebuilt in the parent


def make_training_safe_budgeted(tpl: ChatTemplate, budget: Budget | None = None) -> FixResult:
    """:func:`tmpl.report.make_training_safe` under ``budget`` (default
    :data:`~tmpl.report.budget.DEFAULT_BUDGET`) in a worker process, as ``tmpl fix`` runs it.

    Raises what ``make_training_safe`` raises (:class:`~tmpl.errors.TemplateFixError` on a refusal)
    and :class:`~tmpl.errors.BudgetExceededError` when the budget runs out. The fixed template is
    rebuilt here on ``tpl``'s tokenizer (a tokenizer does not travel between processes).
    """
    if in_worker():
        return make_training_safe(tpl)
    result: FixResult = run_budgeted(_fix_in_worker, tpl, budget=budget or DEFAULT_BUDGET, name=tpl.name)
    fixed = ChatTemplate(
        tpl.tokenizer,
        result.source,
        name=f"{tpl.name} (training-safe)",
        extra_stop_token_ids=tpl.extra_stop_token_ids,
        **tpl.template_kwargs,
    )
    return dataclasses.replace(result, template=fixed)
