"""Turn what a model wrote as a call's arguments into a dict, and coerce it to the tool's schema.

Accepted, in order: a dict; a JSON object; a JSON string that holds a JSON object (double
encoding); a JSON object followed by trailing text; a Python-literal dict (single quotes,
``True``/``None``, trailing commas), read by :mod:`tmpl.toolcalls.literal`, never evaluated.
Each forgiven deviation is reported as a *repair*. Nothing here raises on model output.

>>> read_arguments('{"city": "Paris"}')
Arguments(value={'city': 'Paris'}, repairs=(), error=None)
>>> read_arguments("{'city': 'Paris'} and more").repairs
('python literal', 'trailing text')
>>> read_arguments("[1, 2]").error
'arguments must be an object, got a list'
>>> coerce_arguments({"days": "3", "metric": "true"},
...                  {"properties": {"days": {"type": "integer"}, "metric": {"type": "boolean"}}})
({'days': 3, 'metric': True}, ('coerced days to integer', 'coerced metric to boolean'))
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .literal import LiteralError, read_literal

_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class Arguments:
    """Outcome of reading arguments: a dict, or an error saying why not (never both)."""

    value: dict[str, Any] | None
    repairs: tuple[str, ...] = ()
    error: str | None = None


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, (int, float)):
        return "a number"
    if value is None:
        return "null"
    return f"a {type(value).__name__}"


def _first_value(text: str) -> tuple[Any, int, tuple[str, ...]]:
    """Read one JSON (else Python-literal) value at the start of ``text``; raises ValueError."""
    try:
        value, end = _DECODER.raw_decode(text)
        return value, end, ()
    except (ValueError, RecursionError):
        pass
    try:
        value, end = read_literal(text)
    except LiteralError as exc:
        raise ValueError(str(exc)) from None
    return value, end, ("python literal",)


def read_arguments(raw: Any, *, _depth: int = 0) -> Arguments:
    """Read a call's arguments (a dict, or text) into a dict; see the module docstring."""
    if isinstance(raw, Mapping):
        return Arguments(dict(raw))
    if raw is None:
        return Arguments({}, ("no arguments",))
    if not isinstance(raw, str):
        return Arguments(None, error=f"arguments must be an object, got {_kind(raw)}")
    text = raw.strip()
    if not text:
        return Arguments({}, ("empty arguments",))
    try:
        value, end, repairs = _first_value(text)
    except ValueError as exc:
        return Arguments(None, error=f"arguments are not valid JSON ({exc})")
    if text[end:].strip():
        repairs += ("trailing text",)
    if isinstance(value, str) and _depth < 2:  # a JSON string holding JSON
        inner = read_arguments(value, _depth=_depth + 1)
        if inner.value is not None:
            return Arguments(inner.value, repairs + ("json in a string",) + inner.repairs)
        return Arguments(None, error=f"arguments must be an object, got a string ({inner.error})")
    if not isinstance(value, dict):
        return Arguments(None, error=f"arguments must be an object, got {_kind(value)}")
    return Arguments(value, repairs)


# -- schema coercion ---------------------------------------------------------------------

_INT = re.compile(r"[+-]?\d+\Z")
_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\Z")


def _types(schema: Mapping[str, Any]) -> tuple[str, ...]:
    t = schema.get("type")
    if isinstance(t, str):
        return (t,)
    if isinstance(t, list):
        return tuple(x for x in t if isinstance(x, str))
    if "properties" in schema:
        return ("object",)
    if "items" in schema:
        return ("array",)
    return ()


def _from_text(value: str, types: tuple[str, ...]) -> tuple[bool, Any]:
    """Convert a text value to the single non-string type of ``types`` when that is unambiguous."""
    wanted = [t for t in types if t != "null"]
    text = value.strip()
    if "null" in types and text in ("null", "None"):
        return True, None
    if len(wanted) != 1:
        return False, value
    t = wanted[0]
    if t == "integer":
        if _INT.match(text):
            try:
                return True, int(text)
            except ValueError:
                return False, value
        if _FLOAT.match(text) and float(text).is_integer() and abs(float(text)) < 2**53:
            return True, int(float(text))
    elif t == "number" and _FLOAT.match(text):
        if _INT.match(text):
            try:
                return True, int(text)
            except ValueError:
                return False, value
        return True, float(text)
    elif t == "boolean" and text.lower() in ("true", "false"):
        return True, text.lower() == "true"
    elif t in ("object", "array") and text[:1] in "{[(":
        try:
            parsed, end, _ = _first_value(text)
        except ValueError:
            return False, value
        if not text[end:].strip() and isinstance(parsed, dict if t == "object" else list):
            return True, parsed
    return False, value


_PY_WORDS = {"True": True, "False": False, "None": None}


def _guess_text(value: str) -> Any:
    """A text value with no schema: a JSON literal other than a string when it is one (or Python's
    ``True``/``False``/``None``), else the text."""
    text = value.strip()
    if text in _PY_WORDS:  # Jinja writes Python's spelling of booleans and None with `| string`
        return _PY_WORDS[text]
    if not text or text[0] not in "-0123456789tfn{[":
        return value
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return value
    return value if isinstance(parsed, str) else parsed


def _coerce(value: Any, schema: Any, path: str, repairs: list[str], text_values: bool) -> Any:
    if not isinstance(schema, Mapping):
        return _guess_text(value) if text_values and isinstance(value, str) else value
    types = _types(schema)
    if isinstance(value, str):
        if not types or "string" in types:
            if not types and text_values:
                return _guess_text(value)
            return value
        ok, converted = _from_text(value, types)
        if ok:
            repairs.append(f"coerced {path} to {'/'.join(t for t in types if t != 'null') or 'null'}")
            return (
                _coerce(converted, schema, path, repairs, False) if isinstance(converted, (dict, list)) else converted
            )
        return value
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        if "integer" in types and isinstance(value, float) and value.is_integer() and "number" not in types:
            repairs.append(f"coerced {path} to integer")
            return int(value)
        if types == ("string",):
            repairs.append(f"coerced {path} to string")
            return json.dumps(value)
        return value
    if isinstance(value, dict):
        props = schema.get("properties")
        if isinstance(props, Mapping):
            return {k: _coerce(v, props.get(k), f"{path}.{k}", repairs, text_values) for k, v in value.items()}
        return value
    if isinstance(value, list):
        items = schema.get("items")
        return [_coerce(v, items, f"{path}[{i}]", repairs, text_values) for i, v in enumerate(value)]
    return value


def coerce_arguments(
    arguments: Mapping[str, Any], parameters: Mapping[str, Any] | None, *, text_values: bool = False
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Coerce ``arguments`` to the JSON schema ``parameters`` where the intent is unambiguous.

    Text that spells a number, boolean, null, list or object becomes one where the schema asks
    for exactly that type; integral floats become integers for ``integer``; numbers become text
    for ``string``. Keys the schema does not describe are left alone, except that with
    ``text_values`` (formats that write every value as text, e.g. XML parameters) a value with no
    schema is read as a JSON literal when it is one. Returns (arguments, repairs).
    """
    repairs: list[str] = []
    props = parameters.get("properties") if isinstance(parameters, Mapping) else None
    if not isinstance(props, Mapping):
        props = {}
    out = {k: _coerce(v, props.get(k), k, repairs, text_values) for k, v in arguments.items()}
    return out, tuple(repairs)
