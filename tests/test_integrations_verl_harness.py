"""``tmpl_harness_agent``: verl's agent loop as one harness run per sample (issue 51, item 3), run by verl's own
``AgentLoopWorker.generate_sequences`` (verl 0.9.1, in build/venv-verl: tests/run_envs.sh) and by the loop
itself. The harnesses are real processes on the real ``openai`` SDK (tests/harness_trainers.py), their calls
answered through the gateway by a scripted stand-in of verl's server manager that records what it was sent and
sampled (as tests/test_integrations_verl_agent_loop.py's). Expectations: the tokenizer's own render of what
each harness sent, the manager's sampled IDs and logprobs, the verifier's reward in verl's ``rm_scores``.
"""

from __future__ import annotations

import asyncio
import sys

import pytest

pytest.importorskip(
    "verl.experimental.agent_loop",
    reason="verl is not installed here; tests/run_envs.sh runs this in build/venv-verl (made by .ci/envs)",
)
pytest.importorskip("openai", reason="the openai SDK is not installed (pip install -e '.[test]')")

from tmpl.errors import TrainerConfigError  # noqa: E402
from tmpl.harness import Harness, HarnessTask  # noqa: E402

from .harness_trainers import ANSWER, REWRITE, REWRITER, SILENT, answer_ids, render, verifier  # noqa: E402
from .test_integrations_verl_agent_loop import make_loop, make_worker  # noqa: E402

# the rewriter's first call alone: one training sequence
ONE_CALL = Harness(
    "one-call",
    (sys.executable, "-c", REWRITER.replace(
        'client.chat.completions.create(model=sys.argv[2], messages=[{"role": "user", "content": "Summary: " + reply}])\n',
        "",
    ).replace("{", "{{").replace("}", "}}"), "{task}", "{model}"),
    dialect="openai-chat",
    env=dict(REWRITE.env),
    timeout=60,
)  # fmt: skip


class Manager:
    """verl's server-manager interface answering every call with the template's 'Done.' turn; call ``k``'s
    logprobs are ``-(k + 1) / 8``. Records the prompts, the sampled IDs and the sticky ids."""

    def __init__(self, tok) -> None:
        self.answer = answer_ids(tok)
        self.prompts: list[list[int]] = []
        self.ids: list[str] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        k = len(self.prompts)
        self.prompts.append(list(prompt_ids))
        self.ids.append(request_id)
        return TokenOutput(
            token_ids=list(self.answer), log_probs=[-(k + 1) / 8] * len(self.answer), stop_reason="completed"
        )


def register(name, harness):
    from tmpl.integrations.verl import register_harness_agent

    return register_harness_agent(
        harness, name=name, tasks_from=lambda s: HarnessTask(s["raw_prompt"][-1]["content"], verifier=verifier)
    )


def test_one_harness_run_per_sample_through_verls_worker(tokenizer_of):
    import numpy as np
    from verl import DataProto

    tok = tokenizer_of("qwen2.5-instruct")
    register("tmpl_harness_one", ONE_CALL)
    manager = Manager(tok)
    worker = make_worker(manager, tok)
    prompts = [[{"role": "user", "content": f"Write note {k}."}] for k in range(2)]
    batch = DataProto.from_dict(
        non_tensors={
            "raw_prompt": np.array([*prompts, None], dtype=object)[:-1],
            "agent_name": np.array(["tmpl_harness_one"] * 2, dtype=object),
        },
    )
    out = asyncio.run(worker.generate_sequences(batch))
    assert len(out) == 2 and len(manager.prompts) == 2 and len(set(manager.ids)) == 2  # one sticky id per run
    answer = answer_ids(tok)
    for i in range(2):
        prompt = [
            t for t, a in zip(out.batch["prompts"][i].tolist(), out.batch["attention_mask"][i, :512].tolist()) if a
        ]
        n = int(out.batch["attention_mask"][i, 512:].sum())
        assert prompt == render(tok, f"Write note {i}.")  # the template's render of what the harness sent
        assert (
            out.batch["responses"][i, :n].tolist() == answer and out.batch["response_mask"][i, :n].tolist() == [1] * n
        )
        k = manager.prompts.index(prompt)
        assert out.batch["rollout_log_probs"][i, :n].tolist() == [-(k + 1) / 8] * n
        assert out.non_tensor_batch["harness_status"][i] == "HARNESS_DONE"
        # the verifier's reward is verl's score, on the response's last token
        scores = out.batch["rm_scores"][i].tolist()
        assert scores[n - 1] == 1.0 and sum(scores) == 1.0


def test_a_rewriting_harness_gives_one_output_per_sequence_and_the_legacy_trainer_refuses_it(tokenizer_of):
    pytest.importorskip(
        "transfer_queue", reason="TransferQueue (verl's V1 trainer) is not installed; .ci/envs installs it"
    )
    tok = tokenizer_of("qwen2.5-instruct")
    register("tmpl_harness_rewrite", REWRITE)
    manager = Manager(tok)
    v1 = {"trainer": {"use_v1": True}, "algorithm": {"adv_estimator": "grpo"}}
    v1["manager_class"] = "tmpl.integrations.verl.TmplAgentLoopManager"
    loop = make_loop("tmpl_harness_rewrite", manager, tok, **v1)
    outputs = asyncio.run(loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": "Write note 3."}]))
    answer = answer_ids(tok)
    assert [list(o.prompt_ids) for o in outputs] == [render(tok, "Write note 3."), render(tok, f"Summary: {ANSWER}")]
    assert all(list(o.response_ids) == answer and list(o.response_mask) == [1] * len(answer) for o in outputs)
    assert [o.reward_score for o in outputs] == [1.0, 1.0]
    assert [o.extra_fields["tmpl_row"] for o in outputs] == [0, 1]

    legacy = make_loop("tmpl_harness_rewrite", Manager(tok), tok)
    with pytest.raises(TrainerConfigError, match=r"harness run .* has 2 training sequences"):
        asyncio.run(
            legacy.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": "Write note 4."}], uid="u4")
        )


def test_a_harness_without_calls_keeps_its_sample_with_a_masked_stand_in(tokenizer_of):
    import tmpl

    tok = tokenizer_of("qwen2.5-instruct")
    register("tmpl_harness_silent", SILENT)
    loop = make_loop("tmpl_harness_silent", Manager(tok), tok)
    out = asyncio.run(loop.run({}, raw_prompt=[{"role": "user", "content": "Write note 5."}]))
    assert list(out.prompt_ids) == render(tok, "Write note 5.")
    assert list(out.response_ids) == [tmpl.ChatTemplate(tok).tool_close_ids[-1]] and list(out.response_mask) == [0]
    assert out.extra_fields["harness_status"] == "NO_CALLS" and out.reward_score is None
