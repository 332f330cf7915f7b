"""Per-template state: what tmpl has learned about one template fingerprint.

Everything probed about a template (how its turns close, the frames of tool-result shapes,
the detected tool-call parser, its report) is kept in one :class:`TemplateState` per
fingerprint, shared by every :class:`~tmpl.ChatTemplate` with that fingerprint. The suffix
engine owns the registry; layers above it (tool-call detection, reports) keep their results
in the state's memo slots, so this module never imports them. The registry is bounded: the
least recently used states are dropped beyond :data:`MAX_STATES` fingerprints.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .frames import Frame
    from .probe import TurnInfo

T = TypeVar("T")

#: How many template fingerprints keep their state at once (least recently used dropped first).
MAX_STATES = 256


class TemplateState:
    """What is known about one template fingerprint (thread-safe; see the module doc)."""

    __slots__ = ("fingerprint", "lock", "turns", "frames", "_memo", "__weakref__")

    def __init__(self, fingerprint: str) -> None:
        self.fingerprint = fingerprint
        self.lock = threading.RLock()
        #: how plain and tool-call turns close (probed once)
        self.turns: TurnInfo | None = None
        #: frames by (tools digest, tool-message shape); an exception when the shape is unsupported
        self.frames: dict[tuple[Any, ...], Frame | Exception] = {}
        self._memo: dict[str, Any] = {}

    def memo(self, key: str, make: Callable[[], T]) -> T:
        """The value stored under ``key``, made once by ``make()`` (detection, report...)."""
        try:
            return self._memo[key]  # type: ignore[no-any-return]
        except KeyError:
            pass
        with self.lock:
            if key not in self._memo:
                self._memo[key] = make()
            return self._memo[key]  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"TemplateState({self.fingerprint[:12]}, frames={len(self.frames)}, memo={sorted(self._memo)})"


_STATES: OrderedDict[str, TemplateState] = OrderedDict()
_STATES_LOCK = threading.Lock()


def state_for(fingerprint: str) -> TemplateState:
    """The state of one template fingerprint (made on first use)."""
    with _STATES_LOCK:
        state = _STATES.get(fingerprint)
        if state is None:
            state = _STATES[fingerprint] = TemplateState(fingerprint)
            while len(_STATES) > MAX_STATES:
                _STATES.popitem(last=False)
        else:
            _STATES.move_to_end(fingerprint)
        return state


def clear_caches() -> None:
    """Forget every template's state (tests; or after editing a template file in place)."""
    with _STATES_LOCK:
        _STATES.clear()
