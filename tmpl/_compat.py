"""Decides, once at import, whether tmpl runs on its compiled core or on its pure-Python twins.

Each compiled module has a pure-Python twin beside it with the same public names and the same
behaviour (``tmpl._ids_c`` / ``tmpl/_ids_py.py``, ``tmpl.trajectory._builder_c`` /
``tmpl/trajectory/_builder_py.py``, ``tmpl.episode._episode_c`` / ``tmpl/episode/_episode_py.py``; the Cython sources are in the repository's ``_native/``).
:data:`NATIVE` is True when every compiled module is built (found beside its twin) and
``TMPL_PURE`` is not set; this module imports nothing of tmpl's to decide it. A built module that
then fails to import turns every twin pure (:func:`fall_back`), never the import of tmpl into an
error. Each twin is then picked where it is used, the yarl way::

    if TYPE_CHECKING or not NATIVE:
        from . import _ids_py as ids
    else:
        from . import _ids_c as ids

The token-ID twin is held here (``_compat.ids``), the builder twin by
:mod:`tmpl.trajectory._twin` (``_twin.builder``), the episode twin by :mod:`tmpl.episode._twin`
(``_twin.episode``): code calls a twin through its holder
(``_compat.ids.common_prefix_len(...)``), so a test can swap twins (:data:`HOLDERS`).

>>> from tmpl import _compat
>>> _compat.ids.common_prefix_len([1, 2, 3], [1, 2, 4])
2
"""

from __future__ import annotations

import importlib
import os
from importlib.machinery import PathFinder
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

__all__ = ["HOLDERS", "NATIVE", "PURE_ENV", "REASON", "TWINS", "TWIN_MODULES", "fall_back", "ids", "load"]

#: Twin modules by short name: (compiled module, pure-Python module).
TWINS: dict[str, tuple[str, str]] = {
    "ids": ("tmpl._ids_c", "tmpl._ids_py"),
    "builder": ("tmpl.trajectory._builder_c", "tmpl.trajectory._builder_py"),
    "episode": ("tmpl.episode._episode_c", "tmpl.episode._episode_py"),
}
#: Short names of the twin modules.
TWIN_MODULES: tuple[str, ...] = tuple(TWINS)
#: The module whose attribute of the same short name is the twin in use.
HOLDERS: dict[str, str] = {"ids": "tmpl._compat", "builder": "tmpl.trajectory._twin", "episode": "tmpl.episode._twin"}

#: Environment variable that forces the pure-Python twins when set to a non-empty, non-"0" value.
PURE_ENV = "TMPL_PURE"


def load(kind: str) -> dict[str, ModuleType]:
    """Import every twin module of one kind: ``"native"`` or ``"pure"`` (for tests and benchmarks,
    once tmpl is imported).

    Raises ``ImportError`` when a compiled module is missing (not built).
    """
    if kind not in ("native", "pure"):
        raise ValueError(f"kind must be 'native' or 'pure', not {kind!r}")
    which = 0 if kind == "native" else 1
    return {name: importlib.import_module(paths[which]) for name, paths in TWINS.items()}


def _unbuilt() -> list[str]:
    """The compiled modules not found beside their twins (looked up on disk, nothing imported)."""
    root = Path(__file__).resolve().parent
    missing = []
    for compiled, _ in TWINS.values():
        *folders, leaf = compiled.split(".")[1:]
        if PathFinder.find_spec(leaf, [str(root.joinpath(*folders))]) is None:
            missing.append(compiled)
    return missing


def _choose() -> tuple[bool, str]:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return False, f"{PURE_ENV} is set"
    missing = _unbuilt()
    if missing:  # not built: the package still works on its twins
        return False, f"compiled core unavailable (not built: {', '.join(missing)})"
    return True, "compiled core imported"


NATIVE, REASON = _choose()


def fall_back(module: str, exc: ImportError) -> None:
    """A compiled module was found but does not import (built for another Python or numpy, a broken
    build): every twin is the pure one from here on, and :data:`REASON` says which module failed and why.
    Called by a twin's holder before it takes the pure twin itself."""
    global NATIVE, REASON, ids
    from . import _ids_py

    NATIVE, REASON, ids = False, f"compiled core unavailable ({module} failed to import: {exc})", _ids_py


if TYPE_CHECKING or not NATIVE:  # the type checker sees the pure twin; the compiled one has the same names
    from . import _ids_py as ids
else:
    try:
        from . import _ids_c as ids
    except ImportError as _exc:
        fall_back("tmpl._ids_c", _exc)
