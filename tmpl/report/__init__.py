"""Is a chat template safe for token-in/token-out training? Reports, the matrix, training-safe picks.

This layer sits above :class:`~tmpl.ChatTemplate`: it takes one and probes it.

>>> import tmpl
>>> tpl = tmpl.ChatTemplate.from_pretrained("Qwen/Qwen3-4B")       # doctest: +SKIP
>>> tmpl.report.check(tpl).verdicts["tool_loop"].label              # doctest: +SKIP
'SAFE WITH tmpl TEMPLATE qwen3'
>>> safe = tmpl.report.training_safe(tpl)                           # doctest: +SKIP
>>> safe.name                                                       # doctest: +SKIP
'qwen3'
>>> fixed = tmpl.report.make_training_safe(tpl)    # any template: rewritten, proven  # doctest: +SKIP
>>> print(fixed.to_text())                                          # doctest: +SKIP
"""

from __future__ import annotations

from .api import check, training_safe
from .budget import DEFAULT_BUDGET, Budget, run_budgeted
from .budgeted import make_training_safe_budgeted
from .fix import Change, FixResult, ProofStep, make_training_safe
from .report import SAFE, SAFE_WITH, UNPROVEN, UNSAFE, UNSUPPORTED, TemplateReport, Verdict, build_report

__all__ = [
    "DEFAULT_BUDGET",
    "Budget",
    "Change",
    "FixResult",
    "ProofStep",
    "SAFE",
    "SAFE_WITH",
    "UNPROVEN",
    "UNSAFE",
    "UNSUPPORTED",
    "TemplateReport",
    "Verdict",
    "build_report",
    "check",
    "make_training_safe",
    "make_training_safe_budgeted",
    "run_budgeted",
    "training_safe",
]
