"""slime's generate function on a real engine: the tiny Qwen2.5 tool-calling fixture model.

``make_generate(backend=...)`` with :class:`tmpl.backends.Torch` (transformers on the CPU) instead of
SGLang (which needs CUDA, see tests/test_sglang_backend.py). The samples are slime ``Sample``
stand-ins (fields of slime/utils/types.py at THUDM/slime 0d234f3e). Checked: the #1861 invariants
(lengths aligned, fresh state on a retried sample, the budget) and every appended run against a
full ``apply_chat_template`` render of the conversation up to there.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

import tmpl
from tmpl.integrations.slime import make_generate

from .fixture_models import QUESTIONS, QWEN, get_time, get_weather, missing
from .test_sglang_backend import Sample

pytestmark = pytest.mark.skipif(missing(QWEN) is not None, reason=str(missing(QWEN)))


@pytest.fixture(scope="module")
def engine():
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(QWEN))
    model = AutoModelForCausalLM.from_pretrained(str(QWEN), dtype=torch.float32).eval()
    return tok, tmpl.backends.Torch(model, tokenizer=tok)


def runs(mask, ids):
    """The maximal runs of equal mask values: [(value, ids), ...]."""
    out: list[tuple[int, list[int]]] = []
    for m, t in zip(mask, ids):
        if out and out[-1][0] == m:
            out[-1][1].append(t)
        else:
            out.append((m, [t]))
    return out


TOOLS = [get_time, get_weather]


def generated(engine, max_response: int, prompts: list) -> list:
    """slime's generate function (``make_generate`` over the Torch backend) on ``prompts``, sampled."""
    tok, backend = engine
    generate = make_generate(tools=TOOLS, template=tmpl.ChatTemplate(tok), backend=backend, max_turns=3)
    args = SimpleNamespace(hf_checkpoint=str(QWEN), rollout_max_response_len=max_response, rollout_max_context_len=None)
    samples = [Sample(prompt=list(q)) for q in prompts]
    samples[0].tokens, samples[0].loss_mask, samples[0].rollout_log_probs = [9] * 7, [1] * 3, [-5.0] * 3  # a retry

    async def all_samples():
        return await asyncio.gather(*(generate(args, s, {"temperature": 1.0, "max_new_tokens": 96}) for s in samples))

    return asyncio.run(all_samples())


def checked_rounds(tok, s, max_response: int) -> int:
    """Check one finished sample (the #1861 invariants, every appended run against a full render); how
    many tool rounds it had."""
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED), s.metadata["tmpl_reason"]
    assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length > 0
    assert s.response_length <= max_response
    prompt = tok.apply_chat_template(s.prompt, tools=TOOLS, add_generation_prompt=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    assert s.tokens[: len(prompt)] == prompt and len(s.tokens) == len(prompt) + s.response_length
    response = s.tokens[len(prompt) :]
    assert all(lp == 0.0 for lp, m in zip(s.rollout_log_probs, s.loss_mask) if not m)
    model_lps = [lp for lp, m in zip(s.rollout_log_probs, s.loss_mask) if m]
    assert all(lp <= 0.0 for lp in model_lps) and any(lp < 0.0 for lp in model_lps)
    appended = [ids for m, ids in runs(s.loss_mask, response) if m == 0]
    messages = s.metadata["messages"]
    last_tool = [
        m["role"] == "tool" and (j + 1 == len(messages) or messages[j + 1]["role"] != "tool")
        for j, m in enumerate(messages)
    ]
    cuts = [j for j, last in enumerate(last_tool) if last]  # the last tool message of each round
    cut = s.status is Sample.Status.TRUNCATED and "cut to" in s.metadata["tmpl_reason"]
    if s.status is Sample.Status.TRUNCATED and len(cuts) == len(appended) + 1:
        # the last round's results came when the response was nearly full: its suffix was cut to nothing
        # (seen in full runs: "suffix of 31 tokens cut to 0"); the response ends with sampled tokens, and
        # every earlier round's suffix is whole
        assert "cut to 0" in s.metadata["tmpl_reason"] and s.loss_mask[-1] == 1, s.metadata["tmpl_reason"]
        cuts, cut = cuts[:-1], False
    assert len(cuts) == len(appended)
    for k, (j, run) in enumerate(zip(cuts, appended)):
        full = tok.apply_chat_template(messages[: j + 1], tools=TOOLS, add_generation_prompt=True)
        full = list(full["input_ids"] if hasattr(full, "keys") else full)
        # the suffix starts after the <|im_end|> closing the assistant turn (the tool results' own
        # <|im_end|> is the last one) and runs to the end of the render
        start = [i for i, t in enumerate(full) if t == im_end][-2] + 1
        if cut and k == len(appended) - 1:  # the last suffix, cut at the response limit: a prefix of it
            assert len(run) < len(full) - start and full[start : start + len(run)] == run, s.metadata
        else:
            assert full[start:] == run
    return len(appended)


def test_slime_generate_on_the_fixture_model(engine):
    tok, _ = engine
    rounds = sum(checked_rounds(tok, s, 200) for s in generated(engine, 200, QUESTIONS[:2] * 2))
    assert rounds >= 2, "the fixture model called no tool: nothing multi-turn was checked"


def test_a_suffix_cut_at_the_response_limit_is_a_prefix_of_the_full_render(engine):
    """Response limits that fall inside the first tool results' suffix (the first calls take 25-45
    tokens, their suffix 25-60): the sample ends TRUNCATED with that suffix cut, which is the start of
    the suffix a full render holds."""
    tok, _ = engine
    out = [s for limit in (45, 55, 65, 75) for s in generated(engine, limit, QUESTIONS[:2] * 2)]
    limits = [limit for limit in (45, 55, 65, 75) for _ in range(4)]
    cut = 0
    for s, limit in zip(out, limits):
        checked_rounds(tok, s, limit)
        cut += s.status is Sample.Status.TRUNCATED and "cut to" in s.metadata["tmpl_reason"]
    assert cut >= 2, [s.metadata["tmpl_reason"] for s in out]
