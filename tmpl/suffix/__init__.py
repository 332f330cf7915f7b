"""Suffix IDs: the tokens to append after a completion that made tool calls.

:mod:`.probe` renders dummy conversations to find how turns close; :mod:`.frames` turns
renders of one tool-message shape into static ID chunks and dynamic text runs;
:mod:`.engine` fills a frame with real tool results; :mod:`.state` keeps all of it per
template fingerprint. Use it through :meth:`tmpl.ChatTemplate.suffix_ids`.
"""

from __future__ import annotations

from .engine import SuffixEngine
from .state import TemplateState, clear_caches, state_for

__all__ = ["SuffixEngine", "TemplateState", "clear_caches", "state_for"]
