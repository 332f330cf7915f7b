"""tmpl: exact chat-template token IDs for token-in/token-out multi-turn RL with tools.

>>> import tmpl
>>> tmpl.NATIVE in (True, False)
True
"""

from . import backends, export, templates
from ._core import NATIVE
from ._core import builder as _builder
from .backends import Sampling
from .batch import collate, collate_arrays
from .chat_template import ChatTemplate
from .errors import (
    BudgetError,
    CollateError,
    ExportError,
    HistoryRequiredError,
    IntegrationError,
    LogprobError,
    MessageError,
    MissingContentError,
    NoToolParserError,
    RolloutContractError,
    SpanLabelError,
    SpliceError,
    TemplateError,
    TemplateMetadataError,
    TemplateRenderError,
    TmplError,
    TokenIdError,
    ToolboxError,
    TrainerConfigError,
    ToolMessageCountError,
    ToolSchemaError,
    TrajectoryClosedError,
    TrajectoryError,
    TrlNotInstalledError,
    UnknownParserError,
    UnknownRoleError,
    UnknownTemplateError,
    UnsupportedTemplateError,
    UnsupportedTrlVersionError,
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
    "export",
    # errors
    "BudgetError",
    "CollateError",
    "ExportError",
    "HistoryRequiredError",
    "IntegrationError",
    "LogprobError",
    "MessageError",
    "MissingContentError",
    "NoToolParserError",
    "RolloutContractError",
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
    "TrainerConfigError",
    "TrajectoryClosedError",
    "TrajectoryError",
    "TrlNotInstalledError",
    "UnknownParserError",
    "UnknownRoleError",
    "UnknownTemplateError",
    "UnsupportedTemplateError",
    "UnsupportedTrlVersionError",
]
