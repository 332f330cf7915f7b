"""Cost of ``bridge_to_next_turn``: tmpl's renderer (both history modes) vs renderers' own bridge vs the
full re-render; and how many of the 108 held-out cases each bridges exactly.

    python benchmarks/renderers_bridge.py [--data ../shared/tokenizers] [--families qwen2.5-instruct qwen3 ...]
                                          [--rounds 4] [--calls 300] [--skip-cases]

For each family, one conversation (a user turn, then ``--rounds`` tool rounds: an assistant call,
its result); the bridged turn is the last round: the previous prompt (rendered by the renderer, so
it knows the conversation) and the model's completion (its tokens in transformers' full render) are
extended with the last tool result. Measured on that same turn, in turns (every variant sees the
same load; best turn kept), microseconds per call:

- ``tmpl template``: :class:`tmpl.integrations.renderers.TmplRenderer` ``bridge_to_next_turn`` in
  template mode (the default; with its attribution: message indices and content flags): tmpl's
  suffix where the tool_loop verdict is SAFE, else the template's render of the conversation with
  the sampled IDs spliced back (a Jinja render per bridge);
- ``tmpl append``: the same renderer in append mode (the suffix, whatever the verdict);
- ``tmpl suffix``: ``ChatTemplate.suffix_ids`` alone (what append mode appends, without attribution);
- ``renderers``: the renderer renderers picks for the family's hub id (``MODEL_RENDERER_MAP``, else
  its ``DefaultRenderer``) and its ``bridge_to_next_turn``; None means the caller re-renders;
- ``re-render``: that renderer's ``render(..., add_generation_prompt=True)`` of the whole
  conversation, what the caller runs when a bridge returns None;
- ``apply_chat_template``: transformers' tokenized render of the whole conversation.

Each bridge's output is also compared with the full render (``exact``). Ratios are against tmpl's
template mode in this run.

Then (unless ``--skip-cases``) the 108 held-out cases of tmpl's verl builder (tests/test_integrations_verl.py:
6 families whose templates render parallel calls x 1-3 calls x each hard tool content of
tests/contract.py): how many each bridges to exactly the prompt, the completion and the full render's
tail: append mode, template mode, the rule before the modes (SAFE tool_loop verdicts only), and
renderers' own choice for the family's hub id. Needs ``renderers`` (``pip install 'tmpl[renderers]'``).
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
from tmpl.report import SAFE  # noqa: E402

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


def own_renderer(tokenizer, family: str, hub_ids: dict[str, str] = HUB_IDS):
    """The renderer renderers picks for the family's hub id (its auto choice, without asking the hub)."""
    from renderers import configs, create_renderer
    from renderers.base import MODEL_RENDERER_MAP

    name = MODEL_RENDERER_MAP.get(hub_ids.get(family, ""), "default")
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
    parser.add_argument("--skip-cases", action="store_true", help="skip counting the 108 held-out cases")
    args = parser.parse_args()
    logging.getLogger("tmpl.integrations.renderers").setLevel(logging.WARNING)
    from transformers import AutoTokenizer

    from tmpl.integrations.renderers import TmplRenderer, TmplRendererConfig

    print(f"tmpl {tmpl.__version__}, renderers {_version('renderers')}, transformers {_version('transformers')}")
    print(
        f"{args.rounds} tool rounds, the last one bridged; microseconds per call (best turn); ratios vs tmpl template\n"
    )
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
        ours = TmplRenderer.from_template(tpl)
        appending = TmplRenderer.from_template(tpl, TmplRendererConfig(history="append"))
        own_name, theirs = own_renderer(tok, family)
        messages = conversation(args.rounds)
        history, results = messages[:-2], messages[-1:]
        full = rendered(tok, messages, True)
        prompt = ours.render_ids(history, tools=TOOLS, add_generation_prompt=True)  # known to both renderers
        assert prompt == rendered(tok, history, True)
        stops = tpl.stop_token_ids
        stop = next(t for t in range(len(prompt), len(full)) if full[t] in stops)
        if full[: len(prompt)] != prompt:
            print(f"{family:<20s} (the prompt is not a prefix of the full render: nothing to bridge)")
            continue
        completion = full[len(prompt) : stop + 1]

        def ours_bridge():
            return ours.bridge_to_next_turn(prompt, completion, results, tools=TOOLS)

        def ours_append():
            return appending.bridge_to_next_turn(prompt, completion, results, tools=TOOLS)

        def ours_suffix():
            return tpl.suffix_ids(results, completion_ids=completion, tools=TOOLS)

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
            "tmpl template": verdict_of(ours_bridge()),
            "tmpl append": verdict_of(ours_append()),
            "tmpl suffix": verdict_of(ours_suffix()),
            f"renderers {own_name} bridge": verdict_of(their_bridge()),
            f"renderers {own_name} re-render": "exact" if their_render().token_ids == full else "DIFFERS",
            "apply_chat_template": "exact",
        }
        fast = interleaved(
            {"tmpl template": ours_bridge, "tmpl append": ours_append, "tmpl suffix": ours_suffix}, args.calls
        )
        slow = interleaved(
            {
                f"renderers {own_name} bridge": their_bridge,
                f"renderers {own_name} re-render": their_render,
                "apply_chat_template": hf_render,
            },
            max(args.calls // 10, 10),
        )
        times = {**fast, **slow}
        base = times["tmpl template"]
        how = "its suffix" if verdict.level == SAFE else "render + splice"
        for label, us in times.items():
            print(f"{family:<20s} {label:<34s} {us:>10.1f} {us / base:>7.2f}x  {outputs[label]}")
        print(f"{'':<20s} tool_loop verdict: {verdict.label} (template mode: {how}); full render {len(full)} tokens\n")
    if not args.skip_cases:
        held_out_cases(Path(args.data))


#: tests/test_integrations_verl.py's held-out families (their templates render parallel calls)
PARALLEL = [
    "qwen2.5-instruct",
    "qwen3",
    "gemma-4-it",
    "mistral-nemo-instruct-2407",
    "deepseek-v3",
    "phi-4-mini-instruct",
]
PARALLEL_HUB_IDS = {
    **HUB_IDS,
    "gemma-4-it": "google/gemma-4-E2B-it",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "phi-4-mini-instruct": "microsoft/Phi-4-mini-instruct",
}


def held_out_cases(data: Path) -> None:
    """How many of the 108 held-out cases each bridges exactly: both of tmpl's modes, the rule before the
    modes (a SAFE tool_loop verdict), renderers' own choice for the hub id. The truth is transformers'
    full render: the prompt, the completion (its tokens after the prompt through the stop token after
    the last call) and its tail."""
    from transformers import AutoTokenizer

    from tests.contract import HARD_CONTENTS, HISTORIES, assistant_turn, full_render, marker, tool_results
    from tests.contract import TOOLS as CONTRACT_TOOLS
    from tmpl.integrations.renderers import TmplRenderer, TmplRendererConfig

    print("108 held-out cases (6 families x 1-3 calls x 6 hard tool contents): bridged exactly")
    head = f"{'family':<28s} {'cases':>5s} {'append':>7s} {'template':>9s} {'SAFE only':>10s} {'renderers':>10s}  own renderer"
    print(head)
    print("-" * len(head))
    total = [0] * 5
    for family in PARALLEL:
        folder = data / family
        if not folder.is_dir():
            print(f"{family:<28s} (no tokenizer under {folder})")
            continue
        tok = AutoTokenizer.from_pretrained(str(folder))
        tpl = tmpl.ChatTemplate(tok, name=family)
        modes = [TmplRenderer.from_template(tpl, TmplRendererConfig(history=m)) for m in ("append", "template")]
        safe = tmpl.report.check(tpl).verdicts["tool_loop"].level == SAFE
        own_name, theirs = own_renderer(tok, family, PARALLEL_HUB_IDS)
        row = [0] * 5
        for k in (1, 2, 3):
            for content in HARD_CONTENTS.values():
                history, assistant = list(HISTORIES["user"]), assistant_turn(k)
                results = tool_results(assistant, [content] * k)
                text, full = full_render(tpl, history + [assistant] + results)
                prompt = modes[0].render_ids(history, tools=CONTRACT_TOOLS, add_generation_prompt=True)
                start = next((i for i, (a, b) in enumerate(zip(prompt, full)) if a != b), min(len(prompt), len(full)))
                ends = [text.find(marker(0, i)) for i in range(k)]
                pos = max(e + len(marker(0, 0)) for e in ends) if min(ends) >= 0 else len(tok.decode(full[:start]))
                enc = tok.backend_tokenizer.encode(text, add_special_tokens=False)
                stop = next(t for t, (a, _) in enumerate(enc.offsets) if a >= pos and full[t] in tpl.stop_token_ids)
                completion, truth = full[start : stop + 1], prompt + full[start:]
                row[0] += 1
                for j, renderer in enumerate(modes):
                    out = renderer.bridge_to_next_turn(prompt, completion, results, tools=CONTRACT_TOOLS)
                    row[1 + j] += out is not None and out.token_ids == truth
                row[3] += safe
                try:
                    other = theirs.bridge_to_next_turn(prompt, completion, results, tools=CONTRACT_TOOLS)
                except Exception:  # noqa: BLE001 - a renderer that raises bridges nothing
                    other = None
                row[4] += other is not None and other.token_ids == truth
        total = [a + b for a, b in zip(total, row)]
        print(f"{family:<28s} {row[0]:>5d} {row[1]:>7d} {row[2]:>9d} {row[3]:>10d} {row[4]:>10d}  {own_name}")
    print(f"{'TOTAL':<28s} {total[0]:>5d} {total[1]:>7d} {total[2]:>9d} {total[3]:>10d} {total[4]:>10d}")


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    main()
