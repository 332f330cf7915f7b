"""Tool schemas: from callables (transformers' ``get_json_schema``) or dicts, looked up by name.

>>> def get_weather(city: str, days: int = 1) -> str:
...     '''Weather forecast.
...
...     Args:
...         city: City name.
...         days: Number of days.
...     '''
>>> schema = tool_schema(get_weather)
>>> schema["function"]["parameters"]["properties"]["days"]
{'type': 'integer', 'description': 'Number of days.'}
>>> sorted(parameters_by_name([schema]))
['get_weather']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ToolSchemaError


def tool_schema(tool: Any) -> dict[str, Any]:
    """The OpenAI-style schema ``{"type": "function", "function": {...}}`` of a callable or dict.

    A dict is returned as given when it is already in that form, and wrapped when it is a bare
    function description (``{"name": ..., "parameters": ...}``).
    Raises :class:`~tmpl.errors.ToolSchemaError` when a callable's schema cannot be built.
    """
    if isinstance(tool, Mapping):
        if tool.get("type") == "function" and isinstance(tool.get("function"), Mapping):
            return dict(tool)
        if isinstance(tool.get("name"), str):
            return {"type": "function", "function": dict(tool)}
        raise ToolSchemaError(repr(tool)[:60], "a schema dict needs 'name' (or 'type': 'function' and 'function')")
    if not callable(tool):
        raise ToolSchemaError(repr(tool)[:60], f"a tool must be a callable or a schema dict, not {type(tool).__name__}")
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(tool)
    except Exception as exc:  # DocstringParsingException, TypeHintParsingException
        name = getattr(tool, "__name__", repr(tool))
        raise ToolSchemaError(
            name,
            f"cannot build its JSON schema from type hints and docstring ({type(exc).__name__}: {exc}); "
            "give every argument a type hint and a line under 'Args:' in the docstring, or pass a schema dict",
        ) from exc


def tool_name(schema: Mapping[str, Any]) -> str:
    """The function name of an OpenAI-style schema."""
    return str(schema.get("function", schema).get("name", ""))


def parameters_by_name(tools: Sequence[Any] | Any | None) -> dict[str, dict[str, Any]]:
    """``{tool name: parameters schema}`` for a tools list, a :class:`~tmpl.Toolbox`, or None."""
    if tools is None:
        return {}
    schemas = getattr(tools, "schemas", None)
    if schemas is None:
        schemas = [tool_schema(t) for t in tools]
    out: dict[str, dict[str, Any]] = {}
    for schema in schemas:
        fn = schema.get("function", schema)
        params = fn.get("parameters")
        out[str(fn.get("name", ""))] = dict(params) if isinstance(params, Mapping) else {}
    return out
