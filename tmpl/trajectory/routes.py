"""Mixture-of-experts routes of one token sequence: the experts each position was routed to.

Routing replay (R3, docs/rollouts.md "Routing replay"): the engine reports, per position, the
``top_k`` experts of every MoE layer it routed the token to; the trainer replays them. A
:class:`RouteStore` keeps them aligned with a trajectory's positions (``prompt_ids +
completion_ids``), one ``[layers, top_k]`` row per position, with a "known" flag per position:
the last sampled token of a turn is routed by the next turn's prefill, so where a sample ends it
has no route, and that is marked, never invented. Both trajectory twins hold one
(``Trajectory.add_routes``), so the logic lives here once.

Routes are stored in the narrowest dtype that holds every expert index seen (uint8 up to 256
experts, uint16 up to 65536, else int32); engines report uint8, uint16 or int32 (vLLM's
``routed_experts``), any other dtype is refused (:class:`tmpl.errors.RoutesError`).

>>> import numpy as np
>>> store = RouteStore("q1")
>>> store.add(0, np.array([[[1, 3]], [[0, 2]]], dtype=np.int32), length=3)
>>> store.routes(3)[:, 0].tolist(), store.known(3).tolist()
([[1, 3], [0, 2], [0, 0]], [1, 1, 0])
>>> store.dtype, store.shape
(dtype('uint8'), (1, 2))
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import RoutesError

#: the dtypes an engine may report routes in (vLLM: uint8, uint16 or int32 by expert count)
ROUTE_DTYPES: tuple[np.dtype[Any], ...] = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.int32))


def compact_dtype(max_expert: int) -> np.dtype[Any]:
    """The narrowest route dtype that holds expert indices up to ``max_expert``.

    >>> compact_dtype(255), compact_dtype(256), compact_dtype(70000)
    (dtype('uint8'), dtype('uint16'), dtype('int32'))
    """
    if max_expert < 256:
        return ROUTE_DTYPES[0]
    if max_expert < 65536:
        return ROUTE_DTYPES[1]
    return ROUTE_DTYPES[2]


def check_routes(routes: Any, sample: object = None) -> np.ndarray:
    """``routes`` as a ``[positions, layers, top_k]`` array of a known dtype with no negative expert.

    Raises :class:`tmpl.errors.RoutesError` (naming ``sample``) otherwise.

    >>> check_routes(np.zeros((2, 1, 2), dtype=np.float32), "q1")
    Traceback (most recent call last):
    ...
    tmpl.errors.RoutesError: sample 'q1': routes of dtype float32: an engine reports uint8, uint16 or int32
    """
    if not isinstance(routes, np.ndarray):
        raise RoutesError(sample, f"routes must be a numpy array, not {type(routes).__name__}")
    if routes.dtype not in ROUTE_DTYPES:
        raise RoutesError(sample, f"routes of dtype {routes.dtype}: an engine reports uint8, uint16 or int32")
    if routes.ndim != 3:
        raise RoutesError(sample, f"routes of shape {routes.shape}: expected [positions, layers, top_k]")
    if routes.shape[1] < 1 or routes.shape[2] < 1:
        raise RoutesError(sample, f"routes of shape {routes.shape}: no layer or no expert per position")
    if routes.dtype == np.int32 and routes.size and int(routes.min()) < 0:
        raise RoutesError(sample, f"routes hold a negative expert index ({int(routes.min())})")
    return routes


class RouteStore:
    """The routes of one sequence, aligned with its positions (see the module docstring).

    Storage grows with the positions written (amortized doubling into fresh arrays, so arrays
    handed out before keep what they showed). ``add`` checks everything before writing: a bad
    piece raises :class:`tmpl.errors.RoutesError` and leaves the store as it was.
    """

    __slots__ = ("_sample", "_routes", "_known", "_shape")

    def __init__(self, sample: object = None) -> None:
        self._sample = sample
        self._routes: np.ndarray | None = None
        self._known = np.zeros(0, dtype=np.uint8)
        self._shape: tuple[int, int] | None = None

    @property
    def shape(self) -> tuple[int, int] | None:
        """``(layers, top_k)`` of every position, once routes were added."""
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any] | None:
        return None if self._routes is None else self._routes.dtype

    def _grow(self, need: int, dtype: np.dtype[Any]) -> None:
        assert self._shape is not None
        old = self._routes
        have = 0 if old is None else len(old)
        if old is not None and need <= have and dtype == old.dtype:
            return
        size = max(need, 2 * have, 64) if need > have else have
        grown = np.zeros((size, *self._shape), dtype=dtype)
        known = np.zeros(size, dtype=np.uint8)
        if old is not None:
            grown[:have] = old
            known[:have] = self._known[:have]
        self._routes, self._known = grown, known

    def add(self, start: int, routes: Any, length: int) -> None:
        """Set the routes of positions ``start .. start + len(routes)`` of a sequence of ``length`` tokens."""
        arr = check_routes(routes, self._sample)
        shape = (int(arr.shape[1]), int(arr.shape[2]))
        if self._shape is not None and shape != self._shape:
            raise RoutesError(
                self._sample,
                f"routes of {shape[0]} layers x top-{shape[1]} after {self._shape[0]} layers x top-{self._shape[1]}",
            )
        if start < 0 or start + len(arr) > length:
            raise RoutesError(
                self._sample,
                f"routes for positions {start}..{start + len(arr)} do not fit the sequence of {length} tokens",
            )
        if not len(arr):
            self._shape = shape
            return
        need = compact_dtype(int(arr.max()))
        have = self.dtype
        dtype = need if have is None or need.itemsize > have.itemsize else have
        self._shape = shape
        self._grow(start + len(arr), dtype)
        assert self._routes is not None
        self._routes[start : start + len(arr)] = arr
        self._known[start : start + len(arr)] = 1

    def routes(self, length: int) -> np.ndarray:
        """``[length, layers, top_k]`` (read-only; rows not known are 0: see :meth:`known`)."""
        if self._shape is None:
            raise RoutesError(self._sample, "no routes were added")
        if self._routes is None or len(self._routes) < length:
            self._grow(length, self.dtype or ROUTE_DTYPES[0])
        assert self._routes is not None
        view = self._routes[:length]
        view.flags.writeable = False
        return view

    def known(self, length: int) -> np.ndarray:
        """1 where the position's route is known, 0 where not (uint8 ``[length]``, read-only)."""
        out = np.zeros(length, dtype=np.uint8)
        have = min(length, len(self._known))
        out[:have] = self._known[:have]
        out.flags.writeable = False
        return out

    def first_unknown(self, length: int) -> int:
        """The first position (below ``length``) whose route is not known; ``length`` when all are."""
        known = self._known[: min(length, len(self._known))]
        missing = np.flatnonzero(known == 0)
        return int(missing[0]) if len(missing) else len(known)

    # -- plain values (pickles, exports) ---------------------------------------------------------
    def state(self, length: int) -> dict[str, Any] | None:
        """What pickling and exports keep (None when no routes were added)."""
        if self._shape is None:
            return None
        return {"routes": self.routes(length).copy(), "known": self.known(length).copy()}

    @classmethod
    def from_state(cls, state: Mapping[str, Any] | None, sample: object = None) -> RouteStore | None:
        if state is None:
            return None
        store = cls(sample)
        routes = np.asarray(state["routes"])
        known = np.asarray(state["known"], dtype=np.uint8)
        store._shape = (int(routes.shape[1]), int(routes.shape[2]))
        store._routes = routes.copy()
        store._known = known.copy()
        return store


def routes_record(routes: np.ndarray, known: np.ndarray) -> dict[str, Any]:
    """Routes as a compact JSON-able record: base64 of the array bytes with dtype and shape.

    >>> rec = routes_record(np.array([[[1, 2]]], dtype=np.uint8), np.array([1], dtype=np.uint8))
    >>> rec["dtype"], rec["shape"], rec["data"]
    ('uint8', [1, 1, 2], 'AQI=')
    >>> [a.tolist() for a in routes_from_record(rec)]
    [[[[1, 2]]], [1]]
    """
    arr = np.ascontiguousarray(routes)
    return {
        "dtype": arr.dtype.name,
        "shape": list(arr.shape),
        "data": base64.b64encode(arr.tobytes()).decode("ascii"),
        "known": base64.b64encode(np.packbits(np.asarray(known, dtype=np.uint8)).tobytes()).decode("ascii"),
    }


def routes_from_record(record: Mapping[str, Any], sample: object = None) -> tuple[np.ndarray, np.ndarray]:
    """``(routes, known)`` back from :func:`routes_record`'s record (RoutesError on a bad one)."""
    try:
        dtype = np.dtype(str(record["dtype"]))
        shape = tuple(int(x) for x in record["shape"])
        raw = base64.b64decode(record["data"], validate=True)
        routes = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        bits = np.frombuffer(base64.b64decode(record["known"], validate=True), dtype=np.uint8)
        known = np.unpackbits(bits)[: shape[0]].astype(np.uint8)
    except (KeyError, TypeError, ValueError) as exc:
        raise RoutesError(sample, f"unreadable routes record: {exc}") from None
    if len(known) != shape[0]:
        raise RoutesError(sample, f"routes record: {len(known)} known flags for {shape[0]} positions")
    return check_routes(routes, sample), known
