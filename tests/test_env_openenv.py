"""OpenEnv environments in tmpl's rollout (``tmpl.env.openenv.OpenEnvEnv``), on openenv-core's own SDK.

Two environments written with the SDK: an echo environment (``Environment`` with its own Action and
Observation models; the echo of the CLI's template) served by ``create_app`` on 127.0.0.1 with uvicorn and
reached through ``GenericEnvClient`` over its WebSocket, one session per sample; and an ``MCPEnvironment``
with a FastMCP tool, run in-process (tools listed by ``ListToolsAction``, called by ``CallToolAction``).
Rollouts run on the real Qwen2.5 tokenizer with a scripted model; every prompt the rollout sent is checked
against ``apply_chat_template`` of the conversation so far, so each suffix appended after an observation
or a tool result is the full render's continuation.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

pytest.importorskip("openenv.core")
fastmcp = pytest.importorskip("fastmcp")
uvicorn = pytest.importorskip("uvicorn")

from openenv.core import GenericEnvClient  # noqa: E402 (after the skips)
from openenv.core.env_server.http_server import create_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.mcp_environment import MCPEnvironment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402
from pydantic import Field  # noqa: E402

import tmpl  # noqa: E402
from tmpl.backends import Scripted  # noqa: E402
from tmpl.env.openenv import OpenEnvEnv, observation_text  # noqa: E402
from tmpl.errors import EnvAdapterError  # noqa: E402
from tmpl.rollout.codes import EndCode  # noqa: E402

from .conftest import load_tokenizer  # noqa: E402


class EchoAction(Action):
    message: str = Field(..., description="Message to echo back")


class EchoObservation(Observation):
    echoed_message: str = Field(default="", description="The echoed message")
    message_length: int = Field(default=0)


class EchoEnvironment(Environment):
    """The SDK template's echo environment, ending after three steps; reward: the message's length / 10."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    opened: list[str] = []  # noqa: RUF012 - episodes seen by the server, across instances

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id="-", step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state = State(episode_id=episode_id or "-", step_count=0)
        EchoEnvironment.opened.append(self._state.episode_id)
        return EchoObservation(echoed_message=f"Echo ready for {episode_id}. Say something.", done=False, reward=0.0)

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        message = action.message
        return EchoObservation(
            echoed_message=f"You said: {message}",
            message_length=len(message),
            done=self._state.step_count >= 3,
            reward=len(message) * 0.1,
        )

    @property
    def state(self):
        return self._state


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def echo_server():
    """The echo environment's OpenEnv server on 127.0.0.1 (uvicorn in a thread, stopped at the end)."""
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, env_name="echo", max_concurrent_envs=8)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the OpenEnv server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def tpl():
    return tmpl.ChatTemplate(load_tokenizer("qwen2.5-instruct"))


def full_render(tpl, messages, tools) -> list[int]:
    """The tokenizer's own render (the oracle)."""
    out = tpl.tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=True)
    return list(out["input_ids"])


def completion(tpl, message) -> list[int]:
    """The IDs a model emits for ``message``: the template's render of it as the last turn, through its stop."""
    history = [{"role": "user", "content": "x"}]
    prompt = full_render(tpl, history, None)
    alone = list(tpl.tokenizer.apply_chat_template(history + [message], tokenize=True)["input_ids"])
    end = next(t for t in range(len(prompt), len(alone)) if alone[t] in tpl.stop_token_ids)
    return alone[len(prompt) : end + 1]


def check_prompts(tpl, backend, results, tools) -> int:
    """Every prompt sent is the full render of its sample's conversation up to that turn; returns how many."""
    checked = 0
    for r in results:
        sent = [q for q in backend.requests if q.request_id.startswith(f"{r.index}-{r.sample}-")]
        assistants = [i for i, m in enumerate(r.messages) if m["role"] == "assistant"]
        assert len(sent) == len(assistants)
        for request, at in zip(sent, assistants):
            assert list(request.prompt_ids) == full_render(tpl, r.messages[:at], tools)
            checked += 1
        # and the whole sample is the render of its conversation, through the last turn's close
        whole = list(tpl.tokenizer.apply_chat_template(r.messages, tools=tools, tokenize=True)["input_ids"])
        ids = r.prompt_ids.tolist() + r.completion_ids.tolist()
        assert whole[: len(ids)] == ids and len(whole) - len(ids) <= 1
    return checked


def test_an_openenv_server_runs_as_an_environment_with_exact_suffixes(tpl, echo_server):
    said = iter(range(1000))

    def policy(request):
        return completion(tpl, {"role": "assistant", "content": f"Hello number {next(said)}"})

    made = []

    def factory():  # the async client, and every other sample its blocking .sync() form
        client = GenericEnvClient(base_url=echo_server)
        made.append(client if len(made) % 2 == 0 else client.sync())
        return OpenEnvEnv(made[-1], action=lambda m: {"message": m["content"]})

    backend = Scripted(policy)
    rollout = tmpl.Rollout(tpl, backend, env_factory=factory, max_turns=6, max_length=2048, progress=False)
    tasks = [{"episode_id": f"ep{i}", "prompt": [{"role": "system", "content": "Talk to the echo."}]} for i in range(3)]
    results = rollout.run(tasks)

    assert {f"ep{i}" for i in range(3)} <= set(EchoEnvironment.opened)  # reset kwargs reached the server
    for r in results:
        assert r.code is EndCode.ENV_DONE, r.reason
        roles = [m["role"] for m in r.messages]
        assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
        assert r.messages[1]["content"].startswith(f"Echo ready for ep{r.index}")
        said_texts = [m["content"] for m in r.messages if m["role"] == "assistant"]
        echoed = [m["content"] for m in r.messages[3::2]]
        assert echoed == [f"You said: {t}" for t in said_texts[:2]]  # the server's answers, as user turns
        assert r.env_reward == pytest.approx(sum(len(t) * 0.1 for t in said_texts))
        # the observations' tokens are appended, not trained
        assert int(r.mask.sum()) == sum(len(completion(tpl, {"role": "assistant", "content": t})) for t in said_texts)
    assert check_prompts(tpl, backend, results, None) == 9
    assert [type(c).__name__ for c in made] == ["GenericEnvClient", "SyncEnvClient", "GenericEnvClient"]


def _calculator():
    mcp = fastmcp.FastMCP("calculator")

    @mcp.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    class Calculator(MCPEnvironment):
        def __init__(self) -> None:
            super().__init__(mcp)
            self._state = State(episode_id="-", step_count=0)

        def reset(self, seed=None, episode_id=None, **kwargs):
            return Observation(done=False, reward=0.0)

        def _step_impl(self, action, timeout_s=None, **kwargs):
            return Observation(done=True, reward=0.0)

        @property
        def state(self):
            return self._state

    return Calculator()


def test_an_mcp_environment_gives_the_tools_and_answers_the_calls(tpl):
    calls = [
        {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 40}}},
        {"type": "function", "function": {"name": "missing", "arguments": {}}},
    ]

    def policy(request):
        if "<tool_response>" in tpl.tokenizer.decode(request.prompt_ids):
            return completion(tpl, {"role": "assistant", "content": "It is 42."})
        return completion(tpl, {"role": "assistant", "content": "", "tool_calls": calls})

    def factory():
        return OpenEnvEnv(_calculator())

    backend = Scripted(policy)
    rollout = tmpl.Rollout(tpl, backend, env_factory=factory, max_turns=4, max_length=2048, progress=False)
    [r] = rollout.run([{"prompt": [{"role": "user", "content": "What is 2 + 40?"}]}])
    assert r.code is EndCode.ENV_DONE, r.reason
    tools = [m for m in r.messages if m["role"] == "tool"]
    assert [t["content"] for t in tools] == ["42", "error: Unknown tool: 'missing'"]
    schemas = [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two integers.",
                "parameters": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"],
                },
            },
        }
    ]
    assert '"name": "add"' in tpl.tokenizer.decode(r.prompt_ids.tolist())  # the listed schema is in the prompt
    assert check_prompts(tpl, backend, [r], schemas) == 2


def test_observations_and_bad_setups():
    assert observation_text(EchoObservation(echoed_message="hi", message_length=2)) == "hi"
    assert observation_text({"a": "x", "b": "y", "done": True, "reward": 1.0}) == '{"a": "x", "b": "y"}'
    with pytest.raises(EnvAdapterError, match="pass action="):
        OpenEnvEnv(EchoEnvironment())
    with pytest.raises(EnvAdapterError, match="one required string field"):

        class TwoFields(Action):
            a: str
            b: str

        OpenEnvEnv(EchoEnvironment(), action=TwoFields)
    env = OpenEnvEnv(EchoEnvironment(), action=EchoAction)  # an Action class: the content fills its field
    import asyncio

    opened = asyncio.run(env.reset({"episode_id": "x"}))
    assert opened.messages == [{"role": "user", "content": "Echo ready for x. Say something."}]
    step = asyncio.run(env.step({"role": "assistant", "content": "abc"}))
    assert step.messages == [{"role": "user", "content": "You said: abc"}]
    assert step.reward == pytest.approx(0.3) and not step.done
