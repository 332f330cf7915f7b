"""tmpl: exact chat-template token IDs for token-in/token-out multi-turn RL with tools.

>>> import tmpl
>>> tmpl.NATIVE in (True, False)
True
"""

from . import templates
from ._core import NATIVE
from ._core import builder as _builder
from .batch import collate, collate_arrays
from .chat_template import ChatTemplate
from .errors import (
    BudgetError,
    CollateError,
    HistoryRequiredError,
    LogprobError,
    MessageError,
    MissingContentError,
    SpanLabelError,
    SpliceError,
    TemplateError,
    TemplateMetadataError,
    TemplateRenderError,
    TmplError,
    TokenIdError,
    ToolMessageCountError,
    TrajectoryClosedError,
    TrajectoryError,
    UnknownRoleError,
    UnknownTemplateError,
    UnsupportedTemplateError,
)
from .trajectory_types import Span, Status

#: One sample's token-in/token-out trajectory (compiled core, or its pure twin; see ``tmpl.NATIVE``).
Trajectory = _builder.Trajectory

__version__ = "0.1.0"

__all__ = [
    "NATIVE",
    "BudgetError",
    "ChatTemplate",
    "CollateError",
    "HistoryRequiredError",
    "LogprobError",
    "MessageError",
    "MissingContentError",
    "Span",
    "SpanLabelError",
    "SpliceError",
    "Status",
    "TemplateError",
    "TemplateMetadataError",
    "TemplateRenderError",
    "TmplError",
    "TokenIdError",
    "ToolMessageCountError",
    "Trajectory",
    "TrajectoryClosedError",
    "TrajectoryError",
    "UnknownRoleError",
    "UnknownTemplateError",
    "UnsupportedTemplateError",
    "collate",
    "collate_arrays",
    "templates",
]
