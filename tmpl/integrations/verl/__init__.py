"""tmpl in verl: an exact Continuous Token builder for any model, and a tool agent loop.

verl (0.9.1) renders agent-loop prompts through ``ContinuousTokenBuilder`` subclasses, one per model
family, picked by the exact ``config.json`` ``model_type``; any other model gets a generic builder.
:class:`TmplContinuousTokenBuilder` is one builder for every template tmpl proves: its tool-result
merges are ``tpl.suffix_ids`` (equal to the template's full render, token for token).

>>> from tmpl.integrations.verl import use_tmpl_builders               # doctest: +SKIP
>>> use_tmpl_builders()   # every verl agent loop created from now on uses tmpl's builder  # doctest: +SKIP

Or per dataset row: ``agent_name: tmpl_tool_agent`` (tmpl's own multi-turn loop, see
:mod:`tmpl.integrations.verl.agent_loop`) after ``register_tool_agent(tools=[...])``; with several
training sequences per sample, verl's V1 trainer with :class:`TmplAgentLoopManager`
(:mod:`tmpl.integrations.verl.manager`).

verl is imported when one of these is used, never when ``tmpl`` is imported; without verl they
raise :class:`tmpl.errors.IntegrationNotInstalledError`. See ``docs/integrations.md``.
"""

from __future__ import annotations

from typing import Any

from ...errors import IntegrationNotInstalledError
from .backend import VerlServerBackend

__all__ = [
    "TmplAgentLoopManager",
    "TmplAgentLoopWorker",
    "TmplContinuousTokenBuilder",
    "TmplHarnessAgentLoop",
    "TmplToolAgentLoop",
    "VerlServerBackend",
    "create_tmpl_builder",
    "register_harness_agent",
    "register_tool_agent",
    "require_verl",
    "use_tmpl_builders",
]

VERL_INSTALL = "pip install 'tmpl[verl]' (verl==0.9.1 cachetools uvicorn fastapi; verl 0.9.1 needs transformers<5.11)"


def require_verl() -> Any:
    """Import verl's agent-loop and Continuous Token modules, or raise a clear error."""
    try:
        import verl.utils.tokenizer.continuous_token as ct
    except ImportError as exc:
        raise IntegrationNotInstalledError("verl", VERL_INSTALL, detail=str(exc)) from exc
    return ct


_LAZY = {
    "TmplContinuousTokenBuilder": "builder",
    "create_tmpl_builder": "builder",
    "use_tmpl_builders": "builder",
    "TmplToolAgentLoop": "agent_loop",
    "register_tool_agent": "agent_loop",
    "TmplHarnessAgentLoop": "harness_loop",
    "register_harness_agent": "harness_loop",
    "TmplAgentLoopManager": "manager",
    "TmplAgentLoopWorker": "manager",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    require_verl()
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
