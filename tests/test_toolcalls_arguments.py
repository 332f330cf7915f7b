"""Reading call arguments (JSON, JSON in a string, Python literals, trailing text) and schema coercion.

Also the compiled/pure twins of the ID scanning functions the parsers use, and the docstring
examples of the tool-call modules (so they stay true).
"""

from __future__ import annotations

import doctest
import importlib

import pytest

from tmpl.toolcalls.arguments import coerce_arguments, read_arguments
from tmpl.toolcalls.literal import MAX_DEPTH, LiteralError, read_literal
from tmpl.toolcalls.parsers.gemma4 import read_gemma_value


@pytest.mark.parametrize(
    "raw, value, repairs",
    [
        ('{"city": "Paris"}', {"city": "Paris"}, ()),
        ({"city": "Paris"}, {"city": "Paris"}, ()),
        ('\n  {  "city" :\n "Paris" ,\n "days":[ 1 ,2 ] }\n ', {"city": "Paris", "days": [1, 2]}, ()),
        (
            "{'city': 'Paris', 'ok': True, 'none': None}",
            {"city": "Paris", "ok": True, "none": None},
            ("python literal",),
        ),
        ("{'a': (1, 2), 'b': [3,],}", {"a": [1, 2], "b": [3]}, ("python literal",)),
        ("{city: 'Paris'}", {"city": "Paris"}, ("python literal",)),
        ('{"city": "Paris"}}\n</tool_call>', {"city": "Paris"}, ("trailing text",)),
        ('"{\\"city\\": \\"Paris\\"}"', {"city": "Paris"}, ("json in a string",)),
        ("", {}, ("empty arguments",)),
        (None, {}, ("no arguments",)),
    ],
)
def test_read_arguments_accepts(raw, value, repairs):
    got = read_arguments(raw)
    assert got.error is None and got.value == value and got.repairs == repairs


@pytest.mark.parametrize(
    "raw, error",
    [
        ("[1, 2]", "got a list"),
        ('"just text"', "got a string"),
        ("42", "got a number"),
        ("{'a': 1", "not valid JSON"),
        ("[" * 10_000, "nested deeper"),
        ("{" * 5_000, "expected a key"),
        ("{'x': " + "9" * 5_000 + "}", "integer too long"),
        ("{'x': open('/etc/passwd')}", "not valid JSON"),
        (3.5, "got a number"),
    ],
    ids=lambda v: repr(v)[:30] if isinstance(v, str) else None,
)
def test_read_arguments_rejects_without_raising(raw, error):
    """Parse failures are data: an error string, never an exception (deep nesting included)."""
    got = read_arguments(raw)
    assert got.value is None and error in got.error


def test_literal_reader_escapes_and_positions():
    text = r"'it\'s \u00e9\ud83d\ude00 \x41\n'"
    assert read_literal(text) == ("it's é😀 A\n", len(text))
    assert read_literal('  {"a": [true, false, null]} tail') == ({"a": [True, False, None]}, 28)
    assert read_literal("-1.5e3") == (-1500.0, 6)
    with pytest.raises(LiteralError, match="unterminated"):
        read_literal("'abc")
    with pytest.raises(LiteralError, match=f"deeper than {MAX_DEPTH}"):
        read_literal("[" * (MAX_DEPTH + 5))


def test_gemma_value_reader():
    q = '<|"|>'
    assert read_gemma_value(f"{{a:{q}x, y{q},b:[1,2.5,true,None],c:{{{q}k{q}:-3}}}}", 0, q)[0] == {
        "a": "x, y",
        "b": [1, 2.5, True, None],
        "c": {"k": -3},
    }
    with pytest.raises(LiteralError):
        read_gemma_value("{a:}", 0, q)


SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer"},
        "x": {"type": "number"},
        "flag": {"type": "boolean"},
        "s": {"type": "string"},
        "items": {"type": "array", "items": {"type": "integer"}},
        "opts": {"type": "object", "properties": {"depth": {"type": "integer"}}},
        "maybe": {"type": ["integer", "null"]},
        "either": {"type": ["integer", "string"]},
        "free": {},
    },
}


def test_coercion_where_unambiguous():
    args = {
        "n": "3",
        "x": "2.5",
        "flag": "False",
        "s": 7,
        "items": '[1, "2"]',
        "opts": {"depth": "4"},
        "maybe": "null",
        "either": "5",
        "free": "6",
        "extra": "7",
    }
    got, repairs = coerce_arguments(args, SCHEMA)
    assert got == {
        "n": 3,
        "x": 2.5,
        "flag": False,
        "s": "7",
        "items": [1, 2],
        "opts": {"depth": 4},
        "maybe": None,
        "either": "5",
        "free": "6",
        "extra": "7",
    }
    assert "coerced n to integer" in repairs and "coerced opts.depth to integer" in repairs
    assert not any("either" in r or "free" in r or "extra" in r for r in repairs)


def test_coercion_leaves_what_does_not_fit():
    got, repairs = coerce_arguments({"n": "three", "flag": "yes", "n2": 3.5}, SCHEMA)
    assert got == {"n": "three", "flag": "yes", "n2": 3.5} and repairs == ()
    got, _ = coerce_arguments({"n": 3.0, "x": 3}, SCHEMA)
    assert got == {"n": 3, "x": 3} and type(got["n"]) is int


def test_text_values_without_schema_read_json_literals():
    got, _ = coerce_arguments(
        {"a": "3", "b": "[1]", "c": "True", "d": "text", "e": "3 apples", "f": '"q"'}, None, text_values=True
    )
    assert got == {"a": 3, "b": [1], "c": True, "d": "text", "e": "3 apples", "f": '"q"'}


def test_id_scanning_twins(twin):
    ids = [5, 1, 9, 1, 7]
    assert twin.ids.positions_of(ids, frozenset({1, 7})) == [1, 3, 4]
    assert twin.ids.positions_of(ids, {1}, 2) == [3]
    assert twin.ids.positions_of((x for x in ids), {9}) == [2]
    assert twin.ids.positions_of([], {1}) == [] and twin.ids.positions_of(ids, set()) == []
    assert twin.ids.index_of_any(ids, {7, 9}) == 2
    assert twin.ids.index_of_any(ids, {7, 9}, 3) == 4
    assert twin.ids.index_of_any(ids, {42}) == -1 and twin.ids.index_of_any(ids, {5}, -3) == 0


@pytest.mark.parametrize(
    "module",
    [
        "types",
        "literal",
        "arguments",
        "schema",
        "tmpl.tools.metrics",
        "tmpl.tools.toolbox",
        "parsers.gemma4",
        "parsers.pythonic",
        "parsers.jsoncalls",
        "parsers",
    ],
)
def test_docstring_examples(module):
    mod = importlib.import_module(module if module.startswith("tmpl.") else f"tmpl.toolcalls.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
