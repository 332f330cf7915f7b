"""Shared data of the tool-call tests: real templates (cached), renders of assistant turns.

Expected calls in these tests are always the ones the test put into the rendered message.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from tmpl import ChatTemplate, _compat

from .conftest import DATA, catalog, family_source, load_tokenizer

#: Families whose tokenizer folder ships its own chat template.
FAMILIES = (
    "qwen2.5-instruct",
    "qwen3",
    "llama-3.2-instruct",
    "gemma-2-it",
    "gemma-3-it",
    "gemma-4-it",
    "mistral-nemo-instruct-2407",
    "phi-3-mini-4k-instruct",
    "phi-4-mini-instruct",
    "deepseek-v3",
    "gpt-oss",
)


def template_ids() -> list[str]:
    """Test ids: family names, then catalog template paths (``llama.cpp/GLM-4.6.jinja``)."""
    return list(FAMILIES) + [e["template"].removeprefix("templates/") for e in catalog()]


@functools.lru_cache(maxsize=None)
def chat_template(key: str) -> ChatTemplate:
    """The ChatTemplate of a family or catalog entry (skips when its data is absent)."""
    if key in FAMILIES:
        return ChatTemplate(load_tokenizer(key), name=key)
    entry = next((e for e in catalog() if e["template"] == "templates/" + key), None)
    if entry is None:
        pytest.skip(f"catalog entry {key!r} not found under {DATA}")
    host = entry["host_tokenizer"]
    if family_source(host) is None:
        pytest.skip(f"host tokenizer {host!r} of {key} is not in the test data")
    return ChatTemplate(load_tokenizer(host), Path(DATA / entry["template"]), name=key)


def tool(name: str, properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": properties, "required": required or []},
        },
    }


TOOLS = [
    tool(
        "get_weather",
        {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "metric": {"type": "boolean"},
            "ratio": {"type": "number"},
        },
        ["city"],
    ),
    tool(
        "search",
        {
            "query": {"type": "string"},
            "filters": {"type": "object"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        ["query"],
    ),
    tool("get_time", {}),
]

#: Calls the round trip renders; values chosen to be hard (quotes, braces, unicode, nesting, types).
CALLS = [
    ("get_weather", {"city": 'Pa"ris, {Île}', "days": 3, "metric": True, "ratio": 2.5}),
    ("search", {"query": "naïve café 漢字 🙂 x<y", "filters": {"lang": "fr", "n": 2}, "tags": ["a", "b c"]}),
    ("get_time", {}),
]


def assistant_message(
    calls, *, content: str = "", reasoning: tuple[str, str] | None = None, ids=None, as_text: bool = False
) -> dict:
    """An assistant message making ``calls``; ``as_text`` writes arguments as JSON text (OpenAI's wire format)."""
    msg: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {
                "id": (ids[i] if ids else f"c{i}aBcDeFg"),
                "type": "function",
                "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False) if as_text else a},
            }
            for i, (n, a) in enumerate(calls)
        ],
    }
    if reasoning is not None:
        msg[reasoning[0]] = reasoning[1]
    return msg


def completion_ids(tpl: ChatTemplate, assistant: dict, tools=TOOLS, history=None) -> list[int]:
    """The IDs of ``assistant``'s turn as rendered: full render minus the generation prompt."""
    history = history or [{"role": "user", "content": "What is the weather?"}]
    prompt = tpl.codec.encode(tpl.render(history, tools=tools, add_generation_prompt=True))
    full = tpl.codec.encode(tpl.render(history + [assistant], tools=tools))
    return full[_compat.ids.common_prefix_len(prompt, full) :]


def same(a: Any, b: Any) -> bool:
    """Equal values of equal types, recursively (so True != 1 and 3 != 3.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b
