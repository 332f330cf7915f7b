"""tmpl: exact chat-template token IDs for token-in/token-out multi-turn RL with tools.

The public surface, by subsystem (each a subpackage; see docs/architecture.md):

- templates and suffixes: :class:`ChatTemplate` (``tmpl.suffix`` underneath);
- trajectories: :class:`Trajectory`, :class:`Status`, :class:`Span`, :func:`collate`;
- tool calls: :func:`parse_completion`, :class:`ToolCall` (``tmpl.toolcalls``), :class:`Toolbox` (``tmpl.tools``);
- rollouts: :class:`Rollout`, :class:`RolloutResult`, :class:`Sampling` (``tmpl.backends``);
  :class:`DistributedRollout` (one rollout over worker processes or Ray actors);
- environments: :class:`Env` (``tmpl.env``: ``EnvReset``, ``EnvStep``, ``ToolEnv``; one per sample);
- reports and shipped templates: ``tmpl.report``, ``tmpl.templates``; trainers: ``tmpl.export``,
  ``tmpl.integrations``; every error: ``tmpl.errors`` (all derive from :class:`TmplError`).

>>> import tmpl
>>> tmpl.NATIVE in (True, False)
True
"""

from __future__ import annotations

from . import backends, errors, export, report, templates, toolcalls, trajectory
from ._compat import NATIVE  # after .trajectory: a compiled twin that fails to import turns it False
from .backends import Sampling
from .chat_template import ChatTemplate
from .env import Env
from .errors import TmplError
from .rollout import DistributedRollout, Rollout, RolloutMetrics, RolloutResult
from .toolcalls import ParsedCompletion, ToolCall, parse_completion
from .tools import Toolbox
from .trajectory import Span, Status, Trajectory, collate, collate_arrays

__version__ = "0.2.0"

__all__ = [
    "NATIVE",
    # templates and suffixes
    "ChatTemplate",
    # trajectories
    "Trajectory",
    "Status",
    "Span",
    "collate",
    "collate_arrays",
    # tool calls
    "parse_completion",
    "ParsedCompletion",
    "ToolCall",
    "Toolbox",
    # rollouts
    "Rollout",
    "RolloutResult",
    "RolloutMetrics",
    "DistributedRollout",
    "Sampling",
    # environments
    "Env",
    # errors (every one in tmpl.errors derives from it)
    "TmplError",
    # subsystems
    "backends",
    "errors",
    "export",
    "report",
    "templates",
    "toolcalls",
    "trajectory",
]
