"""tmpl: exact chat-template token IDs for token-in/token-out multi-turn RL with tools.

>>> import tmpl
>>> tmpl.NATIVE in (True, False)
True
"""

from . import backends, templates
from ._core import NATIVE
from ._core import builder as _builder
from .backends import Sampling
from .batch import collate, collate_arrays
from .chat_template import ChatTemplate
from .errors import (
    BudgetError,
    CollateError,
    HistoryRequiredError,
    LogprobError,
    MessageError,
    MissingContentError,
    NoToolParserError,
    SpanLabelError,
    SpliceError,
    TemplateError,
    TemplateMetadataError,
    TemplateRenderError,
    TmplError,
    TokenIdError,
    ToolboxError,
    ToolMessageCountError,
    ToolSchemaError,
    TrajectoryClosedError,
    TrajectoryError,
    UnknownParserError,
    UnknownRoleError,
    UnknownTemplateError,
    UnsupportedTemplateError,
)
from .rollout import Rollout, RolloutResult
from .rollout_metrics import RolloutMetrics
from .toolcalls import (
    BatchResult,
    CallOutcome,
    Detection,
    ParsedCompletion,
    ParseError,
    ToolCall,
    Toolbox,
    ToolMetrics,
    get_parser,
)
from .toolcalls import detect as detect_parser
from .trajectory_types import Span, Status

#: One sample's token-in/token-out trajectory (compiled core, or its pure twin; see ``tmpl.NATIVE``).
Trajectory = _builder.Trajectory

__version__ = "0.1.0"

__all__ = [
    "NATIVE",
    # templates and suffixes
    "ChatTemplate",
    "templates",
    # trajectories
    "Trajectory",
    "Status",
    "Span",
    "collate",
    "collate_arrays",
    # tool calls
    "BatchResult",
    "CallOutcome",
    "Detection",
    "ParseError",
    "ParsedCompletion",
    "ToolCall",
    "ToolMetrics",
    "Toolbox",
    "detect_parser",
    "get_parser",
    # rollouts
    "Rollout",
    "RolloutResult",
    "RolloutMetrics",
    "Sampling",
    "backends",
    # errors
    "BudgetError",
    "CollateError",
    "HistoryRequiredError",
    "LogprobError",
    "MessageError",
    "MissingContentError",
    "NoToolParserError",
    "SpanLabelError",
    "SpliceError",
    "TemplateError",
    "TemplateMetadataError",
    "TemplateRenderError",
    "TmplError",
    "TokenIdError",
    "ToolMessageCountError",
    "ToolSchemaError",
    "ToolboxError",
    "TrajectoryClosedError",
    "TrajectoryError",
    "UnknownParserError",
    "UnknownRoleError",
    "UnknownTemplateError",
    "UnsupportedTemplateError",
]
