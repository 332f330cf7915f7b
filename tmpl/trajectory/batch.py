"""Collation of trajectories into a TRL GRPO batch of torch tensors.

The twin in use (``tmpl.trajectory._twin.builder``) fills numpy arrays in one pass; each becomes a tensor
with ``torch.from_numpy`` (no copy) and moves to ``device`` only when one is given.

>>> import tmpl
>>> a = tmpl.Trajectory([11, 12], max_length=16)
>>> a.add_completion([13, 14], [-0.1, -0.2]), a.add_suffix([15])
(2, 1)
>>> b = tmpl.Trajectory([21], max_length=16)
>>> b.add_completion([22], [-0.3])
1
>>> batch = tmpl.collate([a, b], pad_id=0)
>>> batch["prompt_ids"].tolist(), batch["completion_ids"].tolist()
([[11, 12], [0, 21]], [[13, 14, 15], [22, 0, 0]])
>>> batch["completion_mask"].tolist(), batch["tool_mask"].tolist()
([[1, 1, 1], [1, 0, 0]], [[1, 1, 0], [1, 1, 1]])

Trajectories with images (:class:`tmpl.trajectory.images.ImageTrajectory`) add ``num_images`` and
the image arrays (``pixel_values``, ``image_grid_thw``...: every row's, concatenated in order);
:func:`tmpl.trajectory.images.batch_model_inputs` rebuilds the model inputs from such a batch.

Trajectories with mixture-of-experts routes (``Trajectory.add_routes``, ``Rollout(routes=True)``) add
``routes`` (``[B, P + C, layers, top_k]`` over ``cat(prompt_ids, completion_ids)``) and ``routes_mask``
(1 where a route is known; padding and unrouted positions 0).

Given :class:`tmpl.RolloutResult` objects instead, the batch also has ``versions`` (the policy
version of each token, -1 on appended tokens and padding) and ``tool_mask`` is each result's
``loss_mask`` (the rollout's staleness policy applied: a withheld sample has no token in the loss).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _twin, images
from .types import APPENDED_VERSION

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: Keys of a collated batch, in order.
BATCH_KEYS: tuple[str, ...] = (
    "prompt_ids",
    "prompt_mask",
    "completion_ids",
    "completion_mask",
    "tool_mask",
    "old_per_token_logps",
    "prompt_lengths",
    "completion_lengths",
)


#: The extra key of a batch collated from results.
VERSIONS_KEY = "versions"
#: The keys of a batch whose trajectories hold mixture-of-experts routes (routing replay).
ROUTES_KEY = "routes"
ROUTES_MASK_KEY = "routes_mask"


def _is_result(item: Any) -> bool:
    return hasattr(item, "trajectory") and hasattr(item, "versions") and hasattr(item, "loss_mask")


def collate_arrays(
    trajectories: Sequence[Any],
    pad_id: int,
    *,
    pad_to_multiple_of: int | None = None,
    mask_truncated: bool = False,
    mask_aborted: bool = False,
) -> dict[str, np.ndarray]:
    """``collate`` without torch: the same keys as numpy arrays (int64, logprobs float32).

    >>> import tmpl
    >>> a = tmpl.Trajectory([1], max_length=8); _ = a.add_completion([2, 3], [-0.1, -0.2])
    >>> collate_arrays([a], pad_id=0)["completion_ids"].tolist()
    [[2, 3]]
    """
    items = list(trajectories) if not isinstance(trajectories, list) else trajectories
    results = [_is_result(item) for item in items]
    if not any(results):
        arrays = _twin.builder.collate_arrays(
            items,
            pad_id,
            pad_to_multiple_of=pad_to_multiple_of,
            mask_truncated=mask_truncated,
            mask_aborted=mask_aborted,
        )
        return _routes(items, _images(items, arrays))
    if not all(results):
        from ..errors import CollateError

        k = results.index(False)
        raise CollateError(k, None, "mixes trajectories and rollout results; pass one kind")
    arrays = _twin.builder.collate_arrays(
        [r.trajectory for r in items],
        pad_id,
        pad_to_multiple_of=pad_to_multiple_of,
        mask_truncated=mask_truncated,
        mask_aborted=mask_aborted,
    )
    width = arrays["completion_ids"].shape[1]
    versions = np.full((len(items), width), APPENDED_VERSION, dtype=np.int64)
    for row, result in enumerate(items):
        n = int(arrays["completion_lengths"][row])
        versions[row, :n] = result.versions[:n]
        if arrays["completion_mask"][row, :n].any():  # a row not masked whole by mask_truncated/mask_aborted
            arrays["tool_mask"][row, :n] = result.loss_mask[:n]
    arrays[VERSIONS_KEY] = versions
    return _routes([r.trajectory for r in items], _images([r.trajectory for r in items], arrays))


def _routes(trajectories: list[Any], arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``arrays`` with ``routes`` and ``routes_mask`` when a trajectory holds mixture-of-experts routes.

    ``routes`` is ``[batch, P + C, layers, top_k]`` in the positions of ``cat(prompt_ids, completion_ids)``
    (prompt left-padded, completion right-padded), in the batch's widest route dtype; ``routes_mask``
    (int64, ``[batch, P + C]``) is 1 where a route is known, 0 on padding and on positions without one
    (a trajectory without routes: all 0).
    """
    held = [getattr(t, "routes", None) for t in trajectories]
    if all(r is None for r in held):
        return arrays
    from ..errors import CollateError

    shapes = {r.shape[1:] for r in held if r is not None}
    if len(shapes) > 1:
        first = next(r.shape[1:] for r in held if r is not None)
        k, odd = next((i, r) for i, r in enumerate(held) if r is not None and r.shape[1:] != first)
        raise CollateError(
            k, trajectories[k].sample_id, f"routes of {odd.shape[1:]} (layers, top_k), other rows {first}"
        )
    dtype = np.result_type(*(r.dtype for r in held if r is not None))
    width_p = arrays["prompt_ids"].shape[1]
    width = width_p + arrays["completion_ids"].shape[1]
    routes = np.zeros((len(held), width, *next(iter(shapes))), dtype=dtype)
    mask = np.zeros((len(held), width), dtype=np.int64)
    for row, (traj, r) in enumerate(zip(trajectories, held)):
        if r is None:
            continue
        at = width_p - traj.prompt_length  # where position 0 sits: after the prompt's left padding
        routes[row, at : at + len(r)] = r
        mask[row, at : at + len(r)] = traj.routes_known
    arrays[ROUTES_KEY] = routes
    arrays[ROUTES_MASK_KEY] = mask
    return arrays


def _images(trajectories: list[Any], arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``arrays`` with the batch's image keys when a trajectory holds images (tmpl.trajectory.images)."""
    if images._CLASSES and any(images.has_images(t) for t in trajectories):
        arrays.update(images.collate_images(trajectories))
    return arrays


def collate(
    trajectories: Sequence[Any],
    pad_id: int,
    device: "str | torch.device | None" = None,
    *,
    pad_to_multiple_of: int | None = None,
    mask_truncated: bool = False,
    mask_aborted: bool = False,
) -> dict[str, "torch.Tensor"]:
    """Pad trajectories into a GRPO batch with TRL's keys and conventions.

    - ``prompt_ids`` (B, P) left-padded with ``pad_id``; ``prompt_mask`` 1 on prompt tokens.
    - ``completion_ids`` (B, C) right-padded with ``pad_id``; ``completion_mask`` 1 on every
      completion token, model and suffix (tool) tokens alike, 0 on padding.
    - ``tool_mask`` 1 on model tokens, 0 on suffix tokens, 1 on padding (as TRL pads it), so the
      loss mask ``completion_mask * tool_mask`` is 1 exactly on model tokens.
    - ``old_per_token_logps`` (float32) the rollout logprobs, 0.0 on suffix tokens and padding.
    - ``prompt_lengths``, ``completion_lengths`` (B,) token counts before padding.

    Widths are the batch maxima, rounded up to ``pad_to_multiple_of`` when given. All tensors are
    int64 except the logprobs. Given :class:`tmpl.RolloutResult` objects, ``versions`` (B, C) is
    added (-1 on appended tokens and padding) and ``tool_mask`` follows each result's ``loss_mask``
    (its staleness policy). ``mask_truncated`` / ``mask_aborted`` zero the ``completion_mask``
    and ``tool_mask`` rows of TRUNCATED / ABORTED samples (TRL's ``mask_truncated_completions``);
    an ABORTED sample raises CollateError unless ``mask_aborted`` is set. ``device`` moves the
    tensors (``.to(device)``); without it they share memory with the arrays filled.
    """
    import torch

    arrays = collate_arrays(
        trajectories,
        pad_id,
        pad_to_multiple_of=pad_to_multiple_of,
        mask_truncated=mask_truncated,
        mask_aborted=mask_aborted,
    )
    tensors = {key: torch.from_numpy(np.ascontiguousarray(value)) for key, value in arrays.items()}
    if device is not None:
        tensors = {key: value.to(device) for key, value in tensors.items()}
    return tensors
