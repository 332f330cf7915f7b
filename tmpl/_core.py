"""Chooses the compiled core or its pure-Python twin, once, at import.

Every module in ``_native/`` (compiled to ``tmpl._native.<name>``) has a twin
``tmpl._pure.<name>`` with the same public names and the same behaviour. The
compiled modules are used when all of them import; ``TMPL_PURE=1`` in the
environment forces the pure twins.

>>> from tmpl import _core
>>> _core.ids.common_prefix_len([1, 2, 3], [1, 2, 4])
2
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

#: Names of the twin modules (``_native/<name>.pyx`` and ``tmpl/_pure/<name>.py``).
TWIN_MODULES: tuple[str, ...] = ("ids", "builder")

#: Environment variable that forces the pure-Python twins when set to a non-empty, non-"0" value.
PURE_ENV = "TMPL_PURE"


def load(kind: str) -> dict[str, ModuleType]:
    """Import every twin module of one kind: ``"native"`` or ``"pure"``.

    Raises ``ImportError`` when a compiled module is missing (not built).
    """
    if kind not in ("native", "pure"):
        raise ValueError(f"kind must be 'native' or 'pure', not {kind!r}")
    package = "tmpl._native" if kind == "native" else "tmpl._pure"
    return {name: importlib.import_module(f"{package}.{name}") for name in TWIN_MODULES}


def _choose() -> tuple[bool, dict[str, ModuleType], str]:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return False, load("pure"), f"{PURE_ENV} is set"
    try:
        return True, load("native"), "compiled core imported"
    except ImportError as exc:  # not built: the package still works on its twins
        return False, load("pure"), f"compiled core unavailable ({exc})"


NATIVE, _modules, REASON = _choose()

ids: ModuleType = _modules["ids"]
builder: ModuleType = _modules["builder"]
