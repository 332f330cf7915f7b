"""The source edits: position atoms pinned, the date pinned, ``{% generation %}`` markers added.

Each edit is a span edit of the source text (:func:`~tmpl.report.jinja_source.apply_edits`) at the
place the lexer located, described by a :class:`~tmpl.report.fix.types.Change`. :mod:`.pins` pins positions
and the date, :mod:`.markers` adds the generation markers.
"""

from __future__ import annotations

from .markers import add_generation_markers, has_generation_markers
from .pins import pin_date, pin_positions

__all__ = ["add_generation_markers", "has_generation_markers", "pin_date", "pin_positions"]
