"""Routing replay on the vLLM paths (issue 40): VLLMServer and the offline VLLM adapter against stand-ins
that speak vLLM 0.32's routes (tests/vllm_standin.py): ``routed_experts_prompt_start`` sent, base64
``.npy`` routes decoded, streamed answers merged, multi-turn rollouts stitched, bad routes refused.

vLLM 0.32's CPU build cannot return routes (its AuxOutput connector needs Model Runner V2, which
needs Triton), so the real server path is the GPU script's (benchmarks/moe_routes_gpu.py).
"""

from __future__ import annotations

import asyncio
import base64
import io
import sys

import numpy as np
import pytest

import tmpl
from tmpl.backends import VLLM, GenerationRequest, Sampling, Scripted, VLLMServer
from tmpl.backends.routes import RoutesDecodeError, decode_flat, decode_npy, from_position
from tmpl.backends.server import merge_stream

from .conftest import load_tokenizer
from .vllm_standin import FakeLLM, StandinServer, SyntheticRoutes, fake_vllm_module, npy_base64, synthetic_routes

PROMPT = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]  # any IDs: the synthetic routes hash them
REPLY = [9707, 11, 1879, 0, 151645]
STOP = frozenset({151645})


def _run(coro):
    return asyncio.run(coro)


def _request(rid: str = "r1", routes_from: int | None = 0, prompt=PROMPT, max_tokens: int = 16) -> GenerationRequest:
    return GenerationRequest(rid, list(prompt), max_tokens, STOP, Sampling(temperature=0), routes_from=routes_from)


def _routed(reply=REPLY) -> SyntheticRoutes:
    return SyntheticRoutes(Scripted(lambda req: list(reply)))


# -- the wire format ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int32])
def test_decode_npy_gives_the_array_as_sent(dtype):
    sent = np.arange(24, dtype=dtype).reshape(4, 3, 2) * 7 % 61
    got = decode_npy(npy_base64(sent))  # the stand-in encodes as vLLM's numpy2base64 does (np.save)
    assert got.dtype == np.dtype(dtype) and got.shape == (4, 3, 2) and np.array_equal(got, sent)


def test_decode_npy_refuses_pickles_and_garbage():
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(RoutesDecodeError, match="not base64 of .npy bytes"):
        decode_npy(base64.b64encode(buf.getvalue()).decode())  # an object array would run pickle: refused
    with pytest.raises(RoutesDecodeError):
        decode_npy(base64.b64encode(b"routes").decode())


def test_decode_flat_reads_sglang_wire_dtypes():
    values = np.array([3, 1, 0, 2, 7, 5, 6, 4], dtype=np.uint16)
    got = decode_flat(base64.b64encode(values.tobytes()).decode(), "uint16", 2, 2)
    assert got.dtype == np.uint16 and got.tolist() == [[[3, 1], [0, 2]], [[7, 5], [6, 4]]]
    legacy = decode_flat(base64.b64encode(values.astype(np.int32).tobytes()).decode(), None, 1, 2)
    assert legacy.dtype == np.int32 and legacy.shape == (4, 1, 2)
    with pytest.raises(RoutesDecodeError, match="not a whole number of positions"):
        decode_flat(base64.b64encode(values.tobytes()).decode(), "uint16", 3, 1)


def test_from_position_drops_rows_before_the_asked_start():
    rows = np.arange(6).reshape(6, 1, 1)
    got, start = from_position(rows, 0, 4)
    assert start == 4 and got[:, 0, 0].tolist() == [4, 5]
    same, at = from_position(rows, 4, 4)
    assert same is rows and at == 4


# -- VLLMServer against the stand-in ------------------------------------------------------------


@pytest.mark.parametrize("api", ["generate", "completions"])
@pytest.mark.parametrize("start", [0, 4, len(PROMPT)])
def test_server_sends_the_prompt_start_and_decodes_the_routes(api, start):
    with StandinServer(_routed(), routes=True) as server:
        client = VLLMServer(server.url, api=api, timeout=30, routes=True)
        res = _run(client.agenerate(_request(routes_from=start)))
    assert client.gives_routes and res.error is None and res.token_ids == REPLY
    assert server.route_starts == [start]
    full = synthetic_routes(PROMPT + REPLY)
    # vLLM's coverage: the prompt from the start, every generated token but the last
    assert res.routes_start == start and len(res.routes) == len(PROMPT) + len(REPLY) - 1 - start
    assert res.routes.dtype == np.uint8 and np.array_equal(res.routes, full[start : len(PROMPT) + len(REPLY) - 1])


def test_server_without_routes_asked_sends_no_start_and_keeps_none():
    with StandinServer(_routed(), routes=True) as server:  # the server returns routes for every request
        client = VLLMServer(server.url, timeout=30)
        res = _run(client.agenerate(_request(routes_from=None)))
    assert server.route_starts == [None] and server.sent_routes[0] is not None
    assert res.routes is None and res.token_ids == REPLY and not client.gives_routes


def test_server_refuses_a_start_past_the_prompt_as_vllm_does():
    with StandinServer(_routed(), routes=True) as server:
        client = VLLMServer(server.url, timeout=30, routes=True)
        res = _run(client.agenerate(_request(routes_from=len(PROMPT) + 1)))
    assert res.finish_reason == "error" and "HTTP 400" in res.error and "routed_experts_prompt_start" in res.error


def test_server_fails_a_generation_whose_routes_are_not_npy():
    with StandinServer(_routed(), routes=True, routes_fault="garbage") as server:
        client = VLLMServer(server.url, timeout=30, routes=True)
        res = _run(client.agenerate(_request()))
    assert res.finish_reason == "error" and "not base64 of .npy bytes" in res.error and server.url in res.error


def test_streamed_answer_equals_the_whole_answer():
    reply = [9707, 11, 1879, 0, 3555, 13, 11, 42, 151645]
    with StandinServer(_routed(reply), routes=True, chunk=2) as server:
        whole = _run(VLLMServer(server.url, timeout=30, routes=True).agenerate(_request("w", routes_from=3)))
        streamed = _run(
            VLLMServer(server.url, timeout=30, routes=True, stream=True).agenerate(_request("s", routes_from=3))
        )
    assert server.streamed == [5]  # 9 tokens in events of 2: the routes ride on the last one
    assert streamed.token_ids == whole.token_ids == reply and streamed.finish_reason == whole.finish_reason == "stop"
    assert streamed.logprobs == whole.logprobs and len(streamed.logprobs) == len(reply)
    assert streamed.routes_start == 3 and np.array_equal(streamed.routes, whole.routes)
    assert np.array_equal(streamed.routes, synthetic_routes(PROMPT + reply)[3 : len(PROMPT) + len(reply) - 1])


def test_merge_stream_refuses_an_error_event():
    with pytest.raises(ValueError, match="error"):
        merge_stream([{"request_id": "r", "choices": [{"index": 0, "token_ids": [1]}]}, {"error": {"message": "oom"}}])


def test_stream_needs_the_tokens_api():
    with pytest.raises(ValueError, match="api='generate'"):
        VLLMServer("http://127.0.0.1:9", api="completions", stream=True)


# -- the offline adapter -----------------------------------------------------------------------


def test_offline_vllm_asks_for_routes_and_returns_them(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm_module())
    monkeypatch.setitem(sys.modules, "vllm.inputs", sys.modules["vllm"].inputs)
    llm = FakeLLM(_routed(), routes=True)
    backend = VLLM(llm)
    asked, plain = backend.generate_batch([_request("a", routes_from=5), _request("b", routes_from=None)])
    params = [sp.kwargs for sp in llm.calls[0][1]]
    assert params[0]["routed_experts_prompt_start"] == 5 and "routed_experts_prompt_start" not in params[1]
    assert backend.gives_routes and plain.routes is None
    assert asked.routes_start == 5
    assert np.array_equal(asked.routes, synthetic_routes(PROMPT + REPLY)[5 : len(PROMPT) + len(REPLY) - 1])
    assert not VLLM(FakeLLM(_routed())).gives_routes  # an engine built without enable_return_routed_experts


# -- multi-turn rollouts through VLLMServer ------------------------------------------------------


def get_time(city: str) -> str:
    """Current local time in a city.

    Args:
        city: City name
    """
    return f"It is 10:00 in {city}."


class TwoCalls:
    """A scripted policy on the real Qwen3 template: two turns of tool calls, then an answer; each
    completion is the template's own render of that assistant turn."""

    def __init__(self, tpl):
        self.tpl = tpl
        self.tools = tmpl.Toolbox([get_time]).schemas

    def _render(self, messages, gen):
        out = self.tpl.tokenizer.apply_chat_template(
            messages, tools=self.tools, chat_template=self.tpl.template, tokenize=True, add_generation_prompt=gen
        )
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    def completion(self, message) -> list[int]:
        history = [{"role": "user", "content": "x"}]
        prompt, full = self._render(history, True), self._render(history + [message], False)
        stops = self.tpl.stop_token_ids
        end = next(t for t in range(len(prompt), len(full)) if full[t] in stops)
        return full[len(prompt) : end + 1]

    def __call__(self, req):
        calls = self.tpl.tokenizer.decode(req.prompt_ids).count("<tool_response>")
        if calls < 2:
            call = {
                "type": "function",
                "function": {"name": "get_time", "arguments": {"city": ["Paris", "Oslo"][calls]}},
            }
            return self.completion({"role": "assistant", "content": "", "tool_calls": [call]})
        return self.completion({"role": "assistant", "content": "It is 10:00 in both."})


def _rollout(url: str, *, stream: bool = False, n: int = 2, api: str = "generate"):
    tpl = tmpl.ChatTemplate(load_tokenizer("qwen3"))
    backend = VLLMServer(url, api=api, timeout=60, routes=True, stream=stream)
    rollout = tmpl.Rollout(
        tpl, backend, tools=[get_time], max_turns=5, max_length=2048, sampling=Sampling(n=n), routes=True
    )
    return tpl, rollout.run([[{"role": "user", "content": "Time in Paris and Oslo?"}]])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_rollout_stitches_the_servers_routes_over_every_turn(stream):
    tpl = tmpl.ChatTemplate(load_tokenizer("qwen3"))
    with StandinServer(SyntheticRoutes(Scripted(TwoCalls(tpl))), routes=True, chunk=4) as server:
        _, results = _rollout(server.url, stream=stream)
    assert len(results) == 2 and all(r.code is tmpl.rollout.EndCode.FINISHED for r in results)
    for result in results:
        traj = result.trajectory
        ids = np.concatenate([traj.prompt_ids, traj.completion_ids]).tolist()
        assert result.turns == 3
        # one forward pass over the final sequence routes every position as the turns did
        full = synthetic_routes(ids)
        known = traj.routes_known.astype(bool)
        assert known.tolist() == [True] * (len(ids) - 1) + [False]  # the last sampled token: never forwarded
        assert np.array_equal(traj.routes[known], full[known]) and not traj.routes[~known].any()
    # each turn asked for the routes from the first position not yet routed: 0 on the first turn, then the
    # position of the previous turn's last sampled token (routed by this turn's prefill)
    assert len(server.answered) == 6
    for i, (prompt, _, start) in enumerate(server.answered):
        before = [p + t for p, t, _ in server.answered[:i] if prompt[: len(p) + len(t)] == p + t]
        assert start == (len(max(before, key=len)) - 1 if before else 0)
    assert not stream or all(n > 1 for n in server.streamed)


@pytest.mark.parametrize(
    ("fault", "what"),
    [("length", "position"), ("dtype", "float32"), ("layers", "layers")],
)
def test_bad_routes_end_the_sample_with_a_named_code(fault, what):
    tpl = tmpl.ChatTemplate(load_tokenizer("qwen3"))
    with StandinServer(SyntheticRoutes(Scripted(TwoCalls(tpl))), routes=True, routes_fault=fault) as server:
        _, results = _rollout(server.url, n=1)
    [result] = results
    assert result.code is tmpl.rollout.EndCode.BAD_ROUTES and what in result.reason
    traj = result.trajectory
    if traj.routes is not None:  # whatever was kept before the bad turn is still exact
        ids = np.concatenate([traj.prompt_ids, traj.completion_ids]).tolist()
        known = traj.routes_known.astype(bool)
        assert np.array_equal(traj.routes[known], synthetic_routes(ids)[known])
    assert len(server.answered) == (1 if fault != "layers" else 2)


# -- the server path on a real mixture-of-experts model -------------------------------------------


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    """The tiny Qwen3-MoE of tests/fixture_moe.py (built once for the module), float32, with its tokenizer."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .fixture_moe import build_tiny_moe, tokenizer_folder

    if not tokenizer_folder().is_dir():
        pytest.skip(f"the Qwen3 tokenizer is not at {tokenizer_folder()} (TMPL_TEST_DATA)")
    path = build_tiny_moe(tmp_path_factory.mktemp("tiny-moe"))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(path))


def test_moe_routes_through_the_server_equal_one_forward_pass(tiny_moe):
    """The stand-in generates with the Torch backend on the tiny MoE (routes: the model's own router
    outputs); a greedy two-call rollout through VLLMServer (streamed) stitches them; one transformers
    forward pass over each final sequence routes every known position the same (fp32: 100%)."""
    import torch

    from tmpl.backends import Torch

    from .fixture_moe import get_time, questions

    model, tok = tiny_moe
    tpl = tmpl.ChatTemplate(tok, name="qwen3")
    with StandinServer(Torch(model, tokenizer=tok), routes=True) as server:
        backend = VLLMServer(server.url, timeout=120, routes=True, stream=True)
        rollout = tmpl.Rollout(
            tpl,
            backend,
            tools=[get_time],
            max_turns=4,
            max_length=1024,
            max_tokens_per_turn=48,
            sampling=Sampling(temperature=0),
            routes=True,
        )
        results = rollout.run(questions()[6:8])  # two cities each: a call per city, then the answer
    compared = 0
    for r in results:
        assert r.code is tmpl.rollout.EndCode.FINISHED and r.turns == 3, r.reason
        ids = r.prompt_ids.tolist() + r.completion_ids.tolist()
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), output_router_logits=True)
        want = np.stack([torch.topk(torch.softmax(x, -1), 2, dim=-1).indices.numpy() for x in out.router_logits], 1)
        known = r.routes_known.astype(bool)
        assert known[:-1].all() and not known[-1]
        assert r.routes.dtype == np.uint8 and np.array_equal(r.routes[known], want[known])
        compared += int(known.sum())
    assert compared > 300
    firsts = [start for _, _, start in server.answered if start == 0]
    assert len(firsts) == 2 and len(server.answered) == 6  # one prompt from 0 per sample, later turns from within


# -- SGLang -------------------------------------------------------------------------------------


class SGLangRoutes:
    """A local ``/generate`` in SGLang's shapes with routes (``GenerateReqInput.return_routed_experts``,
    ``routed_experts_start_len``; ``meta_info["routed_experts"]``: base64 of the flat expert IDs, int32
    unless ``wire`` names uint8/uint16 in ``routed_experts_dtype``). ``start_len=False``: an SGLang that
    routes the whole sequence and says nothing of a start."""

    def __init__(self, backend, *, wire: str | None = None, start_len: bool = True) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.bodies: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                asked = body.get("return_routed_experts", False)
                start = int(body.get("routed_experts_start_len", 0)) if start_len else 0
                sp = body["sampling_params"]
                req = GenerationRequest(
                    body["rid"],
                    body["input_ids"],
                    sp["max_new_tokens"],
                    frozenset(sp["stop_token_ids"]),
                    routes_from=start if asked else None,
                )
                [res] = backend.generate_batch([req])
                meta = {
                    "finish_reason": {"type": res.finish_reason},
                    "output_token_logprobs": [[lp, t, None] for t, lp in zip(res.token_ids, res.logprobs)],
                }
                if asked:  # [start, seqlen - 1)
                    rows = res.routes[: len(req.prompt_ids) + len(res.token_ids) - 1 - start]
                    meta["routed_experts"] = base64.b64encode(rows.astype(wire or np.int32).tobytes()).decode()
                    if wire:
                        meta["routed_experts_dtype"] = wire
                    if start_len:
                        meta["routed_experts_start_len"] = start
                data = json.dumps({"output_ids": res.token_ids, "meta_info": meta}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize(("wire", "start_len"), [(None, True), ("uint8", True), ("uint16", False)])
def test_sglang_asks_for_routes_and_shapes_them(wire, start_len):
    from tmpl.backends import SGLang

    with SGLangRoutes(_routed(), wire=wire, start_len=start_len) as server:
        backend = SGLang(server.url, routes=(2, 2), routes_start_len=start_len)
        res = _run(backend.agenerate(_request(routes_from=6)))
        plain = _run(SGLang(server.url).agenerate(_request("p", routes_from=6)))
    asked, unasked = server.bodies
    assert asked["return_routed_experts"] is True and asked.get("routed_experts_start_len") == (
        6 if start_len else None
    )
    assert "return_routed_experts" not in unasked and plain.routes is None and not SGLang(server.url).gives_routes
    assert backend.gives_routes and res.error is None and res.token_ids == REPLY and res.routes_start == 6
    assert res.routes.dtype == np.dtype(wire or np.int32)
    assert np.array_equal(res.routes, synthetic_routes(PROMPT + REPLY)[6 : len(PROMPT) + len(REPLY) - 1])


def test_sglang_fails_routes_of_another_shape():
    from tmpl.backends import SGLang

    with SGLangRoutes(_routed()) as server:
        res = _run(SGLang(server.url, routes=(3, 2)).agenerate(_request()))  # the server's model has 2 layers
    rows = len(PROMPT) + len(REPLY) - 1
    assert res.finish_reason == "error" and f"holds {rows * 4} values" in res.error and "3 layers x top-2" in res.error


# -- a backend without routes -----------------------------------------------------------------------


def test_a_server_without_routes_is_refused_once_and_never_faked():
    tpl = tmpl.ChatTemplate(load_tokenizer("qwen3"))
    # a client not told its servers return routes: the rollout refuses routes=True when it is built
    with pytest.raises(tmpl.errors.RoutesUnavailableError, match="VLLMServer"):
        tmpl.Rollout(tpl, VLLMServer("http://127.0.0.1:9"), tools=[get_time], routes=True)
    # told so, but the server sends none (started without --enable-return-routed-experts): the sample ends
    # BAD_ROUTES, no route invented
    with StandinServer(SyntheticRoutes(Scripted(TwoCalls(tpl))), routes=False) as server:
        _, [result] = _rollout(server.url, n=1)
    assert result.code is tmpl.rollout.EndCode.BAD_ROUTES and result.routes is None
    assert server.route_starts == [0] and server.sent_routes == [None]
