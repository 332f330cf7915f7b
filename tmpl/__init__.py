"""tmpl: exact chat-template token IDs for token-in/token-out multi-turn RL with tools.

>>> import tmpl
>>> tmpl.NATIVE in (True, False)
True
"""

from ._core import NATIVE
from .chat_template import ChatTemplate
from .errors import (
    MessageError,
    MissingContentError,
    NoToolParserError,
    SpliceError,
    TemplateError,
    TemplateRenderError,
    TmplError,
    ToolboxError,
    ToolMessageCountError,
    ToolSchemaError,
    UnknownParserError,
    UnknownRoleError,
    UnsupportedTemplateError,
)
from .toolcalls import (
    BatchResult,
    CallOutcome,
    Detection,
    ParsedCompletion,
    ParseError,
    ToolCall,
    ToolMetrics,
    Toolbox,
    get_parser,
)
from .toolcalls import detect as detect_parser

__version__ = "0.1.0"

__all__ = [
    "NATIVE",
    "ChatTemplate",
    "MessageError",
    "MissingContentError",
    "NoToolParserError",
    "SpliceError",
    "TemplateError",
    "TemplateRenderError",
    "TmplError",
    # tool calls (tmpl.toolcalls)
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
    "ToolMessageCountError",
    "ToolSchemaError",
    "ToolboxError",
    "UnknownParserError",
    "UnknownRoleError",
    "UnsupportedTemplateError",
]
