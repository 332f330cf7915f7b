"""Agent harnesses, run once per sample through the gateway (docs/harnesses.md).

- :mod:`.spec`: :class:`Harness`, a harness as data (argv, env, files, setup, timeout, dialect), with
  placeholders for the session's base URL, the task, the working directory;
- :mod:`.catalog`: ready-made specs of real harnesses (Claude Code, Codex CLI, Gemini CLI, ...);
- :mod:`.rollout`: :class:`HarnessRollout`, one harness run per sample (:mod:`.task`, :mod:`.verifier`,
  :mod:`.result`; the process tree under :mod:`.keeper`, the gateway served by :mod:`.server`).
"""

from __future__ import annotations

from .result import HarnessResult
from .rollout import HarnessRollout
from .spec import BASE_URLS, DIALECTS, Harness, RenderedRun
from .task import HarnessTask
from .verifier import CommandVerifier

__all__ = [
    "BASE_URLS",
    "DIALECTS",
    "CommandVerifier",
    "Harness",
    "HarnessResult",
    "HarnessRollout",
    "HarnessTask",
    "RenderedRun",
]
