"""The suffix contract on every family folder in TMPL_TEST_DATA, on both twins.

Ground truth is a full ``apply_chat_template`` render (see ``contract.py``). The expectations
below come from the templates themselves (../shared/tokenizers/MANIFEST.md), not from tmpl.
"""

from __future__ import annotations

import pytest

import tmpl
from tmpl.suffix import clear_caches

from .conftest import FAMILIES
from .contract import (
    HARD_CONTENTS,
    HISTORIES,
    TOOLS,
    assistant_turn,
    check_turn,
    renders_tool_turn,
    tool_results,
)

#: How many parallel calls each family's template renders (0: no tool conversation at all).
MAX_CALLS = {
    "qwen2.5-instruct": 3,
    "qwen3": 3,
    "gemma-4-it": 3,
    "mistral-nemo-instruct-2407": 3,
    "deepseek-v3": 3,
    "phi-4-mini-instruct": 3,
    "llama-3.2-instruct": 1,  # the template raises on parallel calls
    "gpt-oss": 1,  # the template renders only tool_calls[0]
    "gemma-2-it": 0,  # a 'tool' message raises
    "gemma-3-it": 0,
    "phi-3-mini-4k-instruct": 0,  # tool turns are dropped silently
}

#: Tokens that end an assistant turn (MANIFEST's "closes an assistant turn" column) plus EOS.
STOPS = {
    "qwen2.5-instruct": {"<|im_end|>"},
    "qwen3": {"<|im_end|>"},
    "llama-3.2-instruct": {"<|eot_id|>"},
    "gemma-2-it": {"<end_of_turn>", "<eos>"},
    "gemma-3-it": {"<end_of_turn>", "<eos>"},
    "gemma-4-it": {"<turn|>", "<|tool_response>", "<eos>"},
    "mistral-nemo-instruct-2407": {"</s>"},
    "phi-3-mini-4k-instruct": {"<|end|>", "<|endoftext|>"},
    "phi-4-mini-instruct": {"<|end|>"},
    "deepseek-v3": {"<｜end▁of▁sentence｜>"},
    "gpt-oss": {"<|call|>", "<|return|>"},  # never <|end|>: it ends analysis messages mid-turn
}

#: Templates whose tool results render differently after earlier messages (read off the template:
#: DeepSeek V3's ``is_output_first`` is never reset, so only the first tool output opens the block).
HISTORY_DEPENDENT = {"deepseek-v3"}

#: Prefix-stable for these histories (the prompt is a prefix of the full render).
NOT_PREFIX_STABLE = {("mistral-nemo-instruct-2407", "system")}  # system text moves to the last user turn


@pytest.fixture
def fresh():
    """Each test probes from scratch, so frame building runs under the current twin."""
    clear_caches()
    yield
    clear_caches()


@pytest.mark.parametrize("family", FAMILIES)
def test_stop_tokens_are_the_turn_closes(family, tokenizer_of):
    tok = tokenizer_of(family)
    tpl = tmpl.ChatTemplate(tok, name=family)
    assert {tok.convert_ids_to_tokens(i) for i in tpl.stop_token_ids} == STOPS[family]


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("family", FAMILIES)
def test_contract_hard_contents(twin, fresh, family, k, tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of(family), name=family)
    for hname, history in HISTORIES.items():
        contents = list(HARD_CONTENTS.values())
        cases = {name: [c] * k for name, c in HARD_CONTENTS.items()}
        cases["mixed"] = [contents[(i * 2 + 1) % len(contents)] for i in range(k)]
        for cname, case in cases.items():
            assistant = assistant_turn(k)
            results = tool_results(assistant, case)
            if k > MAX_CALLS[family]:
                with pytest.raises(tmpl.errors.UnsupportedTemplateError) as info:
                    tpl.suffix_ids(results, completion_ids=[0])
                assert family in str(info.value)
                continue
            assert renders_tool_turn(tpl, history, assistant, results)
            checked = check_turn(tpl, history, assistant, results)
            assert checked.prefix_stable == ((family, hname) not in NOT_PREFIX_STABLE), (hname, cname)
            assert checked.needs_history == (family in HISTORY_DEPENDENT)


@pytest.mark.parametrize("family", [f for f in FAMILIES if MAX_CALLS[f]])
def test_contract_over_several_tool_rounds(twin, fresh, family, tokenizer_of):
    """Round after round, the next prompt is the previous prompt + completion + suffix."""
    tpl = tmpl.ChatTemplate(tokenizer_of(family), name=family)
    history = list(HISTORIES["user"])
    prompt = None
    for round_, k in enumerate([1, 3, 2, 1]):
        k = min(k, MAX_CALLS[family])
        assistant = assistant_turn(k, round_)
        results = tool_results(assistant, [f"result {round_}.{i}: {'x' * (round_ * 7)}\n" for i in range(k)])
        checked = check_turn(tpl, history, assistant, results, round_=round_)
        assert checked.prefix_stable
        this_prompt = tpl.prompt_ids(history, tools=TOOLS)
        if prompt is not None:
            assert this_prompt == prompt, f"round {round_}: the spliced sequence drifted from the template"
        history += [assistant] + results
        prompt = this_prompt + checked.completion + checked.suffix
    assert prompt == tpl.prompt_ids(history, tools=TOOLS)


@pytest.mark.parametrize("family", ["qwen2.5-instruct", "gemma-4-it", "gpt-oss", "llama-3.2-instruct"])
def test_truncated_completion_gets_the_canonical_close(fresh, family, tokenizer_of):
    tok = tokenizer_of(family)
    tpl = tmpl.ChatTemplate(tok, name=family)
    assistant = assistant_turn(1)
    results = tool_results(assistant, ["42"])
    checked = check_turn(tpl, HISTORIES["user"], assistant, results)
    truncated = checked.completion[:-1]  # the model was cut off before its stop token
    suffix = tpl.suffix_ids(results, completion_ids=truncated)
    assert suffix == checked.completion[-1:] + checked.suffix
    assert tok.convert_ids_to_tokens(suffix[0]) in STOPS[family]


@pytest.mark.parametrize("family", ["qwen3", "gemma-4-it", "mistral-nemo-instruct-2407"])
def test_batch_equals_single_calls_and_full_renders(twin, fresh, family, tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of(family), name=family)
    contents = list(HARD_CONTENTS.values())
    batch, completions, expected = [], [], []
    for b, k in enumerate([1, 3, 2, 1, 2]):
        assistant = assistant_turn(k, b)
        results = tool_results(assistant, [contents[(b + i) % len(contents)] for i in range(k)])
        checked = check_turn(tpl, HISTORIES["user"], assistant, results, round_=b)
        completion = checked.completion if b % 2 == 0 else checked.completion[:-1]  # some truncated
        batch.append(results)
        completions.append(completion)
        expected.append(checked.suffix if b % 2 == 0 else checked.completion[-1:] + checked.suffix)
    assert tpl.suffix_ids_batch(batch, completion_ids=completions) == expected
    with pytest.raises(ValueError, match="2 lists of tool messages but 1 completions"):
        tpl.suffix_ids_batch(batch[:2], completion_ids=completions[:1])


@pytest.mark.parametrize("family", ["gemma-2-it", "gemma-3-it", "phi-3-mini-4k-instruct"])
def test_templates_without_tool_turns_raise_unsupported(family, tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of(family), name=family)
    with pytest.raises(tmpl.errors.UnsupportedTemplateError) as info:
        tpl.suffix_ids([{"role": "tool", "name": "get_weather", "content": "x"}], completion_ids=[1])
    assert info.value.template == family
    if family.startswith("phi-3"):
        assert "not rendered" in info.value.reason  # dropped silently by the template: we say so


def test_tool_message_without_name_where_the_template_needs_it(fresh, tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of("gpt-oss"), name="gpt-oss")
    with pytest.raises(tmpl.errors.MessageError, match=r"tool_messages\[0\].*no 'name'"):
        tpl.suffix_ids([{"role": "tool", "content": "21 C"}], completion_ids=[200012])
    # Qwen does not write the name into the result: no name needed
    qwen = tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"), name="qwen2.5")
    assert qwen.suffix_ids([{"role": "tool", "content": "21 C"}], completion_ids=[151645])
