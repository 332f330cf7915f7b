"""The clean ``OPEN {json} CLOSE`` completions read from their IDs agree with the general parser.

:mod:`tmpl.toolcalls.parsers.tokencalls` reads a completion of the clean shape without building
its marker text; anything else goes to :meth:`ToolParser.parse`. Generated completions (content,
calls with valid and broken JSON, names, ids, argument shapes, tags as text, reasoning tags,
special tokens, unclosed calls, private-use characters) on each real tokenizer whose tags are
single tokens: wherever the fast reader answers, its answer is the general parser's (generated
call ids aside); most clean-looking completions must take it, so the comparison is not vacuous.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tmpl.toolcalls import PARSERS, get_parser
from tmpl.toolcalls.parsers import base
from tmpl.toolcalls.parsers.base import ToolParser
from tmpl.toolcalls.parsers.tokencalls import TokenDelimitedCalls

from .toolcalls_data import TOOLS, chat_template

#: (parser, template whose tokenizer it runs on): every tokenizer of the test data that has a
#: tagged-JSON parser's tags as single tokens (``<tool_calls>`` and ``<TOOLCALL>`` are text in
#: the host tokenizers of Apriel and Nemotron here: test_no_ids_reader_where_the_tags_are_text)
HOSTS = [
    ("hermes", "qwen2.5-instruct"),
    ("hermes", "qwen3"),
    ("phi4", "phi-4-mini-instruct"),
]

NAMES = ["get_weather", "search", "functions.lookup", "my-tool", " get_weather ", "", "9lives", "a b", "get_weather\n"]
ARGS = [
    {"city": "Paris"},
    {"city": "Zürich", "days": "3", "metric": "true", "ratio": 2},
    {},
    None,
    '{"city": "Paris"}',
    [1, 2],
    "x",
    {"nested": {"a": [1, {"b": None}]}, "s": 'é漢🙂 \\n "q"'},
]
KEYS = ["arguments", "parameters", "args", "input"]
TEXTS = [
    "",
    "Let me check.",
    " ",
    "\n",
    "Sure — I'll look it up.\n\n",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "\U000f0001",
    "é漢🙂",
    '{"name": "get_weather", "arguments": {}}',
]
PAD = ["", "\n", " ", "\n\n", "\t", " ;", ",", "x", "}"]


def _call_object(clean: bool) -> st.SearchStrategy[dict]:
    """A call object: ``clean``, the shapes models write (a tool name, arguments an object or
    absent, maybe an id); otherwise any of the shapes the general parser forgives or refuses."""
    if clean:
        names, keys, args = NAMES[:5], st.sampled_from(KEYS[:1] * 3 + KEYS), st.sampled_from(ARGS[:4] + ARGS[-1:])
        fns, extras = st.none(), st.just({})
    else:
        names, keys, args = NAMES + [None, 3], st.one_of(st.sampled_from(KEYS), st.none()), st.sampled_from(ARGS)
        fns = st.one_of(st.none(), st.sampled_from(["get_weather", {"name": "f", "arguments": {}}]))
        extras = st.dictionaries(st.sampled_from(["type", "x"]), st.integers(), max_size=1)
    return st.builds(
        lambda name, key, arg, cid, fn, extra: {
            **({"name": name} if name is not None else {}),
            **({key: arg} if key is not None else {}),
            **({"id": cid} if cid is not None else {}),
            **({"function": fn} if fn is not None else {}),
            **extra,
        },
        st.sampled_from(names),
        keys,
        args,
        st.one_of(st.none(), st.none(), st.sampled_from(["call_1", " c2 ", "", "x" * 9])),
        fns,
        extras,
    )


def _body(clean: bool) -> st.SearchStrategy[str]:
    """A call body as text: one object written as models write it, or (not ``clean``) anything near it."""
    obj = _call_object(clean)
    written = [
        st.builds(json.dumps, obj),
        st.builds(lambda o: json.dumps(o, ensure_ascii=False, indent=1), obj),
        st.builds(lambda o: json.dumps(o, separators=(",", ":")), obj),
    ]
    if not clean:
        written += [
            st.builds(lambda o: json.dumps([o]), obj),
            st.builds(repr, obj),  # a Python literal
            st.builds(lambda o: json.dumps(o)[:-3], obj),  # cut off
            st.builds(lambda a, sep: json.dumps(a) + sep + json.dumps(a), obj, st.sampled_from(["\n", ";", ", "])),
        ]
    pads = PAD[:5] if clean else PAD
    return st.builds(lambda a, w, b: a + w + b, st.sampled_from(PAD[:5]), st.one_of(*written), st.sampled_from(pads))


@pytest.mark.parametrize(("parser_name", "host"), HOSTS, ids=[f"{p}-{h}" for p, h in HOSTS])
def test_the_ids_reader_agrees_with_the_general_parser(parser_name, host):
    tpl = chat_template(host)
    parser = get_parser(parser_name, tpl.codec)
    reader = parser._by_ids
    assert isinstance(reader, TokenDelimitedCalls), f"{host}: the tags of {parser_name} are single tokens here"
    codec = tpl.codec
    opener, closer = reader.open_id, reader.close_id
    stops = sorted(reader.stop_ids)
    others = sorted(codec.special_ids - reader.stop_ids - {opener, closer})[:4] + sorted(reader.stop_ids)[:2]

    def ids_of(part):
        kind, value = part
        if kind == "text":
            return codec.encode(value) if value else []
        if kind == "call":
            return [opener, *(codec.encode(value) if value else []), closer]
        if kind == "open":
            return [opener, *codec.encode(value)]
        return [value]  # a single token

    clean = st.one_of(
        st.tuples(st.just("text"), st.sampled_from(TEXTS[:5] + TEXTS[-2:])),
        st.tuples(st.just("call"), _body(clean=True)),
    )
    messy = st.one_of(
        st.tuples(st.just("text"), st.sampled_from(TEXTS)),
        st.tuples(st.just("call"), _body(clean=False)),
        st.tuples(st.just("open"), _body(clean=False)),
        st.tuples(st.just("token"), st.sampled_from(others or [opener])),
    )
    completion = st.one_of(st.lists(clean, max_size=6), st.lists(st.one_of(clean, messy), max_size=6))
    seen = {"fast": 0, "clean": 0}

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(completion, st.booleans(), st.booleans())
    def run(parts, stop, with_tools):
        ids = [t for p in parts for t in ids_of(p)] + (stops[:1] if stop and stops else [])
        tools = TOOLS if with_tools else None
        fast = reader.parse(ids, tools)
        slow = ToolParser.parse(parser, ids, tools=tools)
        if all(k in ("text", "call") for k, _ in parts) and not slow.errors and not slow.reasoning:
            seen["clean"] += 1
        if fast is None:
            return
        seen["fast"] += 1
        assert _comparable(fast) == _comparable(slow), (ids, codec.decode(ids))
        assert _comparable(parser.parse(ids, tools=tools)) == _comparable(slow)  # the public entry: the same

    run()
    assert seen["fast"] >= 0.6 * seen["clean"] > 0, seen


def _comparable(parsed):
    """The parsed completion with generated call ids blanked (they are random)."""

    def blank(item):
        generated = getattr(item, "id_generated", True)
        return dataclasses.replace(item, id="") if generated else item

    return dataclasses.replace(
        parsed,
        tool_calls=tuple(map(blank, parsed.tool_calls)),
        errors=tuple(map(blank, parsed.errors)),
        items=tuple(map(blank, parsed.items)),
    )


def test_a_clean_completion_never_builds_marker_text_and_the_rest_falls_back(monkeypatch):
    tpl = chat_template("qwen2.5-instruct")
    parser = get_parser("hermes", tpl.codec)
    codec = tpl.codec
    clean = codec.encode(
        'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": "2"}}\n</tool_call><|im_end|>'
    )
    unclosed = codec.encode('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}<|im_end|>')
    expected = ToolParser.parse(parser, clean, tools=TOOLS)

    def refuse(*args, **kwargs):
        raise AssertionError("TokenText built")

    monkeypatch.setattr(base, "TokenText", refuse)
    got = parser.parse(clean, tools=TOOLS)
    assert _comparable(got) == _comparable(expected)
    assert got.tool_calls[0].arguments == {"city": "Paris", "days": 2} and got.tool_calls[0].token_span == (
        clean.index(codec.added_by_text["<tool_call>"]),
        len(clean) - 1,  # through </tool_call>, before <|im_end|>
    )
    assert got.content == "Checking."
    with pytest.raises(AssertionError, match="TokenText built"):
        parser.parse(unclosed, tools=TOOLS)


@pytest.mark.parametrize(
    ("parser_name", "host"),
    [
        ("hermes", "llama-3.2-instruct"),
        ("tool_calls_tag", "llama.cpp/unsloth-Apriel-1.5.jinja"),
        ("nemotron", "llama.cpp/NVIDIA-Nemotron-Nano-v2.jinja"),
    ],
)
def test_no_ids_reader_where_the_tags_are_text(parser_name, host):
    """Where the tags are ordinary text for the tokenizer, the general parser reads every completion."""
    tpl = chat_template(host)
    parser = get_parser(parser_name, tpl.codec)
    assert tpl.codec.added_by_text.get(PARSERS[parser_name].open_tag) is None
    assert parser._by_ids is None
    text = f'{parser.open_tag}{{"name": "get_weather", "arguments": {{"city": "Paris"}}}}{parser.close_tag}'
    if parser_name != "hermes":
        text = f"{parser.open_tag}[{text[len(parser.open_tag) : -len(parser.close_tag)]}]{parser.close_tag}"
    assert [c.name for c in parser.parse(tpl.codec.encode(text)).tool_calls] == ["get_weather"]
