"""Tool calls for multi-turn RL: parse every major format from token IDs (running them: :mod:`tmpl.tools`).

>>> import tmpl
>>> tpl = tmpl.ChatTemplate.from_pretrained("Qwen/Qwen3-4B")          # doctest: +SKIP
>>> tools = tmpl.Toolbox([get_weather, search], timeout=10.0)         # doctest: +SKIP
>>> parsed = parse_completion(tpl, completion_ids, tools=tools)        # doctest: +SKIP
>>> result = tools.run_batch([parsed])                                # doctest: +SKIP
>>> suffix = tpl.suffix_ids(result.messages[0], completion_ids=completion_ids, tools=tools.schemas)  # doctest: +SKIP

Modules: :mod:`.types` (records), :mod:`.arguments` and :mod:`.literal` (reading arguments),
:mod:`.tokentext` (IDs as marked text), :mod:`.parsers` (one module per format),
:mod:`.detect` (which parser a template needs), :mod:`.schema` (tool schemas).
Running tools (``Toolbox``, ``ToolMetrics``, ``FAILURE_KINDS``) is :mod:`tmpl.tools`.
"""

from .api import parse_completion, parser_for
from .arguments import Arguments, coerce_arguments, read_arguments
from .detect import Detection, detect
from .parsers import PARSERS, ToolParser, get_parser
from .schema import tool_schema
from .types import CallProblem, ParsedCompletion, ParseError, ToolCall, new_call_id

__all__ = [
    "PARSERS",
    "Arguments",
    "CallProblem",
    "Detection",
    "ParseError",
    "ParsedCompletion",
    "ToolCall",
    "ToolParser",
    "coerce_arguments",
    "detect",
    "get_parser",
    "new_call_id",
    "parse_completion",
    "parser_for",
    "read_arguments",
    "tool_schema",
]
