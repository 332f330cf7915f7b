"""The durable store (``tmpl serve --store``): a gateway SIGKILLed mid-call, mid-stream and mid-drain, then
started again on its file, loses no recorded call and records none twice; retried requests are answered
once; a damaged store is refused by name; a full one fails the call whole.

The killed server is ``tmpl serve``'s own (:func:`tmpl.gateway.serve.run`) in a subprocess over a scripted
Qwen2.5 engine (tests/durable_serve.py), driven by the OpenAI and Anthropic SDKs. Every prompt is checked
against the template's own ``apply_chat_template`` render of what the client sent, and against the IDs
recorded before the kill.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
httpx = pytest.importorskip("httpx")

import tmpl  # noqa: E402
from tmpl.backends import Scripted  # noqa: E402
from tmpl.errors import StoreCorruptError, StoreFullError  # noqa: E402
from tmpl.gateway.service import CallParams, Gateway  # noqa: E402

from .conftest import load_tokenizer  # noqa: E402
from .gateway_util import full_render_ids  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
START = 240.0  # seconds a server may take to start (a loaded 2-core machine loads the tokenizer slowly)


class Server:
    """tests/durable_serve.py on a free port, on one store file; SIGKILLed and started again."""

    def __init__(self, folder) -> None:
        self.store = str(folder / "gw.db")
        self.slow = str(folder / "slow")
        self.log = open(folder / "server.log", "ab")  # noqa: SIM115
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        argv = [sys.executable, os.path.join(HERE, "durable_serve.py"), "--slow-file", self.slow]
        argv += ["--store", self.store, "--port", str(self.port)]
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + START
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited {self.proc.returncode}: {self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"the server did not start in {START} s: {self.tail()}")

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self.proc = None

    def tail(self) -> str:
        self.log.flush()
        with open(self.log.name, "rb") as f:
            return f.read()[-3000:].decode(errors="replace")

    def episode(self, key: str) -> dict:
        r = httpx.get(f"{self.url}/s/{key}/episode", timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    def close(self) -> None:
        if self.proc is not None:
            self.kill()
        self.log.close()


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path)
    yield s
    s.close()


def step(client, key: str, messages: list[dict], **kwargs):
    """One call of an OpenAI chat harness in session ``key``: the reply appended to ``messages`` with a
    tool result per call it made; the response."""
    out = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, **kwargs)
    follow(messages, out.choices[0].message.model_dump(exclude_none=True))
    return out


def follow(messages: list[dict], reply: dict) -> None:
    reply.pop("refusal", None)
    messages.append(reply)
    for c in reply.get("tool_calls") or []:
        args = c["function"]["arguments"]
        city = (json.loads(args) if isinstance(args, str) else args)["city"]
        messages.append({"role": "tool", "tool_call_id": c["id"], "content": f"sunny, {city}"})


def client_of(server: Server, key: str, retries: int = 2):
    return openai.OpenAI(base_url=f"{server.url}/s/{key}/v1", api_key="x", max_retries=retries, timeout=300)


def check_calls(tok, calls: list[dict], sent: list[list[dict]]) -> None:
    """Each recorded call's prompt: the template's render of what the client sent, and the previous call's
    prompt and sampled IDs kept as they were."""
    assert len(calls) == len(sent)
    for k, (call, messages) in enumerate(zip(calls, sent)):
        assert call["prompt_ids"] == full_render_ids(tok, messages, TOOLS), f"call {k}: not the full render"
        if k:
            kept = calls[k - 1]["prompt_ids"] + calls[k - 1]["completion_ids"]
            assert call["prompt_ids"][: len(kept)] == kept, f"call {k}: the earlier sampled IDs were not kept"


def test_killed_at_every_phase_and_restarted_loses_nothing(server):
    """SIGKILL with a call in flight, a stream half read and an episode stream half read; then again with
    nothing in flight. Every session continues exactly; every finished episode comes back until acknowledged."""
    tok = load_tokenizer("qwen2.5-instruct")
    server.start()
    # session a: two calls, then a third killed in flight (the SDK retries it against the restarted server)
    a: list[dict] = [{"role": "user", "content": "Weather in Paris, Lima and Oslo?"}]
    sent_a = []
    for _ in range(2):
        sent_a.append(json.loads(json.dumps(a)))
        step(client_of(server, "a"), "a", a)
    before = server.episode("a")["record"]["calls"]
    # session b: one call under an idempotency key (Anthropic SDK)
    b_client = anthropic.Anthropic(base_url=f"{server.url}/s/b", api_key="x", max_retries=0)
    b_args = dict(model="m", max_tokens=200, messages=[{"role": "user", "content": "Weather in Quito?"}])
    b_first = b_client.messages.create(**b_args, extra_headers={"Idempotency-Key": "k-b-1"})
    # sessions c and d: finished, to be read from the stream
    for key in ("c", "d"):
        step(client_of(server, key), key, [{"role": "user", "content": "Weather in Paris?"}])
        assert httpx.post(f"{server.url}/s/{key}/finish", timeout=30).status_code == 200

    open(server.slow, "w").close()  # the engine now holds each generation
    got: dict = {}

    def third_call():
        sent_a.append(json.loads(json.dumps(a)))
        got["a"] = step(client_of(server, "a", retries=30), "a", a)

    caller = threading.Thread(target=third_call)
    caller.start()
    stream = client_of(server, "e").chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Weather in Lima?"}], tools=TOOLS, stream=True
    )
    first = next(iter(stream))  # the stream is half sent: the engine holds its second piece
    assert first.choices[0].delta is not None
    with httpx.stream("GET", f"{server.url}/episodes/stream?idle=60", timeout=60) as r:
        line = next(r.iter_lines())  # one finished episode read, never acknowledged
    read_before = json.loads(line)
    assert read_before["session"] == "c" and read_before["ack"]
    time.sleep(1.0)  # the third call of a is in the engine
    server.kill()
    os.remove(server.slow)
    with pytest.raises(Exception):  # noqa: B017 - the stream's connection died with the server
        list(stream)

    server.start()
    caller.join(300)
    assert "a" in got, server.tail()
    assert got["a"].model_extra["tmpl"]["prompt"] == "append"  # a suffix of the resumed head, not a render
    after = server.episode("a")
    calls = after["record"]["calls"]
    assert calls[:2] == before, "the calls recorded before the kill changed"
    check_calls(tok, calls, sent_a)  # the retried call continues the sequence: append of a tool result
    assert len(after["sequences"]) == 1 and after["tokens"]["reused"] > 0

    # the retried request (same Idempotency-Key) is answered once, after the restart, from the store
    b_again = b_client.messages.create(**b_args, extra_headers={"Idempotency-Key": "k-b-1"})
    assert b_again.model_dump() == b_first.model_dump()
    # an SDK retry of the same request (x-stainless-retry-count > 0) too; a fresh request (count 0) is a call
    body = {"model": "m", **b_args}
    again = httpx.post(f"{server.url}/s/b/v1/messages", json=body, headers={"x-stainless-retry-count": "1"}, timeout=60)
    assert again.json()["id"] == b_first.id
    assert len(server.episode("b")["record"]["calls"]) == 1
    fresh = httpx.post(f"{server.url}/s/b/v1/messages", json=body, headers={"x-stainless-retry-count": "0"}, timeout=60)
    assert fresh.status_code == 200 and fresh.json()["id"] != b_first.id
    assert len(server.episode("b")["record"]["calls"]) == 2

    # the stream cut mid-way: retried, answered whole; the cut call was never recorded, so none twice
    e = [{"role": "user", "content": "Weather in Lima?"}]
    step(client_of(server, "e"), "e", e)
    e_calls = server.episode("e")["record"]["calls"]
    assert len(e_calls) == 1
    check_calls(tok, e_calls, [[{"role": "user", "content": "Weather in Lima?"}]])

    # the episode read before the kill and never acknowledged comes back, with the other one
    drained = httpx.get(f"{server.url}/episodes/drain", timeout=30).json()["episodes"]
    assert sorted(d["session"] for d in drained) == ["c", "d"]
    c_again = next(d for d in drained if d["session"] == "c")
    assert c_again["record"]["calls"] == read_before["record"]["calls"] and c_again["ack"] == read_before["ack"]
    acked = httpx.post(f"{server.url}/episodes/ack", json={"acks": [d["ack"] for d in drained]}, timeout=30)
    assert acked.json() == {"acked": 2}

    # killed with nothing in flight: acknowledged episodes stay gone, session a goes on to its answer
    server.kill()
    server.start()
    assert httpx.get(f"{server.url}/episodes/drain", timeout=30).json()["episodes"] == []
    sent_a.append(json.loads(json.dumps(a)))
    last = step(client_of(server, "a"), "a", a)
    assert last.choices[0].message.content.startswith("It is sunny")
    final = server.episode("a")
    check_calls(tok, final["record"]["calls"], sent_a)
    assert final["record"]["calls"][:3] == calls and len(final["sequences"]) == 1


# -- in process: the store's file, concurrency, a full disk ---------------------------------------------
CALL = '<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call><|im_end|>'


def gateway_on(path: str, **kwargs) -> Gateway:
    tok = load_tokenizer("qwen2.5-instruct")

    def policy(req):
        text = tok.decode(list(req.prompt_ids))
        done = text.count("sunny,")
        return tok.encode(CALL.format(city=f"City{done}") if done < 3 else "Done.<|im_end|>", add_special_tokens=False)

    return Gateway(tmpl.ChatTemplate(tok), Scripted(policy), store=path, **kwargs)


async def turn(gateway: Gateway, key: str, messages: list[dict]):
    done = await gateway.complete(key, messages, TOOLS, CallParams())
    follow(messages, dict(done.replies[0].message))
    return done


def rows(path: str) -> int:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT count(*) FROM events").fetchone()[0]


def test_a_damaged_store_is_refused_by_name(tmp_path):
    path = str(tmp_path / "gw.db")
    gateway = gateway_on(path)
    messages = [{"role": "user", "content": "Weather?"}]
    asyncio.run(turn(gateway, "s", messages))
    gateway.close()
    # a row whose body was changed on disk: refused, the file and the record named
    bad = str(tmp_path / "bad.db")
    shutil.copy(path, bad)
    with sqlite3.connect(bad) as db:
        seq = db.execute("SELECT seq FROM events WHERE kind = 'call'").fetchone()[0]
        db.execute(
            "UPDATE events SET body = CAST(replace(CAST(body AS TEXT), 'City0', 'City9') AS BLOB) WHERE seq = ?", (seq,)
        )
    with pytest.raises(StoreCorruptError) as exc:
        gateway_on(bad)
    assert exc.value.path == bad and exc.value.record == seq and "CRC32" in str(exc.value)
    # a truncated file: refused, named
    cut = str(tmp_path / "cut.db")
    data = open(path, "rb").read()
    with open(cut, "wb") as f:
        f.write(data[: len(data) // 2 + 100])
    with pytest.raises(StoreCorruptError) as exc:
        gateway_on(cut)
    assert exc.value.path == cut
    # not a database at all
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite " * 500)
    with pytest.raises(StoreCorruptError, match="junk.db"):
        gateway_on(str(junk))
    # the intact one loads whole
    again = gateway_on(path)
    assert len(again.episode("s").calls) == 1
    again.close()


def test_a_full_disk_fails_the_call_whole(tmp_path):
    """SQLite's own SQLITE_FULL (the file capped at its pages): the call answers 507, the file holds
    nothing of it, and the session goes on from what the file holds."""
    path = str(tmp_path / "gw.db")
    gateway = gateway_on(path)
    messages = [{"role": "user", "content": "Weather?"}]

    async def go():
        await turn(gateway, "s", messages)
        held = rows(path)
        db = gateway.durable.log._db
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        await gateway.durable.flush()
        db.execute(f"PRAGMA max_page_count={pages}")  # the disk is full
        big = [*messages, {"role": "user", "content": "x " * 20000}]
        with pytest.raises(StoreFullError) as exc:
            await gateway.complete("s", big, TOOLS, CallParams())
        assert exc.value.status == 507 and "full" in str(exc.value)
        assert rows(path) == held  # nothing half-written
        assert len(gateway.episode("s").calls) == 1  # the session as the file holds it
        db.execute("PRAGMA max_page_count=1073741823")
        done = await turn(gateway, "s", messages)  # goes on from the call the file holds
        assert done.plan.mode == "append" and len(gateway.episode("s").calls) == 2

    asyncio.run(go())
    gateway.close()


def test_max_store_bytes_drops_read_episodes_then_refuses(tmp_path):
    path = str(tmp_path / "gw.db")
    gateway = gateway_on(path)
    long = "Weather? " + "lorem ipsum " * 6000  # a session whose rows fill many pages

    async def go():
        await turn(gateway, "s1", [{"role": "user", "content": long}])
        gateway.finish("s1")
        await gateway.durable.flush()
        gateway.durable.max_bytes = gateway.durable.log.used - 1
        with pytest.raises(StoreFullError, match="no episode a reader took") as exc:  # nothing read yet
            await gateway.complete("s2", [{"role": "user", "content": "Weather?"}], TOOLS, CallParams())
        assert exc.value.status == 507
        assert [d.key for d in gateway.drain()] == ["s1"]  # read, not acknowledged: now it may be dropped
        await turn(gateway, "s2", [{"role": "user", "content": "Weather?"}])
        with sqlite3.connect(path) as db:
            assert {k for (k,) in db.execute("SELECT DISTINCT key FROM events")} == {"s2"}

    asyncio.run(go())
    gateway.close()


def test_two_processes_on_one_session_are_serialized(tmp_path):
    """Two harnesses send the same session and lineage at once: the calls run one after the other, each
    recorded once, each a sequence of its own client's conversation (never one interleaved sequence)."""
    tok = load_tokenizer("qwen2.5-instruct")
    gateway = gateway_on(str(tmp_path / "gw.db"))
    running = 0
    most = 0
    inner = gateway.backend.agenerate

    async def counted(request):
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.05)
        try:
            return await inner(request)
        finally:
            running -= 1

    gateway.backend.agenerate = counted

    async def harness(question: str) -> list[list[dict]]:
        messages = [{"role": "user", "content": question}]
        sent = []
        for _ in range(3):
            sent.append(json.loads(json.dumps(messages)))
            await turn(gateway, "shared", messages)
        return sent

    async def both():
        return await asyncio.gather(harness("Weather in A?"), harness("Weather in B?"))

    sent = asyncio.run(both())
    assert most == 1
    episode = gateway.episode("shared")
    assert len(episode.calls) == 6
    for seq in episode.sequences:
        calls = [c for c in episode.calls if c.id in seq.calls]
        first = full_render_ids(tok, sent[0][0], TOOLS)
        mine = 0 if calls[0].prompt_ids.tolist() == first else 1
        for call, messages in zip(calls, sent[mine]):
            assert call.prompt_ids.tolist() == full_render_ids(tok, messages, TOOLS)
    gateway.close()


def test_one_choice_failing_loses_no_other(tmp_path):
    """``n = 3``: choice 1's engine request fails while choice 0 is done and choice 2 still runs. The call
    answers 503; choice 0's tokens are recorded (aborted: never returned), choice 2's engine request is
    stopped, and both stay so after a restart on the store."""
    path = str(tmp_path / "gw.db")
    gateway = gateway_on(path)
    backend = gateway.backend
    inner = backend.agenerate
    stopped = []

    async def choice(request):
        seed = request.sampling.seed
        if seed == 101:
            await asyncio.sleep(0.2)  # after choice 0 is done
            return tmpl.backends.base.GenerationResult.failed(request.request_id, "engine lost the request")
        if seed == 102:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                stopped.append(request.request_id)
                raise
        return await inner(request)

    backend.agenerate = choice
    messages = [{"role": "user", "content": "Weather?"}]

    async def go():
        with pytest.raises(tmpl.errors.BackendUnavailableError):
            await asyncio.wait_for(gateway.complete("s", messages, TOOLS, CallParams(n=3, seed=100)), 30)

    asyncio.run(go())
    session = gateway.session("s")
    calls = session.episode.calls
    assert len(calls) == 1 and calls[0].completion_ids.tolist()  # choice 0: recorded, with its tokens
    assert "another choice of the call failed" in session.ended[calls[0].id]
    assert len(stopped) == 1 and "cancelled" in session.ended[stopped[0]]  # choice 2: stopped
    prompt = calls[0].prompt_ids.tolist()
    assert prompt == full_render_ids(load_tokenizer("qwen2.5-instruct"), messages, TOOLS)
    gateway.durable.log.close()  # as a kill would leave it: nothing ended
    again = gateway_on(path)
    kept = again.session("s")
    assert [c.completion_ids.tolist() for c in kept.episode.calls] == [calls[0].completion_ids.tolist()]
    assert kept.ended == session.ended
    again.close()
