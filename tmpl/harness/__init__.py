"""Agent harnesses, run once per sample through the gateway (docs/harnesses.md).

- :mod:`.spec`: :class:`Harness`, a harness as data (argv, env, files, setup, timeout, dialect), with
  placeholders for the session's base URL, the task, the working directory;
- :mod:`.catalog`: ready-made specs of real harnesses (Claude Code, Codex CLI, Gemini CLI, ...).
"""

from __future__ import annotations

from .spec import BASE_URLS, DIALECTS, Harness, RenderedRun

__all__ = ["BASE_URLS", "DIALECTS", "Harness", "RenderedRun"]
