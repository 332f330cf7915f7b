"""Environments on the gateway's sessions (issue 38: ``Gateway(env_factory=...)``), driven by a harness of
its own through the real ``openai`` SDK and the gateway's env routes, served by uvicorn on 127.0.0.1.

The environment opens each session (its conversation and tools), answers every reply (tool results,
then a user turn after the first answer) and ends the episode with a reward. The checks: every call's
prompt is the tokenization of the template's full render of what the client sent (the earlier sampled
IDs kept), the rewards are summed into the finished episode, the session ends when the environment is
done, and the environment is closed once on every end: done, finished by the trainer, expired, a
failing step, the gateway's shutdown.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

import tmpl
from tmpl.env import EnvReset, EnvStep
from tmpl.gateway import Gateway, create_app

from .gateway_util import full_render_ids, served
from .test_gateway import TOOLS, Policy, load_tokenizer

openai = pytest.importorskip("openai", reason="the openai SDK is not installed (pip install -e '.[test]')")
pytest.importorskip("fastapi", reason="FastAPI is not installed (pip install -e '.[gateway]')")

CLOSED: list[str] = []


class Weather:
    """A stateful environment: answers get_weather calls ("sunny, <city>", 0.1 each), asks once more after
    the first answer, then ends with 1.0; fails a step on demand (``task["fail"]``)."""

    def reset(self, task):
        self.task = task
        self.calls = 0
        self.asked = False
        return EnvReset(messages=[{"role": "user", "content": task["question"]}], tools=TOOLS, state={"calls": 0})

    async def step(self, assistant):  # async: awaited by the gateway
        if self.task.get("fail"):
            raise RuntimeError("the simulator crashed")
        calls = assistant.get("tool_calls") or []
        if calls:
            self.calls += len(calls)
            out = []
            for c in calls:
                city = c["function"]["arguments"]["city"]  # a dict: the gateway parsed the client's JSON string
                out.append({"role": "tool", "tool_call_id": c["id"], "content": f"sunny, {city}"})
            return EnvStep(messages=out, reward=0.1 * len(calls))
        if not self.asked:
            self.asked = True
            return EnvStep(messages=[{"role": "user", "content": "Thanks. And tomorrow?"}])
        return EnvStep(messages=[], reward=1.0, done=True, info={"calls": self.calls})

    def close(self):
        CLOSED.append(self.task["question"])


def gateway_with_env(**kwargs) -> tuple[Gateway, tmpl.backends.Scripted, Policy]:
    tok = load_tokenizer("qwen2.5-instruct")
    policy = Policy(tok, "qwen2.5-instruct", calls=2)
    backend = tmpl.backends.Scripted(policy)
    return Gateway(tmpl.ChatTemplate(tok), backend, env_factory=Weather, **kwargs), backend, policy


def harness(url: str, key: str, question: str) -> tuple[list[dict], list[list[dict]], list[dict]]:
    """An agent loop of its own: the environment's opening, then call the model, hand each reply to the
    environment, append what it answers, until it is done."""
    opened = httpx.post(f"{url}/s/{key}/env/reset", json={"task": {"question": question}}).json()
    messages, tools = opened["messages"], opened["tools"]
    client = openai.OpenAI(base_url=f"{url}/s/{key}/v1", api_key="unused", max_retries=0)
    sent, steps = [], []
    for _ in range(10):
        sent.append(json.loads(json.dumps(messages)))
        reply = client.chat.completions.create(model="m", messages=messages, tools=tools)
        message = reply.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        step = httpx.post(f"{url}/s/{key}/env/step", json={"message": message}).json()
        steps.append(step)
        if step["done"]:
            return messages, sent, steps
        messages += step["messages"]
    raise AssertionError("the environment never ended the episode")


def test_a_harness_runs_an_environment_through_the_gateway_and_every_prompt_is_the_full_render():
    CLOSED.clear()
    gateway, backend, policy = gateway_with_env()
    with served(create_app(gateway)) as url:
        messages, sent, steps = harness(url, "ep-1", "Weather in Paris and Lima?")
        assert httpx.get(f"{url}/s/ep-1/episode").status_code == 404  # done: the session ended
        drained = httpx.get(f"{url}/episodes/drain").json()["episodes"]
    assert [m["role"] for m in messages].count("user") == 2  # the environment's user turn went in
    assert CLOSED == ["Weather in Paris and Lima?"]  # closed once, when it was done
    [entry] = drained
    assert "environment ended the episode (done)" in entry["reason"]
    assert entry["record"]["reward"] == pytest.approx(0.1 * 2 + 1.0)  # every step's reward, summed
    assert entry["env"]["info"] == {"calls": 2} and entry["env"]["state"] == {"calls": 0}
    engine = {r.request_id: list(r.prompt_ids) for r in backend.requests}
    calls = entry["record"]["calls"]
    assert len(calls) == len(sent) >= 4
    tok = gateway.tpl.tokenizer
    for k, (call, conversation) in enumerate(zip(calls, sent)):
        prompt = call["prompt_ids"]
        assert prompt == engine[call["id"]] == full_render_ids(tok, conversation, TOOLS), f"call {k}"
        assert call["completion_ids"] == policy.sampled[call["id"]], f"call {k}: sampled IDs changed"
        if k:  # the earlier sampled IDs kept, never re-tokenized
            kept = calls[k - 1]["prompt_ids"] + calls[k - 1]["completion_ids"]
            assert prompt[: len(kept)] == kept, f"call {k}"
    # the calls after tool results went in as suffixes; the one after the user turn as the template's render
    # with the sampled IDs spliced back (the gateway suffixes tool results only): exact either way, above
    assert gateway.appended == 2


def test_environments_are_closed_on_every_end_of_their_session():
    CLOSED.clear()
    gateway, _, _ = gateway_with_env(ttl=0.5)

    def reset(url, key):
        task = {"question": f"Weather in Oslo? ({key})", "fail": key == "failing"}
        assert httpx.post(f"{url}/s/{key}/env/reset", json={"task": task}).status_code == 200

    def closed():
        return sorted(q.rsplit("(", 1)[-1].rstrip(")") for q in CLOSED)

    with served(create_app(gateway)) as url:
        for key in ("finished", "expired", "failing"):
            reset(url, key)
        assert closed() == []
        assert httpx.post(f"{url}/s/finished/finish").status_code == 200  # the trainer ends it
        assert closed() == ["finished"]
        reply = {"role": "assistant", "content": "Let me see."}
        bad = httpx.post(f"{url}/s/failing/env/step", json={"message": reply})
        assert bad.status_code == 502 and "RuntimeError: the simulator crashed" in bad.json()["error"]["message"]
        assert closed() == ["failing", "finished"]
        assert httpx.post(f"{url}/s/failing/env/step", json={"message": reply}).status_code == 404  # it ended
        time.sleep(0.8)
        reset(url, "shutdown")  # any call ends the sessions idle past the TTL first
        assert closed() == ["expired", "failing", "finished"]
    gateway.close()  # the shutdown ends what is still open
    assert closed() == ["expired", "failing", "finished", "shutdown"]  # each once


def test_bad_env_requests_are_named_errors():
    gateway, _, _ = gateway_with_env()
    plain = Gateway(gateway.tpl, gateway.backend)
    with served(create_app(gateway)) as url, served(create_app(plain)) as other:
        none = httpx.post(f"{other}/s/a/env/reset", json={"task": None})
        assert none.status_code == 400 and "no environments" in none.json()["error"]["message"]
        assert (
            httpx.post(f"{url}/s/a/env/step", json={"message": {"role": "assistant", "content": "x"}}).status_code
            == 404
        )
        assert httpx.post(f"{url}/s/a/env/reset", json={"task": {"question": "Hi"}}).status_code == 200
        again = httpx.post(f"{url}/s/a/env/reset", json={"task": {"question": "Hi"}})
        assert again.status_code == 409
        for body in ({"message": "text"}, {"message": {"role": "user", "content": "x"}}, [1]):
            r = httpx.post(f"{url}/s/a/env/step", json=body)
            assert r.status_code == 400 and "assistant message" in r.json()["error"]["message"], body


def test_an_environment_that_returns_an_unknown_role_ends_its_session_with_the_reason():
    class Odd(Weather):
        def step(self, assistant):
            return EnvStep(messages=[{"role": "narrator", "content": "Meanwhile..."}])

    CLOSED.clear()
    tok = load_tokenizer("qwen2.5-instruct")
    gateway = Gateway(tmpl.ChatTemplate(tok), tmpl.backends.Scripted(Policy(tok, "qwen2.5-instruct")), env_factory=Odd)

    async def run():
        await gateway.env_reset("odd", {"question": "Hi"})
        with pytest.raises(tmpl.errors.GatewayError) as info:
            await gateway.env_step("odd", {"role": "assistant", "content": "Hello."})
        return info.value

    err = asyncio.run(run())
    assert err.status == 502 and "role 'narrator' cannot follow an assistant turn" in str(err)
    assert CLOSED == ["Hi"]
