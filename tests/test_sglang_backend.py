"""``tmpl.backends.SGLang`` and ``tmpl.integrations.slime`` against a stand-in SGLang ``/generate``.

SGLang 0.5.23 needs CUDA (torch 2.14.1, flashinfer, sglang-kernel) and cannot run on these CPU
machines, so the server here is a local HTTP server answering in the shapes of SGLang 0.5.23's
source (``GenerateReqInput``; ``output_ids``, ``meta_info.finish_reason.type``,
``meta_info.output_token_logprobs`` as ``[logprob, token_id, text]``; ``/abort_request``). Its
"model" answers like the tool-calling fixtures with the real Qwen2.5 tokenizer. Appended IDs are
checked against full ``apply_chat_template`` renders; slime's ``Sample`` is a stand-in with the
fields of slime's ``slime/utils/types.py`` (THUDM/slime commit 0d234f3e), as slime is not on the index.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

import tmpl
from tmpl.backends.sglang import SGLang
from tmpl.integrations.slime import make_generate

from .fixture_models import get_weather

pytest.importorskip("httpx")

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
ANSWER = "It is sunny in Paris.<|im_end|>"


class StandinSGLang:
    """A local ``/generate`` in SGLang's shapes: a tool call first, an answer after a tool response."""

    def __init__(self, tokenizer, *, logprobs: bool = True) -> None:
        self.tok, self.logprobs = tokenizer, logprobs
        self.requests: list[dict] = []
        self.outputs: list[tuple[list[int], list[float]]] = []
        self.aborts: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                answer = outer.abort(body) if self.path == "/abort_request" else outer.generate(body)
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def abort(self, body):
        self.aborts.append(body["rid"])
        return {}

    def generate(self, body):
        self.requests.append(body)
        seen = self.tok.decode(body["input_ids"])
        ids = self.tok.encode(ANSWER if "<tool_response>" in seen else CALL, add_special_tokens=False)
        limit = body["sampling_params"]["max_new_tokens"]
        finish = {"type": "stop", "matched": ids[-1]} if len(ids) <= limit else {"type": "length", "length": limit}
        ids = ids[:limit]
        lps = [-0.01 * (i + 1) for i in range(len(ids))]
        self.outputs.append((ids, lps))
        meta = {"id": body["rid"], "finish_reason": finish, "prompt_tokens": len(body["input_ids"])}
        if self.logprobs and body.get("return_logprob"):
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(lps, ids)]
        return {"text": self.tok.decode(ids), "output_ids": ids, "meta_info": meta}

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def qwen(tokenizer_of):
    return tokenizer_of("qwen2.5-instruct")


@pytest.fixture
def server(qwen):
    s = StandinSGLang(qwen)
    yield s
    s.close()


def rendered_tail_ok(tok, messages, appended) -> bool:
    """``appended`` is the tail of the full render of ``messages`` (with the generation prompt), after a turn close."""
    full = tok.apply_chat_template(messages, tools=[get_weather], add_generation_prompt=True)
    full = list(full["input_ids"] if hasattr(full, "keys") else full)
    return full[-len(appended) :] == appended and tok.convert_ids_to_tokens(full[-len(appended) - 1]) == "<|im_end|>"


def test_sglang_backend_runs_an_exact_tool_rollout(server, qwen):
    tpl = tmpl.ChatTemplate(qwen)
    rollout = tmpl.Rollout(tpl, SGLang(server.url), tools=[get_weather], max_turns=3, max_length=1024, progress=False)
    [r] = rollout.run([[{"role": "user", "content": "Weather in Paris?"}]])
    assert r.status.name == "DONE" and r.turns == 2 and r.tool_calls == 1
    first, second = server.requests
    assert first["return_logprob"] is True and first["rid"] and first["sampling_params"]["skip_special_tokens"] is False
    gen0 = server.outputs[0][0]
    assert second["input_ids"][: len(first["input_ids"]) + len(gen0)] == first["input_ids"] + gen0
    appended = second["input_ids"][len(first["input_ids"]) + len(gen0) :]
    assert rendered_tail_ok(qwen, r.messages[:3], appended)
    # model tokens carry the served logprobs, appended tokens 0.0 and mask 0
    served = [lp for _, lps in server.outputs for lp in lps]
    assert [float(x) for x, m in zip(r.logprobs, r.mask) if m] == pytest.approx(served)
    assert r.completion_ids.tolist() == gen0 + appended + server.outputs[1][0]


def test_sglang_without_logprobs_fails_the_generation(qwen):
    s = StandinSGLang(qwen, logprobs=False)
    try:
        req = tmpl.backends.GenerationRequest("q1", qwen.encode("hi"), 8, frozenset({151645}))
        out = asyncio.run(SGLang(s.url).agenerate(req))
        assert out.finish_reason == "error" and "output_token_logprobs" in (out.error or "")
    finally:
        s.close()


def test_sglang_cancel_posts_abort(server, qwen):
    backend = SGLang(server.url)

    async def go():
        backend._inflight["q9"] = (None, "q9")  # a request in flight under its own id
        await backend.cancel("q9")

    asyncio.run(go())
    assert server.aborts == ["q9"] and backend.aborted == ["q9"]


# -- slime ------------------------------------------------------------------------------------
@dataclass
class Sample:
    """Stand-in with the fields slime's ``Sample`` has (slime/utils/types.py at THUDM/slime 0d234f3e)."""

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    prompt: object = ""
    tokens: list = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    loss_mask: list | None = None
    rollout_log_probs: list | None = None
    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)


def args_for(server, **kw):
    return SimpleNamespace(
        hf_checkpoint="unused",
        sglang_router_ip="127.0.0.1",
        sglang_router_port=int(server.url.rsplit(":", 1)[1]),
        rollout_max_response_len=kw.pop("max_response", 256),
        rollout_max_context_len=kw.pop("max_context", None),
    )


def check_aligned(sample):
    assert len(sample.tokens) > sample.response_length > 0
    assert len(sample.loss_mask) == len(sample.rollout_log_probs) == sample.response_length


def test_slime_generate_resets_a_retried_sample_and_is_exact(server, qwen):
    tpl = tmpl.ChatTemplate(qwen)
    generate = make_generate(tools=[get_weather], template=tpl)
    prompt = [{"role": "user", "content": "Weather in Paris?"}]
    stale = Sample(prompt=prompt, tokens=[1, 2, 3], response="old", response_length=9, loss_mask=[1] * 9)
    stale.rollout_log_probs, stale.status = [-1.0] * 9, Sample.Status.ABORTED
    out = asyncio.run(generate(args_for(server), stale, {"temperature": 1.0, "max_new_tokens": 64}))
    check_aligned(out)
    assert out.status is Sample.Status.COMPLETED
    first = server.requests[0]["input_ids"]
    assert out.tokens[: len(first)] == first  # the prompt, rendered fresh (nothing of the old attempt)
    response = out.tokens[len(first) :]
    gen0, gen1 = server.outputs[0][0], server.outputs[1][0]
    appended = response[len(gen0) : len(response) - len(gen1)]
    assert response == gen0 + appended + gen1
    assert out.loss_mask == [1] * len(gen0) + [0] * len(appended) + [1] * len(gen1)
    assert out.rollout_log_probs == pytest.approx(server.outputs[0][1] + [0.0] * len(appended) + server.outputs[1][1])
    assert rendered_tail_ok(qwen, out.metadata["messages"][:3], appended)


def test_slime_generate_clamps_each_turn_to_the_budget_left(server, qwen):
    tpl = tmpl.ChatTemplate(qwen)
    prompt = [{"role": "user", "content": "Weather in Paris?"}]
    n_prompt = len(tpl.prompt_ids(prompt, tools=tmpl.Toolbox([get_weather]).schemas))
    max_context = n_prompt + 60
    out = asyncio.run(
        make_generate(tools=[get_weather], template=tpl)(
            args_for(server, max_context=max_context), Sample(prompt=prompt), {"max_new_tokens": 512}
        )
    )
    for body in server.requests:
        assert len(body["input_ids"]) + body["sampling_params"]["max_new_tokens"] <= max_context
    check_aligned(out)
    assert len(out.tokens) <= max_context


def test_slime_generate_trims_an_overflowing_tool_result_and_truncates(server, qwen):
    def get_weather(city: str) -> str:  # noqa: F811 - same schema, a huge answer
        """Current weather in a city.

        Args:
            city: City name
        """
        return "rain " * 2000

    tpl = tmpl.ChatTemplate(qwen)
    prompt = [{"role": "user", "content": "Weather in Paris?"}]
    n_prompt = len(tpl.prompt_ids(prompt, tools=tmpl.Toolbox([get_weather]).schemas))
    max_context = n_prompt + 120
    out = asyncio.run(
        make_generate(tools=[get_weather], template=tpl)(
            args_for(server, max_context=max_context), Sample(prompt=prompt), {"max_new_tokens": 512}
        )
    )
    assert out.status is Sample.Status.TRUNCATED
    assert len(out.tokens) == max_context  # cut exactly at the budget, mask and logprobs with it
    check_aligned(out)
    assert len(server.requests) == 1  # no generation after the overflow


def test_slime_generate_aborts_without_logprobs(qwen):
    s = StandinSGLang(qwen, logprobs=False)
    try:
        out = asyncio.run(
            make_generate(tools=[get_weather], template=tmpl.ChatTemplate(qwen))(
                args_for(s), Sample(prompt=[{"role": "user", "content": "Weather in Paris?"}]), {"max_new_tokens": 64}
            )
        )
        assert out.status is Sample.Status.ABORTED
        assert len(out.loss_mask) == len(out.rollout_log_probs) == out.response_length
    finally:
        s.close()


def test_slime_refuses_a_text_prompt(server, qwen):
    generate = make_generate(template=tmpl.ChatTemplate(qwen))
    with pytest.raises(tmpl.errors.TrainerConfigError, match="message list"):
        asyncio.run(generate(args_for(server), Sample(prompt="<|im_start|>user\nhi"), {}))
