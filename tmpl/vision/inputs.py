"""The image inputs of a token sequence, aligned with the placeholder runs their images expand to.

An :class:`ImageInputs` holds what the processor made of some images (``pixel_values``,
``image_grid_thw`` or its equivalent: every per-image array the processor returned, as numpy)
and, per image, the ``[start, end)`` span of its placeholder run in the token IDs it belongs to.
Carriers of a prompt and of each suffix are put together with :meth:`ImageInputs.concat` after
:meth:`ImageInputs.shifted` to the offset where those IDs sit in the sequence; a trainer then
rebuilds the processor's model inputs with :meth:`ImageInputs.model_inputs`. The placeholder
tokens are never model tokens: :meth:`ImageInputs.check_outside_loss` proves they are out of a
loss mask.

>>> import numpy as np
>>> inputs = ImageInputs(
...     arrays={"pixel_values": np.zeros((4, 2)), "image_grid_thw": np.array([[1, 2, 2]])},
...     spans=((2, 3),), parts=("messages[0].content[0]",), image_token_id=9, token_type_keys=(),
... )
>>> moved = inputs.shifted(10)
>>> moved.spans, moved.positions()
(((12, 13),), [12])
>>> moved.check_aligned([0] * 12 + [9] + [0])
>>> sorted(ImageInputs.concat([inputs, moved]).model_inputs([0, 0, 9] + [0] * 9 + [9])) == [
...     "attention_mask", "image_grid_thw", "input_ids", "pixel_values"]
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import TrajectoryError

#: Keys of a processor's output that are aligned with the tokens, not with the images.
TOKEN_KEYS = frozenset({"input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids"})


def placeholder_runs(ids: Sequence[int], token_id: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each maximal run of ``token_id`` in ``ids``.

    >>> placeholder_runs([5, 7, 7, 5, 7], 7)
    [(1, 3), (4, 5)]
    """
    arr = np.asarray(ids)
    hit = np.concatenate(([False], arr == token_id, [False]))
    edges = np.flatnonzero(hit[1:] != hit[:-1])
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]


@dataclass(frozen=True)
class ImageInputs:
    """A processor's image inputs for the images of some token IDs, aligned with their placeholders.

    ``arrays``: every per-image array the processor returned (first axis: images, or the patches of
    the images in order, as ``pixel_values`` of Qwen2-VL), ``spans``: the ``[start, end)`` of each
    image's placeholder run in the IDs, ``parts``: where each image came from, ``image_token_id``:
    the placeholder token, ``token_type_keys``: token-aligned keys the processor also returned
    (``mm_token_type_ids``, ``token_type_ids``: 1 on placeholders, else 0), rebuilt from the IDs.
    """

    arrays: Mapping[str, np.ndarray]
    spans: tuple[tuple[int, int], ...]
    parts: tuple[str, ...]
    image_token_id: int
    token_type_keys: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        """How many images."""
        return len(self.spans)

    def positions(self) -> list[int]:
        """Every placeholder position, in order."""
        return [p for a, b in self.spans for p in range(a, b)]

    def shifted(self, offset: int) -> ImageInputs:
        """The same inputs with spans moved by ``offset`` (where these IDs start in the sequence)."""
        return ImageInputs(
            self.arrays,
            tuple((a + offset, b + offset) for a, b in self.spans),
            self.parts,
            self.image_token_id,
            self.token_type_keys,
        )

    @classmethod
    def empty(cls, image_token_id: int, token_type_keys: tuple[str, ...] = ()) -> ImageInputs:
        """No images."""
        return cls({}, (), (), image_token_id, token_type_keys)

    @classmethod
    def concat(cls, pieces: Sequence[ImageInputs]) -> ImageInputs:
        """Carriers of consecutive pieces of one sequence (spans already shifted), as one.

        Arrays are concatenated along their first axis, in order; the pieces must not overlap.
        """
        if not pieces:
            raise ValueError("ImageInputs.concat needs at least one piece")
        first = pieces[0]
        keys: list[str] = []
        for p in pieces:
            if p.image_token_id != first.image_token_id:
                raise ValueError("ImageInputs.concat: pieces from processors with different image tokens")
            keys += [k for k in p.arrays if k not in keys]
        spans = [s for p in pieces for s in p.spans]
        for (_, end), (start, _) in zip(spans, spans[1:]):
            if start < end:
                raise ValueError(f"ImageInputs.concat: placeholder spans overlap or are out of order at {start}")
        arrays: dict[str, np.ndarray] = {}
        for k in keys:
            have = [p for p in pieces if k in p.arrays]
            if len(have) != sum(1 for p in pieces if p.count):
                raise ValueError(f"ImageInputs.concat: {k!r} is missing from some pieces")
            arrays[k] = np.concatenate([p.arrays[k] for p in have], axis=0)
        type_keys = tuple(dict.fromkeys(k for p in pieces for k in p.token_type_keys))
        return cls(arrays, tuple(spans), tuple(x for p in pieces for x in p.parts), first.image_token_id, type_keys)

    def check_aligned(self, ids: Sequence[int]) -> None:
        """Raise :class:`~tmpl.errors.TrajectoryError` unless the placeholder runs of ``ids`` are
        exactly :attr:`spans` (every run carried, nothing else)."""
        runs = placeholder_runs(ids, self.image_token_id)
        if runs != list(self.spans):
            raise TrajectoryError(
                None,
                f"image placeholders of the IDs sit at {runs[:4]}{'...' if len(runs) > 4 else ''} but the image "
                f"inputs carry {list(self.spans[:4])}{'...' if len(self.spans) > 4 else ''} ({len(runs)} vs {self.count})",
            )

    def check_outside_loss(self, loss_mask: Sequence[int], *, offset: int = 0) -> None:
        """Raise :class:`~tmpl.errors.TrajectoryError` when a placeholder is a loss position.

        ``loss_mask[i]`` is the mask of sequence position ``offset + i`` (a trajectory's mask covers
        its completion: pass ``offset=prompt_length``); positions before ``offset`` are prompt.
        """
        mask = np.asarray(loss_mask)
        for (a, b), part in zip(self.spans, self.parts):
            lo, hi = max(a - offset, 0), min(b - offset, len(mask))
            if lo < hi and mask[lo:hi].any():
                bad = offset + lo + int(np.flatnonzero(mask[lo:hi])[0])
                raise TrajectoryError(None, f"the placeholder of image {part} is in the loss mask at position {bad}")

    def model_inputs(self, ids: Sequence[int]) -> dict[str, np.ndarray]:
        """The model inputs of one sequence (batch of one): ``input_ids``, ``attention_mask``, the
        token-type keys the processor returns (rebuilt from the IDs), and every image array.

        Checks first that the placeholders of ``ids`` are the carried spans.
        """
        self.check_aligned(ids)
        arr = np.asarray([list(ids)], dtype=np.int64)
        out: dict[str, Any] = {"input_ids": arr, "attention_mask": np.ones_like(arr)}
        for k in self.token_type_keys:
            out[k] = (arr == self.image_token_id).astype(np.int64)
        out.update(self.arrays)
        return out
