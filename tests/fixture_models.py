"""Where the tiny tool-calling fixture models of ``../shared/models`` are, and what they were trained on.

Shared by the real-vLLM engine and server tests and the TRL runs; ``TMPL_TEST_MODELS`` overrides
the folder. The tools here answer as the models' training data did (the questions are the kind the
models learned to answer with a call).
"""

from __future__ import annotations

import os
from pathlib import Path

from .conftest import REPO

MODELS = Path(os.environ.get("TMPL_TEST_MODELS", REPO.parent / "shared" / "models")).resolve()
QWEN = MODELS / "qwen2.5-instruct-tools"
LLAMA = MODELS / "llama-3.2-instruct-tools"


def missing(path: Path) -> str | None:
    """Why the fixture model at ``path`` cannot be used (a skip reason), or None when it is there."""
    if (path / "model.safetensors").is_file():
        return None
    return f"fixture model not found at {path} (set TMPL_TEST_MODELS)"


def get_time(city: str) -> str:
    """Current local time in a city.

    Args:
        city: City name
    """
    return f"It is 10:00 in {city}."


def get_weather(city: str) -> str:
    """Current weather in a city.

    Args:
        city: City name
    """
    return f"Sunny in {city}, 21 C."


FUNCTIONS = {"get_time": get_time, "get_weather": get_weather}
QUESTIONS = [
    [{"role": "user", "content": "What time is it in Paris?"}],
    [{"role": "user", "content": "What is the weather in Paris and Rome?"}],
    [{"role": "user", "content": "Hello!"}],
]
