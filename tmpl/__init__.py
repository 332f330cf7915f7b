"""tmpl: exact chat-template token IDs for token-in/token-out multi-turn RL with tools.

>>> import tmpl
>>> tmpl.NATIVE in (True, False)
True
"""

from . import templates
from ._core import NATIVE
from .chat_template import ChatTemplate
from .errors import (
    HistoryRequiredError,
    MessageError,
    MissingContentError,
    SpliceError,
    TemplateError,
    TemplateMetadataError,
    TemplateRenderError,
    TmplError,
    ToolMessageCountError,
    UnknownRoleError,
    UnknownTemplateError,
    UnsupportedTemplateError,
)

__version__ = "0.1.0"

__all__ = [
    "NATIVE",
    "ChatTemplate",
    "HistoryRequiredError",
    "MessageError",
    "MissingContentError",
    "SpliceError",
    "TemplateError",
    "TemplateMetadataError",
    "TemplateRenderError",
    "TmplError",
    "ToolMessageCountError",
    "UnknownRoleError",
    "UnknownTemplateError",
    "UnsupportedTemplateError",
    "templates",
]
