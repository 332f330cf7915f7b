"""Chooses the compiled core or its pure-Python twin, once, at import.

Each compiled module has a pure-Python twin beside it with the same public names and the
same behaviour (``tmpl/_ids_c.pyx`` / ``tmpl/_ids_py.py``, ``tmpl/trajectory/_builder_c.pyx`` /
``tmpl/trajectory/_builder_py.py``). The compiled modules are used when all of them import;
``TMPL_PURE=1`` in the environment forces the pure twins. Code inside tmpl calls the chosen
twin through this module (``_compat.ids.common_prefix_len(...)``), so a test can swap twins.

>>> from tmpl import _compat
>>> _compat.ids.common_prefix_len([1, 2, 3], [1, 2, 4])
2
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import TYPE_CHECKING

__all__ = ["NATIVE", "PURE_ENV", "REASON", "TWINS", "TWIN_MODULES", "builder", "ids", "load"]

#: Twin modules by short name: (compiled module, pure-Python module).
TWINS: dict[str, tuple[str, str]] = {
    "ids": ("tmpl._ids_c", "tmpl._ids_py"),
    "builder": ("tmpl.trajectory._builder_c", "tmpl.trajectory._builder_py"),
}
#: Short names of the twin modules.
TWIN_MODULES: tuple[str, ...] = tuple(TWINS)

#: Environment variable that forces the pure-Python twins when set to a non-empty, non-"0" value.
PURE_ENV = "TMPL_PURE"


def load(kind: str) -> dict[str, ModuleType]:
    """Import every twin module of one kind: ``"native"`` or ``"pure"``.

    Raises ``ImportError`` when a compiled module is missing (not built).
    """
    if kind not in ("native", "pure"):
        raise ValueError(f"kind must be 'native' or 'pure', not {kind!r}")
    which = 0 if kind == "native" else 1
    return {name: importlib.import_module(paths[which]) for name, paths in TWINS.items()}


def _choose() -> tuple[bool, dict[str, ModuleType], str]:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return False, load("pure"), f"{PURE_ENV} is set"
    try:
        return True, load("native"), "compiled core imported"
    except ImportError as exc:  # not built: the package still works on its twins
        return False, load("pure"), f"compiled core unavailable ({exc})"


NATIVE, _modules, REASON = _choose()

if TYPE_CHECKING:  # the type checker sees the pure twins; the compiled ones have the same names
    from . import _ids_py as ids
    from .trajectory import _builder_py as builder
else:
    ids: ModuleType = _modules["ids"]
    builder: ModuleType = _modules["builder"]
