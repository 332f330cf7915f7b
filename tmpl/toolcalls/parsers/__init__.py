"""Tool-call parsers, one module per format, and the registry that names them.

``PARSERS`` is in detection priority order: when the probe render of a template is read back
exactly by several parsers, the first one wins (the most specific formats come first, Llama's
bare JSON last).

>>> sorted(PARSERS)[:3]
['deepseek_v3', 'functionary', 'functionary_v3']
"""

from __future__ import annotations

import threading
import weakref

from ...errors import UnknownParserError
from ...tokenize import Codec
from .base import RawCall, ToolParser
from .deepseek import DeepSeekParser
from .functionary import FunctionaryParser
from .functionary_v3 import FunctionaryV3Parser
from .gemma4 import Gemma4Parser
from .glm4 import Glm4Parser
from .harmony import HarmonyParser
from .kimi import KimiK2Parser
from .llama3 import Llama3JsonParser
from .mistral import MistralParser
from .pythonic import PythonicParser
from .qwen_xml import QwenXmlParser
from .tagged import HermesParser, NemotronParser, Phi4Parser, ToolCallsTagParser
from .xml_invoke import XmlInvokeParser

#: name -> parser class, in detection priority order
PARSERS: dict[str, type[ToolParser]] = {
    cls.name: cls
    for cls in (
        HarmonyParser,
        Gemma4Parser,
        DeepSeekParser,
        KimiK2Parser,
        MistralParser,
        QwenXmlParser,
        XmlInvokeParser,
        Glm4Parser,
        HermesParser,
        ToolCallsTagParser,
        NemotronParser,
        Phi4Parser,
        PythonicParser,
        FunctionaryParser,
        Llama3JsonParser,
        FunctionaryV3Parser,
    )
}

_CACHE: "weakref.WeakKeyDictionary[Codec, dict[tuple, ToolParser]]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def get_parser(name: str, codec: Codec, think: tuple[str, str] | None = None) -> ToolParser:
    """The parser ``name`` for a tokenizer's codec (built once per codec, name and ``think``).

    ``think`` overrides the format's reasoning delimiters (open, close) for a template that
    writes reasoning its own way. Raises :class:`~tmpl.errors.UnknownParserError` for a name
    not in :data:`PARSERS`.
    """
    cls = PARSERS.get(name)
    if cls is None:
        raise UnknownParserError(name, list(PARSERS))
    key = (name, think)
    with _LOCK:
        per_codec = _CACHE.setdefault(codec, {})
        parser = per_codec.get(key)
        if parser is None:
            parser = per_codec[key] = cls(codec, think)
    return parser


__all__ = ["PARSERS", "RawCall", "ToolParser", "get_parser"]
