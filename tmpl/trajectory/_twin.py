"""The builder twin in use: the compiled ``_builder_c`` or the pure ``_builder_py``, picked here by
:data:`tmpl.NATIVE` (see :mod:`tmpl._compat`).

Code that builds trajectories or fills batches calls it through this module
(``_twin.builder.collate_arrays(...)``), so a test can swap twins (tests/conftest.py's ``twin``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._compat import NATIVE

if TYPE_CHECKING or not NATIVE:
    from . import _builder_py as builder
else:
    from . import _builder_c as builder

__all__ = ["builder"]
