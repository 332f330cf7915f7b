"""verifiers 0.4.0 episodes whose rollouts are tmpl harness runs (``tmpl.integrations.verifiers.HarnessEnv``).

Runs in ``build/venv-renderers`` (tests/run_envs.sh; verifiers pins openai<3). The env is verifiers' own
``SingleAgentEnv`` machinery over a ``Taskset`` of this module; each episode is one real harness run:
tests/harness_rollout_agent.py (the openai SDK, its own process) against the Qwen2.5 gateway over the
Scripted policy of tests/test_harness_rollout.py, its reward from a verifier callable
(the answer file written). Oracles: the template's own ``apply_chat_template`` render of each request body the SDK sent
(the branch is the last call's render plus its sampled tokens, the tokens between calls the render's
own), the Scripted policy's sampled tokens (exactly the branch's sampled mask), and verifiers' own
``Episode`` model (the episode survives its wire form, JSON, with its branches' tokens).
"""

from __future__ import annotations

import asyncio
import sys

import pytest

pytest.importorskip(
    "verifiers",
    reason="verifiers is not installed here: tests/run_envs.sh runs this file in build/venv-renderers (see its header)",
)

import verifiers.v1 as vf

TASKSET_ID = "tmpl_verifiers_harness_taskset"
PROMPTS = ["mode:ok Weather in Paris?", "mode:exit3 Weather in Paris?"]


class WeatherTask(vf.Task[vf.TaskData]):
    pass


class WeatherTaskset(vf.Taskset[WeatherTask, vf.TasksetConfig]):
    def load(self) -> list[WeatherTask]:
        return [WeatherTask(vf.TaskData(prompt=p)) for p in PROMPTS]


__all__ = ["WeatherTaskset"]  # verifiers loads a taskset as the one Taskset a module exports


def test_a_harness_run_is_a_verifiers_episode_token_for_token(monkeypatch):
    from verifiers.v1.envs.single_agent import SingleAgentEnvConfig
    from verifiers.v1.episode import Episode
    from verifiers.v1.harnesses.null import NullHarnessConfig

    from tmpl.integrations.verifiers import HarnessEnv

    from .test_harness_rollout import World, agent

    monkeypatch.setitem(sys.modules, TASKSET_ID, sys.modules[__name__])
    world = World(monkeypatch)
    config = SingleAgentEnvConfig(
        taskset=vf.TasksetConfig(id=TASKSET_ID), agent=vf.AgentConfig(harness=NullHarnessConfig(id="null"))
    )

    def answered(workdir, episode):  # the tmpl verifier: the agent wrote its answer
        return 1.0 if (workdir / "answer.txt").exists() else 0.0

    env = HarnessEnv(config, harness=agent(), gateway=world.gateway, verifier=answered)

    async def go():
        ctx = vf.ModelContext(model="unused", client=vf.TrainClientConfig(base_url="http://unused/v1"))
        return await asyncio.gather(*(env.run_episode(task, ctx) for task in env.taskset))  # two runs at once

    ok, exits = asyncio.run(go())
    renders = world.renders()
    [trace] = ok.traces
    assert ok.ok and trace.ok and trace.reward == 1.0 and trace.info["tmpl"]["status"] == "HARNESS_DONE"
    [branch] = trace.branches
    ids, mask = branch.token_ids, branch.sampled_mask
    sampled = [i for i, node in enumerate(branch.nodes) if node.sampled]
    assert len(sampled) == 2 and all(branch.nodes[i].message.role == "assistant" for i in sampled)
    first, last = (branch.nodes[i] for i in sampled)
    p_last = sum(len(n.token_ids) for n in branch.nodes[: sampled[1]])
    # the branch: the template's render of the SDK's last request, then the policy's sampled tokens
    assert ids[:p_last] in renders and ids[p_last:] == last.token_ids
    p_first = sum(len(n.token_ids) for n in branch.nodes[: sampled[0]])
    assert ids[:p_first] in renders
    assert {tuple(first.token_ids), tuple(last.token_ids)} <= {tuple(v) for v in world.sampled.values()}
    assert mask == [False] * p_first + [True] * len(first.token_ids) + [False] * (
        p_last - p_first - len(first.token_ids)
    ) + [True] * len(last.token_ids)
    assert len(branch.logprobs) == len(ids) and all(lp == 0.0 for lp, m in zip(branch.logprobs, mask) if not m)
    # the run that exits 3: its calls still make a branch; the episode is not ok
    [bad] = exits.traces
    assert not exits.ok and bad.info["tmpl"]["exit_code"] == 3 and bad.stop_condition == "HARNESS_EXITED"
    assert len(bad.branches) == 1
    # verifiers' wire form (what prime-rl's orchestrator reads): the same branches back from JSON
    again = Episode.model_validate_json(ok.model_dump_json())
    [b2] = again.traces[0].branches
    assert (b2.token_ids, b2.sampled_mask) == (ids, mask)


def test_every_training_sequence_of_an_episode_is_a_branch_of_its_own():
    """Sub-agents and branches (which a simple agent does not make): each of the episode's sequences is one
    verifiers branch, its token IDs, mask and logprobs the sequence's; an untrained call's tokens in no mask."""
    import numpy as np
    from verifiers.v1.trace import AgentInfo, TraceTask

    from tmpl.episode import Call, Episode
    from tmpl.harness import HarnessResult
    from tmpl.integrations.verifiers import harness_trace

    ep = Episode(sample_id="br")
    ep.add_call(Call([1, 2, 3], [4, 5], [-0.5, -0.25], id="a", turn=0))
    ep.add_call(Call([7, 8], [9], [-0.125], id="sub", parent="a", agent="explorer"))
    ep.add_call(Call([1, 2, 3, 4, 5, 6], [10], [-0.75], id="b", turn=1))
    ep.add_call(Call([1, 11], [12, 13], [-1.0, -0.5], id="c", turn=2), edit="compaction")
    ep.add_call(Call([20], [21], [-0.5], id="user", agent="simulated-user", trained=False))
    result = HarnessResult(status="HARNESS_DONE", reward=0.5, episode=ep, session="br", harness="h")
    task = TraceTask(type="WeatherTask", data=vf.TaskData(prompt="p"))
    trace = harness_trace(result, task, AgentInfo(config=vf.AgentConfig()), decode=str)
    branches = trace.branches
    assert len(branches) == len(ep.sequences) == 4
    for branch, seq in zip(branches, ep.sequences):
        assert branch.token_ids == seq.ids.tolist()
        assert branch.sampled_mask == [bool(m) for m in seq.mask]
        assert np.allclose(branch.logprobs, seq.logprobs)
    assert not any(branches[-1].sampled_mask)  # the simulated user's call: sampled, never trained
    assert trace.reward == 0.5 and trace.ok
