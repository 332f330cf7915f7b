"""tmpl as a ``renderers`` Renderer: PrimeIntellect's renderer protocol (prime-rl, verifiers) backed by tmpl.

:class:`TmplRenderer` satisfies ``renderers.base.Renderer``. Its ``bridge_to_next_turn`` has tmpl's two
history modes (``TmplRendererConfig(history=...)``): ``"template"`` (the default) returns the template's
own render of the conversation so far where it extends the previous prompt and completion, and None,
naming the branch, where it does not; ``"append"`` appends tmpl's exact suffix for every tool round tmpl
can suffix. A None's reason is in its log and in ``last_bridge_reason``. It plugs in through renderers'
own ``CustomRendererConfig``:

>>> from renderers import create_renderer                                    # doctest: +SKIP
>>> from renderers.configs import CustomRendererConfig                       # doctest: +SKIP
>>> renderer = create_renderer(tokenizer, CustomRendererConfig(
...     import_path="tmpl.integrations.renderers.TmplRenderer"))              # doctest: +SKIP
>>> bridged = renderer.bridge_to_next_turn(prompt_ids, completion_ids, tool_messages, tools=tools)  # doctest: +SKIP

``renderers`` is imported when :class:`TmplRenderer` or :class:`TmplRendererConfig` is first asked
for, never when ``tmpl`` is imported; without it they raise
:class:`tmpl.errors.IntegrationNotInstalledError` (``pip install 'tmpl[renderers]'``). See
``docs/integrations.md``.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ...errors import IntegrationNotInstalledError

#: the renderers releases this integration was written and tested against
SUPPORTED_RENDERERS = ">=0.1.12,<0.2"
INSTALL = "pip install 'tmpl[renderers]'"

__all__ = ["INSTALL", "SUPPORTED_RENDERERS", "TmplRenderer", "TmplRendererConfig", "require_renderers"]


def require_renderers() -> None:
    """Raise :class:`~tmpl.errors.IntegrationNotInstalledError` unless ``renderers`` can be imported.

    >>> require_renderers()  # doctest: +SKIP
    """
    if importlib.util.find_spec("renderers") is None:
        raise IntegrationNotInstalledError("renderers", INSTALL)
    try:
        import renderers.base  # noqa: F401
    except ImportError as exc:  # installed, but one of its own imports is missing (e.g. httpx)
        raise IntegrationNotInstalledError("renderers", INSTALL, f"importing it failed: {exc}") from exc


def __getattr__(name: str) -> Any:
    if name in ("TmplRenderer", "TmplRendererConfig"):
        require_renderers()
        from . import renderer

        return getattr(renderer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
