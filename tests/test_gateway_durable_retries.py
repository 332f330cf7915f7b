"""Streamed retries answered once (issue 52): with a durable store, a streamed request retried after its first
attempt was answered is given the recorded reply again as a stream of its own dialect, not a second engine
call; one retried while the first attempt still runs waits for it and gets the same answer.

The retries are the SDKs' own: an ASGI wrapper in front of the gateway plays a proxy that loses the first
answer (the gateway answered it whole, the client gets a 502 with ``retry-after-ms``), so the ``openai`` and
``anthropic`` SDKs retry with ``x-stainless-retry-count: 1`` (and the ``Idempotency-Key`` the caller gave).
The engine is a Scripted Qwen2.5 (its requests counted); expectations are the script's own text.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

import tmpl  # noqa: E402
from tmpl.backends import Scripted  # noqa: E402
from tmpl.gateway import Gateway, create_app  # noqa: E402
from tmpl.toolcalls.schema import tool_schema  # noqa: E402

from .conftest import load_tokenizer  # noqa: E402
from .fixture_models import get_weather  # noqa: E402
from .gateway_util import full_render_ids, served, streamed_message  # noqa: E402

QUESTION = [{"role": "user", "content": "Weather in Quito?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Quito"}}\n</tool_call><|im_end|>'
TEXT = "It is sunny in Quito today, 21 degrees.<|im_end|>"
TOOLS = [tool_schema(get_weather)]  # the fixture's schema: the one the script's call names


class LoseFirstAnswers:
    """ASGI wrapper: the first ``lose`` POSTs run whole in the app (their bodies kept in :attr:`lost`), and
    the client gets a 502 instead, as from a proxy that lost the reply; :attr:`headers` has each POST's
    retry headers."""

    def __init__(self, app, lose: int) -> None:
        self.app, self.lose = app, lose
        self.lost: list[str] = []
        self.headers: list[tuple[str | None, str | None]] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        h = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.headers.append((h.get("x-stainless-retry-count"), h.get("idempotency-key")))
        if len(self.headers) > self.lose:
            return await self.app(scope, receive, send)
        parts: list[bytes] = []

        async def swallow(message):
            if message["type"] == "http.response.body":
                parts.append(message.get("body", b""))

        await self.app(scope, receive, swallow)
        self.lost.append(b"".join(parts).decode())
        await send({"type": "http.response.start", "status": 502,
                    "headers": [(b"content-type", b"application/json"), (b"retry-after-ms", b"20")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b'{"error": {"message": "bad gateway"}}'})


@pytest.fixture
def tok():
    return load_tokenizer("qwen2.5-instruct")


def make(tok, tmp_path, text: str, pace=None):
    backend = Scripted(lambda req: tok.encode(text, add_special_tokens=False), pieces=4, pace=pace)
    gateway = Gateway(tmpl.ChatTemplate(tok), backend, store=str(tmp_path / "gw.db"))
    return gateway, backend


def test_a_stream_whose_answer_was_lost_is_replayed_not_generated_again(tok, tmp_path):
    """openai (chat, a tool call) and anthropic (messages, text, with an Idempotency-Key): each SDK's retry
    of a stream the gateway had answered gets the same reply streamed again; the engine ran once each."""
    gateway, backend = make(tok, tmp_path, CALL)
    app = LoseFirstAnswers(create_app(gateway), lose=1)
    with served(app) as url:
        client = openai.OpenAI(base_url=f"{url}/s/o/v1", api_key="x", max_retries=2)
        chunks = list(client.chat.completions.create(model="m", messages=QUESTION, tools=TOOLS, stream=True))
        message = streamed_message(chunks)
        assert app.headers == [("0", None), ("1", None)]  # the SDK's own retry
        [call] = message["tool_calls"]
        assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {
            "city": "Quito"
        }
        lost_ids = set(re.findall(r'"id": "(chatcmpl-[^"]+)"', app.lost[0]))
        assert lost_ids == {c.id for c in chunks} and chunks[-1].choices[0].finish_reason == "tool_calls"
        assert len(backend.requests) == 1

        # anthropic: a text reply, the caller's Idempotency-Key carried by the SDK's retry
        app.headers.clear()
        app.lose = 1
        backend.policy = lambda req: tok.encode(TEXT, add_special_tokens=False)
        aclient = anthropic.Anthropic(base_url=f"{url}/s/a", api_key="x", max_retries=2)
        args = dict(model="m", max_tokens=200, messages=QUESTION, extra_headers={"Idempotency-Key": "k-a-1"})
        with aclient.messages.stream(**args) as stream:
            texts = list(stream.text_stream)
            final = stream.get_final_message()
        assert app.headers == [("0", "k-a-1"), ("1", "k-a-1")]
        assert "".join(texts) == final.content[0].text == TEXT.removesuffix("<|im_end|>")
        assert final.id in app.lost[1] and final.stop_reason == "end_turn"
        assert final.usage.input_tokens == len(full_render_ids(tok, QUESTION, None))
        # the same key again, a fresh request (retry count 0): still the recorded answer
        again = aclient.messages.create(**args)
        assert again.id == final.id and again.content[0].text == final.content[0].text
        assert len(backend.requests) == 2  # one engine call per session
        # another key: a new call
        other = aclient.messages.create(**{**args, "extra_headers": {"Idempotency-Key": "k-a-2"}})
        assert other.id != final.id and len(backend.requests) == 3
    assert [len(gateway.episode(k).calls) for k in ("o", "a")] == [1, 2]
    assert gateway.episode("o").calls[0].prompt_ids.tolist() == full_render_ids(tok, QUESTION, TOOLS)
    gateway.close()


def test_a_retry_sent_while_the_first_stream_runs_waits_for_its_answer(tok, tmp_path):
    """The second request (same Idempotency-Key) arrives while the engine holds the first mid-stream: it is
    answered once the first ends, with the first's reply, and the engine ran once."""
    held = threading.Event()
    release = threading.Event()

    async def pace(req, k):
        if k == 2:
            held.set()
            while not release.is_set():
                await asyncio.sleep(0.01)

    gateway, backend = make(tok, tmp_path, TEXT, pace)
    got: dict[str, object] = {}
    with served(create_app(gateway, poll=0.05)) as url:
        client = anthropic.Anthropic(base_url=f"{url}/s/w", api_key="x", max_retries=0)
        args = dict(model="m", max_tokens=200, messages=QUESTION, extra_headers={"Idempotency-Key": "k-w"})

        def send(name: str) -> None:
            with client.messages.stream(**args) as stream:
                got[name] = ("".join(stream.text_stream), stream.get_final_message())

        first = threading.Thread(target=send, args=("first",))
        first.start()
        assert held.wait(10)
        second = threading.Thread(target=send, args=("second",))
        second.start()
        time.sleep(0.5)
        assert "second" not in got and second.is_alive()  # waiting for the first
        release.set()
        first.join(10)
        second.join(10)
    (text1, msg1), (text2, msg2) = got["first"], got["second"]
    assert text1 == text2 == TEXT.removesuffix("<|im_end|>") and msg1.id == msg2.id
    assert len(backend.requests) == 1 and len(gateway.episode("w").calls) == 1
    gateway.close()
