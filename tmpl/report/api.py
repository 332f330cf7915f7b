"""``check`` (a template's report, kept per fingerprint) and ``training_safe`` (a shipped variant)."""

from __future__ import annotations

from .. import templates
from ..chat_template import ChatTemplate
from .report import TemplateReport, build_report


def check(tpl: ChatTemplate) -> TemplateReport:
    """Probe ``tpl`` and judge it for token-in/token-out training (kept per template fingerprint).

    >>> print(check(tpl).to_markdown())  # doctest: +SKIP
    """
    return tpl.engine.state.memo("report", lambda: build_report(tpl))


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
