"""Episodes: the model calls of one sample, merged into exact training sequences (docs/episodes.md).

A :class:`Call` is what one request to an engine was sent and sampled. An :class:`Episode` merges its
calls into :class:`TrainingSequence` objects: a call continues the longest sequence of its agent whose
IDs are a prefix of its prompt, else it starts a new one (a branch, with a :class:`Branch` saying why).
Every sampled token is in exactly one sequence's loss mask; an append-only history is one sequence,
equal to a :class:`tmpl.Trajectory` (:meth:`Episode.from_trajectory`, :meth:`Episode.from_result`).
:func:`token_advantages` puts one advantage per trained token with a baseline over samples, and
:meth:`Episode.rows` feeds :func:`tmpl.collate` one row per sequence.

The prefix test and the growing arrays are compiled (``_native/episode/_episode_c.pyx``) with a
pure-Python twin (``_episode_py.py``), picked by :mod:`tmpl._compat` and held by :mod:`._twin`.

>>> ep = Episode()
>>> ep.add_call(Call([1, 2], [3], [-0.5])), ep.add_call(Call([1, 2, 3, 4], [5], [-0.1]))
(0, 0)
>>> ep.sequences[0].ids.tolist(), ep.sequences[0].mask.tolist()
([1, 2, 3, 4, 5], [0, 0, 1, 0, 1])
"""

from __future__ import annotations

from .advantages import ESTIMATORS, episode_return, returns_to_go, token_advantages
from .builder import Episode, SequenceRow, episodes_rows
from .types import APPENDED_VERSION, Branch, BranchKind, Call, CallSpan, TrainingSequence, first_difference

__all__ = [
    "APPENDED_VERSION",
    "ESTIMATORS",
    "Branch",
    "BranchKind",
    "Call",
    "CallSpan",
    "Episode",
    "SequenceRow",
    "TrainingSequence",
    "episode_return",
    "episodes_rows",
    "first_difference",
    "returns_to_go",
    "token_advantages",
]
