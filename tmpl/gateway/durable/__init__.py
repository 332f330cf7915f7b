"""The gateway's durable store: sessions kept on disk, resumed on a restart, episodes read at least once.

See :mod:`tmpl.gateway.durable.core` (``Gateway(store=...)``, ``tmpl serve --store``), :mod:`.sqlite`
(the file) and :mod:`.resume` (records and the sessions rebuilt from them).
"""

from .core import RETRY, Durable, RetryHeaders
from .sqlite import SqliteLog

__all__ = ["RETRY", "Durable", "RetryHeaders", "SqliteLog"]
