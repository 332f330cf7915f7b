"""Environments: stateful episodes for agent RL, one per sample (docs/environments.md).

:mod:`.protocol` defines what an environment is (:class:`Env`, :class:`AsyncEnv`: ``reset`` /
``step`` / ``close``, returning :class:`EnvReset` and :class:`EnvStep`); ``Rollout(env_factory=...)``
runs one per sample. :mod:`.checks` refuses what an environment must not return; :mod:`.turns` gives the
exact suffix of any appended turns; :class:`ToolEnv` (:mod:`.toolenv`) is an environment over a Toolbox
with an optional simulated user (:class:`SimulatedUser`, :mod:`.user`: a model through any backend). Layer: above :mod:`tmpl.tools` and :mod:`tmpl.backends`, below
:mod:`tmpl.rollout` (the loop imports this package, never the reverse).

>>> from tmpl.env import EnvReset, EnvStep
>>> EnvStep(messages=[{"role": "user", "content": "And now?"}], reward=0.5).done
False
"""

from .protocol import RESET_ROLES, STEP_ROLES, AsyncEnv, Env, EnvFactory, EnvReset, EnvStep, call_env, is_async_env
from .toolenv import ToolEnv
from .user import SimulatedUser

__all__ = [
    "RESET_ROLES",
    "STEP_ROLES",
    "AsyncEnv",
    "Env",
    "EnvFactory",
    "EnvReset",
    "EnvStep",
    "SimulatedUser",
    "ToolEnv",
    "call_env",
    "is_async_env",
]
