"""Generation backends: token IDs in, token IDs + sampled-token logprobs + finish reason out.

- :class:`Torch`: transformers ``generate`` (CPU or GPU);
- :class:`VLLM`: the offline ``vllm.LLM`` engine (optional extra ``tmpl[vllm]``);
- :class:`VLLMServer`: one or many running vLLM servers over HTTP;
- :class:`SGLang`: an SGLang server or router over its native ``/generate``;
- :class:`Scripted`: replays completions from a function (tests, benchmarks).
"""

from .base import Backend, BackendError, GenerationRequest, GenerationResult, Sampling, StreamDelta
from .scripted import Scripted
from .server import VLLMServer
from .sglang import SGLang
from .torch import Torch
from .vllm import VLLM

__all__ = [
    "Backend",
    "BackendError",
    "GenerationRequest",
    "GenerationResult",
    "Sampling",
    "SGLang",
    "Scripted",
    "StreamDelta",
    "Torch",
    "VLLM",
    "VLLMServer",
]
