"""The plain PyTorch loop of docs/integrations.md runs as written (tiny random model, real tokenizer)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from .conftest import load_tokenizer

DOC = Path(__file__).resolve().parent.parent / "docs" / "integrations.md"


def doc_block(name: str) -> str:
    """The Python block right after ``<!-- tested: NAME -->`` in the integrations guide."""
    match = re.search(
        rf"<!-- tested: {re.escape(name)} -->\n```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL
    )
    assert match, f"no block marked 'tested: {name}' in {DOC}"
    return match.group(1)


def test_plain_pytorch_loop_in_the_docs_trains():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = load_tokenizer("qwen2.5-instruct")
    torch.manual_seed(5)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
            eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
            pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        )
    )
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    def get_weather(city: str) -> str:
        """Current weather in a city.

        Args:
            city: The city name.
        """
        return f"{city}: 21 C"

    seen = []

    def reward_of(result):
        seen.append(result)
        return float(len(seen) % 2)  # samples of a group get different rewards: non-zero advantages

    namespace = {"tokenizer": tokenizer, "model": model, "get_weather": get_weather, "reward_of": reward_of}
    exec(compile(doc_block("plain-pytorch-loop"), str(DOC), "exec"), namespace)  # noqa: S102 (runs our own documentation)

    assert len(seen) == 2 and all(len(r.completion_ids) > 0 for r in seen)
    assert math.isfinite(namespace["loss"].detach().item()) and float(namespace["loss_mask"].sum()) > 0
    changed = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert any("layers.0" in n for n in changed)
