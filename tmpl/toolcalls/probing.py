"""The IDs a model would generate for an assistant message, shared by detection (:mod:`.detect`) and
learning (:mod:`.learn`): the render's tokens after the generation prompt.

The dummy tools and calls with sentinel arguments the probe renders are in :mod:`tmpl.sentinels`.
"""

from __future__ import annotations

from typing import Any

from .. import _compat
from ..render import Renderer

# The probe's vocabulary lives in :mod:`tmpl.sentinels`; these names stay importable from here.
from ..sentinels import CONTENT_SENTINEL as CONTENT_SENTINEL
from ..sentinels import DETECT_TOOLS as DETECT_TOOLS
from ..sentinels import REASONING_KEYS as REASONING_KEYS
from ..sentinels import REASONING_SENTINEL as REASONING_SENTINEL
from ..sentinels import probe_calls as probe_calls
from ..tokenize import Codec


def completion_ids(
    renderer: Renderer, codec: Codec, history: list[dict[str, Any]], assistant: dict[str, Any], tools: Any
) -> list[int]:
    """The IDs the model would generate for ``assistant``: the render's tokens after the generation prompt.

    The cut is at the longest common token prefix of the prompt render and the full render, so a
    prompt that opens a block the full render does not have (``<think>`` in QwQ, an empty thought
    channel in Gemma 4) is cut where the two differ.
    """
    prompt = codec.encode(renderer.text(history, tools=tools, add_generation_prompt=True))
    full = codec.encode(renderer.text(history + [assistant], tools=tools, add_generation_prompt=False))
    return full[_compat.ids.common_prefix_len(prompt, full) :]
