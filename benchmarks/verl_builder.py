"""Benchmark: one tool-result merge of verl's Continuous Token builder, verl 0.9.1's own against tmpl's.

Both merge the same tool results (1-3 calls, plain short contents) after the same runtime tokens,
on real tokenizers of ../shared/tokenizers, through ``merge_context_tokens``: verl's builder renders
the template twice per merge (a synthetic prefix with and without the appended messages) and diffs the
IDs; tmpl's renders the tool results once into verified frames (cached per template) and encodes the
contents. Timed per merge after a warm-up, median of ``--repeat`` runs of ``--merges`` merges.
Whether each is *exact* is tests/test_integrations_verl.py's job, not this one's.

Run in verl's environment (made by .ci/run): ``build/venv-verl/bin/python benchmarks/verl_builder.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FAMILIES = {"qwen2.5-instruct": "qwen2", "qwen3": "qwen3", "gemma-4-it": "gemma4", "deepseek-v3": "deepseek_v3"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--merges", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "tokenizers"))
    a = parser.parse_args()

    from transformers import AutoTokenizer
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    from tests.contract import HISTORIES, TOOLS, assistant_turn, tool_results
    from tmpl.integrations.verl import TmplContinuousTokenBuilder

    print(f"{'tokenizer':20} {'calls':>5} {'verl us/merge':>14} {'tmpl us/merge':>14} {'ratio':>6}")
    for family, model_type in FAMILIES.items():
        folder = Path(a.data) / family
        if not folder.is_dir():
            print(f"{family:20} (not found under {a.data})")
            continue
        tok = AutoTokenizer.from_pretrained(str(folder))
        verl = create_continuous_token_builder(tok, hf_model_type=model_type)
        ours = TmplContinuousTokenBuilder(tok, fallback="error")
        for k in (1, 3):
            history = list(HISTORIES["user"])
            assistant = assistant_turn(k)
            results = tool_results(assistant, [f"result {i}: 21 C, sunny" for i in range(k)])
            previous, updated = history + [assistant], history + [assistant] + results
            runtime = ours.build_initial_tokens(history, tools=TOOLS) + [ours.template.tool_close_ids[-1]]
            times = {}
            for name, builder in (("verl", verl), ("tmpl", ours)):
                builder.merge_context_tokens(previous, updated, list(runtime), tools=TOOLS)  # warm-up
                runs = []
                for _ in range(a.repeat):
                    t0 = time.perf_counter()
                    for _ in range(a.merges):
                        builder.merge_context_tokens(previous, updated, list(runtime), tools=TOOLS)
                    runs.append((time.perf_counter() - t0) / a.merges * 1e6)
                times[name] = statistics.median(runs)
            print(f"{family:20} {k:5} {times['verl']:14.0f} {times['tmpl']:14.0f} {times['verl'] / times['tmpl']:6.1f}")


if __name__ == "__main__":
    main()
