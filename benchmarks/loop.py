"""Overhead of the rollout loop outside the engine: tmpl vs the naive re-render loop.

    python benchmarks/loop.py [--data ../shared/tokenizers] [--samples 256] [--turns 8]

Both loops drive the same scripted policy (the engine answers instantly, so what is timed is
everything outside it), parse with the same parser and run the same zero-latency tools:

- tmpl: ``tmpl.Rollout`` with the ``Scripted`` backend (token IDs kept, suffixes appended);
- naive: each turn, decode the completion, append the parsed messages, and re-render and
  re-tokenize the whole conversation with ``apply_chat_template`` (batched over samples, as
  trainers do).

Prints milliseconds per sample-turn for each, and the ratio from the same run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import tmpl  # noqa: E402
from tmpl.backends import Scripted  # noqa: E402
from tmpl.toolcalls import parse_completion  # noqa: E402

RESULT = {"short": 100, "long": 2000}  # characters of each tool result
_result_chars = RESULT["short"]


def get_weather(city: str) -> str:
    """Current weather in a city.

    Args:
        city: The city name.
    """
    record = f'{{"city": "{city}", "temperature_c": 21.5, "conditions": "partly cloudy", "humidity": 0.41}}'
    return (record * (_result_chars // len(record) + 1))[:_result_chars]


def make_policy(tpl, turns: int):
    call = tpl.codec.encode(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    )
    final = tpl.codec.encode("It is partly cloudy and 21.5 C in Paris.<|im_end|>")

    def policy(turn: int):
        return final if turn >= turns - 1 else call

    return policy


def run_tmpl(tpl, conversations, turns: int, toolbox) -> float:
    policy = make_policy(tpl, turns)
    backend = Scripted(lambda req: policy(int(req.request_id.rsplit("-", 1)[1])))
    rollout = tmpl.Rollout(
        tpl,
        backend,
        tools=toolbox,
        max_turns=turns,
        max_length=32768,
        max_completion_length=None,
        measure_drift=False,
        progress=False,
    )
    start = time.perf_counter()
    results = rollout.run(conversations)
    elapsed = time.perf_counter() - start
    assert all(r.turns == turns and r.status.name == "DONE" for r in results), "scripted run did not finish"
    return elapsed


def run_naive(tpl, conversations, turns: int, toolbox) -> float:
    policy = make_policy(tpl, turns)
    tok = tpl.tokenizer
    histories = [list(c) for c in conversations]
    start = time.perf_counter()
    for turn in range(turns):
        # re-render and re-tokenize every conversation (what the engine gets this turn)
        prompts = tok.apply_chat_template(histories, tools=toolbox.schemas, add_generation_prompt=True, tokenize=True)
        assert len(prompts["input_ids"]) == len(histories)
        completions = [policy(turn) for _ in histories]
        texts = tok.batch_decode(completions)  # what naive loops keep: text
        assert len(texts) == len(completions)
        parsed = [parse_completion(tpl, c, tools=toolbox) for c in completions]
        batch = toolbox.run_batch(parsed)
        for history, p, msgs in zip(histories, parsed, batch.messages):
            history.append(p.to_message())
            history.extend(msgs)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.environ.get("TMPL_TEST_DATA", REPO.parent / "shared" / "tokenizers"))
    parser.add_argument("--family", default="qwen2.5-instruct")
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--turns", type=int, default=8)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    folder = Path(args.data) / args.family
    if not folder.is_dir():
        sys.exit(f"tokenizer data not found at {folder}; pass --data or set TMPL_TEST_DATA")
    tpl = tmpl.ChatTemplate(AutoTokenizer.from_pretrained(str(folder)), name=args.family)
    toolbox = tmpl.Toolbox([get_weather], timeout=5)
    conversations = [
        [
            {"role": "system", "content": "You are a weather assistant."},
            {"role": "user", "content": f"Weather in Paris, question {i}?"},
        ]
        for i in range(args.samples)
    ]
    global _result_chars
    n = args.samples * args.turns
    print(
        f"{args.samples} samples x {args.turns} turns ({args.family}), engine time ~0 (scripted policy); "
        "time outside the engine, per sample-turn"
    )
    for chars in RESULT.values():
        _result_chars = chars
        run_tmpl(tpl, conversations[:8], args.turns, toolbox)  # warm the probe and caches
        t_tmpl = run_tmpl(tpl, conversations, args.turns, toolbox)
        t_naive = run_naive(tpl, conversations, args.turns, toolbox)
        print(
            f"  tool results of {chars:5d} chars: tmpl {t_tmpl * 1e3 / n:7.3f} ms   naive (decode + re-render) "
            f"{t_naive * 1e3 / n:7.3f} ms   naive / tmpl = {t_naive / t_tmpl:.1f}x"
        )
    toolbox.close()


if __name__ == "__main__":
    main()
