"""Environments: stateful episodes for agent RL, one per sample (docs/environments.md).

:mod:`.protocol` defines what an environment is (:class:`Env`, :class:`AsyncEnv`: ``reset`` /
``step`` / ``close``, returning :class:`EnvReset` and :class:`EnvStep`); ``Rollout(env_factory=...)``
runs one per sample. Layer: above :mod:`tmpl.tools` and :mod:`tmpl.backends`, below
:mod:`tmpl.rollout` (the loop imports this package, never the reverse).

>>> from tmpl.env import EnvReset, EnvStep
>>> EnvStep(messages=[{"role": "user", "content": "And now?"}], reward=0.5).done
False
"""

from .protocol import RESET_ROLES, STEP_ROLES, AsyncEnv, Env, EnvFactory, EnvReset, EnvStep, call_env, is_async_env

__all__ = [
    "RESET_ROLES",
    "STEP_ROLES",
    "AsyncEnv",
    "Env",
    "EnvFactory",
    "EnvReset",
    "EnvStep",
    "call_env",
    "is_async_env",
]
