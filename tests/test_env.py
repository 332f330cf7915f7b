"""Environments (tmpl.env, ``Rollout(env_factory=...)``): turns that are not tool results appended with
an exact suffix (checked against ``apply_chat_template`` at every turn), per-episode tools, rewards,
simulated users recorded untrained, and every environment closed on every end."""

from __future__ import annotations

import asyncio
import functools
import math
import pickle
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tmpl
from tmpl.backends import Backend, Scripted
from tmpl.env import EnvReset, EnvStep, SimulatedUser, ToolEnv
from tmpl.env.turns import turn_suffix
from tmpl.errors import UnsupportedTemplateError
from tmpl.rollout.codes import EndCode
from tmpl.trajectory import Status


def get_time(city: str) -> str:
    """The local time in a city.

    Args:
        city: The city.
    """
    return f"12:00 in {city}"


def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: The city.
    """
    return f"{city}: 21 C, sunny"


SCHEMAS = tmpl.Toolbox([get_time]).schemas


def _ids(tpl, messages, tools=SCHEMAS, gen=True) -> list[int]:
    out = tpl.tokenizer.apply_chat_template(
        messages,
        tools=tools,
        chat_template=tpl.template,
        tokenize=True,
        add_generation_prompt=gen,
        **tpl.template_kwargs,
    )
    return list(out["input_ids"])


def _call(turn: int, city: str) -> dict:
    return {
        "id": f"call{turn}abcd"[:9],
        "type": "function",
        "function": {"name": "get_time", "arguments": {"city": city}},
    }


def _assistant(turn: int, calls: int, reasoning: bool = False) -> dict:
    msg: dict = {"role": "assistant", "content": "" if calls else f"Answer {turn}: it is noon."}
    if reasoning:
        msg["reasoning_content"] = f"Turn {turn}: think."
    if calls:
        msg["tool_calls"] = [_call(turn, c) for c in ("Paris", "Tokyo")[:calls]]
    return msg


class Play:
    """The model and the environment of one scripted episode, sharing the conversation.

    ``plan[t]`` = (assistant turn t, what the environment appends after it or "done"). The model's
    completion is the template's own render of its planned turn; every prompt the rollout sends must
    equal ``apply_chat_template`` of the conversation so far (the suffix of each appended turn is
    therefore the full render's continuation).
    """

    def __init__(self, tpl, plan, opening, reasoning=False):
        self.tpl, self.plan, self.reasoning = tpl, plan, reasoning
        self.history = [dict(m) for m in opening]
        self.checked = 0

    def completion(self, prompt_ids, turn):
        expected = _ids(self.tpl, self.history)
        assert list(prompt_ids) == expected, f"turn {turn}: the prompt is not the template's full render"
        self.checked += 1
        assistant = self.plan[turn][0]
        alone = _ids(self.tpl, self.history + [assistant], gen=False)
        assert alone[: len(expected)] == expected
        end = next(t for t in range(len(expected), len(alone)) if alone[t] in self.tpl.stop_token_ids)
        self.history.append(assistant)
        return alone[len(expected) : end + 1]

    def env_messages(self, turn, assistant):
        after = self.plan[turn][1]
        if after == "done":
            return None
        out = []
        for m in after:
            if m == "results":
                out += [
                    {
                        "role": "tool",
                        "tool_call_id": c["id"],
                        "name": "get_time",
                        "content": get_time(**c["function"]["arguments"]),
                    }
                    for c in assistant["tool_calls"]
                ]
            else:
                out.append(dict(m))
        self.history += out
        return out


class PlayedEnv:
    """An environment that appends what its Play says, with a reward per step."""

    live: set = set()

    def __init__(self, plays):
        self.plays = plays

    def reset(self, task):
        self.play = self.plays[task]
        self.turn = 0
        PlayedEnv.live.add(self)
        return EnvReset(messages=[dict(m) for m in self.play.history], tools=[get_time], state={"task": task})

    def step(self, assistant):
        messages = self.play.env_messages(self.turn, assistant)
        self.turn += 1
        if messages is None:
            return EnvStep(messages=[], reward=1.0, done=True, info={"turns": self.turn})
        return EnvStep(messages=messages, reward=0.25)

    def close(self):
        PlayedEnv.live.discard(self)


def _play(tpl, plays, **kw):
    def policy(request):
        i, _, turn = request.request_id.split("-")[:3]
        return plays[int(i)].completion(request.prompt_ids, int(turn))

    rollout = tmpl.Rollout(tpl, Scripted(policy), env_factory=functools.partial(PlayedEnv, plays), **kw)
    return rollout, rollout.run(list(range(len(plays))))


USER = {"role": "user", "content": 'And in "Rome"?\n  Be brief. é 漢字'}
SYSTEM = {"role": "system", "content": "Reminder: answer in one line."}
DEVELOPER = {"role": "developer", "content": "Developer note: keep it short."}
OPENING = [
    {"role": "system", "content": "You tell the time."},
    {"role": "user", "content": "What time is it in Paris?"},
]

PLANS = {  # family -> the plan (assistant turn, what the environment appends)
    "qwen2.5-instruct": [
        (_assistant(0, 1), ["results"]),
        (_assistant(1, 0), [USER]),
        (_assistant(2, 2), ["results", SYSTEM]),
        (_assistant(3, 0), [SYSTEM, USER]),
        (_assistant(4, 0), "done"),
    ],
    "llama-3.2-instruct": [
        (_assistant(0, 1), ["results"]),
        (_assistant(1, 0), [USER]),
        (_assistant(2, 0), [SYSTEM, USER]),
        (_assistant(3, 0), "done"),
    ],
    "gemma-4-it": [
        (_assistant(0, 1), ["results"]),
        (_assistant(1, 0), [USER]),
        (_assistant(2, 0), [SYSTEM, USER]),
        (_assistant(3, 0), [DEVELOPER]),
        (_assistant(4, 0), "done"),
    ],
    # Qwen3 drops the reasoning of assistant turns before the last user query: system turns after tool
    # results keep it (exact in append mode); a user turn is refused below, and rendered in template mode
    "qwen3": [
        (_assistant(0, 2, True), ["results", SYSTEM]),
        (_assistant(1, 1, True), ["results"]),
        (_assistant(2, 0, True), "done"),
    ],
}


@pytest.mark.parametrize("family", list(PLANS))
def test_environment_turns_equal_full_renders_at_every_turn(twin, family, tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of(family), name=family)
    plan = PLANS[family]
    plays = [Play(tpl, plan, OPENING), Play(tpl, plan, [OPENING[1]])]
    _, results = _play(tpl, plays, max_turns=len(plan), verify_every=1)
    for r, play in zip(results, plays):
        assert r.code is EndCode.ENV_DONE and r.trajectory.status is Status.DONE, (r.code, r.trajectory.reason)
        assert play.checked == len(plan)  # every prompt was the full render of the conversation so far
        assert r.env_reward == pytest.approx(0.25 * (len(plan) - 1) + 1.0)
        assert r.env_info == {"turns": len(plan)} and r.env_state["task"] in (0, 1)
        assert r.turns == len(plan) and r.unverified == 0
        assert r.tool_calls == sum(len(a.get("tool_calls", [])) for a, _ in plan)
        assert r.episode.reward == r.env_reward  # the episode carries the environment's reward
    assert not PlayedEnv.live


def test_qwen3_refuses_a_user_turn_after_a_reasoning_turn_and_template_mode_renders_it(tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of("qwen3"), name="qwen3")
    plan = [(_assistant(0, 1, True), ["results"]), (_assistant(1, 0, True), [USER]), (_assistant(2, 0, True), "done")]
    _, [r] = _play(tpl, [Play(tpl, plan, OPENING)], max_turns=3)
    assert r.code is EndCode.SUFFIX_FAILED and r.trajectory.status is Status.ABORTED
    assert "differently once a user turn follows it" in r.trajectory.reason
    assert "<think>\\nTurn 0: think." in r.trajectory.reason  # the counterexample: the reasoning the render drops
    assert not PlayedEnv.live

    # template mode renders every prompt: the user turn goes in, reasoning dropped as the template drops it
    play = Play(tpl, plan, OPENING)
    _, [r] = _play(tpl, [play], max_turns=3, history="template")
    assert r.code is EndCode.ENV_DONE and play.checked == 3, r.trajectory.reason
    assert len(r.sequences) == 2  # the render rewrote the earlier turns: a branch starts at the user turn
    assert not PlayedEnv.live


# -- the suffix of non-tool turns, searched ----------------------------------------------------------
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
TURNS = st.lists(st.tuples(st.sampled_from(["user", "system", "developer"]), TEXT), min_size=1, max_size=3)


@pytest.mark.parametrize("family", ["qwen2.5-instruct", "llama-3.2-instruct", "gemma-4-it", "phi-4-mini-instruct"])
def test_searched_turns_after_an_answer_or_tool_results_are_the_full_renders_continuation(family, tokenizer_of):
    """Generated user / system / developer turns (after a final answer, or after tool results): prompt +
    completion + suffix equals the tokenizer's full render, or the template refuses the turn by name."""
    tok = tokenizer_of(family)
    tpl = tmpl.ChatTemplate(tok, name=family)
    opening = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Time in Paris?"}]
    refused = []

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(turns=TURNS, after_tools=st.booleans(), result=TEXT)
    def check(turns, after_tools, result):
        assistant = _assistant(0, 1) if after_tools else _assistant(0, 0)
        prompt = _ids(tpl, opening)
        alone = _ids(tpl, opening + [assistant], gen=False)
        end = next(t for t in range(len(prompt), len(alone)) if alone[t] in tpl.stop_token_ids)
        completion = alone[len(prompt) : end + 1]
        new = (
            [{"role": "tool", "tool_call_id": "call0abcd", "name": "get_time", "content": result}]
            if after_tools
            else []
        )
        new += [{"role": r, "content": c} for r, c in turns]
        try:
            suffix = turn_suffix(tpl, opening, assistant, completion, new, SCHEMAS)
        except (UnsupportedTemplateError, tmpl.errors.TemplateRenderError) as exc:
            refused.append(str(exc))
            return
        assert prompt + completion + suffix == _ids(tpl, opening + [assistant] + new)

    check()
    assert len(refused) < 25, refused[:3]  # most generated turns are rendered


def test_a_template_that_rewrites_the_prompt_after_a_user_turn_is_refused_with_the_place(tokenizer_of):
    """Mistral Nemo moves the system message to the last user turn: no exact continuation exists."""
    tpl = tmpl.ChatTemplate(tokenizer_of("mistral-nemo-instruct-2407"), name="mistral")
    opening = [{"role": "system", "content": "Be nice."}, {"role": "user", "content": "Hi"}]
    assistant = {"role": "assistant", "content": "Hello!"}
    completion = tpl.codec.encode("Hello!") + [tpl.tokenizer.eos_token_id]
    with pytest.raises(UnsupportedTemplateError, match="conversation before the assistant turn differently") as err:
        turn_suffix(tpl, opening, assistant, completion, [{"role": "user", "content": "Rome?"}])
    assert "Be nice." in str(err.value)  # where: the system message the render moved


# -- per-episode tools, async environments, streams --------------------------------------------------
class ToolsPerTask:
    """An async environment whose tools depend on the task: its schemas go into that sample's prompt."""

    async def reset(self, task):
        tools = [get_time] if task == 0 else [get_weather]
        return EnvReset(messages=[{"role": "user", "content": f"task {task}"}], tools=tools)

    async def step(self, assistant):
        self.seen = assistant
        await asyncio.sleep(0)
        return EnvStep(messages=[], reward=float(len(assistant.get("tool_calls") or [])), done=True)

    async def close(self):
        pass


def test_each_episode_renders_and_parses_its_own_tools(tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"), name="q")
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>'

    def policy(request):
        return tpl.codec.encode(call)

    backend = Scripted(policy)
    results = tmpl.Rollout(tpl, backend, env_factory=ToolsPerTask).run([0, 1])
    prompts = {r.request_id.split("-")[0]: tpl.codec.decode(list(r.prompt_ids)) for r in backend.requests}
    assert '"name": "get_time"' in prompts["0"] and "get_weather" not in prompts["0"]
    assert '"name": "get_weather"' in prompts["1"] and "get_time" not in prompts["1"]
    assert [
        _ids(tpl, [{"role": "user", "content": f"task {i}"}], tools=tmpl.Toolbox([t]).schemas)
        for i, t in enumerate([get_time, get_weather])
    ] == [list(r.trajectory.prompt_ids) for r in results]
    assert [r.code for r in results] == [EndCode.ENV_DONE] * 2
    # sample 1 has the tool: a call with its typed arguments; sample 0's parser does not know get_weather
    assert results[1].messages[-1]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": {"city": "Oslo"},
    }
    assert results[1].env_reward == 1.0


def test_streams_run_environments(tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"), name="q")
    plays = [Play(tpl, PLANS["qwen2.5-instruct"], OPENING) for _ in range(3)]

    def policy(request):
        i, _, turn = request.request_id.split("-")[:3]
        return plays[int(i)].completion(request.prompt_ids, int(turn))

    rollout = tmpl.Rollout(tpl, Scripted(policy), env_factory=functools.partial(PlayedEnv, plays), max_turns=5)
    groups = list(rollout.stream_sync([0, 1, 2], max_in_flight=2))
    assert sorted(g[0].index for g in groups) == [0, 1, 2]
    assert all(g[0].code is EndCode.ENV_DONE and g[0].env_reward == 2.0 for g in groups)
    assert not PlayedEnv.live


# -- simulated users -------------------------------------------------------------------------------
def test_tool_env_with_a_function_user_and_reward(tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"), name="q")
    answers = iter(["Thanks. And Tokyo?", None])
    made = []

    def factory():
        env = ToolEnv([get_time], user=lambda messages: next(answers), reward=lambda messages: len(messages) / 10)
        made.append(env)
        return env

    turns = [
        '<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
        "It is noon.<|im_end|>",
        "Noon there too.<|im_end|>",
    ]

    def policy(request):
        return tpl.codec.encode(turns[int(request.request_id.split("-")[2])])

    [r] = tmpl.Rollout(tpl, Scripted(policy), env_factory=factory, verify_every=1).run(["What time is it in Paris?"])
    assert r.code is EndCode.ENV_DONE, r.trajectory.reason
    assert [m["role"] for m in r.messages] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert r.messages[2]["content"] == "12:00 in Paris" and r.messages[4]["content"] == "Thanks. And Tokyo?"
    assert r.env_reward == pytest.approx(0.6)
    full = _ids(tpl, r.messages[:5]) + tpl.codec.encode(turns[2])
    assert r.trajectory.prompt_ids.tolist() + r.trajectory.completion_ids.tolist() == full
    assert made[0].closed


def test_a_simulated_user_is_a_model_call_of_the_episode_untrained(tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"), name="q")
    replies = iter(["I mean Tokyo.<|im_end|>", "###STOP###<|im_end|>"])
    user_backend = Scripted(lambda request: tpl.codec.encode(next(replies)))
    user = SimulatedUser(user_backend, tpl, instructions="You want the time in Tokyo.")
    agent = Scripted(lambda request: tpl.codec.encode("It is noon.<|im_end|>"))
    rollout = tmpl.Rollout(tpl, agent, env_factory=lambda: ToolEnv(None, user=user), verify_every=1)
    [r] = rollout.run(["What time is it?"])
    assert r.code is EndCode.ENV_DONE and r.turns == 2, r.trajectory.reason
    assert r.messages[2] == {"role": "user", "content": "I mean Tokyo."}
    # the simulator saw the conversation from its side: its instructions, its own turn as the assistant's
    first = user_backend.requests[0]
    assert list(first.prompt_ids) == _ids(
        tpl,
        [
            {"role": "system", "content": "You want the time in Tokyo."},
            {"role": "assistant", "content": "What time is it?"},
            {"role": "user", "content": "It is noon."},
        ],
        tools=None,
    )
    calls = [c for c in r.episode.calls if c.agent == "simulated-user"]
    assert len(calls) == 2 and not any(c.trained for c in calls)
    policy_seq = [s for s in r.sequences if s.mask.sum() > 0]
    assert len(policy_seq) == 1  # the simulator's sequences are all mask 0
    assert sum(int(s.mask.sum()) for s in r.sequences) == int(r.mask.sum())
    assert r.from_calls  # exports carry the episode with the simulator's calls


# -- closing on every end, bad environments --------------------------------------------------------
class Counted:
    """Counts live environments; ``fail`` names the method that raises, ``answer`` what step returns."""

    live = 0
    closed = 0
    lock = threading.Lock()

    def __init__(self, fail=None, answer=None):
        self.fail, self.answer = fail, answer
        with Counted.lock:
            Counted.live += 1

    def reset(self, task):
        if self.fail == "reset":
            raise ConnectionError("the sandbox did not start")
        return EnvReset(messages=[{"role": "user", "content": str(task)}])

    def step(self, assistant):
        if self.fail == "step":
            raise KeyError("missing order")
        return self.answer if self.answer is not None else EnvStep(messages=[{"role": "user", "content": "more"}])

    def close(self):
        with Counted.lock:
            Counted.live -= 1
            Counted.closed += 1
        if self.fail == "close":
            raise OSError("could not remove the scratch dir")


@pytest.fixture
def counted():
    Counted.live = Counted.closed = 0
    yield Counted
    assert Counted.live == 0


def _answers(tpl):
    return Scripted(lambda request: tpl.codec.encode("Done.<|im_end|>"))


@pytest.mark.parametrize(
    ("fail", "answer", "code", "error"),
    [
        ("reset", None, EndCode.ENV_FAILED, "EnvError: sample '0/0': Counted.reset raised ConnectionError"),
        ("step", None, EndCode.ENV_FAILED, "EnvError: sample '0/0': Counted.step raised KeyError"),
        ("close", EnvStep(messages=[], done=True), EndCode.ENV_FAILED, "Counted.close raised OSError"),
        (
            None,
            EnvStep(messages=[{"role": "robot", "content": "beep"}]),
            EndCode.ENV_REJECTED,
            "EnvMessageError: sample '0/0': Counted.step messages[0]: role 'robot' cannot follow an assistant turn",
        ),
        (None, EnvStep(messages=[{"role": "user"}]), EndCode.ENV_REJECTED, "a user message needs 'content'"),
        (
            None,
            EnvStep(messages=[{"role": "tool", "content": "x"}]),
            EndCode.ENV_REJECTED,
            "1 tool result(s) for an assistant turn with 0 tool call(s)",
        ),
        (None, [{"role": "user", "content": "not an EnvStep"}], EndCode.ENV_REJECTED, "returned list, not an EnvStep"),
        (
            None,
            EnvStep(messages=[], reward=math.nan, done=True),
            EndCode.ENV_REJECTED,
            "EnvRewardError: sample '0/0': Counted.step reward nan is not a finite number",
        ),
        (
            None,
            EnvStep(messages=[], reward="1.0", done=True),
            EndCode.ENV_REJECTED,
            "reward '1.0' is not a finite number",
        ),
    ],
)
def test_a_bad_environment_ends_its_sample_by_name_and_is_closed(counted, tokenizer_of, fail, answer, code, error):
    tpl = tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"), name="q")
    rollout = tmpl.Rollout(tpl, _answers(tpl), env_factory=lambda: Counted(fail, answer))
    r, good = rollout.run([0, 1]) if fail is None else (rollout.run([0])[0], None)
    assert r.code is code and r.trajectory.status is Status.ABORTED
    assert error in r.env_error and error in r.trajectory.reason
    assert counted.closed == (2 if fail is None else 1)


def test_a_factory_that_raises_ends_the_sample(counted, tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"), name="q")

    def broken():
        raise RuntimeError("no database")

    [r] = tmpl.Rollout(tpl, _answers(tpl), env_factory=broken).run([0])
    assert r.code is EndCode.ENV_FAILED and "broken.factory raised RuntimeError: no database" in r.env_error


def test_an_environment_that_never_ends_is_ended_by_max_turns(counted, tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"), name="q")
    [r] = tmpl.Rollout(tpl, _answers(tpl), env_factory=Counted, max_turns=3).run([0])
    assert r.code is EndCode.MAX_TURNS and r.turns == 3 and r.trajectory.status is Status.TRUNCATED
    assert counted.closed == 1


def test_truncated_and_budget_ends_close_the_environment(counted, tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"), name="q")
    rollout = tmpl.Rollout(tpl, _answers(tpl), env_factory=lambda: Counted(answer=EnvStep(messages=[], truncated=True)))
    [r] = rollout.run([0])
    assert r.code is EndCode.ENV_TRUNCATED and r.trajectory.status is Status.TRUNCATED
    long = Scripted(lambda request: tpl.codec.encode("word " * 50))  # never stops: the turn limit ends it
    [r] = tmpl.Rollout(tpl, long, env_factory=Counted, max_tokens_per_turn=8).run([0])
    assert r.code is EndCode.TURN_LIMIT
    assert counted.closed == 2


class Slow(Backend):
    """Every request hangs until cancelled."""

    batching = False

    def __init__(self):
        self.holding = 0

    async def agenerate(self, request):
        self.holding += 1
        await asyncio.sleep(3600)
        raise AssertionError("never answered")


class AsyncCounted(Counted):
    async def close(self):  # an async close that yields, under cancellation
        await asyncio.sleep(0)
        Counted.close(self)


@pytest.mark.parametrize("kind", [Counted, AsyncCounted])
def test_cancelling_256_running_samples_closes_every_environment(counted, tokenizer_of, kind):
    tpl = tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"), name="q")
    backend = Slow()
    rollout = tmpl.Rollout(tpl, backend, env_factory=kind, max_concurrency=256)

    async def go():
        task = asyncio.create_task(rollout.run_async(list(range(256))))
        while backend.holding < 256:
            await asyncio.sleep(0.01)
        assert Counted.live == 256
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert Counted.live == 0 and Counted.closed == 256


def test_a_crash_in_the_loop_closes_the_environment(counted, tokenizer_of, monkeypatch):
    tpl = tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"), name="q")
    rollout = tmpl.Rollout(tpl, _answers(tpl), env_factory=Counted)

    def boom(*args, **kwargs):
        raise ZeroDivisionError("bug")

    monkeypatch.setattr("tmpl.rollout.envs.turn_suffix_text", boom)
    [r] = rollout.run([0])
    assert r.code is EndCode.CRASHED and "ZeroDivisionError: bug" in r.trajectory.reason
    assert counted.closed == 1


def test_distributed_rollout_needs_a_picklable_env_factory():
    settings_ = tmpl.rollout.RolloutSettings("x", "http://127.0.0.1:1", options={"env_factory": lambda: None})
    with pytest.raises(tmpl.errors.WorkerSetupError, match="env_factory does not pickle"):
        tmpl.DistributedRollout(settings_, workers=1, mode="process")
    pickle.dumps(functools.partial(ToolEnv, [get_time]))  # what works: a partial of module-level names


def test_closing_a_stream_early_closes_the_environments_of_its_running_samples(counted, tokenizer_of):
    import contextlib

    tpl = tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"), name="q")
    done = tpl.codec.encode("Done.<|im_end|>")

    class FirstAnswers(Slow):
        async def agenerate(self, request):
            if request.request_id.startswith("0-"):
                return tmpl.backends.GenerationResult(request.request_id, done, [-0.1] * len(done), "stop")
            return await Slow.agenerate(self, request)

    answer = EnvStep(messages=[], done=True)
    rollout = tmpl.Rollout(tpl, FirstAnswers(), env_factory=lambda: Counted(answer=answer))

    async def go():
        async with contextlib.aclosing(rollout.stream(list(range(5)))) as groups:
            async for group in groups:
                assert group[0].index == 0 and group[0].code is EndCode.ENV_DONE
                break  # the consumer stops: the stream cancels the other four samples

    asyncio.run(go())
    assert Counted.live == 0 and Counted.closed == 5


# -- DistributedRollout: environments in the workers; a worker stopped by SIGTERM closes its own ----------
class Marked:
    """An environment that leaves a file while open (it lives in a worker process)."""

    def __init__(self, folder):
        self.folder = folder

    def reset(self, task):
        import os

        self.path = os.path.join(self.folder, f"{os.getpid()}-{task}-{id(self)}")
        open(self.path, "w").close()
        return EnvReset(messages=[{"role": "user", "content": str(task)}], state={"pid": os.getpid(), "task": task})

    def step(self, assistant):
        return EnvStep(messages=[], reward=0.5, done=True)

    def close(self):
        import os

        os.remove(self.path)


class HoldWhileFile(Backend):
    """Answers "Done." once ``hold`` is gone; until then every request waits."""

    batching = False

    def __init__(self, hold, answer):
        self.hold, self.answer = hold, answer

    async def agenerate(self, request):
        import os

        while os.path.exists(self.hold):
            await asyncio.sleep(0.05)
        return tmpl.backends.GenerationResult(request.request_id, self.answer, [-0.1] * len(self.answer), "stop")


def make_marked_rollout(folder, hold):
    """A worker's Rollout (module level: pickled by reference to the worker)."""
    from .conftest import load_tokenizer

    tpl = tmpl.ChatTemplate(load_tokenizer("qwen2.5-instruct"), name="q")
    backend = HoldWhileFile(hold, tpl.codec.encode("Done.<|im_end|>"))
    return tmpl.Rollout(tpl, backend, env_factory=functools.partial(Marked, folder), progress=False)


def test_distributed_environments_close_when_a_worker_is_stopped_and_run_again(tmp_path):
    """Six episodes open in a worker; SIGTERM: the worker cancels its shard, closing all six, and dies; the
    shard runs again on a fresh worker, whose environments end the episodes (results with their rewards
    and states come back) and close."""
    import os
    import signal
    import time

    envs, hold = tmp_path / "envs", tmp_path / "hold"
    envs.mkdir()
    hold.touch()
    factory = functools.partial(make_marked_rollout, str(envs), str(hold))
    runner = tmpl.DistributedRollout(factory, workers=1, mode="process", max_restarts=1, shard_size=6)
    try:

        async def go():
            task = asyncio.create_task(runner.run_async(list(range(6))))
            deadline = time.monotonic() + 120
            while len(os.listdir(envs)) < 6:  # all six episodes open, waiting on the backend
                assert time.monotonic() < deadline and not task.done(), "the worker did not open its environments"
                await asyncio.sleep(0.05)
            [pid] = runner.pids()
            os.kill(pid, signal.SIGTERM)
            while runner.pids()[0] in (pid, None) or os.listdir(envs):  # closed before it ended; a new one opens
                assert time.monotonic() < deadline and not task.done(), os.listdir(envs)
                if not os.listdir(envs) and runner.pids()[0] not in (pid, None):
                    break
                await asyncio.sleep(0.05)
            assert not [f for f in os.listdir(envs) if f.startswith(f"{pid}-")]  # the stopped worker's: closed
            hold.unlink()
            return pid, await task

        stopped, results = asyncio.run(go())
        assert runner.deaths and runner.attempts == [2]
        assert [r.code for r in results] == [EndCode.ENV_DONE] * 6
        assert all(r.env_reward == 0.5 and r.env_state["pid"] != stopped for r in results)
        assert os.listdir(envs) == []  # the second worker's environments closed too
    finally:
        runner.close()


def test_a_retried_sample_gets_a_fresh_environment(counted, tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"), name="q")
    done = tpl.codec.encode("Done.<|im_end|>")

    def policy(request):  # the first attempt's generation fails; the retry answers
        if request.request_id.endswith("-r1"):
            return tmpl.backends.GenerationResult(request.request_id, done, [-0.1] * len(done), "stop")
        return tmpl.backends.GenerationResult.failed(request.request_id, "server restarted")

    answer = EnvStep(messages=[], reward=1.0, done=True)
    rollout = tmpl.Rollout(tpl, Scripted(policy), env_factory=lambda: Counted(answer=answer), sample_retries=1)
    [r] = rollout.run([0])
    assert r.code is EndCode.ENV_DONE and r._attempts == 2 and r.env_reward == 1.0
    assert counted.closed == 2  # the failed attempt's environment was closed, the retry had its own
