"""Episodes: what training a template as deployed (``history="template"``) costs.

    python benchmarks/episodes.py [--episodes 16] [--users 3] [--families qwen3,gpt-oss,gemma-4-it]

Each family's episode is the same agent conversation: ``--users`` user questions, each answered by a
tool call (with reasoning where the template renders it) and then a final answer (with reasoning). A
scripted engine samples what the model would: the IDs of the family's own render of each planned
assistant message (the tokens after the generation prompt), so no engine time is in the figures.

Table 1, the whole episode in template mode (a simulated user asks the next question through
``edit_history``; append mode cannot add a user turn): turns and sequences per episode; the tokens
to train on (every sequence's IDs, summed) against one sequence per model call (what a trainer that
cannot merge calls keeps) and against the last call's context alone (the floor: one sequence with
nothing rewritten); the trained tokens (loss masks summed, which must equal the sampled tokens: each
once); and whether every prompt decodes to the tokenizer's own full render of the conversation so far
(``apply_chat_template``), that is, whether it trained on what the deployed model sees.

Table 2, the first user turn alone (a tool loop, which both modes can run): append mode against
template mode, sequences and tokens, and the loop's time per episode (template over append: what
rendering each prompt and splicing the sampled IDs back costs where nothing is rewritten).

Tokenizers come from ``TMPL_TEST_DATA`` (default ``../shared/tokenizers``); a family whose folder is
absent is listed as skipped.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import tmpl
from tmpl.backends import Scripted
from tmpl.toolcalls.probing import completion_ids

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("TMPL_TEST_DATA", ROOT.parent / "shared" / "tokenizers"))

#: where each family's template reads an assistant message's reasoning (None: it renders none)
REASONING_KEY = {
    "qwen2.5-instruct": None,
    "qwen3": "reasoning_content",
    "gpt-oss": "thinking",
    "gemma-4-it": "reasoning_content",
}
CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Perth"]


def get_weather(city: str) -> str:
    """Current weather.

    Args:
        city: The city.
    """
    return f"{city}: 21 C, sunny"


def plan(family: str, users: int) -> list[dict]:
    """The episode's messages in order: per user turn, a question, a tool call, its result, an answer."""
    key = REASONING_KEY[family]
    out: list[dict] = []
    for u in range(users):
        city = CITIES[u % len(CITIES)]
        call = {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}],
        }
        answer = {"role": "assistant", "content": f"It is sunny in {city}, 21 C."}
        if key is not None:
            call[key] = f"The user asks about {city}: I call the weather tool."
            answer[key] = f"The tool says {city} is sunny."
        out += [
            {"role": "user", "content": f"What is the weather in {city}?"},
            call,
            {"role": "tool", "content": get_weather(city)},
            answer,
        ]
    return out


#: gpt-oss (harmony): what the model samples for a call and for a final answer. Its template drops a
#: call turn's analysis once a final answer follows, so the render after the generation prompt of a
#: later turn is not what was sampled; the other families' are.
GPT_OSS = {
    "call": "<|channel|>analysis<|message|>{r}<|end|><|start|>assistant to=functions.get_weather<|channel|>"
    'commentary json<|message|>{{"city": "{c}"}}<|call|>',
    "final": "<|channel|>analysis<|message|>{r}<|end|><|start|>assistant<|channel|>final<|message|>{a}<|return|>",
}


def scripted_ids(tpl: tmpl.ChatTemplate, messages: list[dict], schemas, family: str) -> list[list[int]]:
    """Per assistant turn, the IDs the model samples: up to and with its stop token, the family's render
    of the message after the generation prompt (everything before it in the conversation, nothing dropped)."""
    out = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        if family == "gpt-oss":
            calls = m.get("tool_calls")
            text = (
                GPT_OSS["call"].format(r=m["thinking"], c=calls[0]["function"]["arguments"]["city"])
                if calls
                else GPT_OSS["final"].format(r=m["thinking"], a=m["content"])
            )
            ids = tpl.codec.encode(text)
        else:
            ids = completion_ids(tpl.renderer, tpl.codec, messages[:i], m, schemas)
        stop = next((k for k, t in enumerate(ids) if t in tpl.stop_token_ids), len(ids) - 1)
        out.append(ids[: stop + 1])
    return out


def next_user(messages_plan: list[dict]):
    """The edit_history hook of a simulated user: the next planned question after each final answer."""
    questions = [m["content"] for m in messages_plan if m["role"] == "user"][1:]

    def hook(messages, ctx):
        asked = sum(1 for m in messages if m["role"] == "user") - 1
        if ctx.answered and asked < len(questions):
            return messages + [{"role": "user", "content": questions[asked]}]
        return None

    return hook


def run_mode(tpl, history: str, turns_ids, first: list[dict], episodes: int, hook=None):
    """``episodes`` samples of the scripted episode; (results, prompts of the first, seconds per episode)."""
    prompts: list[list[int]] = []

    def policy(request):
        turn = int(request.request_id.split("-")[2])
        if request.request_id.startswith("0-"):
            prompts.append(list(request.prompt_ids))
        return turns_ids[turn]

    rollout = tmpl.Rollout(
        tpl,
        Scripted(policy),
        tools=[get_weather],
        history=history,
        edit_history=hook,
        max_turns=len(turns_ids),
        max_length=16384,
        progress=False,
    )
    start = time.perf_counter()
    results = rollout.run([first] * episodes)
    return results, prompts, (time.perf_counter() - start) / episodes


def as_deployed(tpl, result, prompts) -> bool:
    """Every prompt of one episode decodes to apply_chat_template of the messages before its turn."""
    starts = [i for i, m in enumerate(result.messages) if m["role"] == "assistant"]
    schemas = tmpl.Toolbox([get_weather]).schemas
    for t, prompt in enumerate(prompts):
        text = tpl.tokenizer.apply_chat_template(
            result.messages[: starts[t]],
            tools=schemas,
            chat_template=tpl.template,
            add_generation_prompt=True,
            tokenize=False,
            **tpl.template_kwargs,
        )
        if tpl.codec.decode(prompt) != text:
            return False
    return True


def failed(results) -> str | None:
    bad = [r for r in results if r.status.name != "DONE"]
    return None if not bad else f"{bad[0].code}: {bad[0].reason}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--users", type=int, default=3)
    parser.add_argument("--families", default="qwen2.5-instruct,qwen3,gpt-oss,gemma-4-it")
    args = parser.parse_args(argv)
    print(f"{args.episodes} episodes per family and mode; {args.users} user turns, each a tool call and an answer")
    rows1, rows2 = [], []
    for family in args.families.split(","):
        folder = DATA / family
        if not folder.is_dir():
            rows1.append(f"{family:18s} skipped: no tokenizer folder at {folder}")
            continue
        print(f"  {family} ...", file=sys.stderr)
        tpl = tmpl.ChatTemplate.from_pretrained(str(folder))
        schemas = tmpl.Toolbox([get_weather]).schemas
        messages_plan = plan(family, args.users)
        turns_ids = scripted_ids(tpl, messages_plan, schemas, family)
        first = [messages_plan[0]]

        # table 1: the whole episode, template mode
        tem, prompts, _ = run_mode(tpl, "template", turns_ids, first, args.episodes, next_user(messages_plan))
        problem = failed(tem)
        if problem is not None:
            rows1.append(f"{family:18s} failed: {problem}")
            continue
        one = tem[0]
        seqs = one.sequences
        tokens = sum(len(s.ids) for s in seqs)
        per_call = sum(len(p) + len(c) for p, c in zip(prompts, turns_ids))
        floor = len(prompts[-1]) + len(turns_ids[one.turns - 1])
        trained = sum(int(s.mask.sum()) for s in seqs)
        sampled = sum(len(c) for c in turns_ids[: one.turns])
        rows1.append(
            f"{family:18s} {one.turns:5d} {len(seqs):5d} {tokens:7d} {per_call:8d} {tokens / per_call:6.2f} "
            f"{floor:6d} {tokens / floor:6.2f} {trained:7d} {str(trained == sampled):>7s} "
            f"{str(as_deployed(tpl, one, prompts[: one.turns])):>8s}"
        )

        # table 2: the first user turn's tool loop, both modes
        loop_ids = turns_ids[:2]
        for h in ("append", "template"):  # warm: the suffix engine's probes, the renderer's compiled template
            run_mode(tpl, h, loop_ids, first, 1)
        runs = {h: run_mode(tpl, h, loop_ids, first, args.episodes) for h in ("append", "template")}
        (app, _, app_s), (tl, _, tl_s) = runs["append"], runs["template"]
        problem = failed(app) or failed(tl)
        if problem is not None:
            rows2.append(f"{family:18s} failed: {problem}")
            continue
        a_tok = sum(len(s.ids) for s in app[0].sequences)
        t_tok = sum(len(s.ids) for s in tl[0].sequences)
        rows2.append(
            f"{family:18s} {len(app[0].sequences):4d} {len(tl[0].sequences):4d} {a_tok:6d} {t_tok:6d} "
            f"{app_s * 1e3:9.2f} {tl_s * 1e3:9.2f} {tl_s / app_s:6.2f}"
        )
    print("\n1. whole episodes, template mode (tokens to train on; trained = loss masks summed)")
    print(
        f"{'family':18s} {'turns':>5s} {'seqs':>5s} {'tokens':>7s} {'per-call':>8s} {'ratio':>6s} "
        f"{'floor':>6s} {'ratio':>6s} {'trained':>7s} {'=sampled':>7s} {'deployed':>8s}"
    )
    print("\n".join(rows1))
    print("\n2. the first user turn's tool loop: append vs template (ms per episode, loop only)")
    print(
        f"{'family':18s} {'seqA':>4s} {'seqT':>4s} {'tokA':>6s} {'tokT':>6s} {'append ms':>9s} {'tmpl ms':>9s} "
        f"{'ratio':>6s}"
    )
    print("\n".join(rows2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
