"""Inside a budget's worker only: the Jinja hooks that refuse a value or a render past ``output_chars``, and the
process limits (address space, CPU time) set when a job starts."""

from __future__ import annotations

import functools
import math
import resource
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .limits import _MB, Budget


class _Exceeded(BaseException):
    """Raised in a worker by a hook; a ``BaseException`` so that no ``except Exception`` on the way
    (Jinja, transformers, tmpl's renderer) turns it into an ordinary render failure."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(what, detail)
        self.what = what
        self.detail = detail


@dataclass
class _Limits:
    budget: Budget
    max_render: int = 0  # the longest render seen (for measurements)


_LIMITS: _Limits | None = None


def _charge(size: int, what: str) -> None:
    assert _LIMITS is not None
    if size > _LIMITS.budget.output_chars:
        raise _Exceeded("output_chars", f"{what} of {size:,} items")


def _sized(x: Any) -> bool:
    return isinstance(x, (str, list, tuple))


def _call_binop(self: Any, _context: Any, operator: str, left: Any, right: Any) -> Any:
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if _sized(seq) and isinstance(n, int) and not isinstance(n, bool):
                _charge(len(seq) * max(n, 0), "a value built by '*'")
    elif operator == "+" and _sized(left) and _sized(right):
        _charge(len(left) + len(right), "a value built by '+'")
    elif operator == "**" and isinstance(left, (int, float)) and isinstance(right, (int, float)):
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            _charge(int(right * math.log10(abs(left))), "a number built by '**' (digits)")
    return self.binop_table[operator](left, right)


def _bounded_concat(parts: Iterable[str]) -> str:
    assert _LIMITS is not None
    limit, total, out = _LIMITS.budget.output_chars, 0, []
    try:
        for part in parts:
            total += len(part)
            if total > limit:
                raise _Exceeded("output_chars", f"a render longer than {limit:,} characters")
            out.append(part)
        text = "".join(out)
    except MemoryError:
        raise _Exceeded("memory_mb", "a render ran out of memory") from None
    _LIMITS.max_render = max(_LIMITS.max_render, total)
    return text


def _install_hooks(budget: Budget) -> None:
    """Jinja hooks for this (worker) process only: sized binary operators, counted output."""
    global _LIMITS
    _LIMITS = _Limits(budget)
    from jinja2.sandbox import SandboxedEnvironment

    SandboxedEnvironment.intercepted_binops = frozenset({"*", "+", "**"})
    SandboxedEnvironment.call_binop = _call_binop  # type: ignore[method-assign, assignment]
    SandboxedEnvironment.concat = staticmethod(_bounded_concat)
    try:  # templates compiled before the fork lack the hooks: only the shipped ones are taken from there
        from transformers.utils import chat_template_utils as ctu

        inherited, trusted = ctu._compile_jinja_template, _TRUSTED
        fresh = functools.lru_cache(maxsize=64)(ctu._cached_compile_jinja_template)

        def compile_template(text: str) -> Any:
            return inherited(text) if text in trusted else fresh(text)

        ctu._compile_jinja_template = compile_template  # type: ignore[assignment]
    except (ImportError, AttributeError):  # pragma: no cover - another transformers layout
        pass
    from ...errors import TemplateRenderError
    from ...render import Renderer

    text = Renderer.text

    def budgeted_text(self: Renderer, *args: Any, **kwargs: Any) -> str:
        try:
            return text(self, *args, **kwargs)
        except TemplateRenderError as exc:  # a MemoryError while compiling or rendering
            if isinstance(exc.__cause__, MemoryError):
                raise _Exceeded("memory_mb", "a render ran out of memory") from None
            raise

    Renderer.text = budgeted_text  # type: ignore[method-assign]


_TRUSTED: frozenset[str] = frozenset()


def _import_hooked_modules() -> None:
    """Once, in the parent: import what the hooks patch and compile the templates tmpl ships (trusted:
    workers use them as compiled here, without hooks), so that no worker pays for either."""
    global _TRUSTED
    if _TRUSTED:
        return
    import jinja2.sandbox  # noqa: F401

    from ... import render, templates  # noqa: F401

    texts = frozenset(templates.load(info.name) for info in templates.available())
    try:
        from transformers.utils import chat_template_utils as ctu

        for text in texts:
            ctu._compile_jinja_template(text)
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass
    _TRUSTED = texts


def _vm_kb(field_name: str) -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:  # pragma: no cover - not Linux
        pass
    return 0


def _set_limits(budget: Budget) -> int:
    """RLIMIT_AS (the address space now plus ``memory_mb``) and RLIMIT_CPU (a backstop); returns the
    address space at the start, in kB."""
    start_kb = _vm_kb("VmSize")
    if start_kb:
        cap = start_kb * 1024 + budget.memory_mb * _MB
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    cpu = int(math.ceil(budget.seconds)) + 5
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    used = int(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]))
    if hard == resource.RLIM_INFINITY or used + cpu <= hard:
        resource.setrlimit(resource.RLIMIT_CPU, (used + cpu, hard))
    return start_kb
