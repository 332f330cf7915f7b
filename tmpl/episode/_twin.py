"""The episode twin in use: the compiled ``_episode_c`` or the pure ``_episode_py``, picked here by
:data:`tmpl.NATIVE` (see :mod:`tmpl._compat`).

:class:`tmpl.episode.Episode` calls it through this module (``_twin.episode.best_match(...)``), so a
test can swap twins (tests/conftest.py's ``twin``, through ``_compat.HOLDERS``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _compat

if TYPE_CHECKING or not _compat.NATIVE:
    from . import _episode_py as episode
else:
    try:
        from . import _episode_c as episode
    except ImportError as _exc:  # built but not loadable: every twin turns pure (_compat.fall_back)
        _compat.fall_back("tmpl.episode._episode_c", _exc)
        from . import _episode_py as episode

__all__ = ["episode"]
