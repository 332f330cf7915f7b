"""slime's generate function as one harness run per sample (``make_generate(harness=...)``, issue 51 item 3).

slime is not on the package index: as in tests/test_integrations_slime.py, the samples are stand-ins with the
fields of slime's ``Sample`` (slime/utils/types.py at THUDM/slime 624b824a). The harnesses are real processes
on the real ``openai`` SDK, their calls answered by a Scripted engine through the gateway; the expectations
come from the tokenizer's own ``apply_chat_template`` of what each harness sent and the IDs the engine sampled.
"""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace

import pytest

pytest.importorskip("openai", reason="the openai SDK is not installed (pip install -e '.[test]')")
pytest.importorskip("fastapi", reason="FastAPI is not installed (pip install -e '.[gateway]')")

import tmpl  # noqa: E402
from tmpl.backends import Scripted  # noqa: E402
from tmpl.harness import Harness, HarnessTask  # noqa: E402
from tmpl.integrations.slime import make_generate  # noqa: E402

from .conftest import load_tokenizer  # noqa: E402
from .harness_trainers import ANSWER, REWRITE, REWRITER, SILENT, answer_ids, render, verifier  # noqa: E402
from .test_integrations_slime import Sample  # noqa: E402

ARGS = SimpleNamespace(rollout_max_response_len=64, rollout_max_context_len=2048, hf_checkpoint="unused")
PARAMS = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 32}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("qwen2.5-instruct")


def generate_with(harness, tok, **options):
    engine = Scripted(lambda request: answer_ids(tok))
    generate = make_generate(
        harness=harness,
        template=tmpl.ChatTemplate(tok),
        backend=engine,
        tasks_from=lambda s: HarnessTask(s.prompt[-1]["content"], verifier=verifier),
        **options,
    )
    return generate, engine


def test_each_sequence_of_a_harness_run_is_a_sample_rewarded_by_its_verifier(tok):
    generate, engine = generate_with(REWRITE, tok)
    sample = Sample(group_index=0, index=7, prompt=[{"role": "user", "content": "Write note 7."}])
    samples = asyncio.run(generate(ARGS, sample, PARAMS))
    assert len(samples) == 2 and samples[0] is sample
    answer = answer_ids(tok)
    # the engine got the template's own render of each message the harness sent, and sampled the answer
    assert [list(r.prompt_ids) for r in engine.requests] == [
        render(tok, "Write note 7."),
        render(tok, f"Summary: {ANSWER}"),
    ]
    for s, text in zip(samples, ("Write note 7.", f"Summary: {ANSWER}")):
        assert s.tokens == render(tok, text) + answer
        assert s.response_length == len(answer) and s.loss_mask == [1] * len(answer)
        assert len(s.rollout_log_probs) == len(answer)
        assert s.reward == 1.0 and s.status is Sample.Status.COMPLETED and s.rollout_id == 7
        assert s.metadata["harness_status"] == "HARNESS_DONE" and s.metadata["tmpl_sequences"] == 2
    assert [s.metadata["tmpl_sequence"] for s in samples] == [0, 1]
    assert sum(sum(s.loss_mask) for s in samples) == sum(len(answer) for _ in engine.requests)


def test_a_harness_without_calls_is_one_aborted_sample_and_a_timeout_truncated(tok):
    generate, _ = generate_with(SILENT, tok)
    sample = Sample(group_index=0, index=1, prompt=[{"role": "user", "content": "Write note 1."}])
    [s] = asyncio.run(generate(ARGS, sample, PARAMS))
    assert s.status is Sample.Status.ABORTED and s.response_length == 0 and s.loss_mask == []
    assert s.tokens == render(tok, "Write note 1.") and s.metadata["harness_status"] == "NO_CALLS"

    # one call, then it hangs past its timeout: its whole tree killed, the call kept, TRUNCATED
    hangs = Harness(
        "hangs",
        (sys.executable, "-c", (REWRITER.split("client.chat.completions.create(model=sys.argv[2], messages=[")[0]
                                + "import time; time.sleep(120)").replace("{", "{{").replace("}", "}}"), "{task}", "{model}"),
        dialect="openai-chat",
        env=dict(REWRITE.env),
        timeout=15,  # the first call well within it, even on a loaded 2-core machine
    )  # fmt: skip
    generate, _ = generate_with(hangs, tok)
    sample = Sample(group_index=0, index=2, prompt=[{"role": "user", "content": "Write note 2."}])
    [s] = asyncio.run(generate(ARGS, sample, PARAMS))
    assert s.metadata["harness_status"] == "HARNESS_TIMEOUT" and s.status is Sample.Status.TRUNCATED
    assert s.tokens == render(tok, "Write note 2.") + answer_ids(tok) and s.reward == 0.0  # no answer.txt written
