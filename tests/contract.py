"""The suffix contract, checked against full ``apply_chat_template`` renders.

``prompt_ids(history) + completion + suffix_ids(tool_messages)`` must equal the tokenization
of the template's full render of ``history + [assistant] + tool_messages`` with the
generation prompt. The completion is what the model would have generated: the full
render's tokens after the prompt, up to the first stop token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import tmpl
from tmpl import _compat


def _tool(name: str, params: dict[str, str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} tool",
            "parameters": {
                "type": "object",
                "properties": {k: {"type": t, "description": k} for k, t in params.items()},
                "required": list(params),
            },
        },
    }


TOOLS = [
    _tool("get_weather", {"city": "string"}),
    _tool("get_time", {"city": "string", "timezone": "string"}),
    _tool("search_web", {"query": "string", "max_results": "integer"}),
]

ARGS = [
    {"city": "Paris"},
    {"city": "Tokyo", "timezone": "Asia/Tokyo"},
    {"query": 'rainfall "today"', "max_results": 3},
]


def marker(round_: int, i: int) -> str:
    """A value unique to one call; found in the full render's text to locate the call."""
    return f"Qz{round_}m{i}Kv"


#: Tool contents that break naive splicing: each is used for every result of a turn.
HARD_CONTENTS = {
    "plain": "Paris: 21.5 C, sunny",
    "empty": "",
    "padded": "  \n  leading and trailing whitespace \n\n",
    "unicode": "Zürich: 12 °C, 🌧 — 雨 — ñ",
    "nested_json": json.dumps({"weather": {"temp": [21.5, None, True], "note": 'say "hi"\n'}, "ok": 1}),
    "long": ("0123456789 lorem ipsum dolor sit amet, " * 260)[:10_000],
}

HISTORIES = {
    "user": [{"role": "user", "content": "What is the weather in Paris and Tokyo?"}],
    "system": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris and Tokyo?"},
    ],
    "multiturn": [
        {"role": "user", "content": "Hi there!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "What is the weather in Paris and Tokyo?"},
    ],
}


def call_id(round_: int, i: int) -> str:
    return f"c{round_:02d}{i:02d}xYz9"  # 9 alphanumerics: valid for Mistral and for everyone else


def assistant_turn(k: int, round_: int = 0) -> dict:
    calls = [
        {
            "id": call_id(round_, i),
            "type": "function",
            "function": {
                "name": TOOLS[i % 3]["function"]["name"],
                "arguments": {**ARGS[i % 3], "tag": marker(round_, i)},
            },
        }
        for i in range(k)
    ]
    return {"role": "assistant", "content": "", "tool_calls": calls}


def tool_results(assistant: dict, contents: list) -> list[dict]:
    return [
        {"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"], "content": content}
        for c, content in zip(assistant["tool_calls"], contents)
    ]


def full_render(tpl: tmpl.ChatTemplate, messages: list[dict], tools=TOOLS) -> tuple[str, list[int]]:
    """Ground truth: transformers' own render, and its own tokenization of the whole conversation."""
    kwargs = dict(tools=tools, chat_template=tpl.template, add_generation_prompt=True, **tpl.template_kwargs)
    text = tpl.tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    out = tpl.tokenizer.apply_chat_template(messages, tokenize=True, **kwargs)
    return text, list(out["input_ids"] if hasattr(out, "keys") else out)


class NoStopToken(AssertionError):
    """The full render has no stop token after the assistant's calls: no completion can end there."""


@dataclass
class TurnCheck:
    prefix_stable: bool  # the prompt is a prefix of the full render
    completion: list[int]
    suffix: list[int]
    needs_history: bool = False  # the template's suffix depends on earlier messages


def check_turn(
    tpl: tmpl.ChatTemplate, history: list[dict], assistant: dict, results: list[dict], tools=TOOLS, round_: int = 0
) -> TurnCheck:
    """Check one tool turn against the full render; AssertionError with a readable diff if wrong.

    The completion ends at the first stop token after the last call's marker in the full
    render (or after the prompt when the template does not render calls). Where the
    template is prefix-stable, ``prompt + completion + suffix`` must equal the full render
    and the completion must hold no earlier stop token; elsewhere the suffix must still be
    exactly the full render's tail after that stop token.
    """
    text, full = full_render(tpl, history + [assistant] + results, tools)
    prompt = tpl.prompt_ids(history, tools=tools)
    start = _compat.ids.common_prefix_len(prompt, full)
    ends = [text.find(marker(round_, i)) + len(marker(round_, i)) for i in range(len(assistant["tool_calls"]))]
    if all(e >= len(marker(0, 0)) for e in ends):
        pos = max(ends)
    else:  # calls are not rendered (e.g. DeepSeek V3's own template)
        pos = len(tpl.codec.decode(full[:start]))
    enc = tpl.tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
    assert enc.ids == full, f"{tpl.name}: backend tokenization differs from apply_chat_template's"
    stops = tpl.stop_token_ids
    j = next((t for t, (s, _) in enumerate(enc.offsets) if s >= pos and full[t] in stops), None)
    if j is None:
        raise NoStopToken(f"{tpl.name}: no stop token after the assistant's calls in the full render")
    completion = full[start : j + 1]
    try:
        suffix = tpl.suffix_ids(results, completion_ids=completion, tools=tools)
        needs_history = False
    except tmpl.errors.HistoryRequiredError:
        suffix = tpl.suffix_ids(results, completion_ids=completion, tools=tools, history=history)
        needs_history = True
    expected = full[j + 1 :]
    if suffix != expected:
        raise AssertionError(
            f"{tpl.name}: suffix differs from the full render\n"
            f"  tmpl:     {tpl.codec.decode(suffix)!r}\n  template: {tpl.codec.decode(expected)!r}"
        )
    prefix_stable = start == len(prompt)
    if prefix_stable:
        early = [tpl.codec.decode([t]) for t in completion[:-1] if t in stops]
        assert not early, f"{tpl.name}: stop token(s) {early} inside the completion: generation would end early"
        assert prompt + completion + suffix == full
    return TurnCheck(prefix_stable, completion, suffix, needs_history)


def renders_tool_turn(tpl: tmpl.ChatTemplate, history: list[dict], assistant: dict, results: list[dict]) -> bool:
    """Whether transformers can render the full conversation at all (the contract's precondition)."""
    try:
        full_render(tpl, history + [assistant] + results)
    except Exception:  # the template raises: Gemma 2/3 on 'tool', Llama 3.2 on parallel calls...
        return False
    return True
