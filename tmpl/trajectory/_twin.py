"""The builder twin in use: the compiled ``_builder_c`` or the pure ``_builder_py``, picked here by
:data:`tmpl.NATIVE` (see :mod:`tmpl._compat`).

Code that builds trajectories or fills batches calls it through this module
(``_twin.builder.collate_arrays(...)``), so a test can swap twins (tests/conftest.py's ``twin``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _compat

if TYPE_CHECKING or not _compat.NATIVE:
    from . import _builder_py as builder
else:
    try:
        from . import _builder_c as builder
    except ImportError as _exc:  # built but not loadable: every twin turns pure (_compat.fall_back)
        _compat.fall_back("tmpl.trajectory._builder_c", _exc)
        from . import _builder_py as builder

__all__ = ["builder"]
