"""The generation loop: exact IDs at every turn, masks, logprobs, statuses, faults, drift."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest
import torch

import tmpl
from tmpl.backends import Backend, GenerationResult, Sampling, Scripted, Torch, VLLMServer

from .vllm_standin import StandinServer


def get_weather(city: str) -> str:
    """Current weather.

    Args:
        city: The city.
    """
    return f"{city}: 21 C, sunny"


def get_time(city: str, timezone: str) -> str:
    """Local time.

    Args:
        city: The city.
        timezone: IANA zone.
    """
    return f"12:00 in {city} ({timezone})"


def search_web(query: str, max_results: int) -> str:
    """Search.

    Args:
        query: What to look for.
        max_results: How many.
    """
    return f"{max_results} results for {query!r}"


FUNCS = [get_weather, get_time, search_web]
SCHEMAS = tmpl.Toolbox(FUNCS).schemas  # what the rollout renders with
ARGS = [{"city": "Paris"}, {"city": "Tokyo", "timezone": "Asia/Tokyo"}, {"query": "rain", "max_results": 2}]


def _ids(tpl, messages, gen: bool) -> list[int]:
    out = tpl.tokenizer.apply_chat_template(
        messages,
        tools=SCHEMAS,
        chat_template=tpl.template,
        tokenize=True,
        add_generation_prompt=gen,
        **tpl.template_kwargs,
    )
    return list(out["input_ids"])


class ScriptedConversation:
    """The policy of one conversation: turn t makes ``calls[t]`` tool calls (0: final answer).

    Each completion is what the template renders for that assistant turn, so the loop's
    sequence must equal the template's full render of the conversation at every turn.
    """

    def __init__(self, tpl, user: str, calls: list[int], reasoning: bool = False):
        self.tpl = tpl
        self.history = [{"role": "user", "content": user}]
        self.plan = calls
        self.reasoning = reasoning
        self.turn_prompts: list[list[int]] = []  # the template's render before each turn
        self.completion_lengths: list[int] = []

    def assistant(self, turn: int) -> dict:
        k = self.plan[turn]
        msg: dict = {"role": "assistant", "content": "" if k else "All done: it is sunny."}
        if self.reasoning:
            msg["reasoning_content"] = f"Turn {turn}: think about the tools."
        if k:
            msg["tool_calls"] = [
                {
                    "id": f"t{turn}c{i}abcde"[:9],
                    "type": "function",
                    "function": {"name": FUNCS[i % 3].__name__, "arguments": ARGS[i % 3]},
                }
                for i in range(k)
            ]
        return msg

    def completion(self, turn: int) -> list[int]:
        prompt = _ids(self.tpl, self.history, True)
        self.turn_prompts.append(prompt)
        assistant = self.assistant(turn)
        alone = _ids(self.tpl, self.history + [assistant], False)
        assert alone[: len(prompt)] == prompt
        stops = self.tpl.stop_token_ids
        end = next(t for t in range(len(prompt), len(alone)) if alone[t] in stops)
        self.history.append(assistant)
        for i, call in enumerate(assistant.get("tool_calls", [])):
            fn = FUNCS[i % 3]
            self.history.append(
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "name": fn.__name__,
                    "content": fn(**call["function"]["arguments"]),
                }
            )
        self.completion_lengths.append(end + 1 - len(prompt))
        return alone[len(prompt) : end + 1]


FAMILIES = {  # family -> (plan of calls per turn, reasoning)
    "qwen2.5-instruct": ([1, 2, 0], False),
    "qwen3": ([2, 1, 0], True),
    "llama-3.2-instruct": ([1, 1, 0], False),
    "gemma-4-it": ([2, 1, 0], False),
    "mistral-nemo-instruct-2407": ([2, 3, 0], False),
    "gpt-oss": ([1, 1, 0], False),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_scripted_multi_turn_equals_full_renders_at_every_turn(twin, family, tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of(family), name=family)
    plan, reasoning = FAMILIES[family]
    users = ["What is the weather in Paris?", "Plan my day in Tokyo."]
    scripts = [ScriptedConversation(tpl, u, plan, reasoning) for u in users]

    def policy(request):
        i, _, turn = request.request_id.split("-")
        script = scripts[int(i)]
        assert list(request.prompt_ids) == _ids(tpl, script.history, True), f"turn {turn}: input drifted"
        return script.completion(int(turn))

    rollout = tmpl.Rollout(
        tpl, Scripted(policy), tools=FUNCS, max_turns=5, max_length=8192, max_completion_length=4096, measure_drift=True
    )
    results = rollout.run([[{"role": "user", "content": u}] for u in users])
    for script, res in zip(scripts, results):
        assert res.status.name == "DONE", res.reason
        assert res.turns == len(plan) and len(script.turn_prompts) == len(plan)
        final = _ids(tpl, script.history, False)
        sequence = res.prompt_ids.tolist() + res.completion_ids.tolist()
        assert final[: len(sequence)] == sequence  # the whole sample is the template's render
        assert len(res.completion_ids) == len(res.mask) == len(res.logprobs)
        assert res.tool_calls == sum(plan) and res.tool_failures == 0
        # mask 1 exactly on the model's completions, 0 on what tmpl appended
        expected = [0] * len(res.mask)
        for prompt, n in zip(script.turn_prompts, script.completion_lengths):
            start = len(prompt) - res.prompt_ids.size
            expected[start : start + n] = [1] * n
        assert res.mask.tolist() == expected
        assert all(lp == 0.0 for lp, m in zip(res.logprobs.tolist(), expected) if not m)
        assert res.drift is False or family in ("qwen3", "gemma-4-it", "gpt-oss")
        assert (res.drift_detail is not None) == res.drift  # every drifted sample says where and why
    assert rollout.metrics.done == len(users) and rollout.metrics.tool_calls == len(users) * sum(plan)


def test_torch_end_to_end_logprobs_match_a_forward_pass(tiny_qwen2):
    model, tok = tiny_qwen2
    tpl = tmpl.ChatTemplate(tok, name="qwen2.5")
    rollout = tmpl.Rollout(
        tpl,
        Torch(model),
        tools=FUNCS,
        max_turns=2,
        max_length=512,
        max_completion_length=48,
        max_tokens_per_turn=24,
        sampling=Sampling(temperature=1.0, n=2, seed=11),
    )
    convs = [[{"role": "user", "content": "Weather in Paris?"}], [{"role": "user", "content": "Hi"}]]
    results = rollout.run(convs)
    assert [(r.index, r.sample) for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in results:
        assert len(r.completion_ids) == len(r.mask) == len(r.logprobs) > 0
        assert r.status.name in ("DONE", "TRUNCATED")
        seq = torch.tensor([r.prompt_ids.tolist() + r.completion_ids.tolist()])
        with torch.no_grad():
            logits = model(seq).logits[0].float()
        lp = torch.log_softmax(logits, -1)
        p = r.prompt_ids.size
        for t in range(len(r.completion_ids)):
            if r.mask[t]:
                assert lp[p + t - 1, r.completion_ids[t]].item() == pytest.approx(float(r.logprobs[t]), abs=1e-4)
            else:
                assert r.logprobs[t] == 0.0
    m = rollout.metrics
    assert m.samples == 4 and m.engine_time > 0 and m.tokens_generated == sum(int(r.mask.sum()) for r in results)


# -- faults -----------------------------------------------------------------------------------


def _tpl(tokenizer_of):
    return tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"), name="qwen2.5")


def test_missing_logprobs_abort_the_sample_not_the_batch(tokenizer_of):
    tpl = _tpl(tokenizer_of)
    end = tpl.codec.encode("Sure.<|im_end|>")

    def policy(req):
        i = int(req.request_id.split("-")[0])
        return GenerationResult(req.request_id, end, None if i == 1 else [-0.1] * len(end), "stop")

    results = tmpl.Rollout(tpl, Scripted(policy)).run([[{"role": "user", "content": f"q{i}"}] for i in range(3)])
    assert [r.status.name for r in results] == ["DONE", "ABORTED", "DONE"]
    assert "logprob" in results[1].reason.lower()
    assert len(results[1].completion_ids) == 0  # nothing appended, never re-tokenized


def test_backend_error_on_one_request(tokenizer_of):
    tpl = _tpl(tokenizer_of)
    end = tpl.codec.encode("Sure.<|im_end|>")

    def policy(req):
        if req.request_id.startswith("2-"):
            return GenerationResult.failed(req.request_id, "CUDA error: device-side assert")
        return end

    rollout = tmpl.Rollout(tpl, Scripted(policy))
    results = rollout.run([[{"role": "user", "content": f"q{i}"}] for i in range(4)])
    assert [r.status.name for r in results] == ["DONE", "DONE", "ABORTED", "DONE"]
    assert "device-side assert" in results[2].reason
    assert rollout.metrics.aborted == 1


def test_dropping_server_is_retried_and_dead_servers_abort(tokenizer_of):
    tpl = _tpl(tokenizer_of)
    end = tpl.codec.encode("Sure.<|im_end|>")
    with StandinServer(Scripted(lambda r: end), drop_first=2) as flaky:
        backend = VLLMServer([flaky.url], retries=3, backoff=0.01, timeout=10)
        results = tmpl.Rollout(tpl, backend).run([[{"role": "user", "content": f"q{i}"}] for i in range(3)])
    assert all(r.status.name == "DONE" and r.completion_ids.tolist() == end for r in results)
    dead = VLLMServer(["http://127.0.0.1:9"], retries=1, backoff=0.0, timeout=5)
    [r] = tmpl.Rollout(tpl, dead).run([[{"role": "user", "content": "q"}]])
    assert r.status.name == "ABORTED" and "cannot connect" in r.reason


def test_budgets_and_turn_limits(tokenizer_of):
    tpl = _tpl(tokenizer_of)
    call = tpl.codec.encode(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    )
    always_call = Scripted(lambda r: call)
    [r] = tmpl.Rollout(tpl, always_call, tools=FUNCS, max_turns=3).run([[{"role": "user", "content": "q"}]])
    assert r.status.name == "TRUNCATED" and "max_turns=3" in r.reason and r.turns == 3
    [r] = tmpl.Rollout(
        tpl, always_call, tools=FUNCS, max_turns=8, max_length=10_000, max_completion_length=len(call) + 10
    ).run([[{"role": "user", "content": "q"}]])
    assert r.status.name == "TRUNCATED" and r.trajectory.tokens_cut > 0  # the tool suffix overflowed
    assert len(r.completion_ids) == len(call) + 10 == len(r.mask) == len(r.logprobs)


def test_drift_is_measured_on_the_seed_completion(tokenizer_of):
    from .test_suffix_engine import SEED_COMPLETION

    tpl = _tpl(tokenizer_of)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "multiply_tool",
                "description": "a*b",
                "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
            },
        }
    ]

    def multiply_tool(a: int, b: int) -> int:
        """Multiply.

        Args:
            a: a
            b: b
        """
        return a * b

    final = tpl.codec.encode("It is 12.<|im_end|>")
    policy = Scripted(lambda r: SEED_COMPLETION if r.request_id.endswith("-0") else final)
    rollout = tmpl.Rollout(tpl, policy, tools=[multiply_tool], measure_drift=True)
    [r] = rollout.run([[{"role": "user", "content": "3 times 4?"}]])
    assert r.status.name == "DONE" and r.completion_ids.tolist()[:47] == SEED_COMPLETION
    assert r.messages[2] == {
        "role": "tool",
        "tool_call_id": r.messages[1]["tool_calls"][0]["id"],
        "name": "multiply_tool",
        "content": "12",
    }
    assert r.drift is True and rollout.metrics.drift_rate == 1.0
    assert r.drift_detail.cause.value in rollout.metrics.drift_causes
    del tools


def test_samples_do_not_wait_for_each_other(tokenizer_of):
    """A slow tool holds back only its own sample: other samples' turns run in the meantime."""
    tpl = _tpl(tokenizer_of)

    async def slow(city: str) -> str:
        """Slow weather.

        Args:
            city: The city.
        """
        await asyncio.sleep(0.6)
        return "slow"

    def fast(city: str) -> str:
        """Fast weather.

        Args:
            city: The city.
        """
        return "fast"

    slow_call = tpl.codec.encode('<tool_call>\n{"name": "slow", "arguments": {"city": "A"}}\n</tool_call><|im_end|>')
    fast_call = tpl.codec.encode('<tool_call>\n{"name": "fast", "arguments": {"city": "B"}}\n</tool_call><|im_end|>')
    final = tpl.codec.encode("Done.<|im_end|>")
    batches = []

    class Recording(Scripted):
        def generate_batch(self, requests):
            batches.append(sorted(r.request_id for r in requests))
            return super().generate_batch(requests)

    def policy(r):
        i, _, turn = r.request_id.split("-")
        if int(turn) >= 3:
            return final
        return slow_call if i == "0" else fast_call

    start = time.perf_counter()
    results = tmpl.Rollout(tpl, Recording(policy), tools=[slow, fast], max_turns=5).run(
        [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]
    )
    assert all(r.status.name == "DONE" for r in results)
    # sample 1 went through turns 1..3 while sample 0 waited on its slow tool: no per-turn barrier
    assert any(b == ["1-0-2"] or b == ["1-0-1"] for b in batches), batches
    assert time.perf_counter() - start < 3 * 0.6 + 1.5


def test_a_retried_sample_starts_clean(tokenizer_of):
    """slime-retool's stale-state bug: a retried sample must not keep the failed attempt's tokens."""
    tpl = _tpl(tokenizer_of)
    call = tpl.codec.encode(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    )
    final = tpl.codec.encode("Sunny.<|im_end|>")

    def policy(req):
        parts = req.request_id.split("-")
        if parts[2] == "1" and len(parts) == 3:  # first attempt fails on its second turn
            return GenerationResult.failed(req.request_id, "engine restarted")
        return call if parts[2] == "0" else final

    rollout = tmpl.Rollout(tpl, Scripted(policy), tools=FUNCS, sample_retries=1)
    [r] = rollout.run([[{"role": "user", "content": "weather?"}]])
    assert r.status.name == "DONE" and r.attempts == 2 and r.metrics["attempts"] == 2
    # exactly one first turn, its tool result, and the final answer: nothing stale from attempt 1
    assert r.completion_ids.tolist()[: len(call)] == call
    assert r.completion_ids.tolist()[-len(final) :] == final
    assert int(r.mask.sum()) == len(call) + len(final) and r.turns == 2
    assert len(r.spans) == 3 and len(r.messages) == 4
    no_retry = tmpl.Rollout(tpl, Scripted(policy), tools=FUNCS).run([[{"role": "user", "content": "weather?"}]])[0]
    assert no_retry.status.name == "ABORTED" and "engine restarted" in no_retry.reason and no_retry.attempts == 1


def test_one_crashing_sample_does_not_take_the_batch_down(tokenizer_of):
    tpl = _tpl(tokenizer_of)
    call = tpl.codec.encode(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    )
    final = tpl.codec.encode("Sunny.<|im_end|>")

    def policy(req):
        if req.request_id == "1-0-0":
            return GenerationResult(req.request_id, [10**9], [-0.1], "stop")  # an id outside the vocabulary
        return call if req.request_id.endswith("-0") else final

    rollout = tmpl.Rollout(tpl, Scripted(policy), tools=FUNCS)
    results = rollout.run([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]])
    assert results[0].status.name == "DONE"
    assert results[1].status.name == "ABORTED" and "TokenIdError" in results[1].reason
    assert rollout.metrics.aborted == 1


def test_tools_with_a_template_that_has_no_parser_fail_early(tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of("gemma-3-it"), name="gemma-3-it")
    with pytest.raises(tmpl.errors.NoToolParserError, match="gemma-3-it"):
        tmpl.Rollout(tpl, Scripted(lambda r: [1]), tools=FUNCS)


def test_without_tools_a_template_that_has_no_parser_answers_as_text(tokenizer_of):
    """Gemma 3's template has no tool-call format: a rollout with no tools needs no parser (every
    sample of it ended 'unexpected error: NoToolParserError' before)."""
    tok = tokenizer_of("gemma-3-it")
    tpl = tmpl.ChatTemplate(tok, name="gemma-3-it")
    answer = tok.encode("Hello there.<end_of_turn>", add_special_tokens=False)
    messages = [{"role": "user", "content": "hi"}]
    [result] = tmpl.Rollout(tpl, Scripted(lambda r: answer), max_turns=2, progress=False).run([messages])
    assert result.status.name == "DONE", result.reason
    assert result.messages[-1] == {"role": "assistant", "content": "Hello there."}
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert result.prompt_ids.tolist() == list(rendered) and result.completion_ids.tolist() == answer


def test_first_turn_of_every_sample_goes_in_one_batch(tokenizer_of):
    """Samples start one after another; their first requests still reach the engine together."""
    tpl = _tpl(tokenizer_of)
    end = tpl.codec.encode("Sure.<|im_end|>")
    batches = []

    class Recording(Scripted):
        threaded = True  # as the torch and vLLM backends

        def generate_batch(self, requests):
            batches.append(sorted(r.request_id for r in requests))
            return super().generate_batch(requests)

    results = tmpl.Rollout(tpl, Recording(lambda r: end), sampling=Sampling(n=2)).run(
        [[{"role": "user", "content": f"q{i}"}] for i in range(3)]
    )
    assert all(r.status.name == "DONE" for r in results)
    assert batches == [sorted(f"{i}-{s}-0" for i in range(3) for s in range(2))]


# -- cancel: aborted samples and cancelled runs reach Backend.cancel ---------------------------


def test_aborted_samples_cancel_their_last_request_and_only_those(tokenizer_of):
    tpl = _tpl(tokenizer_of)
    call = tpl.codec.encode('<tool_call>\n{"name": "boom", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>')
    weather = tpl.codec.encode(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    )
    end = tpl.codec.encode("Sure.<|im_end|>")

    def boom(city: str) -> str:
        """Always fails.

        Args:
            city: The city.
        """
        raise RuntimeError("tool down")

    def policy(req):
        i, _, turn = req.request_id.split("-")
        if i == "1" and turn == "1":
            return GenerationResult(req.request_id, end, None, "stop")  # no logprobs: ABORTED
        if i == "2":
            return GenerationResult.failed(req.request_id, "engine error")  # ABORTED
        if i == "3":
            return call  # the tool fails, on_error="stop": TRUNCATED, not aborted
        if i == "4":
            return GenerationResult(req.request_id, [10**9], [-0.1], "stop")  # crashes the sample: ABORTED
        return weather if turn == "0" else end

    cancelled = []

    class Recording(Scripted):
        async def cancel(self, request_id):
            cancelled.append(request_id)

    rollout = tmpl.Rollout(tpl, Recording(policy), tools=tmpl.Toolbox([get_weather, boom], on_error="stop"))
    results = rollout.run([[{"role": "user", "content": f"q{i}"}] for i in range(5)])
    assert [r.status.name for r in results] == ["DONE", "ABORTED", "ABORTED", "TRUNCATED", "ABORTED"]
    assert sorted(cancelled) == ["1-0-1", "2-0-0", "4-0-0"]  # each aborted sample's last request, once


class Holding(Backend):
    """A server-like backend: sample 0 answers at once, the others' requests hang until cancelled."""

    batching = False

    def __init__(self, end):
        self.end = end
        self.holding: set[str] = set()
        self.events: list[tuple] = []

    async def agenerate(self, req):
        if req.request_id.startswith("0-"):
            return GenerationResult(req.request_id, self.end, [-0.1] * len(self.end), "stop")
        self.holding.add(req.request_id)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.holding.discard(req.request_id)
            self.events.append(("task cancelled", req.request_id))
            raise

    async def cancel(self, request_id):
        # the request must still be held when cancel comes: that is how a server client finds it
        held = request_id in self.holding
        await asyncio.sleep(0.05)  # a round trip to the server: the run must wait for it
        self.events.append(("cancel", request_id, held))


def _expect_cancelled_in_order(events, rids):
    for rid in rids:
        assert events.index(("cancel", rid, True)) < events.index(("task cancelled", rid)), events
    assert {e[1] for e in events} == set(rids)  # nothing for the sample that had finished


def test_cancelling_a_run_cancels_its_requests_in_flight(tokenizer_of):
    tpl = _tpl(tokenizer_of)
    backend = Holding(tpl.codec.encode("Sure.<|im_end|>"))
    rollout = tmpl.Rollout(tpl, backend)

    async def go():
        task = asyncio.create_task(rollout.run_async([[{"role": "user", "content": f"q{i}"}] for i in range(3)]))
        while len(backend.holding) < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    _expect_cancelled_in_order(backend.events, ["1-0-0", "2-0-0"])


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.run turns SIGINT into a cancellation from 3.11")
def test_ctrl_c_cancels_the_requests_in_flight(tokenizer_of):
    """``Rollout.run`` under Ctrl-C: asyncio.run cancels the run, the backend hears of each request."""
    import os
    import signal
    import threading

    tpl = _tpl(tokenizer_of)
    backend = Holding(tpl.codec.encode("Sure.<|im_end|>"))

    def interrupt():
        while len(backend.holding) < 2:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    # a process started in the background by a non-interactive shell (`cmd &`: CI runners, nohup jobs)
    # inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler: the signal would
    # be dropped and the run wait forever. This test is about Ctrl-C reaching a run, so it gives the
    # process Python's own handler for its duration.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            tmpl.Rollout(tpl, backend).run([[{"role": "user", "content": f"q{i}"}] for i in range(3)])
    finally:
        signal.signal(signal.SIGINT, previous)
    _expect_cancelled_in_order(backend.events, ["1-0-0", "2-0-0"])


def test_cancelling_a_run_cancels_a_running_batch_and_drops_queued_requests(tokenizer_of):
    tpl = _tpl(tokenizer_of)
    end = tpl.codec.encode("Sure.<|im_end|>")
    cancelled, batches = [], []

    class Slow(Scripted):
        threaded = True

        def generate_batch(self, requests):
            batches.append([r.request_id for r in requests])
            time.sleep(0.5)
            return super().generate_batch(requests)

        async def cancel(self, request_id):
            cancelled.append(request_id)

    rollout = tmpl.Rollout(tpl, Slow(lambda r: end), max_batch=2)

    async def go():
        task = asyncio.create_task(rollout.run_async([[{"role": "user", "content": f"q{i}"}] for i in range(3)]))
        while not batches:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert batches == [["0-0-0", "1-0-0"]]  # "2-0-0" waited for the next batch and was dropped
    assert sorted(cancelled) == ["0-0-0", "1-0-0"]


@pytest.mark.parametrize("api", ["generate", "completions"])
def test_cancelling_a_run_aborts_its_requests_on_the_server(tokenizer_of, api):
    tpl = _tpl(tokenizer_of)
    end = tpl.codec.encode("Sure.<|im_end|>")
    with StandinServer(Scripted(lambda r: end), delay=2.0) as server:
        backend = VLLMServer(server.url, api=api, timeout=30)
        rollout = tmpl.Rollout(tpl, backend)

        async def go():
            task = asyncio.create_task(rollout.run_async([[{"role": "user", "content": f"q{i}"}] for i in range(2)]))
            while sum(s["outstanding"] for s in backend.stats) < 2:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(go())
    assert backend.stats[0]["aborts"] == 2 and backend.stats[0]["outstanding"] == 0
    if api == "generate":  # told by id too (with completions the closed connection is the only notice)
        assert {"0-0-0", "1-0-0"} <= set(server.aborted)


# -- tool rounds batched across samples ---------------------------------------------------------


class CountingToolbox(tmpl.Toolbox):
    """A real Toolbox that records how many samples each of its batches held."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batch_sizes: list[int] = []

    def start_batch(self, samples, on_done=None):
        self.batch_sizes.append(len(samples))
        return super().start_batch(samples, on_done)


def _weather_policy(tpl, calls_until):
    call = tpl.codec.encode(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    )
    final = tpl.codec.encode("Sunny.<|im_end|>")

    def policy(req):
        i, _, turn = req.request_id.split("-")[:3]
        return call if int(turn) < calls_until[int(i)] else final

    return policy


def test_tool_rounds_of_one_pass_are_one_batch_and_stay_exact(tokenizer_of):
    """Samples back from one generation batch run their tools and suffixes as one batch; every
    sample still equals the template's full render of its messages."""
    tpl = _tpl(tokenizer_of)
    calls_until = [2, 2, 1, 2, 0, 2]  # tool turns per sample: they finish at different turns
    box = CountingToolbox(FUNCS)
    rollout = tmpl.Rollout(tpl, Scripted(_weather_policy(tpl, calls_until)), tools=box, max_turns=4)
    results = rollout.run([[{"role": "user", "content": f"Weather, question {i}?"}] for i in range(6)])
    assert [r.status.name for r in results] == ["DONE"] * 6
    assert [r.tool_calls for r in results] == calls_until
    # turn 0: the five samples that called, from one generation batch, in one tool batch; turn 1:
    # the four still calling (in one batch unless the scheduler's max_wait split their generations)
    assert box.batch_sizes[0] == 5 and sum(box.batch_sizes) == 9 and len(box.batch_sizes) <= 3, box.batch_sizes
    for r in results:
        sequence = r.prompt_ids.tolist() + r.completion_ids.tolist()
        assert _ids(tpl, r.messages, False)[: len(sequence)] == sequence  # the render goes on with "\n"
    assert rollout.metrics.outside["tools"] > 0 and rollout.metrics.outside["suffix"] > 0


def test_a_suffix_error_stays_with_its_sample(tokenizer_of, monkeypatch):
    """When one sample's suffix cannot be built, the batch is redone sample by sample: only that
    sample ends (SUFFIX_FAILED), the others go on exactly."""
    tpl = _tpl(tokenizer_of)
    real = tpl.suffix_ids

    def suffix_ids(tool_messages, **kwargs):
        if kwargs["history"][0]["content"].endswith("3?"):
            raise tmpl.errors.TemplateError(tpl.name, "a template that cannot render this tool result")
        return real(tool_messages, **kwargs)

    def suffix_ids_batch(list_of_tool_messages, *, completion_ids, tools=None, histories=None):
        return [
            suffix_ids(m, completion_ids=c, tools=tools, history=h)
            for m, c, h in zip(list_of_tool_messages, completion_ids, histories)
        ]

    monkeypatch.setattr(tpl, "suffix_ids", suffix_ids)
    monkeypatch.setattr(tpl, "suffix_ids_batch", suffix_ids_batch)
    rollout = tmpl.Rollout(tpl, Scripted(_weather_policy(tpl, [1] * 5)), tools=FUNCS, max_turns=3)
    results = rollout.run([[{"role": "user", "content": f"Weather, question {i}?"}] for i in range(5)])
    assert [r.status.name for r in results] == ["DONE", "DONE", "DONE", "ABORTED", "DONE"]
    assert results[3].code.value == "suffix_failed" and "cannot render" in results[3].reason
    assert results[3].messages[-1]["role"] == "tool"  # the tool ran and its message is kept
    for r in results[:3] + results[4:]:
        sequence = r.prompt_ids.tolist() + r.completion_ids.tolist()
        assert _ids(tpl, r.messages, False)[: len(sequence)] == sequence


def test_a_text_rollout_refuses_a_prompt_with_an_image(tokenizer_of):
    """A text template would render an image part as one placeholder with no pixels: refused, naming
    the part (run and stream alike), before any request."""
    from tmpl.errors import ImageInputError

    seen = []
    rollout = tmpl.Rollout(_tpl(tokenizer_of), Scripted(lambda req: seen.append(req) or [1]), progress=False)
    ok = [{"role": "user", "content": "Hello"}]
    shot = [{"role": "user", "content": [{"type": "text", "text": "Same?"}, {"type": "input_image", "image": "x.png"}]}]
    with pytest.raises(ImageInputError, match=r"conversations\[1\]\[0\].content\[1\]: an image.*VisionTemplate"):
        rollout.run([ok, shot])

    async def stream():
        return [r async for r in rollout.stream([shot])]

    with pytest.raises(ImageInputError, match=r"prompts\[0\]\[0\].content\[1\]"):
        asyncio.run(stream())
    assert seen == []


# -- verify_every: a check that cannot run is never a pass --------------------------------------


def test_a_suffix_whose_full_render_raises_is_unverified_not_verified(tokenizer_of, caplog):
    """Qwen2.5's template with one rule added: it raises on a tool result that mentions a volcano (real
    templates raise on content they refuse). The suffix of that result is built from the template's
    dummy renders, so the rollout goes on; its verify_every check cannot render the conversation. It is
    counted as unverified (result, metrics, one warning naming the template), not passed as verified."""
    tok = tokenizer_of("qwen2.5-instruct")
    guard = (
        "{%- for m in messages %}{%- if m.role == 'tool' and 'VOLCANO' in m.content %}"
        "{{ raise_exception('this template refuses volcano reports') }}{%- endif %}{%- endfor %}"
    )
    tpl = tmpl.ChatTemplate(tok, guard + tok.chat_template, name="qwen2.5-volcano")

    def get_weather(city: str) -> str:
        """Current weather.

        Args:
            city: The city.
        """
        return f"{city}: VOLCANO erupting" if city == "Catania" else f"{city}: 21 C, sunny"

    def policy(request):
        _, _, turn = request.request_id.split("-")
        city = "Catania" if request.prompt_ids and "Catania" in tpl.codec.decode(request.prompt_ids) else "Paris"
        if turn == "0":
            text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "' + city + '"}}\n</tool_call><|im_end|>'
        else:
            text = "Done.<|im_end|>"
        return tpl.codec.encode(text)

    rollout = tmpl.Rollout(tpl, Scripted(policy), tools=[get_weather], max_turns=3, verify_every=1)
    with caplog.at_level("WARNING", logger="tmpl.rollout"):
        paris, catania = rollout.run(
            [[{"role": "user", "content": "Weather in Paris?"}], [{"role": "user", "content": "Weather in Catania?"}]]
        )
    assert paris.status.name == catania.status.name == "DONE", (paris.reason, catania.reason)
    assert paris.unverified == 0 and catania.unverified == 1
    assert rollout.metrics.unverified == 1 and rollout.metrics.to_dict()["rollout/unverified"] == 1.0
    assert catania.metrics["unverified"] == 1
    warned = [r.getMessage() for r in caplog.records if "could not be verified" in r.getMessage()]
    assert len(warned) == 1 and "qwen2.5-volcano" in warned[0] and "volcano reports" in warned[0]
    # the appended suffix is still the template's: the conversation without the guard renders to it
    plain = tmpl.ChatTemplate(tok, name="qwen2.5")
    full = plain.codec.encode(plain.render(catania.messages, tools=rollout.tool_schemas, add_generation_prompt=False))
    sequence = catania.prompt_ids.tolist() + catania.completion_ids.tolist()
    assert full[: len(sequence)] == sequence


def _prompt_keys() -> list[str]:
    from .conftest import FAMILIES, catalog

    return list(FAMILIES) + [e["template"] for e in catalog()]


@pytest.mark.parametrize("key", _prompt_keys())
def test_prompts_rendered_in_one_call_are_each_ones_own_render(key):
    """A rollout renders its prompts in one ``apply_chat_template`` call (``render_many``): each text
    is the conversation's own render, with tools and without; a batch holding a conversation the
    template refuses raises the error that conversation's own render raises."""
    from tmpl.errors import TemplateRenderError

    from .conftest import template_under_test

    tpl = template_under_test(key)
    conversations = [
        [{"role": "user", "content": "What is the weather in Paris?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Plan my day in Tokyo."}],
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Tell me a joke about the number 7."},
        ],
    ]
    checked = 0
    for tools in (None, [get_weather]):
        try:
            alone = [tpl.render(c, tools=tools, add_generation_prompt=True) for c in conversations]
        except TemplateRenderError:
            continue  # the template refuses one of these (a system message, tools...): below
        assert tpl.render_many(conversations, tools=tools, add_generation_prompt=True) == alone
        checked += 1
    if not checked:
        pytest.skip(f"{key}: the template refuses every test conversation")
    refused = [{"role": "assistant", "content": "no user turn"}], [{"role": "tool", "content": "{}"}]
    for bad in refused:
        try:
            tpl.render(bad, add_generation_prompt=True)
        except TemplateRenderError as exc:
            with pytest.raises(TemplateRenderError) as got:
                tpl.render_many([conversations[0], conversations[1], bad], add_generation_prompt=True)
            assert str(got.value) == str(exc)
