"""A tiny Qwen3-MoE that calls ``get_time``: the mixture-of-experts fixture of routing replay (issue 40).

``build_tiny_moe(path)`` makes it in-process and saves it as a Hugging Face model folder (config.json,
model.safetensors, the Qwen3 tokenizer files from ``TMPL_TEST_DATA``), loadable by transformers and by
vLLM: hidden 128, 2 layers (both MoE), 8 experts, top-2. The layers keep random weights (fixed seed):
routers, experts and attention route every token by its context. Only the (untied) output head is fitted,
in about a second, so that on the training questions the model answers with one ``get_time`` call per city,
then a sentence (every other token's head row is 0). The training sequences are tmpl's own: a scripted
append-mode rollout of the Qwen3 template, so prompts, calls and tool suffixes are exactly what a rollout
sends the model. Outside those questions it writes nonsense. Checked on vLLM 0.32's CPU build
(``LLM(path, dtype="float32")``, ``VLLM_CPU_KVCACHE_SPACE=1``): it loads, and greedy on "What time is it in
Paris?" answers ``<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n</tool_call>``. Tests (tests/test_routes.py) and the GPU script
(benchmarks/) call it.

>>> path = build_tiny_moe(tmp / "tiny-moe")          # doctest: +SKIP
>>> AutoModelForCausalLM.from_pretrained(path).config.num_experts   # doctest: +SKIP
8
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

#: what the fixture is, for a test or a script to check it loaded the right model
HIDDEN, LAYERS, EXPERTS, TOP_K = 128, 2, 8, 2
SEED = 40
#: Qwen3's own vocabulary size (the tokenizer's 151,669 tokens padded, as the released checkpoints are)
VOCAB = 151936
#: steps fitting the output head: every trained token is the head's best, by a wide margin (checked)
STEPS = 400
#: the fitted rows are scaled by this, so that sampling at temperature 1 follows the script too
SHARPEN = 4.0

CITIES = ("Paris", "Rome", "Tokyo", "Lima", "Oslo", "Cairo")


def tokenizer_folder() -> Path:
    """The Qwen3 tokenizer of ``TMPL_TEST_DATA`` (default ``../shared/tokenizers``)."""
    repo = Path(__file__).resolve().parent.parent
    return Path(os.environ.get("TMPL_TEST_DATA", repo.parent / "shared" / "tokenizers")).resolve() / "qwen3"


def get_time(city: str) -> str:
    """Current local time in a city.

    Args:
        city: City name
    """
    return f"It is 10:00 in {city}."


def questions(cities: tuple[str, ...] = CITIES) -> list[list[dict[str, Any]]]:
    """One question per city (one call) and per pair of cities (two calls, two turns)."""
    one = [[{"role": "user", "content": f"What time is it in {c}?"}] for c in cities]
    two = [
        [{"role": "user", "content": f"What time is it in {a} and in {b}?"}]
        for a, b in zip(cities, cities[1:] + cities[:1])
    ]
    return one + two


def _cities(conversation: list[dict[str, Any]]) -> list[str]:
    text = conversation[0]["content"]
    return [c for c in CITIES if c in text]


def _script(tok: Any) -> Any:
    """The policy the model is trained to follow: a call per city not yet answered, then a sentence."""

    def policy(request: Any) -> list[int]:
        text = tok.decode(list(request.prompt_ids))
        asked = [c for c in CITIES if f"time is it in {c}" in text or f"and in {c}?" in text]
        answered = [c for c in CITIES if f"It is 10:00 in {c}." in text]
        todo = [c for c in asked if c not in answered]
        if todo:
            call = json.dumps({"name": "get_time", "arguments": {"city": todo[0]}})
            body = f"<tool_call>\n{call}\n</tool_call>"
        else:
            body = " ".join(f"It is 10:00 in {c}." for c in asked)
        return tok.encode(body + "<|im_end|>", add_special_tokens=False)

    return policy


def training_sequences(tok: Any) -> list[tuple[list[int], list[int]]]:
    """``(ids, mask)`` of every training conversation, from tmpl's scripted append-mode rollout."""
    import tmpl
    from tmpl.backends import Scripted

    tpl = tmpl.ChatTemplate(tok, name="qwen3")
    rollout = tmpl.Rollout(
        tpl, Scripted(_script(tok)), tools=[get_time], max_turns=4, max_length=1024, measure_drift=False
    )
    out = []
    for r in rollout.run(questions()):
        assert r.code is not None and r.code.value == "finished", (r.code, r.reason)
        ids = r.prompt_ids.tolist() + r.completion_ids.tolist()
        mask = [0] * len(r.prompt_ids) + r.mask.tolist()
        out.append((ids, mask))
    return out


def build_tiny_moe(path: str | Path, *, steps: int = STEPS, seed: int = SEED) -> Path:
    """Build, train briefly and save the tiny Qwen3-MoE at ``path`` (a folder); returns it.

    Deterministic for a seed on one machine (torch's CPU kernels); a few seconds on two CPU cores.
    """
    import torch
    from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    path = Path(path)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_folder()))
    config = Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        decoder_sparse_step=1,
        norm_topk_prob=True,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(config).eval()
    data = training_sequences(tok)
    # The layers (attention, routers, experts) keep their random weights; only the output head is fitted,
    # on the final hidden states of the training sequences: a position predicts the token after it where
    # that token was sampled. Backpropagating through the MoE layers took minutes on two busy cores.
    features, targets = [], []
    with torch.no_grad():
        for ids, mask in data:
            hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            at = [p for p in range(len(ids) - 1) if mask[p + 1]]
            features.append(hidden[at])
            targets.append(torch.tensor([ids[p + 1] for p in at]))
    h, y = torch.cat(features), torch.cat(targets)
    vocab_of = torch.unique(y)
    local = torch.searchsorted(vocab_of, y)
    rows = torch.zeros((len(vocab_of), HIDDEN), requires_grad=True)
    # every other token's row is 0 (logit 0): one column standing for all of them, weighted by their count
    others = torch.full((len(h), 1), float(torch.log(torch.tensor(float(VOCAB - len(vocab_of))))))
    optimizer = torch.optim.Adam([rows], lr=0.05)
    for _ in range(steps):
        logits = torch.cat([h @ rows.T, others], dim=1)
        loss = torch.nn.functional.cross_entropy(logits, local)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        rows *= SHARPEN
        head = torch.zeros((VOCAB, HIDDEN))
        head[vocab_of] = rows
        model.lm_head.weight.copy_(head)
        logits = h @ rows.T
        best = logits.argmax(dim=1)
        right = logits.gather(1, local[:, None])[:, 0]
        wrong = logits.masked_fill(torch.nn.functional.one_hot(local, len(vocab_of)).bool(), float("-inf"))
        margin = right - torch.maximum(wrong.max(dim=1).values, torch.zeros(()))  # other tokens: logit 0
    if not bool((best == local).all()):
        raise RuntimeError(f"tiny MoE fixture: the head misses {int((best != local).sum())} of {len(y)} tokens")
    model.eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path), safe_serialization=True)
    tok.save_pretrained(str(path))
    facts = {
        "seed": seed,
        "steps": steps,
        "loss": float(loss.detach()),
        "positions": len(y),
        "min_margin": float(margin.min()),
    }
    (path / "fixture.json").write_text(json.dumps(facts))
    return path
