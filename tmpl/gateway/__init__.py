"""``tmpl.gateway``: a token-exact gateway for agent harnesses that run their own loop (``tmpl serve``).

A harness (the OpenAI or Anthropic SDK, an agents framework) sends its whole history on every call.
The gateway keeps each session's episode as token IDs: where the history continues a reply it
returned, the sampled IDs are kept and only the new messages are tokenized (tmpl's suffix engine);
where the client changed its history, the template renders it, the sampled IDs it still holds are
spliced back, and the episode starts a branch that names the change. docs/gateway.md shows the setup
for each client.

>>> gateway = Gateway(tpl, backend)                      # doctest: +SKIP
>>> app = create_app(gateway)                            # an ASGI app: uvicorn.run(app)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from .canonical import canonical_message, canonical_tools, reply_difference
from .service import CallParams, Gateway
from .session import Head, Plan, Reply, Session
from .store import Finished, SessionStore

__all__ = [
    "CallParams",
    "Finished",
    "Gateway",
    "Head",
    "Plan",
    "Reply",
    "Session",
    "SessionStore",
    "canonical_message",
    "canonical_tools",
    "create_app",
    "reply_difference",
]


def create_app(gateway: Gateway, **kwargs: Any) -> Any:
    """The ASGI app serving ``gateway`` (needs the ``gateway`` extra: FastAPI and uvicorn); see :mod:`.app`."""
    from .app import create_app as make

    return make(gateway, **kwargs)
