"""The verdict levels of a report and :class:`Verdict` (shared by :mod:`.report` and :mod:`.multimodal`).

>>> Verdict(UNSAFE, "thinking stripped from earlier turns").label
'UNSAFE (thinking stripped from earlier turns)'
"""

from __future__ import annotations

from dataclasses import dataclass

SAFE, SAFE_WITH, UNSAFE, UNSUPPORTED = "SAFE", "SAFE WITH tmpl TEMPLATE", "UNSAFE", "UNSUPPORTED"
#: a check could not run (a render raised on a shape the template otherwise accepts, a budget ran out...)
UNPROVEN = "UNPROVEN"


@dataclass
class Verdict:
    """One use's verdict. ``label`` reads like ``UNSAFE (thinking stripped from earlier turns)``."""

    level: str
    reason: str = ""
    template: str | None = None
    #: SAFE: the checked steps of this use across the search's conversations
    cases: int = 0

    @property
    def label(self) -> str:
        if self.level == SAFE_WITH:
            return f"{SAFE_WITH} {self.template}"
        return f"{self.level} ({self.reason})" if self.reason and self.level != SAFE else self.level
