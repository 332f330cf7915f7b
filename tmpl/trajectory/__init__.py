"""Trajectories: token IDs, loss mask and logprobs that can never drift apart, with one budget.

:class:`Trajectory` is compiled (``_native/trajectory/_builder_c.pyx``) with a pure-Python twin
(``_builder_py.py``) of the same names, picked here by :data:`tmpl.NATIVE` (see :mod:`tmpl._compat`;
:mod:`._twin` holds the builder module in use);
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

from typing import TYPE_CHECKING

from . import _twin as _twin  # the builder module in use (types.restore_trajectory reaches it here)
from .batch import collate, collate_arrays
from .types import Span, Status

if TYPE_CHECKING:
    from ._builder_py import Trajectory
else:
    Trajectory = _twin.builder.Trajectory

__all__ = ["Span", "Status", "Trajectory", "collate", "collate_arrays"]
