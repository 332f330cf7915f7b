"""Live streams through the gateway (tmpl.gateway.streaming): the real ``openai`` (chat and responses) and
``anthropic`` SDKs parse every event of streams whose engine (a Scripted backend that waits between its
pieces) is still sampling when the first text arrives; keep-alives during a slow first token; a client
that stops reading mid-stream (the call recorded once, aborted, with the tokens sampled so far; the
session goes on); tool calls given as each SDK's own objects; and the recorded call of a streamed request
equal to that of the same request answered whole. On the Qwen2.5 tokenizer; each expected prompt is the
template's own ``apply_chat_template`` render of the raw messages.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

import tmpl
from tmpl.backends import Scripted
from tmpl.gateway import Gateway, create_app
from tmpl.gateway.streaming import LiveText

from .conftest import load_tokenizer
from .gateway_util import full_render_ids, served

openai = pytest.importorskip("openai", reason="the openai SDK is not installed (pip install -e '.[test]')")
anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is not installed (pip install -e '.[test]')")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi", reason="FastAPI is not installed (pip install -e '.[gateway]')")

TEXT = "The weather in Paris is sunny and warm today, with a light breeze from the west.<|im_end|>"
CALL = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}}
]
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]


class Gate:
    """What the Scripted engine awaits before each piece of a streamed completion: pieces listed in
    ``hold`` wait until the test releases them (``release()``), ``delay`` seconds pass before the first."""

    def __init__(self, hold: tuple[int, ...] = (), delay: float = 0.0) -> None:
        self.hold = hold
        self.delay = delay
        self.open = threading.Event()
        self.reached = threading.Event()  # a held piece is being waited for

    async def __call__(self, req, k: int) -> None:
        if k == 0 and self.delay:
            await asyncio.sleep(self.delay)
        if k in self.hold:
            self.reached.set()
            deadline = time.monotonic() + 30  # a test that never releases it fails instead of hanging
            while not self.open.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)

    def release(self) -> None:
        self.open.set()


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("qwen2.5-instruct")


def make(tok, answer: str, gate: Gate | None = None, *, keepalive: float = 5.0):
    """A gateway over a Scripted engine answering ``answer`` in 4 pieces, its app, and the sampled IDs by call."""
    sampled: dict[str, list[int]] = {}

    def policy(req):
        ids = tok.encode(answer, add_special_tokens=False)
        sampled[req.request_id] = ids
        return ids

    backend = Scripted(policy, pieces=4, pace=gate)
    gateway = Gateway(tmpl.ChatTemplate(tok), backend)
    return gateway, create_app(gateway, keepalive=keepalive), sampled


def recorded(gateway, key: str) -> list[tuple[list[int], list[int], list[float]]]:
    return [
        (c.prompt_ids.tolist(), c.completion_ids.tolist(), [round(x, 6) for x in c.logprobs.tolist()])
        for c in gateway.episode(key).calls
    ]


def wait_for(check, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# -- LiveText on real token IDs ------------------------------------------------------------------
def feed(tok, text: str, stops=()) -> tuple[list[str], str]:
    """The pieces LiveText queues for ``text`` fed one token at a time, and its final content as parsed."""
    tpl = tmpl.ChatTemplate(tok)
    ids = tok.encode(text, add_special_tokens=False)

    async def run():
        live = LiveText(tpl, stops)
        for t in ids:
            live.tokens([t])
        pieces = []
        while not live.queue.empty():
            kind, value = live.queue.get_nowait()
            pieces.append(value)
        return pieces

    return asyncio.run(run()), tmpl.toolcalls.parse_completion(tpl, ids).content


def test_live_text_sends_only_whole_characters_and_only_content(tok):
    text = "Clear 🌤 skies, 28°C — très agréable 東京.<|im_end|>"
    ids = tok.encode(text, add_special_tokens=False)
    split = sum(1 for t in ids if "\ufffd" in tok.decode([t]))
    assert split >= 2, "the test needs characters whose bytes span tokens"
    pieces, content = feed(tok, text)
    assert all("\ufffd" not in p for p in pieces) and len(pieces) > 3
    assert "".join(pieces) == content == "Clear 🌤 skies, 28°C — très agréable 東京."

    pieces, content = feed(tok, CALL)
    assert "".join(pieces) == content == "Let me check."  # nothing of the call's markup goes out live
    pieces, _ = feed(tok, "Done. STOP and more<|im_end|>", stops=("STOP",))
    assert "".join(pieces) == "Done."  # the stop string (and what could begin it) is held back
    pieces, _ = feed(tok, "Done. ST", stops=("STOP",))
    assert "".join(pieces) == "Done."  # "ST" may begin "STOP": held until decided
    pieces, _ = feed(tok, "Done. ST<|im_end|>", stops=("STOP",))
    assert "".join(pieces) == "Done. ST"  # the turn ended: decided


# -- the SDKs, live ------------------------------------------------------------------------------
def test_openai_chat_stream_is_live_and_recorded_as_the_whole_call(tok):
    gate = Gate(hold=(2,))
    gateway, app, sampled = make(tok, TEXT, gate)
    with served(app) as url:
        client = openai.OpenAI(base_url=f"{url}/s/live/v1", api_key="x", max_retries=0)
        stream = client.chat.completions.create(model="m", messages=QUESTION, stream=True,
                                                stream_options={"include_usage": True}, logprobs=True)  # fmt: skip
        chunks = []
        for chunk in stream:
            chunks.append(chunk)
            if chunk.choices and chunk.choices[0].delta.content:
                break
        first = chunks[-1].choices[0].delta.content
        assert gate.reached.is_set() and not gateway.session("live").episode.calls  # the engine is still sampling
        assert TEXT.startswith(first)
        gate.release()
        chunks += list(stream)
        whole = openai.OpenAI(base_url=f"{url}/s/whole/v1", api_key="x", max_retries=0)
        answer = whole.chat.completions.create(model="m", messages=QUESTION, logprobs=True)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == answer.choices[0].message.content == TEXT.removesuffix("<|im_end|>")
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 3  # sent in pieces
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    streamed_lps = [
        x.logprob for c in chunks if c.choices and c.choices[0].logprobs for x in c.choices[0].logprobs.content
    ]
    assert streamed_lps == [x.logprob for x in answer.choices[0].logprobs.content]
    assert chunks[-1].usage.completion_tokens == answer.usage.completion_tokens == len(tok.encode(TEXT))
    live, plain = recorded(gateway, "live"), recorded(gateway, "whole")
    assert live == plain and len(live) == 1
    assert live[0][0] == full_render_ids(tok, QUESTION, None)
    assert live[0][1] == tok.encode(TEXT, add_special_tokens=False)


def test_anthropic_stream_is_live_and_gives_the_tool_use(tok):
    gate = Gate(hold=(2,))
    gateway, app, _ = make(tok, CALL, gate)
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": WEATHER}]
    with served(app) as url:
        client = anthropic.Anthropic(base_url=f"{url}/s/live", api_key="x", max_retries=0)
        with client.messages.stream(model="m", max_tokens=64, messages=QUESTION, tools=tools) as stream:
            kinds = []
            for event in stream:
                kinds.append(event.type)
                if event.type == "text" and not gate.open.is_set():
                    assert event.text == "Let me check."
                    assert not gateway.session("live").episode.calls  # the engine has not finished
                    gate.release()
            message = stream.get_final_message()
        whole = anthropic.Anthropic(base_url=f"{url}/s/whole", api_key="x", max_retries=0)
        answer = whole.messages.create(model="m", max_tokens=64, messages=QUESTION, tools=tools)
    assert kinds[0] == "message_start" and "text" in kinds and kinds[-1] == "message_stop"
    assert [b.type for b in message.content] == ["text", "tool_use"] == [b.type for b in answer.content]
    assert message.content[0].text == answer.content[0].text == "Let me check."
    use = message.content[1]
    assert isinstance(use, anthropic.types.ToolUseBlock)
    assert (
        (use.name, use.input) == ("get_weather", {"city": "Paris"}) == (answer.content[1].name, answer.content[1].input)
    )
    assert message.stop_reason == answer.stop_reason == "tool_use"
    assert message.usage.output_tokens == answer.usage.output_tokens == len(tok.encode(CALL))
    assert recorded(gateway, "live") == recorded(gateway, "whole")
    prompt = recorded(gateway, "live")[0][0]
    assert prompt == full_render_ids(tok, QUESTION, [{"type": "function", "function": {"name": "get_weather",
                                                       "description": "Weather", "parameters": WEATHER}}])  # fmt: skip


def test_openai_responses_and_chat_streams_give_the_sdks_tool_calls(tok):
    gate = Gate(hold=(2,))
    gateway, app, _ = make(tok, CALL, gate)
    tools = [{"type": "function", "name": "get_weather", "description": "Weather", "parameters": WEATHER}]
    with served(app) as url:
        client = openai.OpenAI(base_url=f"{url}/s/resp/v1", api_key="x", max_retries=0)
        with client.responses.stream(model="m", input="Weather in Paris?", tools=tools) as stream:
            for event in stream:
                if event.type == "response.output_text.delta" and not gate.open.is_set():
                    assert event.delta == "Let me check." and not gateway.session("resp").episode.calls
                    gate.release()
            response = stream.get_final_response()
        gate.open.clear()
        chat = openai.OpenAI(base_url=f"{url}/s/chat/v1", api_key="x", max_retries=0)
        with chat.chat.completions.stream(model="m", messages=QUESTION, tools=CHAT_TOOLS) as stream:
            for event in stream:
                if event.type == "content.delta" and event.delta:  # (the first chunk's role has content "")
                    assert event.delta == "Let me check." and not gateway.session("chat").episode.calls
                    gate.release()
            completion = stream.get_final_completion()
    kinds = [item.type for item in response.output]
    assert kinds == ["message", "function_call"]
    assert response.output_text == "Let me check." and response.status == "completed"
    call = response.output[1]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    message = completion.choices[0].message
    assert message.content == "Let me check." and completion.choices[0].finish_reason == "tool_calls"
    [tool_call] = message.tool_calls
    assert (tool_call.function.name, json.loads(tool_call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert recorded(gateway, "resp")[0][1:] == recorded(gateway, "chat")[0][1:]


# -- keep-alives -----------------------------------------------------------------------------------
def test_keepalives_during_a_slow_first_token_parse_fine(tok):
    gateway, app, _ = make(tok, TEXT, Gate(delay=0.6), keepalive=0.1)
    body = {"model": "m", "messages": QUESTION, "stream": True, "max_tokens": 64}
    with served(app) as url:
        with httpx.stream("POST", f"{url}/s/raw/v1/chat/completions", json=body, timeout=10) as r:
            raw = r.read().decode()
        with httpx.stream("POST", f"{url}/s/raw2/v1/messages", json=body, timeout=10) as r:
            raw_anthropic = r.read().decode()
        chat = openai.OpenAI(base_url=f"{url}/s/a/v1", api_key="x", max_retries=0)
        text = "".join(c.choices[0].delta.content or "" for c in chat.chat.completions.create(
            model="m", messages=QUESTION, stream=True) if c.choices)  # fmt: skip
        with chat.responses.stream(model="m", input="Weather in Paris?") as stream:
            response = stream.get_final_response()
        claude = anthropic.Anthropic(base_url=f"{url}/s/c", api_key="x", max_retries=0)
        with claude.messages.stream(model="m", max_tokens=64, messages=QUESTION) as stream:
            message = stream.get_final_message()
    lines = raw.split("\n\n")
    pings = [k for k, line in enumerate(lines) if line == ": ping"]
    first_text = next(k for k, line in enumerate(lines) if '"content": "The' in line)
    assert len(pings) >= 3 and max(pings) < first_text  # sent while the engine had no token yet
    assert raw_anthropic.count('event: ping\ndata: {"type": "ping"}') >= 3
    expected = TEXT.removesuffix("<|im_end|>")
    assert text == response.output_text == message.content[0].text == expected


# -- a client that stops reading ---------------------------------------------------------------
@pytest.mark.parametrize("path", ["v1/chat/completions", "v1/messages"])
def test_client_gone_mid_stream_records_the_call_once_aborted(tok, path):
    gate = Gate(hold=(2,))
    gateway, app, sampled = make(tok, TEXT, gate)
    body = {"model": "m", "messages": QUESTION, "stream": True, "max_tokens": 64}
    with served(app) as url:
        with httpx.stream("POST", f"{url}/s/gone/{path}", json=body, timeout=10) as r:
            for line in r.iter_lines():
                if '"content": "The' in line or '"text": "The' in line:
                    break  # the first text: then the client goes away
        session = gateway.session("gone")
        wait_for(lambda: session.ended)
        [(call_id, why)] = session.ended.items()
        assert why.startswith("aborted: the client went away")
        ids = tok.encode(TEXT, add_special_tokens=False)
        halves = round(len(ids) * 2 / 4)  # pieces 0 and 1 of 4 were sampled before the held piece 2
        [call] = gateway.episode("gone").calls
        assert call.id == call_id and call.completion_ids.tolist() == ids[:halves]
        assert call.logprobs.tolist() == [-0.25] * halves
        gate.release()
        time.sleep(0.2)
        assert len(gateway.episode("gone").calls) == 1  # never twice
        # the session goes on: the next call is answered and recorded
        client = openai.OpenAI(base_url=f"{url}/s/gone/v1", api_key="x", max_retries=0)
        again = client.chat.completions.create(model="m", messages=QUESTION)
        assert again.choices[0].message.content == TEXT.removesuffix("<|im_end|>")
    calls = gateway.episode("gone").calls
    assert len(calls) == 2 and calls[1].completion_ids.tolist() == ids
    assert calls[1].prompt_ids.tolist() == full_render_ids(tok, QUESTION, None)


def test_a_refused_streamed_call_is_an_http_error(tok):
    gateway, app, _ = make(tok, TEXT)
    with served(app) as url:
        r = httpx.post(f"{url}/s/x/v1/chat/completions", json={"model": "m", "messages": QUESTION, "stream": True,
                                                              "temperature": -1}, timeout=10)  # fmt: skip
        assert r.status_code == 400 and "temperature" in r.json()["error"]["message"]
    assert not gateway.backend.requests  # refused before the engine


# -- VLLMServer's stream (vLLM's event stream on /inference/v1/generate, the stand-in's) ---------------
def test_vllm_server_passes_each_chunk_on_as_it_comes(tok):
    from tmpl.backends import GenerationRequest, VLLMServer

    from .vllm_standin import StandinServer

    ids = tok.encode(TEXT, add_special_tokens=False)
    engine = Scripted(lambda req: ids)
    with StandinServer(engine, chunk=4) as flaky, StandinServer(engine, chunk=4) as good:
        flaky.drop_first = 1  # the first try loses its connection before any token: retried elsewhere
        backend = VLLMServer([flaky.url, good.url], api="generate", retries=2, backoff=0.0, sticky=False)

        async def run():
            request = GenerationRequest("r1", full_render_ids(tok, QUESTION, None), 64, frozenset(ids[-1:]))
            pieces = [p async for p in backend.astream(request)]
            whole = await backend.agenerate(GenerationRequest("r2", request.prompt_ids, 64, request.stop_token_ids))
            return pieces, whole

        pieces, whole = asyncio.run(run())
        backend.close()
    assert "r1~a1" in good.request_ids and flaky.requests >= 1  # the dropped try was retried under a new id
    assert [len(p.token_ids) for p in pieces[:-1]] == [min(4, len(ids) - a) for a in range(0, len(ids), 4)]
    assert pieces[-1].token_ids == [] and pieces[-1].result is not None
    result = pieces[-1].result
    assert [t for p in pieces for t in p.token_ids] == result.token_ids == whole.token_ids == ids
    assert [x for p in pieces[:-1] for x in p.logprobs] == result.logprobs == whole.logprobs
    assert result.finish_reason == whole.finish_reason == "stop"


def test_torch_passes_each_step_on_and_the_whole_result_last(tiny_qwen2):
    from tmpl.backends import GenerationRequest, Sampling, Torch

    model, tok = tiny_qwen2
    backend = Torch(model)
    stops = frozenset({tok.convert_tokens_to_ids("<|im_end|>")})
    prompt = tok.encode("Hello there, how are you?")

    async def run():
        request = GenerationRequest("t1", prompt, 10, stops, Sampling(temperature=0.0))
        return [p async for p in backend.astream(request)]

    pieces = asyncio.run(run())
    [whole] = backend.generate_batch([GenerationRequest("t2", prompt, 10, stops, Sampling(temperature=0.0))])
    result = pieces[-1].result
    assert len(pieces) > 3 and all(p.result is None and p.logprobs is None for p in pieces[:-1])
    assert [t for p in pieces for t in p.token_ids] == result.token_ids == whole.token_ids
    assert result.logprobs == pytest.approx(whole.logprobs, abs=1e-5)


def test_gemini_stream_is_live_and_gives_the_function_call(tok):
    genai = pytest.importorskip("google.genai", reason="google-genai is not installed (pip install -e '.[test]')")
    types = genai.types
    gate = Gate(hold=(2,))
    gateway, app, _ = make(tok, CALL, gate, keepalive=0.1)
    weather = types.FunctionDeclaration(
        name="get_weather",
        description="Weather",
        parameters=types.Schema(
            type=types.Type.OBJECT, properties={"city": types.Schema(type=types.Type.STRING)}, required=["city"]
        ),
    )
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[weather])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    with served(app) as url:
        client = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=f"{url}/s/gem"))
        chunks = []
        for chunk in client.models.generate_content_stream(model="m", contents="Weather in Paris?", config=config):
            chunks.append(chunk)
            if len(chunks) == 1:
                assert chunk.candidates[0].content.parts[0].text == "Let me check."
                assert not gateway.session("gem").episode.calls  # the engine is still sampling
                time.sleep(0.3)  # keep-alives (blank lines) go out meanwhile: the SDK skips them
                gate.release()
        whole = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=f"{url}/s/gem2"))
        answer = whole.models.generate_content(model="m", contents="Weather in Paris?", config=config)
        with httpx.stream("POST", f"{url}/s/gem3/v1beta/models/m:streamGenerateContent",
                          json={"contents": [{"role": "user", "parts": [{"text": "Hi"}]}]}, timeout=10) as r:  # fmt: skip
            array = json.loads(r.read())  # without alt=sse: one JSON array, sent as it is made
    parts = [p for c in chunks for p in c.candidates[0].content.parts]
    assert "".join(p.text for p in parts if p.text) == answer.text == "Let me check."
    [call] = [p.function_call for p in parts if p.function_call]
    assert (
        (call.name, call.args)
        == ("get_weather", {"city": "Paris"})
        == (
            answer.function_calls[0].name,
            answer.function_calls[0].args,
        )
    )
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert chunks[-1].usage_metadata.candidates_token_count == len(tok.encode(CALL))
    assert recorded(gateway, "gem") == recorded(gateway, "gem2")
    assert array[0]["candidates"][0]["content"]["parts"][0]["text"] == "Let me check."
    assert array[-1]["candidates"][0]["finishReason"] == "STOP"


def test_an_engine_failing_mid_stream_is_each_sdks_error(tok):
    class Breaks(Scripted):
        """Streams its first pieces, then the engine is lost."""

        async def astream(self, request):
            async for piece in super().astream(request):
                if piece.result is not None:
                    raise RuntimeError("the engine was lost")
                yield piece

    backend = Breaks(lambda req: tok.encode(TEXT, add_special_tokens=False), pieces=4)
    gateway = Gateway(tmpl.ChatTemplate(tok), backend)
    with served(create_app(gateway)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/a/v1", api_key="x", max_retries=0)
        got = []
        with pytest.raises(openai.APIError, match="the engine was lost"):
            for chunk in client.chat.completions.create(model="m", messages=QUESTION, stream=True):
                got += [chunk.choices[0].delta.content or ""] if chunk.choices else []
        assert "".join(got) and TEXT.startswith("".join(got))  # the text before the failure came live
        with client.responses.stream(model="m", input="Weather in Paris?") as stream:
            events = list(stream)  # the SDK parses each event; the stream ends failed
        claude = anthropic.Anthropic(base_url=f"{url}/s/b", api_key="x", max_retries=0)
        with pytest.raises(anthropic.APIError, match="the engine was lost"):
            with claude.messages.stream(model="m", max_tokens=64, messages=QUESTION) as stream:
                stream.get_final_message()
    assert [e.type for e in events][-2:] == ["error", "response.failed"]
    assert "the engine was lost" in events[-2].message and events[-1].response.status == "failed"
    assert not gateway.session("a").episode.calls and not gateway.session("b").episode.calls  # as a failed call


THINK = "<think>\nThe user wants the weather in Paris, so I should call the weather tool for it.\n</think>\n\n" + CALL


def test_reasoning_streams_live_then_the_content_for_every_sdk():
    """Qwen3 (reasoning on): a reply that opens with its reasoning block has the reasoning sent live as each
    API's reasoning deltas, then the content, then the call; each SDK assembles what the whole answer says."""
    genai = pytest.importorskip("google.genai", reason="google-genai is not installed (pip install -e '.[test]')")
    tok3 = load_tokenizer("qwen3")
    gate = Gate(hold=(2,))
    backend = Scripted(lambda req: tok3.encode(THINK, add_special_tokens=False), pieces=4, pace=gate)
    gateway = Gateway(tmpl.ChatTemplate(tok3, enable_thinking=True), backend)
    reasoning = "The user wants the weather in Paris, so I should call the weather tool for it."
    seen: dict[str, str] = {}

    def first(name: str, text: str, key: str) -> None:  # the first reasoning delta: the engine still sampling
        if name not in seen:
            seen[name] = text
            assert reasoning.startswith(text) and not gateway.session(key).episode.calls
            gate.release()

    with served(create_app(gateway)) as url:
        oa = openai.OpenAI(base_url=f"{url}/s/chat/v1", api_key="x", max_retries=0)
        thought, content, calls = "", "", {}
        for chunk in oa.chat.completions.create(model="m", messages=QUESTION, tools=CHAT_TOOLS, stream=True):
            delta = chunk.choices[0].delta
            if getattr(delta, "reasoning_content", None):
                first("chat", delta.reasoning_content, "chat")
                thought += delta.reasoning_content
            content += delta.content or ""
            calls.update({c.index: c.function.name for c in delta.tool_calls or []})
        assert (thought, content, calls) == (reasoning, "Let me check.", {0: "get_weather"})

        gate.open.clear()
        claude = anthropic.Anthropic(base_url=f"{url}/s/claude", api_key="x", max_retries=0)
        tools = [{"name": "get_weather", "description": "Weather", "input_schema": WEATHER}]
        with claude.messages.stream(model="m", max_tokens=64, messages=QUESTION, tools=tools) as stream:
            for event in stream:
                if event.type == "thinking":
                    first("anthropic", event.thinking, "claude")
            message = stream.get_final_message()
        assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
        assert (message.content[0].thinking, message.content[1].text) == (reasoning, "Let me check.")

        gate.open.clear()
        resp = openai.OpenAI(base_url=f"{url}/s/resp/v1", api_key="x", max_retries=0)
        functions = [{"type": "function", "name": "get_weather", "description": "Weather", "parameters": WEATHER}]
        with resp.responses.stream(model="m", input="Weather in Paris?", tools=functions) as stream:
            for event in stream:
                if event.type == "response.reasoning_text.delta":
                    first("responses", event.delta, "resp")
            response = stream.get_final_response()
        assert [i.type for i in response.output] == ["reasoning", "message", "function_call"]
        assert response.output[0].content[0].text == reasoning and response.output_text == "Let me check."

        types = genai.types
        client = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=f"{url}/s/gem"))
        config = types.GenerateContentConfig(thinking_config=types.ThinkingConfig(include_thoughts=True))
        parts = []
        for chunk in client.models.generate_content_stream(model="m", contents="Weather in Paris?", config=config):
            for part in chunk.candidates[0].content.parts:
                parts.append(part)
        assert [p.text for p in parts if p.thought] == [reasoning]  # Gemini's thought: one part, at the end
        assert "".join(p.text for p in parts if p.text and not p.thought) == "Let me check."
    assert sorted(seen) == ["anthropic", "chat", "responses"]
    sampled = tok3.encode(THINK, add_special_tokens=False)
    for key in ("chat", "claude", "resp", "gem"):
        assert gateway.episode(key).calls[0].completion_ids.tolist() == sampled
