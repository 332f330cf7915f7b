"""Errors of a trainer integration (:class:`IntegrationError`): TRL and other packages missing or unsupported,
environment adapters, continuous tokens, a trainer's settings, a rollout function's contract."""

from __future__ import annotations

from .base import TmplError


class IntegrationError(TmplError):
    """A trainer integration (``tmpl.integrations``) cannot work with what it was given."""


class TrlNotInstalledError(IntegrationError, ImportError):
    """``tmpl.integrations.trl`` was used but TRL is not installed.

    >>> raise TrlNotInstalledError()
    Traceback (most recent call last):
    ...
    tmpl.errors.TrlNotInstalledError: tmpl.integrations.trl needs TRL, which is not installed: pip install 'tmpl[trl]'
    """

    def __init__(self, detail: str = "") -> None:
        message = "tmpl.integrations.trl needs TRL, which is not installed: pip install 'tmpl[trl]'"
        super().__init__(message + (f" ({detail})" if detail else ""))


class UnsupportedTrlVersionError(IntegrationError):
    """The installed TRL is outside the range whose trainer contract tmpl was checked against.

    >>> raise UnsupportedTrlVersionError("1.9.2", ">=1.11,<1.17")
    Traceback (most recent call last):
    ...
    tmpl.errors.UnsupportedTrlVersionError: TRL 1.9.2 is installed; tmpl.integrations.trl supports trl>=1.11,<1.17 (pip install 'tmpl[trl]'), or set TMPL_TRL_SKIP_VERSION_CHECK=1 to try it anyway
    """

    def __init__(self, installed: str, supported: str) -> None:
        self.installed = installed
        self.supported = supported
        super().__init__(
            f"TRL {installed} is installed; tmpl.integrations.trl supports trl{supported} (pip install 'tmpl[trl]'), "
            "or set TMPL_TRL_SKIP_VERSION_CHECK=1 to try it anyway"
        )


class IntegrationNotInstalledError(IntegrationError, ImportError):
    """An integration (``tmpl.integrations.verl``, ``.slime``) was used without its trainer installed.

    >>> raise IntegrationNotInstalledError("verl", "pip install verl==0.9.1")
    Traceback (most recent call last):
    ...
    tmpl.errors.IntegrationNotInstalledError: tmpl.integrations.verl needs verl, which is not installed: pip install verl==0.9.1
    """

    def __init__(self, package: str, install: str, detail: str = "") -> None:
        self.package = package
        message = f"tmpl.integrations.{package} needs {package}, which is not installed: {install}"
        super().__init__(message + (f" ({detail})" if detail else ""))


class EnvAdapterError(IntegrationError, ValueError):
    """An adapter of another framework's environments (``tmpl.env.trl``, ``tmpl.env.openenv``) was given
    something it cannot run as a tmpl environment; ``adapter`` names it.

    >>> raise EnvAdapterError("OpenEnvEnv", "EchoObservation has no text field to show the model")
    Traceback (most recent call last):
    ...
    tmpl.errors.EnvAdapterError: OpenEnvEnv: EchoObservation has no text field to show the model
    """

    def __init__(self, adapter: str, reason: str) -> None:
        self.adapter = adapter
        self.reason = reason
        super().__init__(f"{adapter}: {reason}")


class ContinuousTokenError(IntegrationError, ValueError):
    """tmpl cannot give exact IDs for a verl Continuous Token merge and was told not to fall back.

    >>> raise ContinuousTokenError("gemma-2-it", "a 'tool' message raises in the template")
    Traceback (most recent call last):
    ...
    tmpl.errors.ContinuousTokenError: gemma-2-it: a 'tool' message raises in the template
    """

    def __init__(self, template: str, reason: str) -> None:
        self.template = template
        self.reason = reason
        super().__init__(f"{template}: {reason}")


class TrainerConfigError(IntegrationError, ValueError):
    """A trainer is configured in a way the integration cannot honour; ``trainer`` names its class,
    ``setting`` the argument at fault.

    >>> raise TrainerConfigError("GRPOTrainer", "tools", "pass the tools to make_rollout_func only")
    Traceback (most recent call last):
    ...
    tmpl.errors.TrainerConfigError: GRPOTrainer(tools=...): pass the tools to make_rollout_func only
    """

    def __init__(self, trainer: str, setting: str, reason: str) -> None:
        self.trainer = trainer
        self.setting = setting
        self.reason = reason
        super().__init__(f"{trainer}({setting}=...): {reason}")


class RolloutContractError(IntegrationError, ValueError):
    """What a ``rollout_func`` returned breaks TRL's contract (a missing key, lengths that differ).

    >>> raise RolloutContractError("completion_ids", "3 rows for 4 prompts")
    Traceback (most recent call last):
    ...
    tmpl.errors.RolloutContractError: rollout_func output 'completion_ids': 3 rows for 4 prompts
    """

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"rollout_func output {key!r}: {reason}")
