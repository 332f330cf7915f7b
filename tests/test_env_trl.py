"""TRL's ``environment_factory`` contract with tmpl, both ways, against the real TRL (1.16).

(a) An environment written for TRL (``reset(**row)`` appending to the prompt, public methods as tools,
``get_reward``) runs as a tmpl environment (``tmpl.env.trl.from_trl_environment``): the tools are the ones
the real ``GRPOTrainer`` extracts from it, and the opening prompt is TRL's own render of the row's prompt
with the reset text appended and those tools.
(b) ``make_rollout_func(environment_factory=...)`` trains it: a real one-step ``GRPOTrainer`` run and a
one-step ``ToolRLOOTrainer`` run on the random-weight tiny Qwen2 of tests/test_integrations_trl.py (real
Qwen2.5 tokenizer, scripted completions). The reward functions get one environment instance per completion,
as TRL passes ``environments``, whose state is that completion's own tool calls, and ``env_reward`` (the
environment's ``get_reward``); RLOO resets each environment with its whole dataset row.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

import tmpl  # noqa: E402 (after the skips)
from tmpl.backends import Scripted  # noqa: E402
from tmpl.env.trl import from_trl_environment  # noqa: E402
from tmpl.integrations.trl import env_reward, make_rollout_func  # noqa: E402
from tmpl.rollout.codes import EndCode  # noqa: E402

from .conftest import load_tokenizer  # noqa: E402
from .trl_config import tiny_qwen2, train_args  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

CODES = ("0000", "1234")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("qwen2.5-instruct")


@pytest.fixture(scope="module")
def model_dir(tok, tmp_path_factory):
    """A random-weight 1-layer Qwen2 on disk, as in tests/test_integrations_trl.py (RLOO loads its reference
    model from the path)."""
    return tiny_qwen2(tok, tmp_path_factory.mktemp("tiny-qwen2-env"))


class Vault:
    """An environment as TRL's docs write them: state per episode, tools as methods, a reward from state."""

    def reset(self, **row) -> str:
        self.secret = row.get("secret", "0000")
        self.tries: list[str] = []
        self.row = row
        return " You have three tries."

    def try_code(self, code: str) -> str:
        """Try a code on the vault.

        Args:
            code: Four digits.
        """
        self.tries.append(code)
        return "open" if code == self.secret else "wrong"

    def get_reward(self) -> float:
        return 1.0 if self.secret in self.tries else 0.0


def prompt_text(n: int) -> str:
    return f"Open vault {n}."


def dataset(secrets=None):
    rows = [{"prompt": [{"role": "user", "content": prompt_text(n)}]} for n in range(2)]
    if secrets is not None:
        for row, secret in zip(rows, secrets):
            row["secret"] = secret
    return datasets.Dataset.from_list(rows)


class VaultPolicy:
    """Tries 0000, then 1234 (when the vault said wrong), then answers; every completion is the template's
    render of the assistant turn, through its stop token."""

    def __init__(self, tok):
        self.tok = tok
        self.stops = tmpl.ChatTemplate(tok).stop_token_ids

    def turn(self, message):
        history = [{"role": "user", "content": "x"}]
        prompt = list(self.tok.apply_chat_template(history, add_generation_prompt=True)["input_ids"])
        full = list(self.tok.apply_chat_template(history + [message])["input_ids"])
        end = next(t for t in range(len(prompt), len(full)) if full[t] in self.stops)
        return full[len(prompt) : end + 1]

    def __call__(self, request):
        text = self.tok.decode(request.prompt_ids)
        answers = text.count("<tool_response>")
        if answers < 2 and "open\n</tool_response>" not in text:
            call = {"type": "function", "function": {"name": "try_code", "arguments": {"code": CODES[answers]}}}
            return self.turn({"role": "assistant", "content": "", "tool_calls": [call]})
        return self.turn({"role": "assistant", "content": "Done."})


def trl_tools(tok, model_dir, tmp_path):
    """The tools the real GRPOTrainer extracts from Vault (its own environment_factory path)."""
    trainer = trl.GRPOTrainer(
        model=model_dir,
        processing_class=tok,
        args=train_args(trl.GRPOConfig, tmp_path),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        train_dataset=dataset(),
        environment_factory=Vault,
    )
    return trainer._env_tools[None], trainer


def test_a_trl_environment_runs_as_a_tmpl_environment(tok, model_dir, tmp_path):
    tools, trainer = trl_tools(tok, model_dir, tmp_path)
    assert [t.__name__ for t in tools] == ["try_code"]
    assert trainer.reward_func_names[-1] == "Vault"  # TRL made get_reward a reward source, as we read it

    tpl = tmpl.ChatTemplate(tok)
    backend = Scripted(VaultPolicy(tok))
    rollout = tmpl.Rollout(
        tpl, backend, env_factory=from_trl_environment(Vault), max_turns=4, max_length=2048, progress=False
    )
    rows = [{"prompt": [{"role": "user", "content": prompt_text(0)}], "secret": "1234"}]
    [r] = rollout.run(rows)
    assert r.code is EndCode.ENV_DONE, r.reason
    vault = r.env_state
    assert isinstance(vault, Vault) and vault.tries == ["0000", "1234"] and vault.row["secret"] == "1234"
    assert r.env_reward == 1.0
    assert [m["content"] for m in r.messages if m["role"] == "tool"] == ["wrong", "open"]
    # the opening prompt is TRL's own render: the reset text appended to the last message, TRL's tools
    opened = [{"role": "user", "content": prompt_text(0) + " You have three tries."}]
    trl_prompt = trl.data_utils.apply_chat_template({"prompt": opened}, tok, tools=tools)["prompt"]
    assert r.prompt_ids.tolist() == tok(trl_prompt, add_special_tokens=False)["input_ids"]
    # every later prompt is the tokenizer's full render of the conversation so far
    assistants = [i for i, m in enumerate(r.messages) if m["role"] == "assistant"]
    for request, at in zip(backend.requests, assistants, strict=True):
        full = tok.apply_chat_template(r.messages[:at], tools=tools, add_generation_prompt=True)["input_ids"]
        assert list(request.prompt_ids) == list(full)


def run(trainer_cls, config_cls, tok, model_dir, tmp_path, secrets=None, **config):
    seen = []

    def reward(completions, environments, env_reward, status, **kwargs):
        seen.append(SimpleNamespace(environments=list(environments), env_reward=list(env_reward), status=status))
        return [float(len(e.tries)) for e in environments]

    results = []
    func = make_rollout_func(
        environment_factory=Vault,
        max_turns=4,
        backend=Scripted(VaultPolicy(tok)),
        on_results=lambda rs, metrics: results.append(rs),
    )
    trainer = trainer_cls(
        model=model_dir,
        args=train_args(config_cls, tmp_path, max_steps=1, max_completion_length=96, **config),
        reward_funcs=[env_reward, reward],
        train_dataset=dataset(secrets),
        processing_class=tok,
        rollout_func=func,
    )
    trainer.train()
    return SimpleNamespace(trainer=trainer, seen=seen, results=results)


def check_environments(run_, secrets):
    assert run_.seen and len(run_.seen) == len(run_.results)
    for got, results in zip(run_.seen, run_.results):
        assert len(got.environments) == len(results) == 2  # a prompt's num_generations completions per call
        assert len({id(e) for e in got.environments}) == len(got.environments)  # one instance per completion
        for env, r in zip(got.environments, results, strict=True):
            assert env is r.env_state and isinstance(env, Vault)
            called = [c["function"]["arguments"]["code"] for m in r.messages for c in m.get("tool_calls") or []]
            assert env.tries == called  # the instance is the one this completion's calls reached
            assert env.secret in secrets
            assert r.code is EndCode.ENV_DONE, r.reason
        assert got.env_reward == [e.get_reward() for e in got.environments] == [1.0, 1.0]


def test_grpo_trains_with_a_trl_environment_through_tmpl(tok, model_dir, tmp_path):
    out = run(trl.GRPOTrainer, trl.GRPOConfig, tok, model_dir, tmp_path)
    check_environments(out, secrets={"0000"})  # GRPOTrainer gives a rollout_func the prompts only
    assert all(e.tries == ["0000"] for e in out.seen[0].environments)
    logs = [h for h in out.trainer.state.log_history if "loss" in h]
    assert logs and all(torch.isfinite(torch.tensor(h["loss"])) for h in logs)


def test_rloo_resets_each_environment_with_its_dataset_row(tok, model_dir, tmp_path):
    from tmpl.integrations.trl import ToolRLOOTrainer

    out = run(ToolRLOOTrainer, trl.RLOOConfig, tok, model_dir, tmp_path, secrets=["1234", "1234"], beta=0.0)
    check_environments(out, secrets={"1234"})
    for env in out.seen[0].environments:
        assert env.row["secret"] == "1234" and env.row["prompt"][0]["content"].startswith("Open vault")
        assert env.tries == ["0000", "1234"]


def test_calls_are_answered_as_trl_answers_them():
    import asyncio
    import pickle

    from tmpl.env.trl import TrlEnvironment
    from tmpl.errors import EnvAdapterError

    class Broken(Vault):
        def explode(self) -> str:
            """Fail."""
            raise RuntimeError("the vault is on fire")

        async def later(self, code: str) -> str:
            """An async tool.

            Args:
                code: Four digits.
            """
            return code[::-1]

    env = TrlEnvironment(Broken())
    opened = asyncio.run(env.reset([{"role": "user", "content": "Open."}]))  # a conversation: prompt=
    assert opened.messages == [{"role": "user", "content": "Open. You have three tries."}]
    assert [t["function"]["name"] for t in opened.tools] == ["explode", "later", "try_code"]  # TRL's order

    def call(name, **arguments):
        return {"id": f"id{name}"[:9], "type": "function", "function": {"name": name, "arguments": arguments}}

    step = asyncio.run(
        env.step({"role": "assistant", "tool_calls": [call("explode"), call("nope"), call("later", code="12")]})
    )
    assert [m["content"] for m in step.messages] == [
        str({"error": "the vault is on fire"}),  # TRL: {"error": str(exc)} as the tool message's text
        str({"error": "Tool nope not found."}),
        "21",
    ]
    assert [m["tool_call_id"] for m in step.messages] == ["idexplode", "idnope", "idlater"] and not step.done
    assert asyncio.run(env.step({"role": "assistant", "content": "I give up."})).reward == 0.0
    assert pickle.loads(pickle.dumps(from_trl_environment(Vault)))().env.__class__ is Vault  # DistributedRollout
    with pytest.raises(EnvAdapterError, match="no callable reset"):
        from_trl_environment(object)()

    class Chatty(Vault):
        def reset(self, **row):
            return 42

    with pytest.raises(EnvAdapterError, match="returned int"):
        asyncio.run(TrlEnvironment(Chatty()).reset({"prompt": [{"role": "user", "content": "x"}]}))
