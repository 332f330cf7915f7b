"""Ready-made :class:`~tmpl.harness.Harness` specs of real agent harnesses (docs/harnesses.md).

Each module holds a ``HARNESSES`` dict (name -> spec), one module per way they are installed:
:mod:`.npm` (the npm CLIs), :mod:`.pypi` (harnesses from PyPI and SDK-built agents), :mod:`.npm_more`
(more npm CLIs). :func:`get` finds one by name, :func:`names` lists them all.

>>> "claude-code" in names()  # doctest: +SKIP
True
"""

from __future__ import annotations

from ...errors import HarnessSpecError
from ..spec import Harness
from . import npm, npm_more, pypi

__all__ = ["get", "names"]

_MODULES = (npm, npm_more, pypi)


def _all() -> dict[str, Harness]:
    out: dict[str, Harness] = {}
    for module in _MODULES:
        for name, spec in module.HARNESSES.items():
            if name in out:
                raise HarnessSpecError(name, f"named twice in tmpl.harness.catalog ({module.__name__})")
            out[name] = spec
    return out


def names() -> list[str]:
    """Every shipped harness spec's name, sorted."""
    return sorted(_all())


def get(name: str) -> Harness:
    """The shipped spec called ``name``; :class:`~tmpl.errors.HarnessSpecError` lists the known ones."""
    found = _all().get(name)
    if found is None:
        raise HarnessSpecError(name, f"no such harness in tmpl.harness.catalog; known: {', '.join(names())}")
    return found
