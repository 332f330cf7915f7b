"""The shipped training-safe templates (``tmpl.templates``), on the real family tokenizers.

Each variant is checked against the ORIGINAL template it mirrors (read from the shared
tokenizer folder, never from the repository):

- last turn: on seeded random conversations, the text from the last user message onward
  (the whole render where no assistant turn comes before it) equals the original's, except
  for the documented changes, which are applied to the original's text by ``DOCUMENTED``
  below (each rule located by the unique strings of the conversation); where the original
  raises, the variant raises too;
- prefix stability: the prompt is a token prefix of the longer conversation's prompt, and
  so is the assistant-last render (what the model generated, as trained on); the original
  fails these for the cases each variant fixes (negative controls);
- the assistant mask: masked tokens decode to exactly what the model generated per turn;
- tmpl's suffix contract (``contract.check_turn``) holds with the variant;
- ``synthetic_tokenizer`` renders the same text as the real tokenizer.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jinja2
import pytest

import tmpl
from tmpl.suffix import clear_caches

from .conftest import DATA, load_tokenizer
from .contract import ARGS, HISTORIES, TOOLS, assistant_turn, check_turn, tool_results

Message = dict[str, Any]


@dataclass(frozen=True)
class Family:
    """What a family's format allows (read off the original template and MANIFEST.md)."""

    tokenizer: str  # folder in TMPL_TEST_DATA
    max_calls: int  # parallel calls the original renders in one assistant message
    reasoning: bool  # the original renders reasoning at all
    thinking_kwarg: bool  # the template reads enable_thinking
    call_content: bool  # text next to tool calls is rendered (and can be generated)
    stops: tuple[str, ...]  # tokens an assistant generation ends with (MANIFEST "closes a turn")
    extra: dict[str, Any] = field(default_factory=dict)  # kwargs for every render


FAMILIES: dict[str, Family] = {
    "qwen2.5": Family("qwen2.5-instruct", 3, False, False, True, ("<|im_end|>",)),
    "qwen3": Family("qwen3", 3, True, True, True, ("<|im_end|>",)),
    # date_string pins "Today Date" so that renders do not depend on the clock
    "llama-3": Family("llama-3.2-instruct", 1, False, False, False, ("<|eot_id|>",), {"date_string": "03 Feb 2025"}),
    "gpt-oss": Family("gpt-oss", 1, True, False, True, ("<|call|>", "<|return|>")),
    "gemma-4": Family("gemma-4-it", 3, True, True, True, ("<turn|>", "<|tool_response>")),
}
NAMES = sorted(FAMILIES)
#: The variants that change what an original renders (the others only add markers).
FIXED = ("gemma-4", "gpt-oss", "qwen3")


# -- the templates ------------------------------------------------------------------------


def original_template(name: str) -> str:
    """The upstream template a variant mirrors, from the shared tokenizer folder (``base_file``)."""
    base_file = tmpl.templates.info(name).base_file
    path, _, key = base_file.partition("#")
    source = DATA / path
    if not source.is_file():
        pytest.skip(f"original template {base_file!r} not found under {DATA}")
    text = source.read_text(encoding="utf-8")
    return json.loads(text)[key] if key else text


def tokenizer(name: str) -> Any:
    return load_tokenizer(FAMILIES[name].tokenizer)


def render(name: str, template: str, messages: list[Message], *, tools=None, gen: bool, **kwargs: Any) -> str:
    kwargs = {**FAMILIES[name].extra, **kwargs}
    return tokenizer(name).apply_chat_template(
        messages, tools=tools, chat_template=template, add_generation_prompt=gen, tokenize=False, **kwargs
    )


def ids(name: str, text: str) -> list[int]:
    return tokenizer(name).encode(text, add_special_tokens=False)


# -- seeded random conversations ------------------------------------------------------------

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


@dataclass
class Convo:
    messages: list[Message]
    tools: list | None
    kwargs: dict[str, Any]
    gen: bool

    @property
    def last_user(self) -> int:
        return max(i for i, m in enumerate(self.messages) if m["role"] == "user")


class Writer:
    """Builds messages whose every text is unique (``...Nq``), so renders can be searched."""

    def __init__(self, rng: random.Random, fam: Family, *, reasoning: bool) -> None:
        self.rng, self.fam, self.n = rng, fam, 0
        self.reasoning = reasoning and fam.reasoning

    def tag(self, kind: str) -> str:
        self.n += 1
        return f"{kind}{self.n}q"

    def user(self) -> Message:
        return {"role": "user", "content": f"{self.tag('Ask')} what is the weather in Paris?"}

    def _reason(self, msg: Message) -> Message:
        if self.reasoning and self.rng.random() < 0.7:
            msg[self.rng.choice(REASONING_FIELDS)] = f"{self.tag('Think')} I should look it up.\nThen answer."
        return msg

    def final(self) -> Message:
        msg = self._reason({"role": "assistant", "content": f"{self.tag('Say')} It is sunny, 21 C."})
        if (
            self.fam.tokenizer == "qwen3"
            and self.reasoning
            and not any(f in msg for f in REASONING_FIELDS)
            and self.rng.random() < 0.3
        ):  # Qwen3 also reads reasoning inline in the content
            msg["content"] = f"<think>\n{self.tag('Think')} inline.\n</think>\n\n{msg['content']}"
        return msg

    def call_turn(self, k: int) -> Message:
        calls = []
        for j in range(k):
            args = {**ARGS[j % 3], "tag": self.tag("Arg")}
            calls.append(
                {
                    "id": f"call{self.n:04d}x",
                    "type": "function",
                    "function": {"name": TOOLS[j % 3]["function"]["name"], "arguments": args},
                }
            )
        content = ""
        if self.fam.call_content and self.rng.random() < 0.4:
            content = f"{self.tag('Pre')} Let me check."
        msg: Message = {"role": "assistant", "content": content, "tool_calls": calls}
        if self.fam.tokenizer == "gpt-oss" and content:
            return msg  # content is the analysis text; thinking as well would raise (checked separately)
        return self._reason(msg)

    def results(self, turn: Message) -> list[Message]:
        return [
            {
                "role": "tool",
                "tool_call_id": c["id"],
                "name": c["function"]["name"],
                "content": f"{self.tag('Result')} 21.5 C, sunny",
            }
            for c in turn["tool_calls"]
        ]


def random_convo(name: str, seed: int, *, ends: str = "any", generated: bool = True) -> tuple[Convo, Writer]:
    """A conversation: optional system, 1-3 user rounds of 0-2 tool steps (1-max calls each)
    and an answer. ``ends``: "any", "prompt" (ends with a user or tool message) or
    "assistant" (ends with an assistant message: a training sample). With ``generated``, turns
    have reasoning only where the model could have generated it (not after Qwen3's prefilled
    empty think block, enable_thinking=False); without, any turn may have reasoning."""
    fam = FAMILIES[name]
    rng = random.Random(f"{name}/{seed}")
    kwargs: dict[str, Any] = {}
    if fam.thinking_kwarg:
        choice = rng.choice([None, True, False])
        if choice is not None:
            kwargs["enable_thinking"] = choice
    off = name == "qwen3" and kwargs.get("enable_thinking") is False
    w = Writer(rng, fam, reasoning=not (generated and off))
    msgs: list[Message] = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": f"{w.tag('Sys')} You are helpful."})
    rounds = rng.randint(1, 3)
    for r in range(rounds):
        msgs.append(w.user())
        for _ in range(rng.randint(0, 2)):
            turn = w.call_turn(rng.randint(1, fam.max_calls))
            msgs += [turn] + w.results(turn)
        if r < rounds - 1 or rng.random() < 0.5:
            msgs.append(w.final())
    if ends == "prompt" and msgs[-1]["role"] == "assistant":
        msgs.append(w.user())
    if ends == "assistant" and msgs[-1]["role"] != "assistant":
        msgs.append(w.final() if rng.random() < 0.6 else w.call_turn(rng.randint(1, fam.max_calls)))
    tools = TOOLS if rng.random() < 0.8 else None
    gen = {"prompt": True, "assistant": False}.get(ends, rng.random() < 0.5)
    return Convo(msgs, tools, kwargs, gen), w


# -- the documented changes, applied to the original's text --------------------------------


def reasoning_of(msg: Message) -> str | None:
    return next((msg[f] for f in REASONING_FIELDS if msg.get(f) is not None), None)


def first_text(msg: Message) -> str:
    """A unique string the render of an assistant message contains: its first call's argument
    tag (every template renders calls), else its content after any inline think block."""
    if msg.get("tool_calls"):
        return msg["tool_calls"][0]["function"]["arguments"]["tag"]
    return msg["content"].split("</think>")[-1].strip()


def insert_at(text: str, pos: int, insertion: str) -> str:
    assert pos >= 0
    return text[:pos] + insertion + text[pos:]


def qwen3_changes(text: str, c: Convo) -> str:
    """Assistant turns after the last user query keep a think block even when not last."""
    for i, m in enumerate(c.messages):
        if m["role"] != "assistant" or i <= c.last_user or i == len(c.messages) - 1:
            continue
        if reasoning_of(m) is None and "</think>" not in m.get("content", ""):
            head = "<|im_start|>assistant\n"
            start = text.rfind(head, 0, text.find(first_text(m)))
            text = insert_at(text, start + len(head), "<think>\n\n</think>\n\n")
    return text


def gpt_oss_changes(text: str, c: Convo) -> str:
    """Analysis of call messages is kept; final answers keep analysis and <|return|>."""
    msgs = c.messages
    for i, m in enumerate(msgs):
        if m["role"] != "assistant" or i <= c.last_user:
            continue
        later_final = any(x["role"] == "assistant" and "tool_calls" not in x for x in msgs[i + 1 :])
        if "tool_calls" in m:
            analysis = m.get("content") or reasoning_of(m)
            if analysis and later_final:
                start = text.rfind("<|start|>assistant to=", 0, text.find(first_text(m)))
                text = insert_at(text, start, f"<|start|>assistant<|channel|>analysis<|message|>{analysis}<|end|>")
        elif i < len(msgs) - 1 or c.gen:
            old = f"<|start|>assistant<|channel|>final<|message|>{m['content']}<|end|>"
            new = f"<|start|>assistant<|channel|>final<|message|>{m['content']}<|return|>"
            if reasoning_of(m) is not None:
                new = f"<|start|>assistant<|channel|>analysis<|message|>{reasoning_of(m)}<|end|>" + new
            assert text.count(old) == 1, old
            text = text.replace(old, new)
    return text


def gemma_changes(text: str, c: Convo) -> str:
    """Answers keep their thought; content of a call message stays before the tool responses."""
    msgs = c.messages
    for i, m in enumerate(msgs):
        if m["role"] != "assistant" or i <= c.last_user:
            continue
        thought = reasoning_of(m)
        if thought and not m.get("tool_calls"):
            assert text.count(m["content"] + "<turn|>") == 1
            text = text.replace(
                m["content"] + "<turn|>", f"<|channel>thought\n{thought}\n<channel|>" + m["content"] + "<turn|>"
            )
        answered = i + 1 < len(msgs) and msgs[i + 1]["role"] == "tool"
        if m.get("tool_calls") and m.get("content") and answered:
            moved = m["content"] + "<turn|>\n"
            assert text.count(moved) == 1
            text = text.replace(moved, "")
            last_tag = m["tool_calls"][-1]["function"]["arguments"]["tag"]
            end = text.find("<tool_call|>", text.find(last_tag)) + len("<tool_call|>")
            text = insert_at(text, end, m["content"])
    return text


DOCUMENTED: dict[str, Callable[[str, Convo], str]] = {
    "qwen2.5": lambda text, c: text,
    "llama-3": lambda text, c: text,
    "qwen3": qwen3_changes,
    "gpt-oss": gpt_oss_changes,
    "gemma-4": gemma_changes,
}

TURN_HEADS = {
    "qwen2.5": "<|im_start|>",
    "qwen3": "<|im_start|>",
    "llama-3": "<|start_header_id|>",
    "gpt-oss": "<|start|>",
    "gemma-4": "<|turn>",
}


def last_turn(name: str, text: str, c: Convo) -> str:
    """The render from the last user message's turn on (all of it when no assistant turn precedes)."""
    if not any(m["role"] == "assistant" for m in c.messages[: c.last_user]):
        return text
    pos = text.find(c.messages[c.last_user]["content"])
    return text[text.rfind(TURN_HEADS[name], 0, pos) :]


def try_render(name: str, template: str, c: Convo) -> str | Exception:
    try:
        return render(name, template, c.messages, tools=c.tools, gen=c.gen, **c.kwargs)
    except Exception as exc:  # the template raised (raise_exception, undefined content...)
        return exc


def break_some(rng: random.Random, name: str, c: Convo) -> None:
    """Make some conversations invalid the way real data is, in a way the family's original
    template reacts to: a missing content, two calls where one is allowed, analysis given both
    as content and as thinking (gpt-oss), a tool result that is a mapping (Gemma 4)."""
    if rng.random() > 0.2:
        return
    assistants = [m for m in c.messages if m["role"] == "assistant"]
    callers = [m for m in assistants if m.get("tool_calls")]
    results = [m for m in c.messages if m["role"] == "tool"]
    if name == "gemma-4" and results:
        rng.choice(results)["content"] = {"temp_c": 21}
    elif name == "llama-3" and callers:
        victim = rng.choice(callers)
        victim["tool_calls"] = victim["tool_calls"] * 2
    elif name == "gpt-oss" and callers and rng.random() < 0.5:
        victim = rng.choice(callers)
        victim["content"], victim["thinking"] = "Both fields.", "Both fields too."
    elif assistants and name != "gemma-4":
        del rng.choice(assistants)["content"]


# -- 1. the last turn renders as the original -----------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_last_turn_renders_as_the_original(name):
    variant, original = tmpl.templates.load(name), original_template(name)
    changed = raised = 0
    for seed in range(60):
        c, _ = random_convo(name, seed, generated=False)
        break_some(random.Random(seed), name, c)
        want, got = try_render(name, original, c), try_render(name, variant, c)
        if isinstance(want, Exception):
            assert isinstance(got, Exception), f"seed {seed}: the original raises ({want}), the variant renders"
            raised += 1
            continue
        assert not isinstance(got, Exception), f"seed {seed}: the variant raises ({got}), the original renders"
        expected = DOCUMENTED[name](want, c)
        changed += expected != want
        assert last_turn(name, got, c) == last_turn(name, expected, c), f"seed {seed}"
    if name in FIXED:
        assert changed, "no conversation exercised the documented changes"
    assert raised, "no invalid conversation was rendered"


def test_llama_date_logic_is_the_originals(tokenizer_of):
    """'Today Date' comes from date_string, else strftime_now, exactly as in the original."""
    tok = tokenizer_of("llama-3.2-instruct")
    msgs = [{"role": "user", "content": "hi"}]
    for kwargs in ({}, {"date_string": "01 Jan 1999"}):
        texts = {
            tok.apply_chat_template(msgs, chat_template=t, tokenize=False, add_generation_prompt=True, **kwargs)
            for t in (tmpl.templates.load("llama-3"), original_template("llama-3"))
        }
        assert len(texts) == 1
    assert "Today Date: 01 Jan 1999\n" in texts.pop()


RICH_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "plan",
            "description": "Plan a trip.",
            "parameters": {
                "type": "object",
                "required": ["stops", "mode"],
                "properties": {
                    "stops": {"type": "array", "items": {"type": "string"}, "nullable": True, "description": "Cities"},
                    "legs": {
                        "type": "array",
                        "items": {"type": "object", "properties": {"km": {"type": "integer"}}, "required": ["km"]},
                    },
                    "any_list": {"type": "array"},
                    "mode": {"type": "string", "enum": ["car", "train"], "default": "train"},
                    "when": {
                        "oneOf": [
                            {"type": "string", "description": "ISO date", "default": "today"},
                            {"type": "object"},
                            {"type": "number"},
                        ],
                        "default": "now",
                    },
                    "either": {"type": ["string", "number"]},
                    "prefs": {
                        "type": "object",
                        "description": "Preferences",
                        "required": ["seat"],
                        "properties": {
                            "seat": {"type": "boolean"},
                            "meal": {
                                "type": "object",
                                "properties": {"kind": {"type": "number"}},
                                "required": ["kind"],
                            },
                        },
                    },
                    "extra": {"type": "object", "additionalProperties": {"type": "string"}},
                    "count": {"type": "integer", "default": 3},
                    "grid": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
                    "note": {"type": "string", "nullable": True},
                },
            },
        },
    },
    {"type": "function", "function": {"name": "ping", "description": "No parameters.", "parameters": {}}},
    {
        "type": "function",
        "function": {
            "name": "rated",
            "description": "With a response.",
            "parameters": {"properties": {"q": {"type": "string"}}, "required": ["q"]},
            "response": {"type": "object", "description": "the rating"},
        },
    },
]


@pytest.mark.parametrize("name", NAMES)
def test_tool_declarations_render_as_the_original(name):
    """System/developer text with rich tool schemas (nested objects, enums, unions, defaults)."""
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Plan a trip."}]
    kwargs = {"builtin_tools": ["browser", "python"]} if name == "gpt-oss" else {}
    for tools in (RICH_TOOLS, TOOLS):
        want = render(name, original_template(name), msgs, tools=tools, gen=True, **kwargs)
        assert render(name, tmpl.templates.load(name), msgs, tools=tools, gen=True, **kwargs) == want


# -- 2. prefix stability, and the originals' failures ---------------------------------------


def is_prefix(short: list[int], long: list[int]) -> bool:
    return long[: len(short)] == short


@dataclass
class Growth:
    """One step of a rollout: the prompt, the assistant turn, and what follows it."""

    before: Convo
    turn: Message
    after: list[Message]


def growths(name: str, seed: int) -> list[Growth]:
    """From a random prompt state: an assistant call turn + tool results, and an answer + user."""
    c, w = random_convo(name, seed, ends="prompt")
    call = w.call_turn(w.rng.randint(1, FAMILIES[name].max_calls))
    return [Growth(c, call, w.results(call)), Growth(c, w.final(), [w.user()])]


def stability(name: str, template: str, g: Growth) -> tuple[bool, bool]:
    """(prompt stable, generated turn stable): the prompt, and the assistant-last render, are
    token prefixes of the grown conversation's prompt."""
    c = g.before
    kw = dict(tools=c.tools, **c.kwargs)
    prompt = ids(name, render(name, template, c.messages, gen=True, **kw))
    trained = ids(name, render(name, template, c.messages + [g.turn], gen=False, **kw))
    grown = ids(name, render(name, template, c.messages + [g.turn] + g.after, gen=True, **kw))
    return is_prefix(prompt, grown), is_prefix(trained, grown)


@pytest.mark.parametrize("name", NAMES)
def test_prefix_stable_on_random_conversations(name):
    variant, original = tmpl.templates.load(name), original_template(name)
    original_failures = 0
    for seed in range(25):
        for g in growths(name, seed):
            assert stability(name, variant, g) == (True, True), f"seed {seed}: {g.turn}"
            original_failures += stability(name, original, g) != (True, True)
    if name in FIXED:  # the same conversations break the original: the check can fail
        assert original_failures > 0
    else:  # the original is already prefix-stable: its variant only adds markers
        assert original_failures == 0


def _user(text: str) -> Message:
    return {"role": "user", "content": text}


def _call(tag: str, **extra: Any) -> Message:
    return {
        "role": "assistant",
        "content": "",
        **extra,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris", "tag": tag}},
            }
        ],
    }


RESULT = {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "21 C"}

#: For each fixed variant, growths that the ORIGINAL template is known to break (what the variant fixes),
#: and how: (prompt stable, generated turn stable) as ``stability`` reports them for the original.
ORIGINAL_BREAKS = {
    "qwen3": [
        # earlier reasoning is stripped once a new user query arrives
        (
            Growth(
                Convo([_user("q1"), _call("t1", reasoning_content="R1"), RESULT], TOOLS, {}, True),
                {"role": "assistant", "content": "A1", "reasoning_content": "R2"},
                [_user("q2")],
            ),
            (False, False),
        ),
        # enable_thinking=False: the prompt's empty think block disappears once a tool result follows
        (Growth(Convo([_user("q1")], TOOLS, {"enable_thinking": False}, True), _call("t1"), [RESULT]), (False, False)),
        # the assistant-last render has an empty think block, the grown render none
        (Growth(Convo([_user("q1")], TOOLS, {}, True), _call("t1"), [RESULT]), (True, False)),
    ],
    "gpt-oss": [
        # the analysis of a call is dropped once a final answer exists
        (
            Growth(
                Convo([_user("q1"), _call("t1", thinking="R1"), RESULT], TOOLS, {}, True),
                {"role": "assistant", "content": "A1"},
                [_user("q2")],
            ),
            (False, False),
        ),
        # the generated <|return|> (and analysis) of an answer become <|end|> once a user follows
        (
            Growth(
                Convo([_user("q1")], TOOLS, {}, True),
                {"role": "assistant", "content": "A1", "thinking": "R1"},
                [_user("q2")],
            ),
            (True, False),
        ),
    ],
    "gemma-4": [
        # the thought of an earlier tool-call turn is dropped once a new user query arrives
        (
            Growth(
                Convo([_user("q1"), _call("t1", reasoning_content="R1"), RESULT], TOOLS, {}, True),
                {"role": "assistant", "content": "A1"},
                [_user("q2")],
            ),
            (False, False),
        ),
        # content written next to a call moves behind the tool response
        (
            Growth(Convo([_user("q1")], TOOLS, {}, True), _call("t1") | {"content": "Checking."}, [RESULT]),
            (True, False),
        ),
    ],
}


@pytest.mark.parametrize("name", FIXED)
def test_originals_break_where_the_variants_hold(name):
    for g, broken in ORIGINAL_BREAKS[name]:
        assert stability(name, original_template(name), g) == broken, g.turn
        assert stability(name, tmpl.templates.load(name), g) == (True, True), g.turn


# -- 3. the assistant mask --------------------------------------------------------------------


def mask_runs(name: str, template: str, c: Convo) -> list[str]:
    """Decoded runs of consecutive tokens whose assistant mask is 1."""
    tok = tokenizer(name)
    out = tok.apply_chat_template(
        c.messages,
        tools=c.tools,
        chat_template=template,
        return_assistant_tokens_mask=True,
        return_dict=True,
        add_generation_prompt=False,
        **{**FAMILIES[name].extra, **c.kwargs},
    )
    runs, run = [], []
    for tid, bit in zip(out["input_ids"], out["assistant_masks"]):
        if bit:
            run.append(tid)
        elif run:
            runs.append(tok.decode(run))
            run = []
    if run:
        runs.append(tok.decode(run))
    return runs


def generated_text(name: str, template: str, c: Convo, i: int) -> str:
    """What the model generated for assistant message i: the render with it last, after the
    prompt, up to its last stop token (the separator after the stop is not generated)."""
    kw = dict(tools=c.tools, **c.kwargs)
    prompt = render(name, template, c.messages[:i], gen=True, **kw)
    alone = render(name, template, c.messages[: i + 1], gen=False, **kw)
    assert alone.startswith(prompt)
    turn = alone[len(prompt) :]
    end = max(turn.rfind(s) + len(s) for s in FAMILIES[name].stops if s in turn)
    return turn[:end]


def sentinels(m: Message) -> list[str]:
    found = [m["content"].split("</think>")[-1].strip()] if m.get("content") else []
    if m.get("content") and "</think>" in m["content"]:
        found.append(m["content"].split("</think>")[0].replace("<think>", "").strip())
    if reasoning_of(m):
        found.append(reasoning_of(m))
    found += [c["function"]["arguments"]["tag"] for c in m.get("tool_calls", [])]
    return found


@pytest.mark.parametrize("name", NAMES)
def test_assistant_mask_is_exactly_what_the_model_generated(name):
    variant = tmpl.templates.load(name)
    for seed in range(15):
        c, _ = random_convo(name, seed, ends="assistant")
        runs = mask_runs(name, variant, c)
        turns = [i for i, m in enumerate(c.messages) if m["role"] == "assistant"]
        assert runs == [generated_text(name, variant, c, i) for i in turns], f"seed {seed}"
        for run, i in zip(runs, turns):  # independent of how the expectation was computed:
            assert run.endswith(FAMILIES[name].stops), run
            assert all(s in run for s in sentinels(c.messages[i])), (run, c.messages[i])
        others = [m["content"] for m in c.messages if m["role"] != "assistant"]
        assert not any(o in run for o in others for run in runs)


@pytest.mark.parametrize("name", NAMES)
def test_originals_give_no_assistant_mask(name):
    c, _ = random_convo(name, 3, ends="assistant")
    assert mask_runs(name, original_template(name), c) == []  # transformers warns: no {% generation %}


def test_qwen3_mask_leaves_out_the_prefilled_empty_think_block():
    c = Convo(
        [_user("q1"), _call("t1"), RESULT, {"role": "assistant", "content": "A1"}],
        TOOLS,
        {"enable_thinking": False},
        False,
    )
    runs = mask_runs("qwen3", tmpl.templates.load("qwen3"), c)
    assert runs[1] == "A1<|im_end|>"
    c.kwargs = {}
    assert mask_runs("qwen3", tmpl.templates.load("qwen3"), c)[1] == "<think>\n\n</think>\n\nA1<|im_end|>"


def test_gemma_legacy_tool_responses_render_as_the_original():
    """Gemma-native messages that carry their own tool responses are left as the original renders them."""
    msg = {
        "role": "assistant",
        "content": "It is sunny.",
        "tool_calls": _call("t1")["tool_calls"],
        "tool_responses": [{"name": "get_weather", "response": {"temp_c": 21, "sky": "clear"}}],
    }
    c = Convo([_user("q1"), msg], TOOLS, {}, False)
    variant = tmpl.templates.load("gemma-4")
    for gen in (False, True):
        kw = dict(tools=TOOLS, gen=gen)
        assert render("gemma-4", variant, c.messages, **kw) == render(
            "gemma-4", original_template("gemma-4"), c.messages, **kw
        )
    calls, answer = mask_runs("gemma-4", variant, c)
    assert calls.endswith("<tool_call|><|tool_response>") and answer == "It is sunny.<turn|>"


# -- 4. tmpl's suffix contract with the variants -----------------------------------------------

STOPS = {
    "qwen2.5": {"<|im_end|>"},
    "qwen3": {"<|im_end|>"},
    "llama-3": {"<|eot_id|>"},
    "gpt-oss": {"<|call|>", "<|return|>"},
    "gemma-4": {"<turn|>", "<|tool_response>", "<eos>"},
}

CONTRACT_CASES = [(n, {}) for n in NAMES] + [
    ("qwen3", {"enable_thinking": False}),
    ("gemma-4", {"enable_thinking": True}),
]


@pytest.fixture
def fresh():
    clear_caches()
    yield
    clear_caches()


@pytest.mark.parametrize("name,kwargs", CONTRACT_CASES)
def test_suffix_contract_with_the_variant(fresh, name, kwargs):
    tok = tokenizer(name)
    tpl = tmpl.ChatTemplate(
        tok, chat_template=tmpl.templates.load(name), name=name, **{**FAMILIES[name].extra, **kwargs}
    )
    assert {tok.convert_ids_to_tokens(i) for i in tpl.stop_token_ids} == STOPS[name]
    for k in (1, 2, 3):
        assistant = assistant_turn(k)
        results = tool_results(assistant, [f"result {i}: 21.5 C\n" for i in range(k)])
        if k > FAMILIES[name].max_calls:
            with pytest.raises(tmpl.errors.UnsupportedTemplateError):
                tpl.suffix_ids(results, completion_ids=[0])
            continue
        for hname, history in HISTORIES.items():
            assert check_turn(tpl, history, assistant, results).prefix_stable, (k, hname)


@pytest.mark.parametrize("name", FIXED)
def test_rollout_with_reasoning_stays_token_in_token_out(fresh, name):
    """Rounds of reasoning + calls, then an answer and a new question: every next prompt is the
    previous prompt + the model's tokens + tmpl's suffix (or + the user turn), never re-rendered."""
    tok = tokenizer(name)
    tpl = tmpl.ChatTemplate(tok, chat_template=tmpl.templates.load(name), name=name)
    fam = FAMILIES[name]
    history: list[Message] = [_user("What is the weather in Paris and Tokyo?")]
    sequence = tpl.prompt_ids(history, tools=TOOLS)
    for round_ in range(3):
        assistant = assistant_turn(min(round_ + 1, fam.max_calls), round_)
        assistant["reasoning_content"] = f"Round {round_}: I need the tools."
        results = tool_results(assistant, [f"result {round_}.{i}" for i in range(len(assistant["tool_calls"]))])
        checked = check_turn(tpl, history, assistant, results, round_=round_)
        assert checked.prefix_stable
        assert tpl.prompt_ids(history, tools=TOOLS) == sequence
        sequence = sequence + checked.completion + checked.suffix
        history += [assistant] + results
    answer = {"role": "assistant", "content": "Sunny in both.", "reasoning_content": "All results are in."}
    trained = tok.encode(tpl.render(history + [answer], tools=TOOLS), add_special_tokens=False)
    assert is_prefix(sequence, trained)  # the answer is generated after the last suffix
    follow = tpl.prompt_ids(history + [answer, _user("And tomorrow?")], tools=TOOLS)
    assert is_prefix(trained, follow)  # ...and stays in the next prompt, reasoning and stop token included


def test_gpt_oss_variant_refuses_parallel_calls():
    c = Convo([_user("q"), assistant_turn(2)], TOOLS, {}, False)
    with pytest.raises(jinja2.TemplateError, match="one call per assistant message"):
        render("gpt-oss", tmpl.templates.load("gpt-oss"), c.messages, tools=c.tools, gen=False)
    # the original silently drops the second call
    text = render("gpt-oss", original_template("gpt-oss"), c.messages, tools=c.tools, gen=False)
    assert "get_weather" in text.split("<|start|>user")[-1] and "to=functions.get_time" not in text


# -- 5. the offline synthetic tokenizer ---------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_synthetic_tokenizer_renders_like_the_real_one(name):
    info = tmpl.templates.info(name)
    real, synth = tokenizer(name), tmpl.templates.synthetic_tokenizer(name)
    added = {t.content: t for t in real.backend_tokenizer.get_added_tokens_decoder().values()}
    seen: set[str] = set()
    for seed in range(8):
        c, _ = random_convo(name, seed)
        kw = dict(tools=c.tools, add_generation_prompt=c.gen, tokenize=False, **{**FAMILIES[name].extra, **c.kwargs})
        text = real.apply_chat_template(c.messages, chat_template=info.text(), **kw)
        assert synth.apply_chat_template(c.messages, **kw) == text
        synth_ids = synth.encode(text, add_special_tokens=False)
        assert synth.decode(synth_ids) == text
        real_ids = real.encode(text, add_special_tokens=False)
        seen |= {real.convert_ids_to_tokens(t) for t in real_ids if real.convert_ids_to_tokens(t) in added}
    markers = set(info.special_tokens)
    seen = {s for s in seen if s.strip()}  # whitespace pieces of the vocabulary are not markers
    assert seen <= markers, f"markers missing from {name}.json: {seen - markers}"
    for marker in markers:  # every listed marker is one added token, special as in the real tokenizer
        assert marker in added, marker
        assert added[marker].special == (marker not in info.non_special_tokens), marker
        assert len(synth.encode(marker, add_special_tokens=False)) == 1, marker
        assert len(real.encode(marker, add_special_tokens=False)) == 1, marker
    assert (synth.bos_token, synth.eos_token) == (real.bos_token, real.eos_token)
    for attr, token in info.named_tokens:  # what a processor reads by name: as the real tokenizer has it
        assert getattr(real, attr) == getattr(synth, attr) == token, attr
        assert len(synth.encode(token, add_special_tokens=False)) == 1, attr


def test_shipped_gemma4_images_verdict_offline_is_the_real_tokenizers():
    """The offline matrix builds Gemma 4's processor on the synthetic tokenizer (its named image and audio
    tokens, its pad token): the images verdict is the one the real tokenizer gets with the same template,
    not an UNPROVEN about the synthetic tokenizer."""
    from tmpl.report.multimodal import check_images

    info = tmpl.templates.info("gemma-4")
    assert dict(info.named_tokens)["image_token"] == "<|image|>"
    offline = check_images(tmpl.ChatTemplate(tmpl.templates.synthetic_tokenizer("gemma-4"), name="gemma-4"))
    real = check_images(tmpl.ChatTemplate(tokenizer("gemma-4"), info.text(), name="gemma-4"))
    assert offline is not None and real is not None
    assert offline.placeholders.level == real.placeholders.level == "SAFE"
    assert offline.suffix.level == real.suffix.level == "SAFE"  # tool-result images render (the stock one drops them)
    assert "cannot be built" not in offline.label


def test_named_tokens_must_be_token_names(tmp_path):
    from tmpl.errors import TemplateMetadataError
    from tmpl.templates import _parse

    meta = json.loads((tmpl.templates.shipped_dir() / "gemma-4.json").read_text(encoding="utf-8"))
    jinja = tmp_path / "gemma-4.jinja"
    jinja.write_text("{{ messages }}", encoding="utf-8")
    for bad in ({"image": "<|image|>"}, {"image_token": ""}, ["<|image|>"]):
        (tmp_path / "gemma-4.json").write_text(json.dumps({**meta, "named_tokens": bad}), encoding="utf-8")
        with pytest.raises(TemplateMetadataError, match="named_tokens"):
            _parse(tmp_path / "gemma-4.json", jinja)


@pytest.mark.parametrize("name", NAMES)
def test_synthetic_tokenizer_passes_the_suffix_contract(fresh, name):
    synth = tmpl.templates.synthetic_tokenizer(name)
    tpl = tmpl.ChatTemplate(synth, name=f"{name}-synthetic", **FAMILIES[name].extra)
    k = min(2, FAMILIES[name].max_calls)
    assistant = assistant_turn(k)
    assert check_turn(tpl, HISTORIES["system"], assistant, tool_results(assistant, ["21 C"] * k)).prefix_stable


# -- the catalog API ----------------------------------------------------------------------------


def test_available_lists_every_shipped_file():
    folder = tmpl.templates.shipped_dir()
    files = sorted(p.name.removesuffix(".jinja") for p in folder.iterdir() if p.name.endswith(".jinja"))
    assert [t.name for t in tmpl.templates.available()] == files
    assert set(FAMILIES) <= set(files)
    for t in tmpl.templates.available():
        text = tmpl.templates.load(t.name)
        assert re.search(r"\{%-?\s*generation\s*-?%\}", text) and re.search(r"\{%-?\s*endgeneration\s*-?%\}", text)
        assert t.changes and t.description and t.path.name == f"{t.name}.jinja"


def test_unknown_name_raises_a_typed_error_listing_the_names():
    with pytest.raises(tmpl.errors.UnknownTemplateError) as info:
        tmpl.templates.load("qwen9")
    assert info.value.name == "qwen9"
    assert info.value.available == [t.name for t in tmpl.templates.available()]
    assert "qwen9" in str(info.value) and "qwen3" in str(info.value)
    assert isinstance(info.value, tmpl.errors.TmplError) and isinstance(info.value, LookupError)


def test_for_family():
    assert tmpl.templates.for_family("qwen2.5-instruct").name == "qwen2.5"
    assert tmpl.templates.for_family("/models/Llama-3.2-Instruct/").name == "llama-3"
    assert tmpl.templates.for_family("GEMMA-4-IT").name == "gemma-4"
    assert tmpl.templates.for_family("gemma-2-it") is None
    for name, fam in FAMILIES.items():
        assert tmpl.templates.for_family(fam.tokenizer).name == name


def test_bad_metadata_is_reported_with_its_path(tmp_path, monkeypatch):
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "x.jinja").write_text("{{ messages }}")
    (tmp_path / "x.json").write_text(json.dumps({"name": "x", "family": "f"}))
    monkeypatch.setattr(tmpl.templates, "shipped_dir", lambda: tmp_path)
    tmpl.templates._catalog.cache_clear()
    try:
        with pytest.raises(tmpl.errors.TemplateMetadataError, match=r"x\.json: missing key 'base_template'"):
            tmpl.templates.available()
    finally:
        monkeypatch.undo()
        tmpl.templates._catalog.cache_clear()
