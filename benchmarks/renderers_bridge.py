"""Cost of ``bridge_to_next_turn``: tmpl's renderer vs renderers' own bridge vs the full re-render.

    python benchmarks/renderers_bridge.py [--data ../shared/tokenizers] [--families qwen2.5-instruct qwen3 ...]
                                          [--rounds 4] [--calls 300]

For each family, one conversation (a user turn, then ``--rounds`` tool rounds: an assistant call,
its result); the bridged turn is the last round: the previous prompt and the model's completion
(its tokens in transformers' full render) are extended with the last tool result. Measured on
that same turn, in turns (every variant sees the same load; best turn kept), microseconds per call:

- ``tmpl``: :class:`tmpl.integrations.renderers.TmplRenderer` ``bridge_to_next_turn`` (with its
  attribution: message indices and content flags); for a template whose tool_loop verdict is
  ``SAFE WITH tmpl TEMPLATE X`` (Qwen3) with ``training_safe=True``;
- ``tmpl suffix``: ``ChatTemplate.suffix_ids`` alone (what the bridge appends, without attribution);
- ``renderers``: the renderer renderers picks for the family's hub id (``MODEL_RENDERER_MAP``, else
  its ``DefaultRenderer``) and its ``bridge_to_next_turn``; None means the caller re-renders;
- ``re-render``: that renderer's ``render(..., add_generation_prompt=True)`` of the whole
  conversation, what the caller runs when a bridge returns None;
- ``apply_chat_template``: transformers' tokenized render of the whole conversation.

Each bridge's output is also compared with the full render (``exact``). Ratios are against tmpl in
this run. Needs ``renderers`` (``pip install 'tmpl[renderers]'``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import tmpl  # noqa: E402
from tmpl.report import SAFE_WITH  # noqa: E402

HUB_IDS = {
    "qwen2.5-instruct": "Qwen/Qwen2.5-1.5B-Instruct",
    "qwen3": "Qwen/Qwen3-4B",
    "llama-3.2-instruct": "meta-llama/Llama-3.2-1B-Instruct",
    "mistral-nemo-instruct-2407": "mistralai/Mistral-Nemo-Instruct-2407",
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
RESULT = '{"city": "Paris", "temperature_c": 21.5, "conditions": "partly cloudy", "humidity": 0.4, "wind": 12}'
CITIES = ["Paris", "Rome", "Oslo", "Lima", "Kyiv", "Pune", "Bern", "Riga"]


def conversation(rounds: int) -> list[dict]:
    messages: list[dict] = [{"role": "user", "content": "What is the weather in " + ", ".join(CITIES[:rounds]) + "?"}]
    for r in range(rounds):
        call_id = f"c{r:02d}xYz9ab"  # 9 alphanumerics: valid for Mistral too
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": CITIES[r % len(CITIES)]}},
                    }
                ],
            }
        )
        messages.append(
            {
                "role": "tool",
                "tool_call_id": call_id,
                "name": "get_weather",
                "content": RESULT.replace("Paris", CITIES[r]),
            }
        )
    return messages


def rendered(tokenizer, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    out = tokenizer.apply_chat_template(
        messages, tools=TOOLS, add_generation_prompt=add_generation_prompt, tokenize=True
    )
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def own_renderer(tokenizer, family: str):
    """The renderer renderers picks for the family's hub id (its auto choice, without asking the hub)."""
    from renderers import configs, create_renderer
    from renderers.base import MODEL_RENDERER_MAP

    name = MODEL_RENDERER_MAP.get(HUB_IDS.get(family, ""), "default")
    for cls in vars(configs).values():
        if isinstance(cls, type) and issubclass(cls, configs.BaseRendererConfig) and "name" in cls.model_fields:
            if cls.model_fields["name"].default == name:
                return name, create_renderer(tokenizer, cls())
    raise LookupError(name)


def interleaved(variants: dict, calls: int, rounds: int = 7) -> dict[str, float]:
    """Best microseconds per call of each variant, timed in turns of ``calls`` calls."""
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(rounds):
        for label, fn in variants.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best[label] = min(best[label], (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "tokenizers"))
    parser.add_argument("--families", nargs="+", default=["qwen2.5-instruct", "qwen3", "llama-3.2-instruct"])
    parser.add_argument("--rounds", type=int, default=4, help="tool rounds in the conversation (the last is bridged)")
    parser.add_argument("--calls", type=int, default=300, help="calls per timed turn of the fast variants")
    args = parser.parse_args()
    logging.getLogger("tmpl.integrations.renderers").setLevel(logging.WARNING)
    from transformers import AutoTokenizer

    from tmpl.integrations.renderers import TmplRenderer, TmplRendererConfig

    print(f"tmpl {tmpl.__version__}, renderers {_version('renderers')}, transformers {_version('transformers')}")
    print(f"{args.rounds} tool rounds, the last one bridged; microseconds per call (best turn); ratios vs tmpl\n")
    header = f"{'family':<20s} {'variant':<34s} {'us/call':>10s} {'x tmpl':>8s}  output"
    print(header)
    print("-" * len(header))
    for family in args.families:
        folder = Path(args.data) / family
        if not folder.is_dir():
            print(f"{family:<20s} (no tokenizer under {folder})")
            continue
        tok = AutoTokenizer.from_pretrained(str(folder))
        tpl = tmpl.ChatTemplate(tok)
        verdict = tmpl.report.check(tpl).verdicts["tool_loop"]
        ours = TmplRenderer.from_template(tpl, TmplRendererConfig(training_safe=verdict.level == SAFE_WITH))
        own_name, theirs = own_renderer(tok, family)
        messages = conversation(args.rounds)
        history, results = messages[:-2], messages[-1:]
        full = rendered(tok, messages, True)
        prompt = rendered(tok, history, True)
        stops = tpl.stop_token_ids
        stop = next(t for t in range(len(prompt), len(full)) if full[t] in stops)
        if full[: len(prompt)] != prompt:
            print(f"{family:<20s} (the prompt is not a prefix of the full render: nothing to bridge)")
            continue
        completion = full[len(prompt) : stop + 1]

        def ours_bridge():
            return ours.bridge_to_next_turn(prompt, completion, results, tools=TOOLS)

        def ours_suffix():
            return ours.tpl.suffix_ids(results, completion_ids=completion, tools=TOOLS)

        def their_bridge():
            return theirs.bridge_to_next_turn(prompt, completion, results, tools=TOOLS)

        def their_render():
            return theirs.render(messages, tools=TOOLS, add_generation_prompt=True)

        def hf_render():
            return rendered(tok, messages, True)

        def verdict_of(out) -> str:
            if out is None:
                return "None (the caller re-renders)"
            ids = out.token_ids if hasattr(out, "token_ids") else list(prompt) + list(completion) + list(out)
            return "exact" if ids == full else "DIFFERS from the full render"

        outputs = {
            "tmpl": verdict_of(ours_bridge()),
            "tmpl suffix": verdict_of(ours_suffix()),
            f"renderers {own_name} bridge": verdict_of(their_bridge()),
            f"renderers {own_name} re-render": "exact" if their_render().token_ids == full else "DIFFERS",
            "apply_chat_template": "exact",
        }
        fast = interleaved({"tmpl": ours_bridge, "tmpl suffix": ours_suffix}, args.calls)
        slow = interleaved(
            {
                f"renderers {own_name} bridge": their_bridge,
                f"renderers {own_name} re-render": their_render,
                "apply_chat_template": hf_render,
            },
            max(args.calls // 10, 10),
        )
        times = {**fast, **slow}
        base = times["tmpl"]
        note = f" (tmpl: training_safe -> {ours.tpl.name})" if ours.tpl is not tpl else ""
        for label, us in times.items():
            print(f"{family:<20s} {label:<34s} {us:>10.1f} {us / base:>7.2f}x  {outputs[label]}")
        print(f"{'':<20s} tool_loop verdict: {verdict.label}{note}; full render {len(full)} tokens\n")


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    main()
