"""What the detection probe renders, shared by detection (:mod:`.detect`) and learning (:mod:`.learn`).

Dummy tools and calls with sentinel arguments, and the IDs a model would generate for an
assistant message (the render's tokens after the generation prompt).
"""

from __future__ import annotations

from typing import Any

from .. import _compat
from ..codec import Codec
from ..render import Renderer
from ..suffix.probe import arg_sentinel

#: Tools of the detection probe: a string and an integer argument, then a string one.
DETECT_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "tmpl_probe_lookup",
            "description": "A tool used by tmpl to recognise the call format.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query", "limit"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "tmpl_probe_note",
            "description": "A second tool used by tmpl to recognise the call format.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        },
    },
]
REASONING_SENTINEL = "TmPlReAsOnInG"
CONTENT_SENTINEL = "TmPlViSiBlEtExT"
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def probe_calls(k: int) -> list[dict[str, Any]]:
    """The ``k`` (1 or 2) dummy calls the probe renders: what a parser must give back."""
    calls = [
        {"name": "tmpl_probe_lookup", "arguments": {"query": arg_sentinel(0), "limit": 7}},
        {"name": "tmpl_probe_note", "arguments": {"text": arg_sentinel(1)}},
    ]
    return calls[:k]


def completion_ids(renderer: Renderer, codec: Codec, history: list[dict], assistant: dict, tools: Any) -> list[int]:
    """The IDs the model would generate for ``assistant``: the render's tokens after the generation prompt.

    The cut is at the longest common token prefix of the prompt render and the full render, so a
    prompt that opens a block the full render does not have (``<think>`` in QwQ, an empty thought
    channel in Gemma 4) is cut where the two differ.
    """
    prompt = codec.encode(renderer.text(history, tools=tools, add_generation_prompt=True))
    full = codec.encode(renderer.text(history + [assistant], tools=tools, add_generation_prompt=False))
    return full[_compat.ids.common_prefix_len(prompt, full) :]
