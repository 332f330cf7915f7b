"""tmpl as TRL's rollout: real 2-step GRPO and RLOO runs on CPU, backend selection, version gate, errors.

The trainer runs use a random-weight tiny Qwen2 with the real Qwen2.5 tokenizer and a scripted
completion source whose completions are real Qwen2.5 tool calls (what the chat template renders
for an assistant turn with ``tool_calls``), so the token sequences are known exactly. A second
GRPO/RLOO pair trains the tool-calling Qwen2.5 fixture model of ``../shared/models``
(``TMPL_TEST_MODELS``; skipped when absent) on its own completions: the tools are really called
during training, and the loss gradient shows which tokens are in the loss.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
from transformers import AutoTokenizer  # noqa: E402 (after the skips)

import tmpl
from tmpl.backends import (
    VLLM,
    GenerationRequest,
    GenerationResult,
    Sampling,
    Scripted,
    Torch,
    VLLMServer,
)
from tmpl.errors import (
    RolloutContractError,
    TrainerConfigError,
    TrlNotInstalledError,
    UnsupportedTrlVersionError,
)
from tmpl.integrations.trl import VLLMClientBackend, make_rollout_func
from tmpl.rollout.codes import EndCode

from .conftest import load_tokenizer
from .fixture_models import QWEN, missing
from .trl_config import tiny_qwen2, train_args
from .vllm_standin import FakeLLM, StandinServer, fake_vllm_module

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def get_weather(city: str) -> str:
    """Weather now.

    Args:
        city: City.
    """
    return f"{city}: 21 C"


def get_time(city: str) -> str:
    """Local time.

    Args:
        city: City.
    """
    return f"{city}: 12:00"


TOOLS = [get_weather, get_time]
SCHEMAS = tmpl.Toolbox(TOOLS).schemas
QUESTIONS = ["What is the weather in Paris?", "What time is it in Tokyo?", "Weather in Rome?", "Time in Oslo?"]


def render(tok, messages, gen: bool) -> list[int]:
    """The tokenizer's own render of a conversation (the oracle the rollout must match)."""
    return list(tok.apply_chat_template(messages, tools=SCHEMAS, tokenize=True, add_generation_prompt=gen)["input_ids"])


class ToolPolicy:
    """Scripted completions: the first sample of each pair (every sample, when the request id does not
    say which it is) calls the tool its question is about, then answers; the second answers at once.
    Each completion is the template's render of the assistant turn."""

    def __init__(self, tok):
        self.tok = tok
        self.tpl = tmpl.ChatTemplate(tok)
        self.stops = self.tpl.stop_token_ids

    def turn(self, message: dict) -> list[int]:
        history = [{"role": "user", "content": "x"}]
        prompt, full = render(self.tok, history, True), render(self.tok, history + [message], False)
        end = next(t for t in range(len(prompt), len(full)) if full[t] in self.stops)
        return full[len(prompt) : end + 1]

    def __call__(self, request: GenerationRequest) -> list[int]:
        text = self.tok.decode(request.prompt_ids)
        city = next(c for c in ("Paris", "Tokyo", "Rome", "Oslo") if c in text)
        parts = request.request_id.split("-")  # "{conversation}-{sample}-{turn}" from tmpl's loop
        first_of_pair = len(parts) != 3 or int(parts[0]) % 2 == 0
        if first_of_pair and "<tool_response>" not in text:
            tool = "get_weather" if "eather" in text.split("<|im_start|>user")[1] else "get_time"
            return self.turn(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"type": "function", "function": {"name": tool, "arguments": {"city": city}}}],
                }
            )
        return self.turn({"role": "assistant", "content": f"Done for {city}."})


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("qwen2.5-instruct")


@pytest.fixture(scope="module")
def model_dir(tok, tmp_path_factory):
    """A random-weight 2-layer Qwen2 saved to disk (RLOO builds its reference model from the path)."""
    return tiny_qwen2(tok, tmp_path_factory.mktemp("tiny-qwen2"), hidden=32, layers=2)


def dataset():
    return datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for q in QUESTIONS])


def token_logps(model, batch, temperature: float = 1.0):
    """Per-token logprobs of the completion under ``model``: a plain forward and log-softmax (the oracle)."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = batch["completion_ids"].size(1)
    with torch.no_grad():
        # the LM head only where a completion token is predicted (151k-wide logits over the prompt too cost
        # most of this run's time)
        out = model(input_ids=ids, attention_mask=attention, logits_to_keep=width + 1)
        logits = out.logits[:, :-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)


def snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def check_batch_is_tmpl(tok, batch, results):
    """The padded batch TRL built holds tmpl's sequences token for token, and its masks are tmpl's."""
    assert batch["completion_ids"].size(0) == len(results)
    appended = 0
    for i, r in enumerate(results):
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
        n = int(batch["completion_mask"][i].sum())
        assert prompt == r.prompt_ids.tolist()
        assert n == len(r.completion_ids) and batch["completion_ids"][i][:n].tolist() == r.completion_ids.tolist()
        assert batch["tool_mask"][i][:n].tolist() == r.mask.tolist()
        assert batch["tool_mask"][i][n:].eq(1).all()  # TRL pads the tool mask with 1 (cut by completion_mask)
        loss_mask = (batch["completion_mask"][i] * batch["tool_mask"][i])[:n]
        assert loss_mask.tolist() == r.mask.tolist()
        appended += n - int(r.mask.sum())
        # independent oracle: the whole sample is the tokenizer's render of the conversation
        full = render(tok, r.messages, False)
        sequence = prompt + r.completion_ids.tolist()
        assert full[: len(sequence)] == sequence and len(full) - len(sequence) <= 1
    return appended


# -- GRPO: a real 2-step run ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def grpo_run(tok, model_dir, tmp_path_factory):
    from trl import GRPOTrainer

    class Capturing(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            self.batches.append({k: v.detach().clone() if torch.is_tensor(v) else v for k, v in out.items()})
            return out

    rollouts, received, rewarded = [], [], []
    tmpl_func = make_rollout_func(
        tools=TOOLS,
        max_turns=3,
        backend=Scripted(ToolPolicy(tok)),
        on_results=lambda results, metrics: rollouts.append(results),
    )

    def rollout_func(prompts, trainer):
        received.append([p[-1]["content"] for p in prompts])
        return tmpl_func(prompts, trainer)

    def reward(completions, tool_calls, status, **kwargs):
        rewarded.append({"n": len(completions), "tool_calls": tool_calls, "status": status, **kwargs})
        return [float(c) for c in tool_calls]

    trainer = Capturing(
        model=model_dir,
        args=train_args(trl.GRPOConfig, tmp_path_factory.mktemp("grpo")),
        reward_funcs=reward,
        train_dataset=dataset(),
        processing_class=tok,
        rollout_func=rollout_func,
    )
    trainer.batches = []
    before = snapshot(trainer.model)
    trainer.train()
    return SimpleNamespace(
        trainer=trainer,
        before=before,
        rollouts=rollouts,
        received=received,
        rewarded=rewarded,
        batches=trainer.batches,
        func=tmpl_func,
    )


def test_grpo_receives_repeated_prompts_and_gets_one_completion_each(grpo_run):
    # per call: per_device_train_batch_size * steps_per_generation prompts, each repeated num_generations times
    assert len(grpo_run.received) == 2
    for prompts, results in zip(grpo_run.received, grpo_run.rollouts):
        assert len(prompts) == 2 and prompts[0] == prompts[1]
        assert len(results) == len(prompts)
        assert [r.messages[0]["content"] for r in results] == prompts


def test_grpo_trains_two_steps_with_finite_loss_and_moving_parameters(grpo_run):
    losses = [h["loss"] for h in grpo_run.trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert grpo_run.trainer.state.global_step == 2
    after = dict(grpo_run.trainer.model.named_parameters())
    changed = [n for n, p in grpo_run.before.items() if not torch.equal(p, after[n].detach())]
    assert any("layers.0" in n for n in changed) and any("embed_tokens" in n for n in changed)


def test_grpo_batch_is_tmpl_sequences_and_tool_tokens_leave_the_loss(grpo_run, tok):
    assert len(grpo_run.batches) == 2
    for batch, results in zip(grpo_run.batches, grpo_run.rollouts):
        assert [r.status.name for r in results] == ["DONE", "DONE"]
        assert results[0].tool_calls == 1 and results[1].tool_calls == 0
        appended = check_batch_is_tmpl(tok, batch, results)
        assert appended > 10  # the tool result and the next generation prompt are in the batch, out of the loss
    # TRL counts completion lengths from the tool mask (model tokens only), not from the sequences
    logged = [h["completions/mean_length"] for h in grpo_run.trainer.state.log_history if "loss" in h]
    model_tokens = [sum(int(r.mask.sum()) for r in rs) / len(rs) for rs in grpo_run.rollouts]
    all_tokens = [sum(len(r.completion_ids) for r in rs) / len(rs) for rs in grpo_run.rollouts]
    assert logged == pytest.approx(model_tokens) and logged != pytest.approx(all_tokens)


def test_grpo_reward_functions_get_messages_tool_results_and_statuses(grpo_run):
    assert len(grpo_run.rewarded) == 2
    for seen in grpo_run.rewarded:
        assert seen["n"] == 2 and seen["status"] == ["DONE", "DONE"] and seen["tool_calls"] == [1, 0]
        assert seen["turns"] == [2, 1] and seen["tool_failures"] == [0, 0] and seen["reason"] == ["", ""]
        [tool_message] = seen["tool_results"][0]
        assert tool_message["role"] == "tool" and tool_message["content"] in {
            "Paris: 21 C",
            "Tokyo: 12:00",
            "Rome: 21 C",
            "Oslo: 12:00",
        }
        assert seen["tool_results"][1] == []
        assert [m["role"] for m in seen["messages"][0]] == ["user", "assistant", "tool", "assistant"]
        assert seen["rollout_metrics"][0]["rollout/tool_calls"] == 1.0
    logged = [h for h in grpo_run.trainer.state.log_history if "loss" in h]
    assert all(h["tmpl/tool_calls"] == 1.0 and h["tmpl/done"] == 2.0 for h in logged)


# -- RLOO: the same run through ToolRLOOTrainer ---------------------------------------------------


@pytest.fixture(scope="module")
def rloo_run(tok, model_dir, tmp_path_factory):
    from tmpl.integrations.trl import ToolRLOOTrainer

    class Capturing(ToolRLOOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            batch = {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in out.items()}
            self.records.append(
                {
                    "batch": batch,
                    "kl": self._metrics["train"]["kl"][-1],
                    "policy": token_logps(self.model, batch),
                    "ref": token_logps(self.ref_model, batch),
                }
            )
            return out

        def _compute_loss(self, model, inputs):
            loss = super()._compute_loss(model, inputs)
            self.records[-1].setdefault("losses", []).append(
                (
                    loss.detach().clone(),
                    {k: v.clone() for k, v in inputs.items() if torch.is_tensor(v)},
                    token_logps(model, inputs),
                )
            )
            return loss

    rollouts = []
    func = make_rollout_func(
        tools=TOOLS,
        max_turns=3,
        backend=Scripted(ToolPolicy(tok)),
        on_results=lambda results, metrics: rollouts.append(results),
    )

    def reward(completions, tool_calls, **kwargs):
        return [float(c) for c in tool_calls]

    trainer = Capturing(
        model=model_dir,
        args=train_args(trl.RLOOConfig, tmp_path_factory.mktemp("rloo"), beta=0.1),
        reward_funcs=reward,
        train_dataset=dataset(),
        processing_class=tok,
        rollout_func=func,
    )
    trainer.records = []
    before = snapshot(trainer.model)
    trainer.train()
    return SimpleNamespace(trainer=trainer, before=before, rollouts=rollouts, records=trainer.records)


def test_rloo_trains_two_steps_on_tmpl_sequences(rloo_run, tok):
    trainer = rloo_run.trainer
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(p, after[n].detach()) for n, p in rloo_run.before.items() if "layers.1" in n)
    assert len(rloo_run.records) == 2
    for record, results in zip(rloo_run.records, rloo_run.rollouts):
        assert check_batch_is_tmpl(tok, record["batch"], results) > 10
        assert "sample_index" not in record["batch"]  # append mode: one row per sample, RLOO's own scoring


def test_rloo_old_logprobs_and_kl_count_model_tokens_only(rloo_run):
    for step, record in enumerate(rloo_run.records):
        batch = record["batch"]
        loss_mask = batch["completion_mask"] * batch["tool_mask"]
        masked = (record["policy"] * loss_mask).sum(1)
        unmasked = (record["policy"] * batch["completion_mask"]).sum(1)
        assert batch["old_logps"] == pytest.approx(masked, rel=1e-4, abs=1e-3)
        has_appended = (batch["completion_mask"] * (1 - batch["tool_mask"])).sum(1) > 0
        assert has_appended.tolist() == [True, False]  # the tool-calling sample, the direct answer
        assert (batch["old_logps"] - unmasked)[has_appended].abs().min() > 1.0  # appended tokens would have counted
        per_token_kl = record["policy"] - record["ref"]
        expected = float((per_token_kl * loss_mask).sum() / batch["completion_mask"].sum())
        wrong = float((per_token_kl * batch["completion_mask"]).sum() / batch["completion_mask"].sum())
        assert record["kl"] == pytest.approx(expected, rel=1e-3, abs=1e-6)
        if step == 1:  # after one update the policy differs from the reference
            assert abs(expected) > 1e-4 and abs(wrong - expected) > 10 * abs(expected - record["kl"]) + 1e-5
        else:
            assert expected == pytest.approx(0.0, abs=1e-5)


def test_rloo_loss_sums_model_tokens_only(rloo_run):
    trainer = rloo_run.trainer
    for record in rloo_run.records:
        for loss, inputs, token_lp in record["losses"]:
            mask = inputs["completion_mask"] * inputs["tool_mask"]
            adv = inputs["advantages"]

            def ppo(logps, inputs=inputs, adv=adv):
                coef = torch.exp(logps - inputs["old_logps"])
                clipped = torch.clamp(coef, 1 - trainer.epsilon_low, 1 + trainer.epsilon_high)
                return float(-torch.min(coef * adv, clipped * adv).mean())

            # the policy has not moved since generation: the ratio is 1 up to float error (losses are O(advantage))
            assert float(loss) == pytest.approx(ppo((token_lp * mask).sum(1)), abs=1e-3)
            # summing the appended tokens too would move the ratio far from 1
            assert abs(float(loss) - ppo((token_lp * inputs["completion_mask"]).sum(1))) > 0.1 * float(adv.abs().max())


def test_rloo_rejects_a_malformed_rollout_output():
    from tmpl.integrations.trl.rloo import _check_output

    good = {"prompt_ids": [[1, 2]], "completion_ids": [[3, 4]], "logprobs": [[0.0, 0.0]], "env_mask": [[1, 0]]}
    assert _check_output(good, 1).env_mask == [[1, 0]]
    assert _check_output({**good, "env_mask": None}, 1).env_mask == [[1, 1]]
    with pytest.raises(RolloutContractError, match="'logprobs': missing"):
        _check_output({k: v for k, v in good.items() if k != "logprobs"}, 1)
    with pytest.raises(RolloutContractError, match="'completion_ids': 1 rows for 2 prompts"):
        _check_output({**good, "prompt_ids": [[1], [2]]}, 2)
    with pytest.raises(RolloutContractError, match="row 0 has 1 entries for 2 completion tokens"):
        _check_output({**good, "env_mask": [[1]]}, 1)
    with pytest.raises(RolloutContractError, match="row 0 is empty"):
        _check_output({**good, "completion_ids": [[]], "env_mask": [[]]}, 1)


# -- backend selection, with stand-ins for vLLM ----------------------------------------------------


class StandinTrainer(SimpleNamespace):
    """The attributes of a TRL trainer that the rollout function reads."""


def standin(tok, **overrides):
    base = dict(
        processing_class=tok,
        _tokenizer=tok,
        chat_template=None,
        chat_template_kwargs={},
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        repetition_penalty=1.0,
        min_p=None,
        max_completion_length=64,
        num_generations=2,
        use_vllm=False,
        tools=[],
        environment_factories=None,
        vllm_generation=None,
        args=SimpleNamespace(
            generation_kwargs=None, vllm_server_base_url=None, vllm_max_model_length=None, vllm_server_timeout=30.0
        ),
        model=SimpleNamespace(training=True, config=SimpleNamespace(max_position_embeddings=4096)),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    base.update(overrides)
    return StandinTrainer(**base)


def prompts(k: int = 2):
    return [[{"role": "user", "content": QUESTIONS[0]}]] * k


def check_output(out, tok, results):
    assert len(out["completion_ids"]) == len(results) == len(out["env_mask"]) == len(out["logprobs"])
    for i, r in enumerate(results):
        assert out["completion_ids"][i] == r.completion_ids.tolist() and out["env_mask"][i] == r.mask.tolist()
        assert out["logprobs"][i] == pytest.approx(r.logprobs.tolist())
        assert r.status.name == "DONE"
        full = render(tok, r.messages, False)
        sequence = out["prompt_ids"][i] + out["completion_ids"][i]
        assert full[: len(sequence)] == sequence


class SleepyLLM(FakeLLM):
    """A stand-in ``vllm.LLM`` that also records sleep-mode calls."""

    def __init__(self, backend, events):
        super().__init__(backend)
        self.events = events

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        self.events.append("generate")
        return super().generate(prompts, sampling_params, use_tqdm)

    def wake_up(self, tags=None):
        self.events.append(("wake_up", tuple(tags or ())))

    def sleep(self, level=1):
        self.events.append(("sleep", level))


def test_colocate_mode_uses_the_trainers_vllm_engine(tok, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm_module())
    monkeypatch.setitem(sys.modules, "vllm.inputs", sys.modules["vllm"].inputs)
    events: list = []
    llm = SleepyLLM(Scripted(ToolPolicy(tok)), events)
    engine = SimpleNamespace(
        mode="colocate",
        llm=llm,
        tensor_parallel_size=1,
        enable_sleep_mode=True,
        _llm_weights_sleeping=True,
        sync_weights=lambda: events.append("sync_weights"),
    )
    trainer = standin(tok, use_vllm=True, vllm_generation=engine)
    func = make_rollout_func(tools=TOOLS, max_turns=3)
    out = func(prompts(), trainer)
    assert isinstance(func.last_backend, VLLM) and func.last_backend.llm is llm
    check_output(out, tok, func.last_results)
    assert func.last_results[0].tool_calls == 1 and 0 in out["env_mask"][0]
    # one wake for the whole multi-turn rollout (weights pushed first, they were discarded), then back to sleep
    assert events[:2] == ["sync_weights", ("wake_up", ("kv_cache",))]
    assert events.count("generate") >= 2 and events[-1] == ("sleep", 2) and engine._llm_weights_sleeping
    assert events.count(("wake_up", ("kv_cache",))) == 1 and events.count(("sleep", 2)) == 1
    params = llm.calls[0][1][0].kwargs  # the trainer's sampling settings reached the engine
    assert (params["temperature"], params["top_p"], params["top_k"], params["logprobs"]) == (0.7, 0.9, 5, 0)
    assert set(params["stop_token_ids"]) == set(func.chat_template(trainer).stop_token_ids)
    assert params["max_tokens"] == 64
    tp2 = standin(tok, use_vllm=True, vllm_generation=SimpleNamespace(mode="colocate", llm=llm, tensor_parallel_size=2))
    with pytest.raises(TrainerConfigError, match="vllm_tensor_parallel_size"):
        func(prompts(), tp2)


class FakeVLLMClient:
    """TRL's ``VLLMClient.generate`` interface, answering through a tmpl backend; calls are recorded."""

    def __init__(self, backend):
        self.backend = backend
        self.calls: list[dict] = []

    def generate(
        self,
        prompts,
        n=1,
        repetition_penalty=1.0,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        max_tokens=16,
        logprobs=0,
        structured_outputs_regex=None,
        generation_kwargs=None,
    ):
        self.calls.append(
            dict(
                prompts=prompts,
                n=n,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                max_tokens=max_tokens,
                logprobs=logprobs,
                generation_kwargs=generation_kwargs,
            )
        )
        stops = frozenset((generation_kwargs or {}).get("stop_token_ids", ()))
        requests = [
            GenerationRequest(str(k), p, max_tokens, stops, Sampling(temperature, top_p, top_k))
            for k, p in enumerate(prompts)
        ]
        results = self.backend.generate_batch(requests)
        return {
            "prompt_ids": prompts,
            "completion_ids": [r.token_ids for r in results],
            "logprobs": [[[lp] for lp in r.logprobs] for r in results],
            "logprob_token_ids": [[[t] for t in r.token_ids] for r in results],
        }


def test_server_mode_uses_the_trainers_vllm_client(tok):
    client = FakeVLLMClient(Scripted(ToolPolicy(tok)))
    trainer = standin(tok, use_vllm=True, vllm_generation=SimpleNamespace(mode="server", vllm_client=client))
    func = make_rollout_func(tools=TOOLS, max_turns=3)
    out = func(prompts(), trainer)
    assert isinstance(func.last_backend, VLLMClientBackend) and func.last_backend.client is client
    check_output(out, tok, func.last_results)
    first = client.calls[0]
    assert len(first["prompts"]) == 2 and first["n"] == 1 and first["logprobs"] == 0
    assert (first["temperature"], first["top_p"], first["top_k"]) == (0.7, 0.9, 5)
    assert set(first["generation_kwargs"]["stop_token_ids"]) == set(func.chat_template(trainer).stop_token_ids)
    assert sum(len(call["prompts"]) for call in client.calls) == 4  # 2 samples: a tool call, then an answer


def test_server_mode_on_other_processes_talks_to_the_server_url(tok):
    with StandinServer(Scripted(ToolPolicy(tok))) as server:
        args = SimpleNamespace(
            generation_kwargs=None,
            vllm_server_base_url=server.url,
            vllm_max_model_length=None,
            vllm_server_timeout=30.0,
        )
        trainer = standin(tok, use_vllm=True, args=args, vllm_generation=SimpleNamespace(mode="server"))
        func = make_rollout_func(tools=TOOLS, max_turns=3)
        out = func(prompts(), trainer)
    assert isinstance(func.last_backend, VLLMServer) and func.last_backend.servers[0].url == server.url
    assert func.last_backend.api == "completions" and server.requests == 4  # 2 samples x 2 turns
    check_output(out, tok, func.last_results)


def test_vllm_client_backend_cuts_at_each_requests_limit_and_reports_failures():
    class Client:
        def generate(self, prompts, max_tokens, generation_kwargs, **kw):
            self.max_tokens = max_tokens
            return {
                "completion_ids": [[5, 6, 7, 8, 9]] * len(prompts),
                "logprobs": [[[-0.5], [-0.25], [-1.0], [-2.0], [-3.0]]] * len(prompts),
                "logprob_token_ids": [[[5], [6], [7], [8], [9]]] * len(prompts),
            }

    client = Client()
    backend = VLLMClientBackend(client)
    stop7 = frozenset({7})
    a, b, c = backend.generate_batch(
        [
            GenerationRequest("a", [1], 2, frozenset()),
            GenerationRequest("b", [1], 8, stop7),
            GenerationRequest("c", [1], 8, frozenset()),
        ]
    )
    assert (a.token_ids, a.logprobs, a.finish_reason) == ([5, 6], [-0.5, -0.25], "length")
    assert (b.token_ids, b.logprobs, b.finish_reason) == ([5, 6, 7], [-0.5, -0.25, -1.0], "stop")
    assert (c.token_ids, c.finish_reason) == ([5, 6, 7, 8, 9], "stop")  # the server ended it before 8 tokens

    class Broken:
        def generate(self, **kw):
            raise ConnectionError("server gone")

    [failed] = VLLMClientBackend(Broken()).generate_batch([GenerationRequest("x", [1], 4, frozenset())])
    assert failed.finish_reason == "error" and "server gone" in failed.error


def test_torch_backend_on_the_trainers_model_without_vllm(tok, model_dir, tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    func = make_rollout_func(tools=TOOLS, max_turns=2)
    args = train_args(GRPOConfig, tmp_path, max_completion_length=12)
    trainer = GRPOTrainer(
        model=model_dir,
        args=args,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        train_dataset=dataset(),
        processing_class=tok,
        rollout_func=func,
    )
    out = func(prompts(), trainer)
    assert isinstance(func.last_backend, Torch)
    assert func.last_backend.model is trainer.accelerator.unwrap_model(trainer.model)
    assert all(p.grad is None for p in trainer.model.parameters())  # generated without gradients
    for i, r in enumerate(func.last_results):
        assert 0 < len(out["completion_ids"][i]) <= 12 and r.status.name in ("DONE", "TRUNCATED")
        assert out["completion_ids"][i] == r.completion_ids.tolist()
        assert all(lp < 0 for lp, m in zip(out["logprobs"][i], out["env_mask"][i]) if m)


# -- errors and edge cases -----------------------------------------------------------------------


def test_tools_given_to_the_trainer_too_are_refused(tok, model_dir, tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    func = make_rollout_func(tools=TOOLS, backend=Scripted(ToolPolicy(tok)))
    trainer = GRPOTrainer(
        model=model_dir,
        args=train_args(GRPOConfig, tmp_path),
        tools=TOOLS,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        train_dataset=dataset(),
        processing_class=tok,
        rollout_func=func,
    )
    with pytest.raises(
        TrainerConfigError,
        match=r"GRPOTrainer\(tools=\.\.\.\).*get_weather, get_time.*"
        r"make_rollout_func\(tools=\.\.\.\) only",
    ):
        trainer.train()


def test_version_gate(monkeypatch):
    from tmpl.integrations.trl import SUPPORTED_TRL, supported

    assert supported(trl.__version__)  # the installed TRL is in the range

    import tomllib

    extras = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert "trl" + SUPPORTED_TRL in extras["trl"] and "trl" + SUPPORTED_TRL in extras["test"]
    monkeypatch.setattr(trl, "__version__", "1.10.0")
    with pytest.raises(UnsupportedTrlVersionError) as info:
        make_rollout_func(tools=TOOLS)
    assert "TRL 1.10.0 is installed" in str(info.value) and SUPPORTED_TRL == ">=1.11,<1.17"
    assert info.value.installed == "1.10.0" and info.value.supported == SUPPORTED_TRL
    monkeypatch.setattr(trl, "__version__", "1.17.0.dev0")
    with pytest.raises(UnsupportedTrlVersionError, match="trl>=1.11,<1.17"):
        make_rollout_func(tools=TOOLS)
    monkeypatch.setenv("TMPL_TRL_SKIP_VERSION_CHECK", "1")
    make_rollout_func(tools=TOOLS)
    monkeypatch.setitem(sys.modules, "trl", None)  # TRL not installed
    with pytest.raises(TrlNotInstalledError, match=r"pip install 'tmpl\[trl\]'"):
        make_rollout_func(tools=TOOLS)
    import tmpl.integrations.trl as integration

    with pytest.raises(TrlNotInstalledError):
        getattr(integration, "ToolRLOOTrainer")  # noqa: B009 (the lazy attribute imports TRL)


def test_arguments_and_trainer_settings_that_cannot_be_honoured(tok):
    with pytest.raises(TrainerConfigError, match="n=4"):
        make_rollout_func(sampling=Sampling(n=4))
    with pytest.raises(TypeError, match="max_completion_length comes from the trainer"):
        make_rollout_func(max_completion_length=10)
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_turn'"):
        make_rollout_func(max_turn=3)
    func = make_rollout_func(tools=TOOLS, backend=Scripted(ToolPolicy(tok)))
    with pytest.raises(TrainerConfigError, match=r"repetition_penalty=\.\.\.\): 1.2"):
        func(prompts(), standin(tok, repetition_penalty=1.2))
    with pytest.raises(TrainerConfigError, match=r"train_dataset=\.\.\.\): prompt 0 is str"):
        func(["What is the weather?"], standin(tok))
    with pytest.raises(TrainerConfigError, match="environment_factory"):
        func(prompts(), standin(tok, environment_factories={None: object}))


def test_aborted_samples_stay_in_the_batch_without_loss(tok):
    final = ToolPolicy(tok).turn({"role": "assistant", "content": "Fine."})

    def policy(request):
        if request.request_id.startswith("1-"):
            return GenerationResult.failed(request.request_id, "engine crashed")
        return final

    func = make_rollout_func(tools=TOOLS, backend=Scripted(policy))
    out = func(prompts(), standin(tok))
    assert out["status"] == ["DONE", "ABORTED"] and "engine crashed" in out["reason"][1]
    assert out["env_mask"][0] == [1] * len(final)
    assert out["completion_ids"][1] == [tok.convert_tokens_to_ids("<|im_end|>")] and out["env_mask"][1] == [0]


def test_runs_inside_a_running_event_loop(tok):
    func = make_rollout_func(tools=TOOLS, max_turns=3, backend=Scripted(ToolPolicy(tok)))

    async def notebook_cell():
        return func(prompts(), standin(tok))

    out = asyncio.run(notebook_cell())
    assert out["tool_calls"] == [1, 0] and out["status"] == ["DONE", "DONE"]


def test_truncated_samples_can_be_masked_out(tok):
    policy = ToolPolicy(tok)  # request ids of tmpl's loop: sample 0 of a pair calls a tool, sample 1 answers
    kept = make_rollout_func(tools=TOOLS, max_turns=1, backend=Scripted(policy))(prompts(), standin(tok))
    masked = make_rollout_func(tools=TOOLS, max_turns=1, backend=Scripted(policy), mask_truncated=True)(
        prompts(), standin(tok)
    )
    assert kept["status"] == masked["status"] == ["TRUNCATED", "DONE"]
    assert "max_turns=1" in kept["reason"][0]
    assert kept["env_mask"][0] == [1] * len(kept["completion_ids"][0]) and masked["env_mask"][0] == [0] * len(
        kept["completion_ids"][0]
    )
    assert kept["env_mask"][1] == masked["env_mask"][1] == [1] * len(kept["completion_ids"][1])


def test_template_follows_the_trainer_or_the_argument(tok):
    trainer = standin(tok, chat_template_kwargs={"enable_thinking": False})
    own = make_rollout_func(tools=TOOLS).chat_template(trainer)
    assert (
        own.tokenizer is tok and own.template == tok.chat_template and own.template_kwargs == {"enable_thinking": False}
    )
    shipped = make_rollout_func(tools=TOOLS, template="qwen2.5").chat_template(trainer)
    assert shipped.name == "qwen2.5" and shipped.template == tmpl.templates.load("qwen2.5")
    out = make_rollout_func(tools=TOOLS, template="qwen2.5", backend=Scripted(ToolPolicy(tok)))(prompts(), trainer)
    assert out["status"] == ["DONE", "DONE"] and out["tool_calls"] == [1, 0]
    other = tmpl.ChatTemplate(load_tokenizer("llama-3.2-instruct"))
    with pytest.raises(TrainerConfigError, match="built on a different tokenizer"):
        make_rollout_func(tools=TOOLS, template=other).chat_template(trainer)


# -- real tool calls during training: the tiny tool-calling Qwen2.5 fixture model ------------------

FIXTURE_MODEL = QWEN
FIXTURE_QUESTIONS = ["What time is it in Paris?", "What is the weather in Rome?"]


def fixture_tools():
    """get_time / get_weather with the schemas the fixture model was trained with (its fixture.json)."""
    if missing(FIXTURE_MODEL):
        pytest.skip(missing(FIXTURE_MODEL))
    functions = {"get_time": get_time, "get_weather": get_weather}
    schemas = json.loads((FIXTURE_MODEL / "fixture.json").read_text())["tools"]
    return [(functions[s["function"]["name"]], s) for s in schemas]


class HiddenGradients:
    """Keeps the final hidden states (the last norm's output) of every forward that builds a graph.

    TRL 1.16 scores completions with a fused LM head (no logits tensor), so the gradient is read one
    step earlier: a completion token's logprob depends on the final hidden state of the position
    before it and nothing else does, so the token is out of the loss exactly when the loss's
    gradient w.r.t. that hidden state is zero.
    """

    def __init__(self, model):
        self.outputs: list = []
        self.handle = model.model.norm.register_forward_hook(self.keep)

    def keep(self, module, args, output):
        if output.requires_grad:
            output.retain_grad()
            self.outputs.append(output)


def capturing(cls):
    """``cls`` recording, per loss computation, its inputs and the hidden states it differentiated."""

    class Capturing(cls):
        def compute_loss(self, model, inputs, *args, **kwargs):
            start = len(self.grads.outputs)
            loss = super().compute_loss(model, inputs, *args, **kwargs)
            [hidden] = self.grads.outputs[start:]  # one forward with a graph per loss
            self.losses.append(({k: v.detach().clone() for k, v in inputs.items() if torch.is_tensor(v)}, hidden))
            return loss

    return Capturing


def fixture_run(cls, config_cls, tmp_path, **config):
    tok = AutoTokenizer.from_pretrained(str(FIXTURE_MODEL))
    rollouts = []
    func = make_rollout_func(
        tools=fixture_tools(),
        max_turns=3,
        verify_every=1,
        on_results=lambda results, metrics: rollouts.append(results),
    )

    def reward(completions, **kwargs):  # distinct rewards in each group: nonzero advantages for every sample
        return [float(i % 2) for i in range(len(completions))]

    data = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for q in FIXTURE_QUESTIONS])
    # one step: the masking claim holds per step, and the suite's time is mostly these trainer runs
    args = train_args(config_cls, tmp_path, max_completion_length=64, learning_rate=1e-6, max_steps=1, **config)
    trainer = capturing(cls)(
        model=str(FIXTURE_MODEL),
        args=args,
        reward_funcs=reward,
        train_dataset=data,
        processing_class=tok,
        rollout_func=func,
    )
    trainer.losses = []
    trainer.grads = HiddenGradients(trainer.model)
    trainer.train()
    trainer.grads.handle.remove()
    return SimpleNamespace(trainer=trainer, tok=tok, rollouts=rollouts, losses=trainer.losses)


def check_tool_tokens_leave_the_loss(run):
    """In the steps where the model called tools, the gradient reaches its own tokens and never the appended ones."""
    assert len(run.rollouts) == len(run.losses) == run.trainer.args.max_steps
    called = 0
    for results, (inputs, hidden) in zip(run.rollouts, run.losses):
        assert all(r.code is not EndCode.VERIFY_FAILED for r in results)  # every suffix equal to a full render
        if not any(r.tool_calls for r in results):
            continue
        called += 1
        width = inputs["completion_ids"].size(1)
        grad = hidden.grad[:, -width - 1 : -1].abs().sum(-1)  # per completion token
        model_tokens = (inputs["completion_mask"] * inputs["tool_mask"]).bool()
        appended = inputs["completion_mask"].bool() & ~inputs["tool_mask"].bool()
        assert appended.sum() > 10  # tool results and the next generation prompt are in the batch
        assert bool((grad[appended] == 0).all())  # out of the loss: exactly zero gradient
        assert bool((grad[model_tokens] > 0).all())  # every generated token is in the loss
        assert bool((grad[~inputs["completion_mask"].bool()] == 0).all())  # padding too
        # the appended tokens are the tool results tmpl appended (mask 0), generated ones are the model's
        for i in range(inputs["completion_ids"].size(0)):
            text = run.tok.decode(inputs["completion_ids"][i][appended[i]])
            if appended[i].any():
                assert "<tool_response>" in text and "</tool_response>" in text, text
            assert "<tool_call>" not in text
        # tmpl's masks are the ones TRL used: the same multiset of (ids, mask) rows as the rollout's
        rows = sorted((r.completion_ids.tolist(), r.mask.tolist()) for r in results)
        n = inputs["completion_mask"].sum(1).tolist()
        batch = sorted(
            (inputs["completion_ids"][i][: n[i]].tolist(), inputs["tool_mask"][i][: n[i]].tolist())
            for i in range(len(n))
        )
        assert batch == rows
    assert called >= 1, [[r.tool_calls for r in rs] for rs in run.rollouts]


def test_grpo_with_the_fixture_model_masks_real_tool_results_out_of_the_loss(tmp_path):
    from trl import GRPOTrainer

    run = fixture_run(GRPOTrainer, trl.GRPOConfig, tmp_path)
    assert isinstance(run.trainer.rollout_func.last_backend, Torch)  # the trainer's own transformers model
    assert sum(r.tool_calls for rs in run.rollouts for r in rs) >= 2
    check_tool_tokens_leave_the_loss(run)


def test_rloo_with_the_fixture_model_masks_real_tool_results_out_of_the_loss(tmp_path):
    from tmpl.integrations.trl import ToolRLOOTrainer

    run = fixture_run(ToolRLOOTrainer, trl.RLOOConfig, tmp_path, beta=0.0)
    assert isinstance(run.trainer.rollout_func.last_backend, Torch)
    assert sum(r.tool_calls for rs in run.rollouts for r in rs) >= 2
    check_tool_tokens_leave_the_loss(run)
