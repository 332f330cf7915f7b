"""``make_rollout_func(harness=...)`` rows against the real TRL (1.16), on a Scripted backend (no engine): a real
harness process (the ``openai`` SDK) whose second call rewrites its history, so its episode has two training
sequences. ``ToolRLOOTrainer`` trains one row per sequence (``sample_index`` naming the run); ``GRPOTrainer``
refuses such a run by name rather than train one sequence of it; a harness that never calls the gateway keeps
its completion's place with a stand-in row outside every mask. Expectations come from the tokenizer's own
``apply_chat_template`` of what the harness sent.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
pytest.importorskip("openai", reason="the openai SDK is not installed (pip install -e '.[test]')")
pytest.importorskip("fastapi", reason="FastAPI is not installed (pip install -e '.[gateway]')")

import tmpl  # noqa: E402 (after the skips)
from tmpl.backends import Scripted  # noqa: E402
from tmpl.errors import TrainerConfigError  # noqa: E402
from tmpl.harness import HarnessTask  # noqa: E402
from tmpl.integrations.trl import harness_reward, make_rollout_func  # noqa: E402

from .conftest import load_tokenizer  # noqa: E402
from .harness_trainers import ANSWER, REWRITE, SILENT, answer_ids, render, verifier  # noqa: E402
from .trl_config import tiny_qwen2, train_args  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("qwen2.5-instruct")


@pytest.fixture(scope="module")
def model_dir(tok, tmp_path_factory):
    """A random-weight 1-layer Qwen2 on disk (as tests/test_env_trl.py)."""
    return tiny_qwen2(tok, tmp_path_factory.mktemp("tiny-qwen2-harness"))


def dataset():
    return datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": f"Write note {k}."}]} for k in range(2)])


def trainer_for(cls, config, harness, tok, model_dir, tmp_path, **overrides):
    backend = Scripted(lambda request: answer_ids(tok))
    outputs = []
    func = make_rollout_func(
        harness=harness,
        backend=backend,
        tasks_from=lambda row: HarnessTask(row["prompt"][-1]["content"], verifier=verifier),
    )

    def recording(prompts, trainer):
        outputs.append(func(prompts, trainer))
        return outputs[-1]

    trainer = cls(
        model=model_dir,
        processing_class=tok,
        args=train_args(config, tmp_path, max_steps=1, max_completion_length=96, **overrides),
        reward_funcs=harness_reward,
        train_dataset=dataset(),
        rollout_func=recording,
    )
    return trainer, func, outputs


def test_rloo_trains_one_row_per_sequence_of_each_harness_run(tok, model_dir, tmp_path):
    from tmpl.integrations.trl import ToolRLOOTrainer

    trainer, func, outputs = trainer_for(ToolRLOOTrainer, trl.RLOOConfig, REWRITE, tok, model_dir, tmp_path, beta=0.0)
    trainer.train()
    [out] = outputs
    results = func.last_results
    assert [r.status for r in results] == ["HARNESS_DONE"] * 2 and [r.reward for r in results] == [1.0, 1.0]
    assert out["sample_index"] == [0, 0, 1, 1]  # two sequences per run
    assert out["harness_reward"] == [1.0, 1.0] and len(out["harness_status"]) == 2
    answer = answer_ids(tok)
    tasks = [render(tok, f"Write note {n}.") for n in range(2)]
    for row, prompt_ids in enumerate(out["prompt_ids"]):
        # each sequence: the template's own render of what the harness sent (the task, then its rewrite),
        # then the scripted answer, every sampled token in the mask
        assert prompt_ids in tasks if row % 2 == 0 else prompt_ids == render(tok, f"Summary: {ANSWER}")
        assert out["completion_ids"][row] == answer and out["env_mask"][row] == [1] * len(answer)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs and all(torch.isfinite(torch.tensor(h["loss"])) for h in logs)


def test_grpo_refuses_a_harness_run_with_several_sequences(tok, model_dir, tmp_path):
    trainer, _, _ = trainer_for(trl.GRPOTrainer, trl.GRPOConfig, REWRITE, tok, model_dir, tmp_path)
    with pytest.raises(
        TrainerConfigError, match=r"completion 0 \(harness run sample0-0-\w+\) has 2 training sequences"
    ):
        trainer.train()


def test_a_run_without_calls_keeps_its_place_outside_every_mask(tok, model_dir, tmp_path):
    trainer, func, outputs = trainer_for(trl.GRPOTrainer, trl.GRPOConfig, SILENT, tok, model_dir, tmp_path)
    trainer.train()
    [out] = outputs
    assert [r.status for r in func.last_results] == ["NO_CALLS"] * 2
    assert out["harness_reward"] == [None, None]
    tasks = [render(tok, f"Write note {n}.") for n in range(2)]
    close = tmpl.ChatTemplate(tok).tool_close_ids[-1]
    for k, prompt_ids in enumerate(out["prompt_ids"]):
        assert prompt_ids in tasks
        assert out["completion_ids"][k] == [close] and out["env_mask"][k] == [0]
