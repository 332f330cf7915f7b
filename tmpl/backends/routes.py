"""Mixture-of-experts routes as engines send them, decoded for :class:`GenerationResult.routes`.

Routing replay (docs/rollouts.md, "Routing replay"): a request with ``routes_from`` asks the engine for
the experts it routed every position to, from that prompt index on. What comes back, per engine:

- vLLM 0.32 (``enable_return_routed_experts``): ``CompletionOutput.routed_experts``, a numpy
  ``[positions, layers, top_k]`` array (uint8, uint16 or int32); over HTTP, per choice,
  ``routed_experts``: base64 of the array's ``.npy`` bytes (:func:`decode_npy`). It covers the prompt
  from ``routed_experts_prompt_start`` and the generated tokens except the last sampled one.
- SGLang (``--enable-return-routed-experts``, ``return_routed_experts``): ``meta_info["routed_experts"]``,
  base64 of the flat row-major bytes, int32 unless ``meta_info["routed_experts_dtype"]`` says uint8 or
  uint16; the shape is the caller's to know (:func:`decode_flat`). It covers
  ``[routed_experts_start_len, seqlen - 1)``.

Decoding only reads what was sent: the dtype is the sender's, nothing is cast or invented. Whether
the routes fit the sample's positions (their count, their dtype, the layer count of earlier turns) is
checked where they are stitched in (:class:`tmpl.trajectory.routes.RouteStore`), which ends a sample
that does not fit with ``EndCode.BAD_ROUTES``.

>>> import base64, io, numpy as np
>>> buf = io.BytesIO(); np.save(buf, np.array([[[1, 5]], [[0, 7]]], dtype=np.uint8))
>>> decode_npy(base64.b64encode(buf.getvalue()).decode()).tolist()
[[[1, 5]], [[0, 7]]]
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

import numpy as np

from ..errors import RoutesDecodeError

__all__ = ["RoutesDecodeError", "decode_flat", "decode_npy", "from_position"]

#: SGLang's wire dtypes (``routed_experts_dtype``; absent: int32)
_FLAT_DTYPES: dict[str, np.dtype[Any]] = {
    "int32": np.dtype(np.int32),
    "uint16": np.dtype(np.uint16),
    "uint8": np.dtype(np.uint8),
}


def decode_npy(payload: str) -> np.ndarray:
    """vLLM's ``routed_experts``: base64 of ``.npy`` bytes -> the array, as sent (no pickles).

    >>> decode_npy("AAAA")  # base64, but not of .npy bytes
    Traceback (most recent call last):
    ...
    tmpl.errors.RoutesDecodeError: routed_experts is not base64 of .npy bytes: ...
    """
    try:
        raw = base64.b64decode(payload, validate=False)
        array = np.load(io.BytesIO(raw), allow_pickle=False)
    except (binascii.Error, ValueError, TypeError, OSError, EOFError) as exc:
        raise RoutesDecodeError(f"routed_experts is not base64 of .npy bytes: {exc}") from None
    if not isinstance(array, np.ndarray):  # .npz bytes load as an archive
        raise RoutesDecodeError(f"routed_experts is not base64 of .npy bytes: {type(array).__name__}")
    return array


def decode_flat(payload: str, dtype: str | None, layers: int, top_k: int) -> np.ndarray:
    """SGLang's ``routed_experts``: base64 of flat row-major bytes of ``dtype`` (None: int32) ->
    ``[positions, layers, top_k]``.

    >>> import base64, numpy as np
    >>> data = base64.b64encode(np.arange(8, dtype=np.int32).tobytes()).decode()
    >>> decode_flat(data, None, 2, 2).shape
    (2, 2, 2)
    >>> decode_flat(data, "float16", 2, 2)
    Traceback (most recent call last):
    ...
    tmpl.errors.RoutesDecodeError: routed_experts_dtype 'float16': SGLang sends int32, uint16 or uint8
    """
    name = "int32" if dtype is None else str(dtype).strip().lower()
    if name not in _FLAT_DTYPES:
        raise RoutesDecodeError(f"routed_experts_dtype {dtype!r}: SGLang sends int32, uint16 or uint8")
    try:
        flat = np.frombuffer(base64.b64decode(payload, validate=False), dtype=_FLAT_DTYPES[name])
    except (binascii.Error, ValueError, TypeError) as exc:
        raise RoutesDecodeError(f"routed_experts is not base64 of {name} values: {exc}") from None
    row = layers * top_k
    if row < 1 or flat.size % row:
        raise RoutesDecodeError(
            f"routed_experts holds {flat.size} values, not a whole number of positions of {layers} layers x top-{top_k}"
        )
    routes: np.ndarray = flat.reshape(-1, layers, top_k).copy()
    return routes


def from_position(routes: Any, start: int, want: int | None) -> tuple[Any, int]:
    """``(routes, start)`` cut to the positions from ``want`` on (what the request asked for).

    An engine may report routes from an earlier position than asked (one that ignores the prompt
    start: verl's servers, an SGLang without ``routed_experts_start_len``); the rows before ``want``
    are dropped, so a result always starts where its request asked. ``want`` None: no routes asked,
    none kept. Routes that start after ``want`` are kept as they are (the stitching refuses them).

    >>> import numpy as np
    >>> r, s = from_position(np.arange(5).reshape(5, 1, 1), 0, 3)
    >>> r[:, 0, 0].tolist(), s
    ([3, 4], 3)
    >>> from_position(np.zeros((2, 1, 1)), 0, None)
    (None, 0)
    """
    if routes is None or want is None:
        return None, 0
    if start < want and isinstance(routes, np.ndarray) and routes.ndim >= 1:
        return routes[want - start :], want
    return routes, start
