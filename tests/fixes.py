"""``make_training_safe`` of a template, made once per test process.

tests/test_fix.py and tests/test_generation_markers.py check the same fixes (the first that each is
SAFE or refused with a reason, the second that its generation markers give the trajectory's loss mask);
a fix searches and proves for seconds (Gemma 4: 15-20 s), so they share this cache, and
tests/conftest.py's ``SERIAL_GROUPS`` runs both modules on one worker.

>>> result = fixed("qwen3")   # a FixResult, or the TemplateFixError that refused it  # doctest: +SKIP
"""

from __future__ import annotations

import functools

import tmpl
from tmpl.errors import TemplateFixError
from tmpl.report import make_training_safe

from .conftest import template_under_test


@functools.lru_cache(maxsize=None)
def fixed(key: str) -> tmpl.report.FixResult | TemplateFixError:
    """The fix of the template ``key`` names (a family folder or a catalog template), or its refusal."""
    try:
        return make_training_safe(template_under_test(key))
    except TemplateFixError as exc:
        return exc
