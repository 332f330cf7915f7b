"""tmpl in TRL: a drop-in ``rollout_func`` for ``GRPOTrainer``, and an RLOO trainer that takes one.

>>> from tmpl.integrations.trl import make_rollout_func, ToolRLOOTrainer        # doctest: +SKIP
>>> trainer = GRPOTrainer(model=model, args=GRPOConfig(...), reward_funcs=reward, train_dataset=ds,
...                       rollout_func=make_rollout_func(tools=[get_weather], max_turns=8))  # doctest: +SKIP
>>> trainer = ToolRLOOTrainer(model=model, args=RLOOConfig(...), reward_funcs=reward, train_dataset=ds,
...                           rollout_func=make_rollout_func(tools=[get_weather]))          # doctest: +SKIP

TRL is imported when one of these is used, never when ``tmpl`` is imported; a missing TRL
raises :class:`tmpl.errors.TrlNotInstalledError`, a version outside ``SUPPORTED_TRL``
:class:`tmpl.errors.UnsupportedTrlVersionError`. See ``docs/integrations.md``.
"""

from __future__ import annotations

from typing import Any

from .backends import VLLMClientBackend, server_url, trainer_backend
from .environments import env_reward
from .harness import HARNESS_KEYS, HarnessRolloutFunc, harness_reward
from .output import ENV_KEYS, REWARD_KEYS, to_trl_output
from .rollout_func import TmplRolloutFunc, make_rollout_func
from .version import SUPPORTED_TRL, check_trl_version, require_trl, supported

__all__ = [
    "ENV_KEYS",
    "HARNESS_KEYS",
    "HarnessRolloutFunc",
    "REWARD_KEYS",
    "SUPPORTED_TRL",
    "TmplRolloutFunc",
    "ToolRLOOTrainer",
    "VLLMClientBackend",
    "check_trl_version",
    "env_reward",
    "harness_reward",
    "make_rollout_func",
    "require_trl",
    "server_url",
    "supported",
    "to_trl_output",
    "trainer_backend",
]


def __getattr__(name: str) -> Any:
    if name == "ToolRLOOTrainer":  # subclasses trl.RLOOTrainer: import TRL only when asked for
        require_trl()
        from .rloo import ToolRLOOTrainer

        return ToolRLOOTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
