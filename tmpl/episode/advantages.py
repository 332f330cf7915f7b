"""Rewards and advantages of episodes: one value per trained token, with a baseline over samples.

An episode's return is its reward plus every call's (per-turn) reward. The baseline is computed over
the *samples* of one prompt (the group), never over turns: each sample's return counts once, whatever
its number of turns or sequences. A per-turn-index baseline (normalizing turn k's rewards across the
samples that reached turn k) subtracts a baseline whose terms depend on when the sample itself stopped,
which biases the gradient towards or against taking another turn (verl #7244).

For a group of samples with returns ``R_1..R_n``:

- GRPO: ``b = mean(R)``, advantage ``(G - b) / (std(R) + eps)`` (``std`` as torch computes it, with
  ``n - 1``; ``scale=False`` leaves the division out, as Dr. GRPO does);
- RLOO: ``b_i = mean of the other samples' R`` (leave-one-out), advantage ``G - b_i``.

``G`` is the sample's return, or with ``reward_to_go=True`` (the default) the part of it that comes at
or after the call that sampled the token: the episode reward plus the rewards of that call and the calls
added after it. With only an episode reward both are the same. Tokens outside the loss mask get 0.0.

>>> from tmpl.episode import Call, Episode
>>> group = [Episode(reward=r) for r in (1.0, 0.0, 0.5)]
>>> for ep in group:
...     _ = ep.add_call(Call([1], [2, 3], [-0.1, -0.2]))
>>> [a[0].tolist() for a in token_advantages(group, estimator="rloo")]
[[0.0, 0.75, 0.75], [0.0, -0.75, -0.75], [0.0, 0.0, 0.0]]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from ..errors import RewardError
from .builder import Episode

__all__ = ["ESTIMATORS", "episode_return", "returns_to_go", "sample_advantages", "token_advantages"]

#: The group baselines :func:`token_advantages` knows.
ESTIMATORS: tuple[str, ...] = ("grpo", "rloo")


def episode_return(episode: Episode) -> float:
    """The episode's reward plus every call's reward; RewardError when it has neither.

    >>> from tmpl.episode import Call, Episode
    >>> ep = Episode(reward=1.0)
    >>> _ = ep.add_call(Call([1], [2], [-0.1], reward=0.25))
    >>> episode_return(ep)
    1.25
    """
    rewards = [episode.call_reward(call.id) for call in episode.calls if call.id is not None]
    given = [r for r in rewards if r is not None]
    if episode.reward is None and not given:
        raise RewardError(episode.sample_id, None, "the episode has no reward (neither its own nor any call's)")
    return (episode.reward or 0.0) + math.fsum(given)


def returns_to_go(episode: Episode) -> dict[str, float]:
    """Per call id: the episode reward plus the rewards of that call and every call added after it."""
    episode_return(episode)  # raises when there is no reward at all
    out: dict[str, float] = {}
    running = episode.reward or 0.0
    for call in reversed(episode.calls):
        assert call.id is not None
        running += episode.call_reward(call.id) or 0.0
        out[call.id] = running
    return out


def _baselines(totals: np.ndarray, estimator: str, scale: bool, eps: float) -> tuple[np.ndarray, float]:
    """Per sample: the group baseline, and the divisor of ``G - baseline``."""
    n = len(totals)
    if estimator == "rloo":
        return (totals.sum() - totals) / (n - 1), 1.0
    divisor = (float(totals.std(ddof=1)) if n > 1 else 0.0) + eps if scale else 1.0
    return np.full(n, totals.mean()), divisor


def sample_advantages(
    returns: Sequence[float] | np.ndarray,
    *,
    estimator: Literal["grpo", "rloo"] = "grpo",
    scale: bool = True,
    eps: float = 1e-6,
) -> np.ndarray:
    """One advantage per sample of a group from the samples' returns (the baseline of :func:`token_advantages`).

    For a trainer that scores whole samples (TRL's reward functions): every training sequence of sample
    ``i`` gets ``out[i]`` on its loss mask. RewardError for an empty group, a non-finite return, an
    unknown estimator or an RLOO group of one sample.

    >>> sample_advantages([1.0, 0.0, 0.5], estimator="rloo").tolist()
    [0.75, -0.75, 0.0]
    """
    totals = np.asarray(returns, dtype=np.float64).reshape(-1)
    if not len(totals):
        raise RewardError(None, None, "no returns to compute advantages for")
    if estimator not in ESTIMATORS:
        raise RewardError(None, None, f"unknown estimator {estimator!r}; known: {', '.join(ESTIMATORS)}")
    bad = np.flatnonzero(~np.isfinite(totals))
    if len(bad):
        raise RewardError(int(bad[0]), None, f"return {totals[bad[0]]} of sample {int(bad[0])} is not finite")
    if estimator == "rloo" and len(totals) < 2:
        raise RewardError(None, None, "RLOO needs at least 2 samples of the prompt")
    baselines, divisor = _baselines(totals, estimator, scale, eps)
    out: np.ndarray = (totals - baselines) / divisor
    return out


def token_advantages(
    group: Sequence[Episode],
    *,
    estimator: Literal["grpo", "rloo"] = "grpo",
    scale: bool = True,
    eps: float = 1e-6,
    reward_to_go: bool = True,
) -> list[list[np.ndarray]]:
    """One advantage per token for every sequence of every episode of one group (samples of one prompt).

    Returns ``out[i][k]``: a float32 array aligned with ``group[i].sequences[k].ids``, the advantage on
    that sequence's loss-mask tokens and 0.0 elsewhere. ``scale`` divides by the group's standard
    deviation (GRPO only). RewardError for an empty group, an episode without reward, an unknown
    estimator or an RLOO group of one sample.
    """
    episodes = list(group)
    if not episodes:
        raise RewardError(None, None, "no episodes to compute advantages for")
    if estimator not in ESTIMATORS:
        raise RewardError(None, None, f"unknown estimator {estimator!r}; known: {', '.join(ESTIMATORS)}")
    totals = np.array([episode_return(ep) for ep in episodes], dtype=np.float64)
    if estimator == "rloo" and len(totals) < 2:
        raise RewardError(episodes[0].sample_id, None, "RLOO needs at least 2 samples of the prompt")
    baselines, divisor = _baselines(totals, estimator, scale, eps)
    out: list[list[np.ndarray]] = []
    for ep, total, baseline in zip(episodes, totals, baselines):
        to_go = returns_to_go(ep) if reward_to_go else {}
        rows: list[np.ndarray] = []
        for seq in ep.sequences:
            adv = np.zeros(len(seq.ids), dtype=np.float32)
            for span in seq.spans:
                if span.size and seq.mask[span.start]:
                    value = to_go.get(span.call, float(total))
                    adv[span.start : span.end] = (value - baseline) / divisor
            rows.append(adv)
        out.append(rows)
    return out
