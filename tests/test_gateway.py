"""The gateway (issue 37) with real clients, unmodified, on real tokenizers: the ``openai`` SDK (chat
completions, streamed and not) and the ``anthropic`` SDK (messages, streamed and not) run multi-turn
tool episodes through ``tmpl.gateway.create_app`` served by uvicorn on 127.0.0.1, over a Scripted
backend that writes each family's own tool-call format.

For every call: the prompt IDs the engine was sent are the tokenization of the template's full render
of the conversation the client sent (``apply_chat_template``), the engine's sampled IDs come back
unchanged in the next prompt (never re-tokenized), the episode is one sequence equal to the last
prompt plus what it sampled, and every sampled token is in its loss mask once. A client that compacts
its history at turn 3 gets a branch naming the message and field it changed. Bad input gets each API's
own error shape and records nothing. (tests/test_gateway_vllm.py runs the clients against a real vLLM
server.)
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import numpy as np
import pytest

import tmpl
from tmpl.backends import Scripted
from tmpl.backends.base import Backend, GenerationResult
from tmpl.gateway import Gateway, create_app

from .conftest import load_tokenizer
from .gateway_util import as_rendered, full_render_ids, served, streamed_message

openai = pytest.importorskip("openai", reason="the openai SDK is not installed (pip install -e '.[test]')")
anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is not installed (pip install -e '.[test]')")
pytest.importorskip("fastapi", reason="FastAPI is not installed (pip install -e '.[gateway]')")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]  # fmt: skip

#: each family's completions as its model writes them: a call to get_weather(city), then an answer
FAMILIES = {
    "qwen2.5-instruct": (
        '<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call><|im_end|>',
        "It is sunny in {city}.<|im_end|>",
    ),
    "qwen3": (
        '<think>\nI should look it up.\n</think>\n\n<tool_call>\n{{"name": "get_weather", "arguments": {{"city": '
        '"{city}"}}}}\n</tool_call><|im_end|>',
        "<think>\nThe tool said so.\n</think>\n\nIt is sunny in {city}.<|im_end|>",
    ),
    "llama-3.2-instruct": (
        '{{"name": "get_weather", "parameters": {{"city": "{city}"}}}}<|eot_id|>',
        "It is sunny in {city}.<|eot_id|>",
    ),
}
CITIES = ["Paris", "Lima", "Oslo", "Quito"]


class Policy:
    """Scripted: a call per city until every city of the episode has a result, then the answer; the
    results it returned, by request, to check against the episode."""

    def __init__(self, tokenizer, family: str, calls: int = 2) -> None:
        self.tok = tokenizer
        self.call, self.answer = FAMILIES[family]
        self.calls = calls
        self.sampled: dict[str, list[int]] = {}

    def __call__(self, req):
        text = self.tok.decode(list(req.prompt_ids))
        done = sum(text.count(f"sunny, {c}") for c in CITIES)
        city = CITIES[done % len(CITIES)]
        out = self.call if done < self.calls else self.answer
        ids = self.tok.encode(out.format(city=city), add_special_tokens=False)
        self.sampled[req.request_id] = ids
        return ids


def gateway_of(family: str, calls: int = 2, **kwargs) -> tuple[Gateway, Scripted, Policy]:
    tok = load_tokenizer(family)
    tpl = tmpl.ChatTemplate(tok, enable_thinking=True) if family == "qwen3" else tmpl.ChatTemplate(tok)
    policy = Policy(tok, family, calls)
    backend = Scripted(policy)
    return Gateway(tpl, backend, **kwargs), backend, policy


def check_episode(gateway: Gateway, backend: Scripted, policy: Policy, key: str, sent: list[list[dict]]) -> None:
    """Each call's prompt: what the engine got, the full render of what the client sent, and the previous
    prompt plus its sampled IDs (kept); the episode one sequence, each sampled token in the mask once."""
    episode = gateway.episode(key)
    calls = episode.calls
    assert len(calls) == len(sent) >= 3
    engine = {r.request_id: list(r.prompt_ids) for r in backend.requests}
    for k, (call, messages) in enumerate(zip(calls, sent)):
        prompt = call.prompt_ids.tolist()
        assert prompt == engine[call.id], f"call {k}: the engine was sent other IDs"
        assert call.completion_ids.tolist() == policy.sampled[call.id], f"call {k}: sampled IDs changed"
        assert prompt == full_render_ids(gateway.tpl.tokenizer, messages, TOOLS), f"call {k}: not the full render"
        if k:
            before = calls[k - 1]
            kept = before.prompt_ids.tolist() + before.completion_ids.tolist()
            assert prompt[: len(kept)] == kept, f"call {k}: the earlier sampled IDs were not kept"
    assert episode.num_sequences == 1, [str(s.branch) for s in episode.sequences]
    seq = episode.sequences[0]
    last = calls[-1]
    assert seq.ids.tolist() == last.prompt_ids.tolist() + last.completion_ids.tolist()
    assert int(seq.mask.sum()) == sum(len(c.completion_ids) for c in calls)
    for span, call in zip(seq.spans, calls):
        assert seq.ids[span.start : span.end].tolist() == call.completion_ids.tolist()
        assert seq.mask[span.start : span.end].all()


def openai_episode(client, *, stream: bool, question: str = "Weather in Paris and Lima?"):
    """The loop an OpenAI chat harness runs: call, run the tools, send everything back, until an answer."""
    messages: list[dict] = [{"role": "user", "content": question}]
    sent = []
    for _ in range(8):
        sent.append(json.loads(json.dumps(messages)))
        if stream:
            chunks = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True)
            message = streamed_message(chunks)
        else:
            reply = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
            message = reply.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        if not message.get("tool_calls"):
            return messages, sent
        for call in message["tool_calls"]:
            city = json.loads(call["function"]["arguments"])["city"]
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"sunny, {city}"})
    raise AssertionError("the episode did not end")


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_openai_chat_episode_is_exact(family, stream):
    gateway, backend, policy = gateway_of(family)
    with served(create_app(gateway)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/ep-1/v1", api_key="unused", max_retries=0)
        messages, sent = openai_episode(client, stream=stream)
        record = httpx.get(f"{url}/s/ep-1/episode").json()
    assert messages[-1]["content"].strip() == "It is sunny in Oslo."
    check_episode(gateway, backend, policy, "ep-1", sent)
    assert gateway.appended == len(sent) - 1  # every later call went in as a suffix, none re-rendered
    seq = gateway.episode("ep-1").sequences[0]
    assert record["sequences"][0]["ids"] == seq.ids.tolist() and record["sequences"][0]["mask"] == seq.mask.tolist()
    if family == "qwen3":  # the reasoning went out, came back, and stayed as sampled
        assert all("reasoning_content" in m for m in messages if m["role"] == "assistant")


def anthropic_episode(client, *, stream: bool):
    messages: list[dict] = [{"role": "user", "content": "Weather in Paris and Lima?"}]
    sent = []  # the same conversation in the OpenAI shape, for the full render
    chat: list[dict] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": messages[0]["content"]}]
    for _ in range(8):
        sent.append(json.loads(json.dumps(chat)))
        kwargs = dict(model="m", max_tokens=128, system="Be brief.", messages=messages, tools=ANTHROPIC_TOOLS)
        if stream:
            with client.messages.stream(**kwargs) as events:
                reply = events.get_final_message()
        else:
            reply = client.messages.create(**kwargs)
        blocks = [b.model_dump(exclude_none=True) for b in reply.content]
        messages.append({"role": "assistant", "content": blocks})
        text = "".join(b["text"] for b in blocks if b["type"] == "text")
        uses = [b for b in blocks if b["type"] == "tool_use"]
        thinking = "".join(b["thinking"] for b in blocks if b["type"] == "thinking")
        turn = {"role": "assistant", "content": text}
        if thinking:
            turn["reasoning_content"] = thinking
        if uses:
            turn["tool_calls"] = [{"id": b["id"], "type": "function",
                                   "function": {"name": b["name"], "arguments": b["input"]}} for b in uses]  # fmt: skip
        chat.append(turn)
        if reply.stop_reason != "tool_use":
            assert reply.stop_reason == "end_turn"
            return messages, sent
        results = [
            {"type": "tool_result", "tool_use_id": b["id"], "content": f"sunny, {b['input']['city']}"} for b in uses
        ]
        messages.append({"role": "user", "content": results})
        chat += [{"role": "tool", "tool_call_id": r["tool_use_id"], "content": r["content"]} for r in results]
    raise AssertionError("the episode did not end")


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_anthropic_messages_episode_is_exact(family, stream):
    gateway, backend, policy = gateway_of(family)
    with served(create_app(gateway)) as url:
        client = anthropic.Anthropic(base_url=f"{url}/s/ep-2", api_key="unused", max_retries=0)
        messages, sent = anthropic_episode(client, stream=stream)
    assert messages[-1]["content"][-1]["text"].strip() == "It is sunny in Oslo."
    check_episode(gateway, backend, policy, "ep-2", sent)


def test_a_compacting_client_gets_a_branch_where_it_changed_its_history():
    """A harness that summarises its history at turn 3: the calls before stay one exact sequence, the
    call after starts a branch that names the message and field changed; every sampled token is in one
    loss mask."""
    gateway, backend, policy = gateway_of("qwen2.5-instruct", calls=3)
    with served(create_app(gateway)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/compact/v1", api_key="unused", max_retries=0)
        messages: list[dict] = [{"role": "user", "content": "Weather in Paris, Lima and Oslo?"}]
        for turn in range(6):
            if turn == 3:  # compaction: the tool exchanges so far become one summary line
                messages = [messages[0], {"role": "user", "content": "Summary so far: Paris and Lima are sunny."}]
            reply = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
            message = reply.choices[0].message.model_dump(exclude_none=True)
            messages.append(message)
            if not message.get("tool_calls"):
                break
            for call in message["tool_calls"]:
                city = json.loads(call["function"]["arguments"])["city"]
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"sunny, {city}"})
    episode = gateway.episode("compact")
    assert episode.num_sequences == 2, [str(s.branch) for s in episode.sequences]
    first, second = episode.sequences
    assert len(first.calls) == 3 and first.branch.kind == "first"
    assert second.branch.kind == "diverged"
    assert (second.branch.message, second.branch.field) == (1, "role"), str(second.branch)
    assert "client changed messages[1] (role)" in second.branch.edit
    assert int(first.mask.sum() + second.mask.sum()) == sum(len(c.completion_ids) for c in episode.calls)
    # the branch's prompt is the template's render of the compacted history
    last = episode.calls[3]
    expected = full_render_ids(gateway.tpl.tokenizer, [messages[0], messages[1]], TOOLS)
    assert last.prompt_ids.tolist() == expected


def test_n_choices_and_continuing_the_second():
    gateway, backend, policy = gateway_of("qwen2.5-instruct", calls=1)
    with served(create_app(gateway)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/n2/v1", api_key="unused", max_retries=0)
        messages: list[dict] = [{"role": "user", "content": "Weather in Paris?"}]
        reply = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, n=2, logprobs=True)
        assert [c.index for c in reply.choices] == [0, 1]
        assert len(reply.choices[1].logprobs.content) == len(policy.sampled[reply.tmpl["calls"][1]])
        chosen = reply.choices[1].message.model_dump(exclude_none=True)
        messages += [chosen, {"role": "tool", "tool_call_id": chosen["tool_calls"][0]["id"], "content": "sunny, Paris"}]
        client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    episode = gateway.episode("n2")
    calls = episode.calls
    assert len(calls) == 3
    # the third call continues the second choice's sequence, not the first's
    assert episode.sequence_of(calls[2].id) == episode.sequence_of(calls[1].id) != episode.sequence_of(calls[0].id)
    kept = calls[1].prompt_ids.tolist() + calls[1].completion_ids.tolist()
    assert calls[2].prompt_ids.tolist()[: len(kept)] == kept


def test_sessions_never_share_tokens():
    """Eight clients at once, each with its own marker in its question: each session's sequences hold its
    marker and no other's."""
    gateway, backend, policy = gateway_of("qwen2.5-instruct", calls=1)
    marks = [f"zebra{k}quokka" for k in range(8)]
    errors: list[BaseException] = []
    with served(create_app(gateway)) as url:

        def run(k: int) -> None:
            try:
                client = openai.OpenAI(base_url=f"{url}/s/iso-{k}/v1", api_key="unused", max_retries=0)
                openai_episode(client, stream=k % 2 == 1, question=f"Weather in Paris? {marks[k]}")
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors, errors
    tok = gateway.tpl.tokenizer
    for k, mark in enumerate(marks):
        text = "".join(tok.decode(s.ids.tolist()) for s in gateway.episode(f"iso-{k}").sequences)
        assert mark in text
        assert not [m for m in marks if m != mark and m in text]


# -- bad input -------------------------------------------------------------------------------


def _call(url: str, key: str, dialect: str, body, **kwargs) -> httpx.Response:
    path = "chat/completions" if dialect == "openai" else "messages"
    if isinstance(body, (bytes, str)):
        return httpx.post(f"{url}/s/{key}/v1/{path}", content=body, timeout=30, **kwargs)
    return httpx.post(f"{url}/s/{key}/v1/{path}", json=body, timeout=30, **kwargs)


def _shape(dialect: str, response: httpx.Response, status: int) -> str:
    """The error's message, after checking the status and the API's own error shape."""
    assert response.status_code == status, response.text
    body = response.json()
    if dialect == "openai":
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
        return body["error"]["message"]
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return body["error"]["message"]


GOOD = {
    "openai": {"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS},
    "anthropic": {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "Weather in Paris?"}],
                  "tools": ANTHROPIC_TOOLS},
}  # fmt: skip


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_bad_requests_get_the_apis_own_errors_and_record_nothing(dialect):
    gateway, backend, policy = gateway_of("qwen2.5-instruct", calls=1)
    with served(create_app(gateway, max_body=4096)) as url:
        assert "not valid JSON" in _shape(dialect, _call(url, "bad", dialect, b'{"messages": [}'), 400)
        assert "messages" in _shape(dialect, _call(url, "bad", dialect, {"model": "m"}), 400)
        wrong_role = dict(GOOD[dialect], messages=[{"role": "wizard", "content": "x"}])
        assert "role" in _shape(dialect, _call(url, "bad", dialect, wrong_role), 400)
        huge = dict(GOOD[dialect], messages=[{"role": "user", "content": "x" * 10_000}])
        assert "limit" in _shape(dialect, _call(url, "bad", dialect, huge), 413)
        if dialect == "openai":
            stray = [GOOD["openai"]["messages"][0], {"role": "tool", "tool_call_id": "nope12345", "content": "1"}]
        else:
            stray = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope12345", "content": "1"}]}]
        message = _shape(dialect, _call(url, "bad", dialect, dict(GOOD[dialect], messages=stray)), 400)
        assert "nope12345" in message and "never issued" in message
        assert backend.requests == []  # nothing reached the engine
        assert gateway.episode("bad").calls == ()
        good = _call(url, "good", dialect, GOOD[dialect])  # other sessions unaffected
        assert good.status_code == 200, good.text
    assert len(gateway.episode("good").calls) == 1


class Down(Backend):
    """A backend whose engine cannot be reached."""

    async def agenerate(self, request):
        raise ConnectionRefusedError("[Errno 111] connection refused by 127.0.0.1:9")


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_a_backend_that_is_down_is_a_503(dialect):
    tok = load_tokenizer("qwen2.5-instruct")
    gateway = Gateway(tmpl.ChatTemplate(tok), Down())
    with served(create_app(gateway)) as url:
        assert "connection refused" in _shape(dialect, _call(url, "down", dialect, GOOD[dialect]), 503)
    assert gateway.episode("down").calls == ()


def test_strict_mode_refuses_a_history_the_gateway_never_produced_and_the_default_branches():
    forged = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "It is raining in Paris."},  # never returned by the gateway
        {"role": "user", "content": "Sure?"},
    ]
    for strict in (True, False):
        gateway, backend, _ = gateway_of("qwen2.5-instruct", calls=1, strict=strict)
        with served(create_app(gateway)) as url:
            _call(url, "s", "openai", GOOD["openai"])
            response = _call(url, "s", "openai", dict(GOOD["openai"], messages=forged))
            if strict:
                assert "never returned" in _shape("openai", response, 409)
                assert len(gateway.episode("s").calls) == 1
            else:
                assert response.status_code == 200
                episode = gateway.episode("s")
                assert episode.num_sequences == 2
                assert (episode.sequences[1].branch.message, episode.sequences[1].branch.field) == (1, "content")


def test_an_expired_session_is_a_404_and_its_episode_is_drained():
    gateway, backend, _ = gateway_of("qwen2.5-instruct", calls=1, ttl=0.5)
    with served(create_app(gateway)) as url:
        assert _call(url, "old", "openai", GOOD["openai"]).status_code == 200
        time.sleep(0.8)
        assert "ended" in _shape("openai", _call(url, "old", "openai", GOOD["openai"]), 404)
        assert "ended" in _shape("anthropic", _call(url, "old", "anthropic", GOOD["anthropic"]), 404)
        drained = httpx.get(f"{url}/episodes/drain").json()["episodes"]
        assert [d["session"] for d in drained] == ["old"] and "expired" in drained[0]["reason"]
        assert len(drained[0]["record"]["calls"]) == 1
        assert httpx.get(f"{url}/episodes/drain").json()["episodes"] == []  # given once
        assert httpx.get(f"{url}/s/old/episode").status_code == 404


class Slow(Backend):
    """An engine that takes 30 s unless its request is cancelled; says which were."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self.started = threading.Event()

    async def agenerate(self, request):
        self.started.set()
        await asyncio.sleep(30)
        return GenerationResult(request.request_id, [1], [-0.1], "stop")

    async def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)


def test_a_client_that_goes_away_has_its_engine_request_cancelled():
    tok = load_tokenizer("qwen2.5-instruct")
    backend = Slow()
    gateway = Gateway(tmpl.ChatTemplate(tok), backend)
    with served(create_app(gateway, poll=0.05)) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/s/gone/v1/chat/completions", json=dict(GOOD["openai"], stream=True), timeout=1.0)
        deadline = time.monotonic() + 10
        while not backend.cancelled and time.monotonic() < deadline:
            time.sleep(0.05)
    assert backend.started.is_set() and len(backend.cancelled) == 1
    session = gateway.session("gone")
    assert list(session.ended) == backend.cancelled and "aborted" in session.ended[backend.cancelled[0]]
    assert session.episode.calls == ()


def test_rewards_and_finish_over_http():
    gateway, backend, _ = gateway_of("qwen2.5-instruct", calls=1)
    with served(create_app(gateway)) as url:
        _call(url, "r", "openai", GOOD["openai"])
        call = gateway.episode("r").calls[0].id
        assert httpx.post(f"{url}/s/r/reward", json={"reward": 0.5, "call": call}).status_code == 200
        assert httpx.post(f"{url}/s/r/reward", json={"reward": 1.0}).status_code == 200
        bad = httpx.post(f"{url}/s/r/reward", json={"reward": "lots"})
        assert bad.status_code == 400 and "not a number" in bad.json()["error"]["message"]
        done = httpx.post(f"{url}/s/r/finish").json()
        assert done["record"]["reward"] == 1.0
        assert httpx.post(f"{url}/s/r/finish").status_code == 404
    finished = gateway.drain()
    assert [f.key for f in finished] == ["r"]
    assert finished[0].episode.reward == 1.0 and finished[0].episode.call_reward(call) == 0.5
    assert np.all(finished[0].episode.sequences[0].mask.sum() == len(finished[0].episode.calls[0].completion_ids))


def test_sessions_are_bounded():
    gateway, backend, _ = gateway_of("qwen2.5-instruct", calls=1, max_sessions=2, max_finished=1)
    with served(create_app(gateway)) as url:
        for key in ("a", "b", "c"):
            assert _call(url, key, "openai", GOOD["openai"]).status_code == 200
        assert len(gateway.sessions) == 2
        assert "room" in _shape("openai", _call(url, "a", "openai", GOOD["openai"]), 404)
        for key in ("d",):  # ends b: the queue (1) drops a, unread, counted
            _call(url, key, "openai", GOOD["openai"])
    assert gateway.sessions.dropped == 1
    assert [f.key for f in gateway.drain()] == ["b"]


def test_models_and_health():
    gateway, _, _ = gateway_of("qwen2.5-instruct", calls=1, model="tiny")
    with served(create_app(gateway)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/x/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list()] == ["tiny"]
        assert httpx.get(f"{url}/health").json()["status"] == "ok"


def test_renders_used_for_checks_are_the_templates():
    """The test's own full render differs from tmpl's when a call's arguments are left as a JSON string
    (the template re-encodes it): as_rendered must parse them, or every exactness check above is void."""
    tok = load_tokenizer("qwen2.5-instruct")
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    ]  # fmt: skip
    text = tok.apply_chat_template(as_rendered(messages), tools=TOOLS, tokenize=False)
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text


def test_tmpl_serve_answers_an_sdk_on_the_fixture_model_and_stops_cleanly(tmp_path):
    """The README's command: ``tmpl serve <model folder>`` with torch on this machine, then the openai SDK."""
    import os
    import signal
    import subprocess
    import sys

    from .fixture_models import QWEN, get_weather, missing
    from .vllm_servers import free_port

    if missing(QWEN):
        pytest.skip(missing(QWEN))
    from tmpl.toolcalls.schema import tool_schema

    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tmpl", "serve", str(QWEN), "--port", str(port), "--max-tokens", "64"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "tmpl serve did not come up"
            time.sleep(0.25)
        client = openai.OpenAI(base_url=f"{url}/s/cli/v1", api_key="unused", max_retries=0, timeout=120)
        reply = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=[tool_schema(get_weather)],
            temperature=0,
        )
        choice = reply.choices[0]
        assert choice.message.tool_calls or choice.message.content
        record = httpx.get(f"{url}/s/cli/episode").json()
        assert record["sequences"][0]["mask"].count(1) == reply.usage.completion_tokens
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        log.close()
    assert code == 0, (tmp_path / "serve.log").read_text()
    assert "tmpl serve:" in (tmp_path / "serve.log").read_text()


def test_weight_updates_version_the_tokens_and_hold_new_calls():
    """``drain``: the update is applied once the engine request in flight ended (its tokens keep version
    0), and a call that comes meanwhile reaches the engine only after it (its tokens have version 3)."""
    gateway, backend, policy = gateway_of("qwen2.5-instruct", calls=1)
    events: list[str] = []
    real_generate, real_update = backend.generate_batch, backend.update_weights

    def generate(requests):
        events.append(f"engine starts {requests[0].sample}")
        if requests[0].sample == "v":
            time.sleep(0.5)
        out = real_generate(requests)
        events.append(f"engine ends {requests[0].sample}")
        return out

    async def update(*args, **kwargs):
        events.append("weights applied")
        await real_update(*args, **kwargs)

    backend.generate_batch, backend.update_weights = generate, update

    async def run():
        from tmpl.gateway import CallParams, canonical_message, canonical_tools

        tools = canonical_tools(TOOLS)
        question = [canonical_message({"role": "user", "content": "Weather in Paris?"}, 0)]
        flight = asyncio.ensure_future(gateway.complete("v", question, tools, CallParams()))
        await asyncio.sleep(0.1)
        upd = asyncio.ensure_future(gateway.update_weights_async(3, mode="drain"))
        await asyncio.sleep(0.05)
        late = asyncio.ensure_future(gateway.complete("w", question, tools, CallParams()))
        await asyncio.gather(flight, upd, late)

    asyncio.run(run())
    assert events == ["engine starts v", "engine ends v", "weights applied", "engine starts w", "engine ends w"]
    assert gateway.backend.weight_version == 3 and gateway.updates[0]["mode"] == "drain"
    for key, version in (("v", 0), ("w", 3)):
        seq = gateway.episode(key).sequences[0]
        assert {int(v) for v in seq.versions[seq.mask.astype(bool)]} == {version}


def test_the_admin_weights_route_needs_its_token():
    gateway, backend, _ = gateway_of("qwen2.5-instruct", calls=1)
    with served(create_app(gateway, admin_token="s3cret")) as url:
        assert httpx.post(f"{url}/admin/weights", json={"version": 2}).status_code == 401
        wrong = httpx.post(f"{url}/admin/weights", json={"version": 2}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        ok = httpx.post(f"{url}/admin/weights", json={"version": 2}, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and gateway.backend.weight_version == 2
        assert _call(url, "a", "openai", GOOD["openai"]).status_code == 200
    seq = gateway.episode("a").sequences[0]
    assert {int(v) for v in seq.versions[seq.mask.astype(bool)]} == {2}
    with served(create_app(gateway)) as url:  # no token: not served
        assert httpx.post(f"{url}/admin/weights", json={"version": 4}).status_code in (404, 405)


# -- review fixes: each a scenario that failed before ------------------------------------------


def _complete(gateway, key, messages, **params):
    from tmpl.gateway import CallParams, canonical_message, canonical_tools

    canonical = [canonical_message(m, i) for i, m in enumerate(messages)]
    return asyncio.run(gateway.complete(key, canonical, canonical_tools(TOOLS), CallParams(**params)))


def test_a_reply_sent_back_without_its_reasoning_keeps_its_sampled_ids():
    """Qwen3: the client drops ``reasoning_content`` (most chat clients do). The next prompt is the render
    of what it sent, and the reply's call tokens, which that render still holds, are the sampled IDs."""
    gateway, backend, policy = gateway_of("qwen3")
    first = _complete(gateway, "r", [{"role": "user", "content": "Weather in Paris?"}])
    reply = first.replies[0]
    assert reply.message.get("reasoning_content")
    sent = {k: v for k, v in reply.message.items() if k != "reasoning_content"}
    call_id = sent["tool_calls"][0]["id"]
    history = [{"role": "user", "content": "Weather in Paris?"}, sent,
               {"role": "tool", "tool_call_id": call_id, "content": "sunny, Paris"}]  # fmt: skip
    second = _complete(gateway, "r", history)
    assert second.plan.mode == "render"
    tok = gateway.tpl.tokenizer
    text = tok.apply_chat_template(as_rendered(history), tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert tok.decode(second.plan.prompt_ids) == text  # the render of what the client sent
    sampled = reply.result.token_ids
    tail = sampled[sampled.index(tok.convert_tokens_to_ids("</think>")) + 1 :]
    tail = tail[next(i for i, t in enumerate(tail) if tok.decode([t]).strip()) :]  # from the call's first token
    prompt = second.plan.prompt_ids
    assert any(prompt[i : i + len(tail)] == tail for i in range(len(prompt))), "the call's tokens were re-tokenized"
    assert second.plan.encoded < len(prompt) - len(tail)


def test_of_two_choices_that_read_alike_the_one_the_client_sent_is_continued():
    tok = load_tokenizer("qwen2.5-instruct")
    spaced = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    tight = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call><|im_end|>'
    outs = iter([spaced, tight, "It is sunny.<|im_end|>"])
    backend = Scripted(lambda req: tok.encode(next(outs), add_special_tokens=False))
    gateway = Gateway(tmpl.ChatTemplate(tok), backend)
    first = _complete(gateway, "n", [{"role": "user", "content": "Weather in Paris?"}], n=2)
    a, b = first.replies
    assert a.result.token_ids != b.result.token_ids and a.message["tool_calls"][0]["function"] == b.message[
        "tool_calls"][0]["function"]  # fmt: skip
    history = [{"role": "user", "content": "Weather in Paris?"}, a.message,
               {"role": "tool", "tool_call_id": a.message["tool_calls"][0]["id"], "content": "sunny, Paris"}]  # fmt: skip
    third = _complete(gateway, "n", history)
    episode = gateway.episode("n")
    assert episode.sequence_of(third.replies[0].call) == episode.sequence_of(a.call) != episode.sequence_of(b.call)


def test_a_reply_that_an_earlier_message_quotes_is_kept_where_it_is():
    """The user asks the model to say OK; its reply is ``OK``: on the next render (a new user turn) the
    reply's IDs go at the reply, not inside the user message that holds the same text."""
    tok = load_tokenizer("qwen2.5-instruct")
    backend = Scripted(lambda req: tok.encode("OK<|im_end|>", add_special_tokens=False))
    gateway = Gateway(tmpl.ChatTemplate(tok), backend)
    ask = [{"role": "user", "content": "Please say OK"}]
    first = _complete(gateway, "ok", ask)
    second = _complete(gateway, "ok", [*ask, first.replies[0].message, {"role": "user", "content": "Again"}])
    kept = first.plan.prompt_ids + first.replies[0].result.token_ids
    assert second.plan.prompt_ids[: len(kept)] == kept
    assert gateway.episode("ok").num_sequences == 1


def test_a_session_never_ends_while_a_call_of_it_runs():
    gateway, backend, _ = gateway_of("qwen2.5-instruct", calls=1, ttl=0.2)
    real = backend.generate_batch
    started, release = threading.Event(), threading.Event()

    def held(requests):  # the engine answers only when the test lets it
        started.set()
        release.wait(30)
        return real(requests)

    backend.generate_batch = held
    with served(create_app(gateway)) as url:
        pending: dict = {}
        worker = threading.Thread(target=lambda: pending.setdefault("r", _call(url, "long", "openai", GOOD["openai"])))
        worker.start()
        assert started.wait(30)
        time.sleep(0.4)  # past the TTL, mid-call
        assert httpx.get(f"{url}/episodes/drain").json()["episodes"] == []  # not expired
        busy = httpx.post(f"{url}/s/long/finish")
        assert busy.status_code == 409 and "in flight" in busy.json()["error"]["message"]
        release.set()
        worker.join(30)
        assert pending["r"].status_code == 200
        time.sleep(0.4)  # now idle past the TTL: it ends, with its call
        drained = httpx.get(f"{url}/episodes/drain").json()["episodes"]
        assert [d["session"] for d in drained] == ["long"] and len(drained[0]["record"]["calls"]) == 1


def test_a_call_that_names_no_session_is_an_episode_of_one_call():
    gateway, backend, _ = gateway_of("qwen2.5-instruct", calls=1)
    with served(create_app(gateway)) as url:
        r = httpx.post(f"{url}/v1/chat/completions", json=GOOD["openai"], timeout=30)
        assert r.status_code == 200
        key = r.headers["x-tmpl-session"]
        assert key.startswith("anon-") and len(gateway.sessions) == 0
        drained = httpx.get(f"{url}/episodes/drain").json()["episodes"]
        assert [d["session"] for d in drained] == [key] and len(drained[0]["record"]["calls"]) == 1
        named = httpx.post(f"{url}/v1/chat/completions", json=GOOD["openai"], headers={"X-Tmpl-Session": "mine"})
        assert named.status_code == 200 and len(gateway.episode("mine").calls) == 1


def test_with_an_admin_token_the_trainers_routes_need_it():
    gateway, backend, _ = gateway_of("qwen2.5-instruct", calls=1)
    auth = {"Authorization": "Bearer t0ken"}
    with served(create_app(gateway, admin_token="t0ken")) as url:
        assert _call(url, "s", "openai", GOOD["openai"]).status_code == 200  # the agent's calls need none
        for method, path, body in (("get", "/s/s/episode", None), ("post", "/s/s/reward", {"reward": 1}),
                                   ("get", "/episodes/drain", None), ("post", "/s/s/finish", None)):  # fmt: skip
            kwargs = {"json": body} if body is not None else {}
            assert getattr(httpx, method)(url + path, **kwargs).status_code == 401, path
            assert getattr(httpx, method)(url + path, headers=auth, **kwargs).status_code == 200, path


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"stop": 5}, "stop must be"),
        ({"stop": {"a": 1}}, "stop must be"),
    ],
)
def test_more_bad_fields_are_400s(body, needle):
    gateway, _, _ = gateway_of("qwen2.5-instruct", calls=1)
    with served(create_app(gateway)) as url:
        assert needle in _shape("openai", _call(url, "b", "openai", dict(GOOD["openai"], **body)), 400)
        deep = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        with_limit = httpx.post(f"{url}/s/b/v1/chat/completions", content=deep, timeout=30)
        assert with_limit.status_code == 400 and "nested too deep" in with_limit.json()["error"]["message"]
        bad_call = httpx.post(f"{url}/s/b/reward", json={"reward": 1, "call": ["x"]})
        assert bad_call.status_code == 400


def test_anthropic_reports_the_stop_sequence_that_ended_a_reply():
    tok = load_tokenizer("qwen2.5-instruct")
    backend = Scripted(lambda req: tok.encode("Sunny. END more words.<|im_end|>", add_special_tokens=False))
    gateway = Gateway(tmpl.ChatTemplate(tok), backend)
    with served(create_app(gateway)) as url:
        client = anthropic.Anthropic(base_url=f"{url}/s/a", api_key="unused", max_retries=0)
        reply = client.messages.create(
            model="m", max_tokens=64, messages=[{"role": "user", "content": "Weather?"}], stop_sequences=["END"]
        )
    assert (reply.stop_reason, reply.stop_sequence, reply.content[0].text) == ("stop_sequence", "END", "Sunny.")


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_an_engine_past_the_call_timeout_is_cancelled_and_a_504(dialect):
    tok = load_tokenizer("qwen2.5-instruct")
    backend = Slow()
    gateway = Gateway(tmpl.ChatTemplate(tok), backend, call_timeout=0.3)
    with served(create_app(gateway)) as url:
        started = time.monotonic()
        message = _shape(dialect, _call(url, "late", dialect, GOOD[dialect]), 504)
        assert time.monotonic() - started < 20  # not the engine's 30 s
    assert "call_timeout=0.3" in message
    assert len(backend.cancelled) == 1
    session = gateway.session("late")
    assert list(session.ended) == backend.cancelled and "no reply within 0.3 s" in session.ended[backend.cancelled[0]]
    assert session.episode.calls == () and session.inflight == 0


def test_a_504_has_each_apis_error_type():
    tok = load_tokenizer("qwen2.5-instruct")
    gateway = Gateway(tmpl.ChatTemplate(tok), Slow(), call_timeout=0.2)
    with served(create_app(gateway)) as url:
        openai_body = _call(url, "t1", "openai", GOOD["openai"]).json()
        anthropic_body = _call(url, "t2", "anthropic", GOOD["anthropic"]).json()
    assert openai_body["error"]["code"] == 504 and openai_body["error"]["type"] == "timeout_error"
    assert anthropic_body["error"]["type"] == "timeout_error"


def test_a_session_is_bounded_in_tokens_and_a_refused_call_records_nothing():
    gateway, backend, policy = gateway_of("qwen2.5-instruct", calls=3, max_session_tokens=700)
    client_messages = [{"role": "user", "content": "Weather in Paris, Lima and Oslo?"}]
    with served(create_app(gateway)) as url:
        refused = None
        for _ in range(6):
            response = _call(url, "big", "openai", dict(GOOD["openai"], messages=client_messages))
            if response.status_code != 200:
                refused = response
                break
            message = response.json()["choices"][0]["message"]
            client_messages.append({k: v for k, v in message.items() if v is not None})
            for call in message.get("tool_calls") or []:
                city = json.loads(call["function"]["arguments"])["city"]
                client_messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"sunny, {city}"})
        assert refused is not None, "the session was never refused"
        assert "over the limit of 700" in _shape("openai", refused, 400)
        other = _call(url, "small", "openai", GOOD["openai"])  # another session is unaffected
        assert other.status_code == 200
    session = gateway.session("big")
    episode = session.episode
    held = sum(len(c.prompt_ids) + len(c.completion_ids) for c in episode.calls)
    assert held == session.tokens_held <= 700
    assert len(backend.requests) == len(gateway.episode("big").calls) + 1  # the refused call never reached it
    assert len(episode.calls) >= 1 and int(episode.sequences[0].mask.sum()) == sum(
        len(c.completion_ids) for c in episode.calls
    )


def _same_sequences(a, b) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.ids.tolist() == y.ids.tolist() and x.mask.tolist() == y.mask.tolist()
        assert x.logprobs.tolist() == y.logprobs.tolist() and x.versions.tolist() == y.versions.tolist()
        assert x.branch.kind == y.branch.kind and x.branch.edit == y.branch.edit


def test_finished_episodes_stream_as_json_lines_and_read_back_the_same(tmp_path):
    gateway, backend, policy = gateway_of("qwen2.5-instruct", calls=1, ttl=1.0)
    got: list[dict] = []

    def read_stream(url: str) -> None:
        with httpx.stream("GET", f"{url}/episodes/stream", params={"limit": 3, "idle": 20}, timeout=30) as r:
            assert r.headers["content-type"].startswith("application/x-ndjson")
            for line in r.iter_lines():
                if line:
                    got.append(json.loads(line))

    with served(create_app(gateway)) as url:
        reader = threading.Thread(target=read_stream, args=(url,))
        reader.start()
        time.sleep(0.3)  # the stream is waiting before any session ends
        for key in ("a", "b", "old"):
            assert _call(url, key, "openai", GOOD["openai"]).status_code == 200
        episodes = {key: gateway.episode(key) for key in ("a", "b", "old")}
        call = episodes["a"].calls[0].id
        assert httpx.post(f"{url}/s/a/reward", json={"reward": 0.25, "call": call}).status_code == 200
        assert httpx.post(f"{url}/s/a/reward", json={"reward": 1.0}).status_code == 200
        httpx.post(f"{url}/s/a/finish")
        httpx.post(f"{url}/s/b/finish")
        # "old" is never finished: its TTL ends it while the stream waits
        reader.join(25)
        assert not reader.is_alive()
        assert httpx.get(f"{url}/episodes/drain").json()["episodes"] == []  # each given once
    assert [g["session"] for g in got] == ["a", "b", "old"]
    assert "expired" in got[2]["reason"]
    back = {g["session"]: tmpl.export.episode_from_entry(g) for g in got}
    for key, episode in episodes.items():
        _same_sequences(episode.sequences, back[key].sequences)
    assert back["a"].reward == 1.0 and back["a"].call_reward(call) == 0.25  # a call's reward set later is kept
    # the same lines to a file and back, then into one collated batch (one row per sequence)
    path = tmpl.export.episodes_to_jsonl(list(back.values()), tmp_path / "episodes.jsonl.gz")
    again = tmpl.export.episodes_from_jsonl(path)
    assert [e.sample_id for e in again] == ["a", "b", "old"]
    for x, y in zip(again, back.values()):
        _same_sequences(x.sequences, y.sequences)
    rows = [row for ep in again for row in ep.rows()]
    batch = tmpl.collate(rows, pad_id=0)
    sampled = sum(len(c.completion_ids) for ep in episodes.values() for c in ep.calls)
    assert int((np.asarray(batch["tool_mask"]) * np.asarray(batch["completion_mask"])).sum()) == sampled
    assert sum(int(seq.mask.sum()) for ep in again for seq in ep.sequences) == sampled


def test_a_bad_episode_line_is_an_export_error(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"session": "x", "record": {"calls": [{"prompt_ids": [1]}]}}\n')
    with pytest.raises(tmpl.errors.ExportError, match=r"bad.jsonl:1.*completion_ids"):
        tmpl.export.episodes_from_jsonl(path)
    with pytest.raises(tmpl.errors.ExportError, match="an episode line is"):
        tmpl.export.episode_from_entry({"session": "x"})


class Stoppable(Backend):
    """An engine that samples ``partial`` then waits (30 s) until stopped: stopped, it answers with what it
    sampled (``finish_reason="abort"``), as vLLM's ``abort_requests`` does; after that, ``answer``."""

    def __init__(self, partial: list[int], answer: list[int]) -> None:
        self.partial, self.answer = partial, answer
        self.stopped: list[str] = []
        self.cancelled: list[str] = []
        self.started = threading.Event()
        self._stops: dict[str, asyncio.Event] = {}
        self.requests: list = []

    async def agenerate(self, request):
        self.requests.append(request)
        if len(self.requests) > 1:
            return GenerationResult(request.request_id, self.answer, [-0.2] * len(self.answer), "stop")
        stop = self._stops[request.request_id] = asyncio.Event()
        self.started.set()
        try:
            await asyncio.wait_for(stop.wait(), 30)
        except TimeoutError:
            return GenerationResult(request.request_id, [*self.partial, *self.answer], [-0.1] * 99, "stop")
        return GenerationResult(request.request_id, self.partial, [-0.3] * len(self.partial), "abort")

    async def stop(self, request_id: str) -> bool:
        event = self._stops.get(request_id)
        if event is None:
            return False
        self.stopped.append(request_id)
        event.set()
        return True

    async def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)


def test_a_client_gone_mid_call_leaves_the_tokens_sampled_so_far_recorded_as_aborted():
    tok = load_tokenizer("qwen2.5-instruct")
    partial = tok.encode("Let me think about the weather in", add_special_tokens=False)
    answer = tok.encode("It is sunny in Paris.<|im_end|>", add_special_tokens=False)
    backend = Stoppable(partial, answer)
    gateway = Gateway(tmpl.ChatTemplate(tok), backend)
    with served(create_app(gateway, poll=0.05)) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/s/gone/v1/chat/completions", json=GOOD["openai"], timeout=1.0)
        deadline = time.monotonic() + 10
        while not gateway.session("gone").ended and time.monotonic() < deadline:
            time.sleep(0.05)
        # the client tries again with the same history: the engine answers, the reply is a new sequence
        again = _call(url, "gone", "openai", GOOD["openai"])
        assert again.status_code == 200, again.text
    assert backend.started.is_set() and backend.cancelled == []
    session = gateway.session("gone")
    [stopped] = backend.stopped
    assert (
        list(session.ended) == [stopped] and f"its {len(partial)} sampled tokens are recorded" in session.ended[stopped]
    )
    episode = session.episode
    first, second = episode.calls
    full = full_render_ids(tok, GOOD["openai"]["messages"], TOOLS)
    assert first.id == stopped and first.completion_ids.tolist() == partial  # what the engine sampled, kept
    assert first.prompt_ids.tolist() == full == second.prompt_ids.tolist()  # the retry never sees them
    assert second.completion_ids.tolist() == answer
    assert episode.num_sequences == 2 and episode.sequences[1].branch.kind == "rewound"
    assert [int(s.mask.sum()) for s in episode.sequences] == [len(partial), len(answer)]  # each trained once
    reply = again.json()["choices"][0]["message"]["content"]
    assert reply == "It is sunny in Paris." and "think about" not in reply
