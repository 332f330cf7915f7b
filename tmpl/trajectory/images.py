"""The image inputs of a token sequence, aligned with the placeholder runs their images expand to.

An :class:`ImageInputs` holds what the processor made of some images (``pixel_values``,
``image_grid_thw`` or its equivalent: every per-image array the processor returned, as numpy)
and, per image, the ``[start, end)`` span of its placeholder run in the token IDs it belongs to.
Carriers of a prompt and of each suffix are put together with :meth:`ImageInputs.concat` after
:meth:`ImageInputs.shifted` to the offset where those IDs sit in the sequence; a trainer then
rebuilds the processor's model inputs with :meth:`ImageInputs.model_inputs`. The placeholder
tokens are never model tokens: :meth:`ImageInputs.check_outside_loss` proves they are out of a
loss mask.

The carrier lives here, in the trajectory's layer (it needs numpy only), so that a trajectory
(:class:`ImageTrajectory`), ``collate`` and ``tmpl.export`` can hold it; :mod:`tmpl.vision`, which
makes it from a processor, re-exports it.

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

import base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CollateError, TrajectoryError
from . import _twin
from .types import state_of

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

    def rows(self) -> dict[str, list[int]]:
        """Per array, how many of its first-axis rows each image holds (1, or its patches for Qwen).

        >>> import numpy as np
        >>> ImageInputs({"pixel_values": np.zeros((6, 2)), "image_grid_thw": np.array([[1, 1, 2], [1, 2, 2]])},
        ...             ((0, 1), (5, 6)), ("a", "b"), 9).rows()
        {'pixel_values': [2, 4], 'image_grid_thw': [1, 1]}
        """
        grid = self.arrays.get("image_grid_thw")
        patches = [int(np.prod(g)) for g in grid] if grid is not None and len(grid) == self.count else None
        out: dict[str, list[int]] = {}
        for key, arr in self.arrays.items():
            if len(arr) == self.count:
                out[key] = [1] * self.count
            elif patches is not None and len(arr) == sum(patches):
                out[key] = patches
            else:
                raise ValueError(
                    f"ImageInputs: {key!r} has {len(arr)} rows for {self.count} image(s): cannot tell which are whose"
                )
        return out

    def split(self, k: int) -> tuple[ImageInputs, ImageInputs]:
        """The first ``k`` images and the others, each with their arrays' rows.

        >>> import numpy as np
        >>> grid = np.array([[1, 1, 1], [1, 1, 2]])
        >>> two = ImageInputs({"pixel_values": np.arange(3)[:, None], "image_grid_thw": grid}, ((0, 1), (4, 6)), ("a", "b"), 9)
        >>> [(p.spans, p.arrays["pixel_values"].ravel().tolist()) for p in two.split(1)]
        [(((0, 1),), [0]), (((4, 6),), [1, 2])]
        """
        k = max(0, min(k, self.count))
        cut = {key: sum(n[:k]) for key, n in self.rows().items()}
        head = {key: arr[: cut[key]] for key, arr in self.arrays.items()}
        tail = {key: arr[cut[key] :] for key, arr in self.arrays.items()}
        return (
            ImageInputs(head if k else {}, self.spans[:k], self.parts[:k], self.image_token_id, self.token_type_keys),
            ImageInputs(
                tail if k < self.count else {},
                self.spans[k:],
                self.parts[k:],
                self.image_token_id,
                self.token_type_keys,
            ),
        )

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


# -- a trajectory with images ----------------------------------------------------------------------


class _WithImages:
    """What :class:`ImageTrajectory` adds to the trajectory twin it extends (see there)."""

    _prompt_images: ImageInputs
    _suffix_images: list[ImageInputs]

    def __init__(
        self,
        prompt_ids: Sequence[int],
        max_length: int,
        max_completion_length: int | None = None,
        *,
        vocab_size: int | None = None,
        sample_id: Any = None,
        images: ImageInputs | None = None,
        image_token_id: int | None = None,
    ) -> None:
        super().__init__(  # type: ignore[call-arg]
            prompt_ids, max_length, max_completion_length, vocab_size=vocab_size, sample_id=sample_id
        )
        if images is None:  # image_token_id None: being restored (restore_image_trajectory sets them)
            images = ImageInputs.empty(-1 if image_token_id is None else image_token_id)
        else:
            try:
                images.check_aligned(prompt_ids)
            except TrajectoryError as exc:
                raise TrajectoryError(sample_id, f"prompt images: {exc.reason}") from None
        self._prompt_images = images
        self._suffix_images = []

    @property
    def images(self) -> ImageInputs:
        """The image inputs of the whole sequence (prompt, then every suffix), spans in sequence
        positions: ``prompt_ids + completion_ids`` indexes them."""
        if not self._suffix_images:
            return self._prompt_images
        return ImageInputs.concat([self._prompt_images, *self._suffix_images])

    def add_suffix(self, ids: Sequence[int], *, message: int | None = None, images: ImageInputs | None = None) -> int:
        """Append a suffix (mask 0) and the images of its placeholders (spans relative to ``ids``).

        An image whose placeholders would not fit the budget whole is never cut in two: the suffix
        is appended up to that image's first placeholder and the sample is TRUNCATED, with the
        image named in its reason (its model inputs would be unbuildable otherwise).
        """
        traj: Any = self
        add = super().add_suffix  # type: ignore[misc]
        if images is None or not images.count:
            return int(add(ids, message=message))
        start = traj.prompt_length + traj.completion_length
        room = traj.remaining if traj.running else 0
        fits = sum(1 for _, end in images.spans if end <= room)
        if fits == images.count or len(ids) <= room:
            kept = int(add(ids, message=message))
        else:
            cut_at = images.spans[fits][0]
            kept = int(add(list(ids)[:cut_at], message=message))
            traj.truncate(
                f"suffix of {len(ids)} tokens cut to {kept} ({len(ids) - kept} cut) before the placeholders of "
                f"image {images.parts[fits]} ({images.spans[fits][1] - cut_at} tokens), which do not fit whole: "
                "token budget reached",
                cut=len(ids) - kept,
            )
        whole, _ = images.split(sum(1 for _, end in images.spans if end <= kept))
        if whole.count:
            self._suffix_images.append(whole.shifted(start))
        return kept

    def reset(self) -> None:
        super().reset()  # type: ignore[misc]
        self._suffix_images = []

    def model_inputs(self) -> dict[str, np.ndarray]:
        """The model inputs of this sample's whole sequence (see :meth:`ImageInputs.model_inputs`)."""
        traj: Any = self
        return self.images.model_inputs(traj.prompt_ids.tolist() + traj.completion_ids.tolist())

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (restore_image_trajectory, (state_of(self), self.images))


_CLASSES: dict[type, type] = {}


def image_trajectory_class(base: type | None = None) -> type:
    """The :class:`ImageTrajectory` class over ``base`` (default: the trajectory twin in use)."""
    base = _twin.builder.Trajectory if base is None else base
    cls = _CLASSES.get(base)
    if cls is None:
        cls = type("ImageTrajectory", (_WithImages, base), {"__module__": __name__, "__doc__": ImageTrajectory.__doc__})
        _CLASSES[base] = cls
    return cls


def ImageTrajectory(  # noqa: N802 - a class to its callers: builds one on the twin in use
    prompt_ids: Sequence[int],
    max_length: int,
    max_completion_length: int | None = None,
    *,
    vocab_size: int | None = None,
    sample_id: Any = None,
    images: ImageInputs | None = None,
    image_token_id: int | None = None,
) -> Any:
    """A :class:`tmpl.Trajectory` whose prompt and suffixes carry images (``isinstance`` of it).

    ``images``: the prompt's :class:`ImageInputs` (spans relative to ``prompt_ids``; checked
    against its placeholders), or ``image_token_id`` for a prompt without images.
    ``add_suffix(ids, message=..., images=...)`` appends a suffix with the images of its
    placeholders (spans relative to ``ids``); ``.images`` is the whole sequence's carrier, spans in
    sequence positions (``prompt_ids + completion_ids``); ``.model_inputs()`` rebuilds the
    processor's outputs. Placeholders are suffix or prompt tokens: never in the mask. Pickles
    (and ``tmpl.export``) keep the images. ``collate`` adds the batch's image arrays.

    >>> import numpy as np, tmpl
    >>> tile = ImageInputs({"pixel_values": np.ones((1, 3))}, ((1, 3),), ("tool[0]",), 9)
    >>> t = ImageTrajectory([1, 2], max_length=16, image_token_id=9)
    >>> t.add_completion([3], [-0.5]), t.add_suffix([5, 9, 9, 6], images=tile)
    (1, 4)
    >>> isinstance(t, tmpl.Trajectory), t.images.spans, t.mask.tolist()
    (True, ((4, 6),), [1, 0, 0, 0, 0])
    """
    if images is None and image_token_id is None:
        raise TrajectoryError(sample_id, "an ImageTrajectory needs the prompt's images or an image_token_id")
    return image_trajectory_class()(
        prompt_ids,
        max_length,
        max_completion_length,
        vocab_size=vocab_size,
        sample_id=sample_id,
        images=images,
        image_token_id=image_token_id,
    )


def has_images(traj: Any) -> bool:
    """Whether ``traj`` is an :class:`ImageTrajectory` (of either twin)."""
    return type(traj) in _CLASSES.values()


def restore_image_trajectory(state: dict[str, Any], images: ImageInputs) -> Any:
    """Rebuild a pickled or exported :class:`ImageTrajectory` (``images``: the whole sequence's)."""
    cls = image_trajectory_class()
    plen = len(state["prompt_ids"])
    k = sum(1 for _, end in images.spans if end <= plen)
    prompt, rest = images.split(k)
    traj = cls._from_state(state)  # type: ignore[attr-defined]
    traj._prompt_images = prompt
    if rest.count:
        traj._suffix_images.append(rest)
    try:
        traj.images.check_aligned(state["prompt_ids"].tolist() + state["completion_ids"].tolist())
    except TrajectoryError as exc:
        raise TrajectoryError(state.get("sample_id"), exc.reason) from None
    return traj


# -- batches ---------------------------------------------------------------------------------------

#: The key of a collated batch with the number of images of each row.
NUM_IMAGES = "num_images"


def collate_images(trajectories: Sequence[Any]) -> dict[str, np.ndarray]:
    """The image keys of a batch of trajectories (``collate`` adds them when one holds images).

    ``num_images`` (B,): images per row; each image array the processor returned
    (``pixel_values``, ``image_grid_thw``...), the rows' arrays concatenated in batch order (as a
    processor batches them, and as TRL's GRPO splits them back by ``num_images``). Rows without
    images add nothing; every row with images must come from the same processor (same keys and
    image token). :func:`batch_model_inputs` rebuilds the model inputs from the batch.
    """
    carriers = [t.images if has_images(t) else None for t in trajectories]
    token = next((c.image_token_id for c in carriers if c is not None and c.count), None)
    keys: list[str] | None = None
    for k, c in enumerate(carriers):
        if c is None or not c.count:
            continue
        if c.image_token_id != token or (keys is not None and list(c.arrays) != keys):
            raise CollateError(
                k, trajectories[k].sample_id, "its images come from another processor than the batch's first ones"
            )
        keys = list(c.arrays)
    out: dict[str, np.ndarray] = {NUM_IMAGES: np.array([c.count if c else 0 for c in carriers], dtype=np.int64)}
    for key in keys or []:
        out[key] = np.concatenate([c.arrays[key] for c in carriers if c is not None and c.count], axis=0)
    return out


def batch_model_inputs(
    batch: Mapping[str, Any], image_token_id: int, token_type_keys: Sequence[str] = ("mm_token_type_ids",)
) -> dict[str, np.ndarray]:
    """The model inputs of a collated batch (numpy or torch values): what the processor would give
    for the rows' whole sequences, left-padded as the batch's prompts are.

    ``input_ids`` = ``prompt_ids`` then ``completion_ids``; ``attention_mask`` = ``prompt_mask``
    then ``completion_mask``; each of ``token_type_keys`` 1 on ``image_token_id`` positions; the
    image arrays as collated. Checks that each row holds as many placeholder runs as its
    ``num_images``.

    >>> import numpy as np
    >>> batch = {"prompt_ids": np.array([[0, 9, 1]]), "prompt_mask": np.array([[0, 1, 1]]),
    ...          "completion_ids": np.array([[2]]), "completion_mask": np.array([[1]]),
    ...          "num_images": np.array([1]), "pixel_values": np.ones((1, 4))}
    >>> out = batch_model_inputs(batch, image_token_id=9)
    >>> out["input_ids"].tolist(), out["mm_token_type_ids"].tolist(), out["pixel_values"].shape
    ([[0, 9, 1, 2]], [[0, 1, 0, 0]], (1, 4))
    """

    def arr(key: str) -> np.ndarray:
        value = batch[key]
        return np.asarray(value.cpu() if hasattr(value, "cpu") else value)

    ids = np.concatenate([arr("prompt_ids"), arr("completion_ids")], axis=1).astype(np.int64)
    attention = np.concatenate([arr("prompt_mask"), arr("completion_mask")], axis=1).astype(np.int64)
    out: dict[str, np.ndarray] = {"input_ids": ids, "attention_mask": attention}
    placeholder = (ids == image_token_id) & (attention == 1)
    for key in token_type_keys:
        out[key] = placeholder.astype(np.int64)
    counts = arr(NUM_IMAGES) if NUM_IMAGES in batch else np.zeros(len(ids), dtype=np.int64)
    for row in range(len(ids)):
        runs = len(placeholder_runs(placeholder[row].astype(np.int64), 1))
        if runs != int(counts[row]):
            raise CollateError(row, None, f"{runs} placeholder run(s) but num_images is {int(counts[row])}")
    skip = {"prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask", "old_per_token_logps"}
    skip |= {"prompt_lengths", "completion_lengths", "versions", NUM_IMAGES}
    for key in batch:
        if key not in skip:
            out[key] = arr(key)
    return out


# -- records (tmpl.export) -------------------------------------------------------------------------

#: Arrays of more bytes than this are written to a side file by ``tmpl.export.to_jsonl``.
INLINE_BYTES = 64 * 1024


def to_record(
    inputs: ImageInputs, save: Callable[[str, np.ndarray], str] | None = None, inline_bytes: int = INLINE_BYTES
) -> dict[str, Any]:
    """``inputs`` as plain JSON-ready values; arrays inline (base64 of their bytes) or, when larger
    than ``inline_bytes`` and ``save`` is given, by reference: ``save(key, array)`` writes the
    array and returns the file name recorded.

    >>> import numpy as np
    >>> rec = to_record(ImageInputs({"pixel_values": np.ones((1, 2), np.float32)}, ((3, 5),), ("a",), 9))
    >>> rec["spans"], rec["arrays"]["pixel_values"]["shape"], from_record(rec).spans
    ([[3, 5]], [1, 2], ((3, 5),))
    """
    arrays: dict[str, Any] = {}
    for key, value in inputs.arrays.items():
        a = np.ascontiguousarray(value)
        entry: dict[str, Any] = {"dtype": a.dtype.str, "shape": list(a.shape)}
        if save is not None and a.nbytes > inline_bytes:
            entry["file"] = save(key, a)
        else:
            entry["b64"] = base64.b64encode(a.tobytes()).decode("ascii")
        arrays[key] = entry
    return {
        "image_token_id": inputs.image_token_id,
        "spans": [list(s) for s in inputs.spans],
        "parts": list(inputs.parts),
        "token_type_keys": list(inputs.token_type_keys),
        "arrays": arrays,
    }


def from_record(record: Mapping[str, Any], load: Callable[[str], np.ndarray] | None = None) -> ImageInputs:
    """The :class:`ImageInputs` of a record made by :func:`to_record` (``load(file)`` reads a
    referenced array; ``ValueError`` on an array that does not match its dtype and shape)."""
    arrays: dict[str, np.ndarray] = {}
    for key, entry in record["arrays"].items():
        dtype, shape = np.dtype(entry["dtype"]), tuple(entry["shape"])
        if "file" in entry:
            if load is None:
                raise ValueError(f"array {key!r} is in file {entry['file']!r} and no folder to read it from was given")
            a = load(entry["file"])
        else:
            a = np.frombuffer(base64.b64decode(entry["b64"]), dtype=dtype).reshape(shape)
        if a.dtype != dtype or a.shape != shape:
            raise ValueError(f"array {key!r} is {a.dtype}{list(a.shape)}, its record says {dtype}{list(shape)}")
        arrays[key] = a
    return ImageInputs(
        arrays,
        tuple((int(a), int(b)) for a, b in record["spans"]),
        tuple(record["parts"]),
        int(record["image_token_id"]),
        tuple(record.get("token_type_keys") or ()),
    )
