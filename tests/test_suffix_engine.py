"""Engine behaviour around the contract: cache, per-call path, splice safety, typed errors."""

from __future__ import annotations

import json

import pytest

import tmpl
from tmpl.suffix import clear_caches

from .conftest import DATA
from .contract import HISTORIES, TOOLS, assistant_turn, check_turn, full_render, tool_results

# The seed (TRL PR #5145): a Qwen completion whose tool call is whitespace-heavy JSON, as token IDs.
SEED_COMPLETION = [
    151657,
    198,
    515,
    6656,
    330,
    606,
    1,
    286,
    549,
    338,
    330,
    64648,
    22785,
    756,
    6656,
    330,
    16370,
    1,
    256,
    549,
    338,
    341,
    6374,
    330,
    64,
    1,
    256,
    549,
    220,
    220,
    18,
    345,
    6374,
    330,
    65,
    1,
    256,
    549,
    220,
    220,
    19,
    198,
    4569,
    456,
    532,
    151658,
    151645,
]


@pytest.fixture(autouse=True)
def fresh():
    clear_caches()
    yield
    clear_caches()


def test_seed_whitespace_heavy_call_keeps_its_47_tokens(tokenizer_of):
    tok = tokenizer_of("qwen2.5-instruct")
    tpl = tmpl.ChatTemplate(tok, name="qwen2.5-instruct")
    history = [{"role": "user", "content": "What is 3 times 4?"}]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "multiply_tool",
                "description": "a*b",
                "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
            },
        }
    ]
    prompt = tpl.prompt_ids(history, tools=tools)
    assert len(SEED_COMPLETION) == 47
    # the naive way: decode, parse, re-render. The model's 47 tokens become 41 others.
    text = tok.decode(SEED_COMPLETION)
    call = json.loads(text.split("<tool_call>")[1].split("</tool_call>")[0])
    assistant = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}],
    }
    results = [{"role": "tool", "name": "multiply_tool", "content": "12"}]
    _, rerendered = full_render(tpl, history + [assistant] + results, tools)
    assert rerendered[: len(prompt)] == prompt
    naive = rerendered[len(prompt) : rerendered.index(151645, len(prompt)) + 1]
    # The seed's trainer counted 41 tokens (its own test's turn and result); with this real
    # Qwen2.5 template, the re-rendered call alone is 26 tokens. Either way: shorter, different.
    assert len(naive) < 47 and naive != SEED_COMPLETION
    # tmpl: the 47 tokens stay; the suffix is exactly what the template renders after the turn
    suffix = tpl.suffix_ids(results, completion_ids=SEED_COMPLETION, tools=tools)
    sequence = prompt + SEED_COMPLETION + suffix
    assert sequence[len(prompt) : len(prompt) + 47] == SEED_COMPLETION
    assert suffix == rerendered[len(prompt) + len(naive) :]


def test_second_call_performs_no_render_and_templates_share_the_cache(tokenizer_of):
    tok = tokenizer_of("qwen3")
    tpl = tmpl.ChatTemplate(tok, name="qwen3")
    msgs = [{"role": "tool", "name": "get_weather", "content": "sunny"}]
    first = tpl.suffix_ids(msgs, completion_ids=[151645], tools=TOOLS)
    assert tpl.renders > 0  # probing rendered dummy conversations
    before = tpl.renders
    for content in ["other", "", "  padded\n", "unicode é", "x" * 5000]:
        tpl.suffix_ids([{**msgs[0], "content": content}], completion_ids=[151645], tools=TOOLS)
    assert tpl.renders == before, "cached frames must not render again"
    again = tmpl.ChatTemplate(tok, name="qwen3-again")
    assert again.fingerprint == tpl.fingerprint
    assert again.suffix_ids(msgs, completion_ids=[151645], tools=TOOLS) == first
    assert again.renders == 0


def test_fingerprint_covers_template_kwargs_and_text(tokenizer_of):
    tok = tokenizer_of("qwen3")
    base = tmpl.ChatTemplate(tok)
    assert tmpl.ChatTemplate(tok, enable_thinking=False).fingerprint != base.fingerprint
    assert tmpl.ChatTemplate(tok, chat_template=tok.chat_template + " ").fingerprint != base.fingerprint
    assert tmpl.ChatTemplate(tok).fingerprint == base.fingerprint


def test_non_string_content_takes_the_per_call_path_and_stays_exact(tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of("gemma-4-it"), name="gemma-4-it")
    assistant = assistant_turn(2)
    results = tool_results(
        assistant, [[{"type": "text", "text": "part one, "}, {"type": "text", "text": "two"}], "plain"]
    )
    check_turn(tpl, HISTORIES["user"], assistant, results)
    assert tpl.engine.per_call_count == 1


TRANSFORMING = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'tool' %}{{ m.content | upper | replace('A', 'a!') }}"
    "{%- elif m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
    "{%- else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_content_transforms_it_cannot_reproduce_go_through_one_render(tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"), TRANSFORMING, name="upper")
    assistant = assistant_turn(2)
    for contents in (["Paris: sunny", "Tokyo ä"], ["", "  padded "]):
        check_turn(tpl, HISTORIES["user"], assistant, tool_results(assistant, contents))
    frame = next(iter(tpl.engine.state.frames.values()))
    assert frame.transforms == {}, "no fast transform reproduces `upper | replace`"
    assert tpl.engine.per_call_count == 2


def test_tojson_content_is_reproduced_without_rendering(tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of("llama-3.2-instruct"), name="llama-3.2")
    assistant = assistant_turn(1)
    check_turn(tpl, HISTORIES["user"], assistant, tool_results(assistant, ['say "hi"\n\tü']))
    frame = next(iter(tpl.engine.state.frames.values()))
    assert frame.transforms["plain"] == "tojson"  # Llama 3.2 json-encodes string results
    assert tpl.engine.per_call_count == 0


def test_history_dependent_template_requires_history(tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of("deepseek-v3"), name="deepseek-v3")
    msgs = [{"role": "tool", "name": "get_weather", "content": "sunny"}]
    with pytest.raises(tmpl.errors.HistoryRequiredError, match="pass history=") as info:
        tpl.suffix_ids(msgs, completion_ids=[1], tools=TOOLS)
    assert "earlier tool round" in str(info.value)
    assert tpl.suffix_ids(msgs, completion_ids=[1], tools=TOOLS, history=HISTORIES["user"])


def test_close_that_is_not_a_token_raises_splice_error(tokenizer_of):
    path = DATA / "templates" / "llama.cpp" / "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    # Hermes writes <|im_end|>, which the Llama 3.2 tokenizer splits into plain-text pieces
    tpl = tmpl.ChatTemplate(tokenizer_of("llama-3.2-instruct"), path)
    with pytest.raises(tmpl.errors.SpliceError) as info:
        tpl.suffix_ids([{"role": "tool", "name": "get_weather", "content": "x"}], completion_ids=[1], tools=TOOLS)
    assert info.value.template == path.stem
    assert "<|im_end|>" in info.value.boundary


def test_template_errors_become_typed_errors(tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of("gemma-3-it"), name="gemma-3-it")
    with pytest.raises(tmpl.errors.TemplateRenderError, match="gemma-3-it.*alternate"):
        tpl.prompt_ids([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    with pytest.raises(tmpl.errors.MessageError):
        tpl.prompt_ids([{"role": "user"}])


def test_named_template_of_a_tokenizer_and_missing_template(tokenizer_of):
    tok = tokenizer_of("qwen2.5-instruct")

    class NoTemplate:
        chat_template = None
        name_or_path = "nowhere"
        backend_tokenizer = tok.backend_tokenizer

    with pytest.raises(tmpl.errors.TmplError, match="has no chat template"):
        tmpl.ChatTemplate(NoTemplate())
