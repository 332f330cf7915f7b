"""The image-inputs carrier, re-exported: it lives in :mod:`tmpl.trajectory.images`, the trajectory's
layer, so that trajectories, ``collate`` and ``tmpl.export`` can hold it.

>>> from tmpl.vision.inputs import ImageInputs
>>> ImageInputs.empty(9).count
0
"""

from __future__ import annotations

from ..trajectory.images import TOKEN_KEYS, ImageInputs, ImageTrajectory, placeholder_runs

__all__ = ["TOKEN_KEYS", "ImageInputs", "ImageTrajectory", "placeholder_runs"]
