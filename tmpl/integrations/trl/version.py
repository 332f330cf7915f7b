"""Which TRL versions the integration supports, and the lazy import that checks it.

The ``rollout_func`` contract this integration relies on (``GRPOTrainer._generate`` calling
``rollout_func(prompts, trainer)``, the required keys ``prompt_ids`` / ``completion_ids`` /
``logprobs``, ``env_mask`` becoming the tool mask, other keys reaching the reward functions),
``VLLMClient.generate`` and the ``RLOOTrainer`` methods that :class:`ToolRLOOTrainer`
overrides read the same in TRL 1.11.0 to 1.16.0 (compared source). 1.10 sent server
generations to a different endpoint. Only 1.16.0 is exercised by the test suite.

>>> supported("1.16.0"), supported("1.11.2"), supported("1.10.0"), supported("1.17.0.dev0")
(True, True, False, False)
"""

from __future__ import annotations

import os
from types import ModuleType

from ...errors import TrlNotInstalledError, UnsupportedTrlVersionError

#: Oldest and newest supported (major, minor), both included.
OLDEST: tuple[int, int] = (1, 11)
NEWEST: tuple[int, int] = (1, 16)
#: The same range as a pip specifier (also in pyproject's ``trl`` extra).
SUPPORTED_TRL = ">=1.11,<1.17"
#: Set to 1 to use an unsupported TRL anyway (at your own risk).
SKIP_ENV = "TMPL_TRL_SKIP_VERSION_CHECK"


def supported(version: str) -> bool:
    """Whether a TRL version string lies in the supported range (pre-releases of a newer minor do not)."""
    from packaging.version import InvalidVersion, Version

    try:
        release = Version(version).release
    except InvalidVersion:
        return False
    return OLDEST <= tuple(release[:2]) <= NEWEST


def check_trl_version(version: str) -> None:
    """Raise :class:`~tmpl.errors.UnsupportedTrlVersionError` unless ``version`` is supported."""
    if os.environ.get(SKIP_ENV, "") not in ("", "0"):
        return
    if not supported(version):
        raise UnsupportedTrlVersionError(version, SUPPORTED_TRL)


def require_trl() -> ModuleType:
    """Import TRL and check its version; the clear errors when it is missing or unsupported.

    >>> trl = require_trl()  # doctest: +SKIP
    """
    try:
        import trl
    except ImportError as exc:
        raise TrlNotInstalledError(str(exc)) from exc
    check_trl_version(getattr(trl, "__version__", "unknown"))
    return trl
