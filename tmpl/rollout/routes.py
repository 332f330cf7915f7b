"""Routing replay in the loop: each turn's mixture-of-experts routes, checked and stitched.

With ``Rollout(..., routes=True)`` every request asks the engine for routes from the first position
of the sample's sequence not yet routed (``GenerationRequest.routes_from``): the previous turn's last
sampled token, which that turn could not route, is routed by this turn's prefill. A generation that an
abort-mode weight update interrupted comes back in pieces (``Rollout._generate``); each piece asks
from where the previous one's routes ended. :func:`stitch` checks the pieces of one turn and joins
them; anything that would misalign routes and tokens raises :class:`tmpl.errors.RoutesError`, and the
loop ends the sample with ``EndCode.BAD_ROUTES`` (docs/rollouts.md, "Routing replay").

>>> import numpy as np
>>> r = np.zeros((4, 2, 2), dtype=np.uint8)  # prompt of 3 from position 0, 2 sampled: 3 + 2 - 1 routed
>>> routes, start = stitch([RoutePiece(asked=0, prompt=3, tokens=2, routes=r, start=0)], sample="0/0")
>>> routes.shape, start
((4, 2, 2), 0)
>>> stitch([RoutePiece(asked=0, prompt=3, tokens=2, routes=r[:3], start=0)], sample="0/0")
Traceback (most recent call last):
...
tmpl.errors.RoutesError: sample '0/0': routes of 3 positions from 0: the request covers positions 0..4 \
(the last sampled token may be left out: 4 or 5 positions, not 3)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import RoutesError
from ..trajectory.routes import check_routes


@dataclass(frozen=True, slots=True)
class RoutePiece:
    """The routes one request of a turn returned: ``asked`` its ``routes_from``, ``prompt`` the length of
    the prompt it sent, ``tokens`` how many it sampled, ``routes``/``start`` the result's
    ``routes``/``routes_start`` (positions of ``prompt + sampled``)."""

    asked: int
    prompt: int
    tokens: int
    routes: Any
    start: int


def stitch(
    pieces: Sequence[RoutePiece], *, sample: object, shape: tuple[int, int] | None = None
) -> tuple[np.ndarray, int]:
    """One turn's routes from its pieces: ``(routes, start)``, positions ``start ..`` of the sequence.

    Each piece must start where it was asked to, the next piece be asked from where it ended, and cover
    its request up to its last sampled token (which may be left out, as vLLM leaves it out). ``shape``:
    the ``(layers, top_k)`` of the routes the sample holds already. RoutesError otherwise.
    """
    if not pieces:
        raise RoutesError(sample, "no generation result to take routes from")
    out: list[np.ndarray] = []
    expected = pieces[0].asked
    for k, piece in enumerate(pieces):
        last = k == len(pieces) - 1
        if piece.asked != expected:
            raise RoutesError(sample, f"routes asked from {piece.asked} after routes that ended at {expected}")
        if piece.routes is None:
            if last:
                raise RoutesError(sample, f"the backend returned no routes (asked from position {piece.asked})")
            continue  # an interrupted piece without routes: the next one asks from the same position
        routes = check_routes(piece.routes, sample)
        if piece.start != piece.asked:
            raise RoutesError(sample, f"routes start at position {piece.start}, asked from {piece.asked}")
        total = piece.prompt + piece.tokens
        end = piece.start + len(routes)
        if not (end in (total - 1, total) and end >= piece.start) and (last or len(routes)):
            raise RoutesError(
                sample,
                f"routes of {len(routes)} positions from {piece.start}: the request covers positions "
                f"{piece.start}..{total - 1} (the last sampled token may be left out: {total - 1 - piece.start} "
                f"or {total - piece.start} positions, not {len(routes)})",
            )
        got = (int(routes.shape[1]), int(routes.shape[2]))
        if shape is not None and got != shape:
            raise RoutesError(
                sample, f"routes of {got[0]} layers x top-{got[1]} after {shape[0]} layers x top-{shape[1]}"
            )
        shape = got
        out.append(routes)
        expected = end
    joined = out[0] if len(out) == 1 else np.concatenate(out)
    return joined, pieces[0].asked
