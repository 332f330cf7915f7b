"""Benchmark: peak memory of one Torch-backend batch vs generated length, step-wise logprobs
against keeping a vocabulary row per step, both in the same run.

    python benchmarks/torch_memory.py [--data ../shared/tokenizers] [--batch 8] [--lengths 32 128 512]

Workload: a random-weight 2-layer Qwen2 (hidden 64) with the real Qwen2.5 tokenizer's
151,665-token vocabulary, a batch of ``--batch`` chat prompts (rendered by the real template),
sampling at temperature 1 with no stop token, so every sequence runs the full length.

Contenders, each in both logprob modes (``raw``, ``processed``):

- ``step-wise``: ``tmpl.backends.Torch.generate_batch`` (one logprob per sampled token taken
  at its step; nothing per step is kept but ``batch`` floats).
- ``every row``: what the backend did before: ``generate(output_logits=True)`` (raw) or
  ``output_scores=True`` (processed), then log-softmax of the stacked rows gathered at the
  sampled tokens: ``batch x steps x vocab`` floats, plus their stacked copy.

Peak memory: each point runs in a fresh subprocess. On CUDA, ``torch.cuda.max_memory_allocated``
after a reset; on CPU (torch keeps no allocator statistics there) the process's RSS high-water
mark (``VmHWM``), reset through ``/proc/self/clear_refs`` just before the batch, minus the RSS
at that moment. Children run with a fixed glibc mmap threshold (``MALLOC_MMAP_THRESHOLD_``):
every tensor of a vocabulary row or more is then its own mapping, returned when freed, so the
high-water mark follows live tensors instead of heap fragmentation. The goal: the step-wise
peak does not grow with the length.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MiB = 1024 * 1024


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


class PeakMemory:
    """Bytes a block adds at its peak: CUDA allocator statistics, else the RSS high-water mark."""

    def __init__(self, device: str) -> None:
        self.device = device

    def __enter__(self) -> PeakMemory:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS
            self.base = _rss_kib("VmRSS") * 1024
        return self

    def __exit__(self, *exc: object) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.base
        else:
            self.peak = _rss_kib("VmHWM") * 1024 - self.base


def _every_row(model, requests, sampling, pad: int):
    """The replaced approach (the backend before step-wise logprobs): returns (batch, steps) logprobs."""
    import torch

    width = max(len(r.prompt_ids) for r in requests)
    ids = torch.full((len(requests), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(requests):
        ids[i, width - len(r.prompt_ids) :] = torch.tensor(list(r.prompt_ids))
        mask[i, width - len(r.prompt_ids) :] = 1
    device = next(model.parameters()).device
    raw = sampling.logprobs == "raw"
    torch.manual_seed(sampling.seed)
    with torch.no_grad():
        gen = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            max_new_tokens=requests[0].max_tokens,
            pad_token_id=pad,
            eos_token_id=None,
            return_dict_in_generate=True,
            output_logits=raw,
            output_scores=not raw,
            do_sample=True,
            temperature=sampling.temperature,
            top_p=None,
            top_k=None,
        )
    steps = torch.stack([s.float() for s in (gen.logits if raw else gen.scores)], dim=1)
    new = gen.sequences[:, width:]
    return torch.log_softmax(steps, dim=-1).gather(-1, new[:, : steps.shape[1], None]).squeeze(-1)


def measure_point(data: Path, approach: str, mode: str, length: int, batch: int, device: str) -> dict:
    """One batch of ``batch`` x ``length`` tokens; runs in its own process (see main)."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from tmpl.backends import GenerationRequest, Sampling, Torch

    tok = AutoTokenizer.from_pretrained(str(data / "qwen2.5-instruct"))
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
    )
    model = Qwen2ForCausalLM(config).eval().to(device)
    questions = ["What time is it in Paris?", "Weather in Rome and Oslo, please.", "Hello!", "Summarise this."]
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": questions[i % len(questions)] * (1 + i % 3)}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(batch)
    ]
    sampling = Sampling(temperature=1.0, logprobs=mode, seed=0)
    requests = [GenerationRequest(f"r{i}", p, length, frozenset(), sampling) for i, p in enumerate(prompts)]
    backend = Torch(model, max_batch_size=batch)
    run = (
        (lambda: backend.generate_batch(requests))
        if approach == "step-wise"
        else (lambda: _every_row(model, requests, sampling, backend.pad_token_id))
    )
    backend.generate_batch([GenerationRequest("warm", prompts[0], 2, frozenset(), sampling)])  # lazy init outside
    started = time.perf_counter()
    with PeakMemory(device) as peak:
        out = run()
    seconds = time.perf_counter() - started
    tokens = sum(len(r.token_ids) for r in out) if approach == "step-wise" else int(out.numel())
    return {"peak": peak.peak, "seconds": seconds, "tokens": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", type=Path, default=Path(os.environ.get("TMPL_TEST_DATA", REPO.parent / "shared" / "tokenizers"))
    )
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--modes", nargs="+", default=["raw", "processed"], choices=["raw", "processed"])
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--point", help=argparse.SUPPRESS)  # internal: approach,mode,length in a child process
    args = parser.parse_args()
    if not (args.data / "qwen2.5-instruct").is_dir():
        sys.exit(f"tokenizer data not found at {args.data}; pass --data or set TMPL_TEST_DATA")
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.point:
        approach, mode, length = args.point.split(",")
        print(json.dumps(measure_point(args.data, approach, mode, int(length), args.batch, args.device)))
        return

    def point(approach: str, mode: str, length: int) -> dict:
        cmd = [
            sys.executable,
            __file__,
            "--data",
            str(args.data),
            "--batch",
            str(args.batch),
            "--device",
            args.device,
            "--point",
            f"{approach},{mode},{length}",
        ]
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "1048576"}
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        if done.returncode != 0:
            sys.exit(f"point {approach}/{mode}/{length} failed:\n{done.stderr[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    meter = "CUDA max_memory_allocated" if args.device == "cuda" else "RSS high-water (VmHWM) above RSS at start"
    print(f"Torch backend, one batch of {args.batch}, tiny Qwen2 + 151,665-token vocabulary, device {args.device}")
    print(f"peak = {meter}, each point in a fresh process")
    print(
        f"{'mode':<10} {'tokens':>7} {'step-wise MiB':>14} {'every row MiB':>14} {'ratio':>7} "
        f"{'step-wise s':>12} {'every row s':>12}"
    )
    for mode in args.modes:
        for length in args.lengths:
            new, old = point("step-wise", mode, length), point("every row", mode, length)
            print(
                f"{mode:<10} {length:>7} {new['peak'] / MiB:>14.1f} {old['peak'] / MiB:>14.1f} "
                f"{old['peak'] / max(new['peak'], 1):>6.1f}x {new['seconds']:>12.2f} {old['seconds']:>12.2f}",
                flush=True,
            )
    print("ratio = every-row peak / step-wise peak (higher is better); goal: step-wise flat in the length")


if __name__ == "__main__":
    main()
