"""Fuzz: generated token sequences and strings through every parser.

The only acceptable outcome is a ParsedCompletion whose calls and errors are well-formed
records: no exception of any kind, whatever the IDs. Sequences are built from the format's own
delimiters (as tokens where the tokenizer has them), JSON and XML fragments, special tokens,
and arbitrary IDs of the vocabulary, so that they reach deep into every parser.
"""

from __future__ import annotations

import json
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tmpl.toolcalls import PARSERS, ParsedCompletion, ParseError, ToolCall, get_parser, parse_completion, read_arguments
from tmpl.toolcalls.arguments import coerce_arguments
from tmpl.toolcalls.literal import LiteralError, read_literal
from tmpl.toolcalls.parsers.base import NAME_RE
from tmpl.toolcalls.types import PARSE_ERROR_KINDS

from .toolcalls_data import TOOLS, chat_template

#: parser -> template whose tokenizer it is fuzzed on
HOSTS = {
    "hermes": "qwen3",
    "qwen3_xml": "llama.cpp/Qwen3-Coder.jinja",
    "glm4": "llama.cpp/GLM-4.6.jinja",
    "llama3_json": "llama-3.2-instruct",
    "mistral": "mistral-nemo-instruct-2407",
    "gemma4": "gemma-4-it",
    "harmony": "gpt-oss",
    "deepseek_v3": "deepseek-v3",
    "kimi_k2": "llama.cpp/moonshotai-Kimi-K2.jinja",
    "pythonic": "llama.cpp/LFM2.5-8B-A1B.jinja",
    "functionary": "llama.cpp/meetkai-functionary-medium-v3.1.jinja",
    "functionary_v3": "llama.cpp/meetkai-functionary-medium-v3.2.jinja",
    "tool_calls_tag": "llama.cpp/unsloth-Apriel-1.5.jinja",
    "nemotron": "llama.cpp/NVIDIA-Nemotron-Nano-v2.jinja",
    "phi4": "phi-4-mini-instruct",
    "xml_invoke": "llama.cpp/deepseek-ai-DeepSeek-V4.jinja",
}

FRAGMENTS = [
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    ",",
    ":",
    ";",
    '"',
    "'",
    "\\",
    "\n",
    " ",
    "  \n\t",
    "=",
    '"name"',
    '"arguments"',
    '"parameters"',
    '"id"',
    '"get_weather"',
    '"city"',
    '"Paris"',
    "get_weather",
    "city",
    "3",
    "-2.5e3",
    "true",
    "None",
    "null",
    "{}",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "{'name': 'f', 'arguments': {'x': 1}}",
    '"{\\"a\\": 1}"',
    "call:",
    "functions.get_weather",
    "to=functions.f",
    " to=",
    "json",
    "commentary",
    "analysis",
    "final",
    "<function=get_weather>",
    "</function>",
    "<parameter=city>",
    "</parameter>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "```json\n",
    "```",
    "function",
    "get_weather(city='Paris')",
    ".call(",
    ">>>",
    ">>>all\n",
    "get_weather\n",
    "[ARGS]",
    "[CALL_ID]",
    "<think>",
    "</think>",
    "é漢🙂",
    "\U000f0001",
    '<｜DSML｜invoke name="f">',
    '<｜DSML｜parameter name="k" string="false">',
    "</｜DSML｜parameter>",
    "</｜DSML｜invoke>",
    '<function name="f">',
    '<param name="k">',
    "</param>",
    "<![CDATA[",
    "[" * 30,
    "{" * 30,
]


def _pool(parser: str):
    tpl = chat_template(HOSTS[parser])
    cls = PARSERS[parser]
    texts = list(cls.delimiters) + list(cls.think or ()) + FRAGMENTS
    pieces = [tpl.codec.encode(t) for t in texts if t]
    specials = sorted(tpl.codec.special_ids)[:12]
    pieces += [[t] for t in specials]
    return tpl, pieces


def _check(parsed: ParsedCompletion, n_ids: int) -> None:
    assert isinstance(parsed, ParsedCompletion)
    assert isinstance(parsed.content, str) and (parsed.reasoning is None or isinstance(parsed.reasoning, str))
    assert len(parsed.items) == len(parsed.tool_calls) + len(parsed.errors)
    last = 0
    for item in parsed.items:
        assert isinstance(item, (ToolCall, ParseError))
        if item.token_span is not None:
            a, b = item.token_span
            assert 0 <= a <= b <= n_ids and a >= last
            last = b
    for call in parsed.tool_calls:
        assert NAME_RE.match(call.name) and isinstance(call.arguments, dict)
        assert isinstance(call.id, str) and call.id and isinstance(call.raw, str)
    for err in parsed.errors:
        assert err.kind in PARSE_ERROR_KINDS and isinstance(err.message, str) and err.message
    json.dumps(parsed.to_message(), default=str)


#: the token that must open any call of these formats (when the tokenizer has it)
OPENERS = {
    "hermes": "<tool_call>",
    "mistral": "[TOOL_CALLS]",
    "gemma4": "<|tool_call>",
    "deepseek_v3": "<｜tool▁call▁begin｜>",
    "phi4": "<|tool_call|>",
}

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.mark.parametrize("parser", list(PARSERS))
def test_fuzz_token_sequences(parser):
    assert parser in HOSTS, f"add a fuzz host for {parser}"
    tpl, pieces = _pool(parser)
    p = get_parser(parser, tpl.codec)
    vocab = tpl.codec.vocab_size
    piece = st.one_of(st.sampled_from(pieces), st.lists(st.integers(0, vocab - 1), min_size=1, max_size=3))

    opener = tpl.codec.added_by_text.get(OPENERS.get(parser, ""))

    @SETTINGS
    @given(st.lists(piece, max_size=40), st.booleans())
    def run(chunks, with_tools):
        ids = [t for chunk in chunks for t in chunk]
        parsed = p.parse(ids, tools=TOOLS if with_tools else None)
        _check(parsed, len(ids))
        if opener is not None and opener not in ids:  # the same text as ordinary tokens opens nothing
            assert not parsed.items, parsed.items

    run()


@pytest.mark.parametrize("parser", list(PARSERS))
def test_fuzz_strings(parser):
    tpl, _ = _pool(parser)
    p = get_parser(parser, tpl.codec)
    cls = PARSERS[parser]
    words = list(cls.delimiters) + list(cls.think or ()) + ["{", "}", '"', "'", ":", ",", "\n", "name", "[", "]"]

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.lists(st.one_of(st.sampled_from(words), st.text(max_size=8)), max_size=30))
    def run(parts):
        ids = tpl.codec.encode("".join(parts))
        _check(p.parse(ids), len(ids))

    run()


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.one_of(st.text(max_size=60), st.text(alphabet="{}[]()'\",:;=\\ntuefalsNo0123456789.-eE ", max_size=60)))
def test_fuzz_argument_readers(text):
    got = read_arguments(text)
    assert (got.value is None) != (got.error is None)
    try:
        read_literal(text)
    except LiteralError:
        pass
    coerce_arguments(
        {"days": text, "city": text, "filters": text}, TOOLS[0]["function"]["parameters"], text_values=True
    )
    coerce_arguments({"filters": text, "tags": text}, TOOLS[1]["function"]["parameters"])


def _real_completion(parser: str) -> tuple[object, list[int]]:
    """A real render of an assistant turn with two calls (one where the template takes only one)."""
    from .toolcalls_data import CALLS, assistant_message, completion_ids

    tpl = chat_template(HOSTS[parser])
    for k in (2, 1):
        try:
            ids = completion_ids(tpl, assistant_message(CALLS[:k], content="Sure."))
        except Exception:  # noqa: BLE001 - templates that take one call raise on two
            continue
        if "get_weather" in tpl.codec.decode(ids):
            return tpl, ids
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    return tpl, tpl.codec.encode(text)


_MUTATION = st.tuples(
    st.sampled_from(["delete", "duplicate", "insert", "swap", "truncate"]),
    st.integers(0, 10_000),
    st.integers(0, 10_000),
    st.integers(0, 10_000),
)


@pytest.mark.parametrize("parser", list(PARSERS))
def test_fuzz_mutated_real_renders(parser):
    """Real renders with tokens deleted, duplicated, inserted, swapped or cut off."""
    tpl, base = _real_completion(parser)
    p = get_parser(parser, tpl.codec)
    specials = sorted(tpl.codec.added_by_text[t] for t in PARSERS[parser].delimiters if t in tpl.codec.added_by_text)
    pool = specials + base

    @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.lists(_MUTATION, min_size=1, max_size=4))
    def run(mutations):
        ids = list(base)
        for kind, i, j, k in mutations:
            n = max(len(ids), 1)
            a, b = sorted((i % n, j % n))
            if kind == "delete":
                del ids[a : b + 1]
            elif kind == "duplicate":
                ids[b:b] = ids[a : b + 1]
            elif kind == "insert":
                ids.insert(a, pool[k % len(pool)])
            elif kind == "swap" and ids:
                ids[a], ids[b] = ids[b], ids[a]
            else:
                ids = ids[:a]
        _check(p.parse(ids, tools=TOOLS), len(ids))

    run()


_TEXT = st.text(
    alphabet=st.characters(
        exclude_categories=("Cs", "Cc", "Co", "Cn"), exclude_characters="<>|", include_characters="\n\t"
    ),
    max_size=12,
).filter(lambda t: unicodedata.normalize("NFKC", t) == t)  # tokenizers normalize; the model never writes the rest
_IDENT = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
_SCALAR = st.one_of(
    _TEXT,
    st.integers(-(10**12), 10**12),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False, width=32).filter(lambda x: x != 0 or str(x) == "0.0"),
)
_VALUE = st.recursive(
    _SCALAR,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_IDENT, inner, max_size=3)),
    max_leaves=6,
)
_ARGS = st.dictionaries(_IDENT, _VALUE, max_size=4)
_KIND = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}

ROUND_TRIP = [
    "qwen3",
    "llama.cpp/Qwen3-Coder.jinja",
    "llama.cpp/GLM-4.6.jinja",
    "gemma-4-it",
    "llama.cpp/deepseek-ai-DeepSeek-V4.jinja",
    "mistral-nemo-instruct-2407",
    "gpt-oss",
    "llama-3.2-instruct",
    "llama.cpp/deepseek-ai-DeepSeek-V3.1.jinja",
]


@pytest.mark.parametrize("key", ROUND_TRIP)
def test_fuzz_round_trip_of_generated_calls(key):
    """Generated names and arguments, rendered by the real template, read back identically."""
    from .toolcalls_data import assistant_message, completion_ids, same, tool

    tpl = chat_template(key)
    single = key in ("gpt-oss", "llama-3.2-instruct")

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.lists(st.tuples(_IDENT, _ARGS), min_size=1, max_size=1 if single else 3, unique_by=lambda c: c[0]))
    def run(calls):
        tools = [tool(name, {k: {"type": _KIND[type(v)]} for k, v in args.items()}) for name, args in calls]
        ids = completion_ids(
            tpl, assistant_message(calls, ids=[f"Id{i}x5Yz7Q" for i in range(len(calls))]), tools=tools
        )
        parsed = parse_completion(tpl, ids, tools=tools)
        assert not parsed.errors, (parsed.errors, tpl.codec.decode(ids))
        got = [(c.name, c.arguments) for c in parsed.tool_calls]
        assert len(got) == len(calls) and all(g[0] == c[0] and same(g[1], c[1]) for g, c in zip(got, calls)), (
            got,
            calls,
            tpl.codec.decode(ids),
        )

    run()
