"""Trajectories: token IDs, loss mask and logprobs that can never drift apart, with one budget.

:class:`Trajectory` is compiled (``_builder_c.pyx``) with a pure-Python twin
(``_builder_py.py``) of the same names, chosen once at import (see :mod:`tmpl._compat`);
:mod:`.types` holds the vocabulary both share (:class:`Status`, :class:`Span`, reasons);
:mod:`.batch` pads many trajectories into a trainer's batch.

>>> import tmpl
>>> t = tmpl.Trajectory([1, 2], max_length=8)
>>> t.add_completion([3, 4], [-0.5, -0.25]), t.add_suffix([5])
(2, 1)
>>> t.completion_ids.tolist(), t.mask.tolist()
([3, 4, 5], [1, 1, 0])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .batch import collate, collate_arrays
from .types import Span, Status

if TYPE_CHECKING:
    from ._builder_py import Trajectory


def __getattr__(name: str) -> Any:
    # The twin is picked by tmpl._compat, which imports this package's compiled module first:
    # resolving the name lazily keeps that import free of cycles.
    if name == "Trajectory":
        from .. import _compat

        return _compat.builder.Trajectory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Span", "Status", "Trajectory", "collate", "collate_arrays"]
