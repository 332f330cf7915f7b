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


def test_slime_generate_on_the_fixture_model(engine):
    tok, backend = engine
    tpl = tmpl.ChatTemplate(tok)
    tools = [get_time, get_weather]
    generate = make_generate(tools=tools, template=tpl, backend=backend, max_turns=3)
    args = SimpleNamespace(hf_checkpoint=str(QWEN), rollout_max_response_len=200, rollout_max_context_len=None)
    samples = [Sample(prompt=list(q)) for q in QUESTIONS[:2] * 2]
    samples[0].tokens, samples[0].loss_mask, samples[0].rollout_log_probs = [9] * 7, [1] * 3, [-5.0] * 3  # a retry

    async def all_samples():
        return await asyncio.gather(*(generate(args, s, {"temperature": 1.0, "max_new_tokens": 96}) for s in samples))

    out = asyncio.run(all_samples())
    rounds = 0
    for s in out:
        assert s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED), s.metadata["tmpl_reason"]
        assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length > 0
        assert s.response_length <= 200
        prompt = tok.apply_chat_template(s.prompt, tools=tools, add_generation_prompt=True)
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
        assert len(cuts) == len(appended)
        for j, run in zip(cuts, appended):
            full = tok.apply_chat_template(messages[: j + 1], tools=tools, add_generation_prompt=True)
            full = list(full["input_ids"] if hasattr(full, "keys") else full)
            assert full[-len(run) :] == run and tok.convert_ids_to_tokens(full[-len(run) - 1]) == "<|im_end|>"
            rounds += 1
    assert rounds >= 2, "the fixture model called no tool: nothing multi-turn was checked"
