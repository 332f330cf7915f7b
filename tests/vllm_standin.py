"""Stand-ins for vLLM in tests: a fake ``vllm`` module for the offline adapter, and a local
HTTP server that speaks vLLM's JSON (tokens API and completions API) and generates with any
tmpl backend (the torch backend in the tests).

Routing replay (vLLM 0.32, ``--enable-return-routed-experts``; ``routes=True`` here): a request's
``routed_experts_prompt_start`` (in ``sampling_params`` on the tokens API, top-level on
``/v1/completions``) is checked as vLLM checks it (``0 <= start <= len(prompt)``, else HTTP 400),
recorded in ``StandinServer.route_starts``, and passed to the backend as ``routes_from``; the
backend's routes are cut to vLLM's coverage (the prompt from the start, the generated tokens except
the last) and sent per choice as ``routed_experts``, base64 of ``.npy`` bytes, on the final chunk
when streaming (``"stream": true`` on the tokens API: ``data:`` events, then ``data: [DONE]``).
:class:`SyntheticRoutes` gives any backend deterministic routes that depend on the whole prefix of
each position, as a model's do; ``StandinServer(routes_fault=...)`` sends bad ones.
"""

from __future__ import annotations

import base64
import io
import json
import threading
import types
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from tmpl.backends.base import Backend, GenerationRequest, Sampling

# -- a fake ``vllm`` module with the interface the adapter uses ----------------------------------


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None


class SamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


def fake_vllm_module() -> types.ModuleType:
    vllm = types.ModuleType("vllm")
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    vllm.inputs = inputs
    vllm.SamplingParams = SamplingParams
    return vllm


@dataclass
class FakeLLM:
    """``generate`` answers through a tmpl backend; every call is recorded. ``routes=True``: an engine built
    with ``enable_return_routed_experts=True`` (vLLM 0.32's config path), whose outputs carry
    ``routed_experts`` for requests with ``routed_experts_prompt_start``."""

    backend: object
    calls: list = field(default_factory=list)
    routes: bool = False

    def __post_init__(self):
        aux = types.SimpleNamespace(enable_return_routed_experts=self.routes)
        self.llm_engine = types.SimpleNamespace(vllm_config=types.SimpleNamespace(aux_output_config=aux))

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        self.calls.append((prompts, sampling_params, use_tqdm))
        requests = [
            _request(str(i), p["prompt_token_ids"], sp.kwargs, routes=self.routes)
            for i, (p, sp) in enumerate(zip(prompts, sampling_params))
        ]
        outputs = []
        for req, res in zip(requests, self.backend.generate_batch(requests)):
            steps = [{t: Logprob(lp)} for t, lp in zip(res.token_ids, res.logprobs)]
            completion = types.SimpleNamespace(
                token_ids=tuple(res.token_ids),
                logprobs=steps,
                finish_reason=res.finish_reason,
                text="",
                routed_experts=vllm_routes(req, res) if self.routes else None,
            )
            outputs.append(types.SimpleNamespace(outputs=[completion]))
        return outputs


def _request(rid: str, ids, params: dict, *, routes: bool = False) -> GenerationRequest:
    sampling = Sampling(
        temperature=params.get("temperature", 1.0),
        top_p=params.get("top_p", 1.0),
        top_k=params.get("top_k", 0) or 0,
        seed=params.get("seed"),
    )
    return GenerationRequest(
        rid,
        list(ids),
        int(params.get("max_tokens", 16)),
        frozenset(params.get("stop_token_ids") or ()),
        sampling,
        # an engine with routes on reports them for every request, from routed_experts_prompt_start (default 0)
        routes_from=int(params.get("routed_experts_prompt_start", 0)) if routes else None,
    )


def vllm_routes(req: GenerationRequest, res) -> np.ndarray | None:
    """The backend's routes cut to what vLLM 0.32 reports: ``[len(prompt) - start + len(tokens) - 1, layers,
    top_k]`` for the positions from ``routed_experts_prompt_start`` (the last sampled token is not forwarded)."""
    if req.routes_from is None or res.routes is None:
        return None
    assert res.routes_start == req.routes_from, (res.routes_start, req.routes_from)
    rows = len(req.prompt_ids) - req.routes_from + max(len(res.token_ids) - 1, 0)
    assert len(res.routes) >= rows, (len(res.routes), rows)
    return np.asarray(res.routes[:rows])


def npy_base64(array: np.ndarray) -> str:
    """vLLM's wire form of routes: base64 of the array's ``.npy`` bytes."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


# -- deterministic routes for any backend -----------------------------------------------------


def synthetic_routes(ids, *, layers: int = 2, top_k: int = 2, experts: int = 8) -> np.ndarray:
    """``[len(ids), layers, top_k]`` uint8 routes where position ``i``'s depend on ``ids[: i + 1]`` only (a
    rolling hash of the prefix), as a causal model's router's do: ``top_k`` distinct experts per layer."""
    out = np.zeros((len(ids), layers, top_k), dtype=np.uint8)
    h = 1469598103934665603
    for i, t in enumerate(ids):
        h = ((h ^ (int(t) + 1)) * 1099511628211) % (1 << 61)
        for layer in range(layers):
            x = (h >> (7 * layer)) ^ (h >> 29)
            chosen: list[int] = []
            while len(chosen) < top_k:
                e = x % experts
                x = x // experts + 2654435761 * (len(chosen) + 1)
                if e not in chosen:
                    chosen.append(e)
            out[i, layer] = chosen
    return out


class SyntheticRoutes(Backend):
    """Wrap a backend: each result with ``routes_from`` gets :func:`synthetic_routes` of ``prompt + tokens``
    from that position to the last generated token (inclusive: the stand-in cuts to vLLM's coverage)."""

    gives_routes = True

    def __init__(self, inner: Backend, *, layers: int = 2, top_k: int = 2, experts: int = 8) -> None:
        self.inner = inner
        self.shape = {"layers": layers, "top_k": top_k, "experts": experts}
        self.batching = inner.batching
        self.threaded = inner.threaded

    def generate_batch(self, requests):
        results = self.inner.generate_batch(requests)
        return [self._routed(req, res) for req, res in zip(requests, results)]

    def _routed(self, req: GenerationRequest, res):
        if req.routes_from is None or res.finish_reason == "error":
            return res
        full = synthetic_routes(list(req.prompt_ids) + list(res.token_ids), **self.shape)
        return replace(res, routes=full[req.routes_from :], routes_start=req.routes_from)


# -- a local server speaking vLLM's HTTP JSON ---------------------------------------------------


class StandinServer:
    """``POST /inference/v1/generate``, ``POST /v1/completions``, ``POST /[inference/v1/]abort_requests``.

    ``drop_first`` closes the connection without an answer on the first N generation requests
    (a flaky server); ``aborted`` collects the ids posted to /abort_requests, answered with
    ``abort_status``.
    """

    def __init__(
        self,
        backend,
        *,
        drop_first: int = 0,
        delay: float = 0.0,
        abort_status: int = 200,
        routes: bool = False,
        routes_fault: str | None = None,
        chunk: int = 3,
    ) -> None:
        self.backend = backend
        self.abort_status = abort_status
        self.drop_first = drop_first
        self.delay = delay
        self.requests = 0
        self.aborted: list[str] = []
        self.request_ids: list[str] = []  # ids of the tokens-API requests answered
        #: started with --enable-return-routed-experts: routes go back with every answer
        self.routes = routes
        #: send bad routes: "length" (one row short), "dtype" (float32), "layers" (one more layer from the
        #: second request on), "garbage" (not .npy bytes)
        self.routes_fault = routes_fault
        #: the routed_experts_prompt_start of each generation request, in order (None: not sent)
        self.route_starts: list[int | None] = []
        #: (prompt IDs, token IDs, routes start) of each answered generation, and the routes sent with it
        self.answered: list[tuple[list[int], list[int], int | None]] = []
        self.sent_routes: list[np.ndarray | None] = []
        self.streamed: list[int] = []  # events sent per streamed answer
        self.chunk = chunk  # tokens per streamed event
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path in ("/abort_requests", "/inference/v1/abort_requests"):
                    server.aborted.extend(body["request_ids"])
                    return self._send(server.abort_status, {})
                with server.lock:
                    server.requests += 1
                    drop = server.requests <= server.drop_first
                if drop:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return None
                if server.delay:
                    import time

                    time.sleep(server.delay)
                if self.path == "/inference/v1/generate":
                    server.request_ids.append(body["request_id"])
                    params = body["sampling_params"]
                    problem = server._start_problem(body["token_ids"], params)
                    if problem:
                        return self._send(400, {"error": {"message": problem, "type": "BadRequestError"}})
                    req = _request(body["request_id"], body["token_ids"], params, routes=server.routes)
                    [res] = server.backend.generate_batch([req])
                    routed = server._routes_of(req, res)
                    content = [{"token": f"token_id:{t}", "logprob": lp} for t, lp in zip(res.token_ids, res.logprobs)]
                    if body.get("stream"):
                        return self._stream(body["request_id"], res, content, routed)
                    return self._send(
                        200,
                        {
                            "request_id": body["request_id"],
                            "choices": [
                                {
                                    "index": 0,
                                    "token_ids": res.token_ids,
                                    "finish_reason": res.finish_reason,
                                    "logprobs": {"content": content},
                                    "routed_experts": routed,
                                }
                            ],
                        },
                    )
                if self.path == "/v1/completions":
                    problem = server._start_problem(body["prompt"], body)
                    if problem:
                        return self._send(400, {"error": {"message": problem, "type": "BadRequestError"}})
                    req = _request("c", body["prompt"], body, routes=server.routes)
                    [res] = server.backend.generate_batch([req])
                    choice = {
                        "index": 0,
                        "text": "",
                        "finish_reason": res.finish_reason,
                        "logprobs": {
                            "token_logprobs": res.logprobs,
                            "tokens": [f"token_id:{t}" for t in res.token_ids],
                        },
                        "routed_experts": server._routes_of(req, res),
                    }
                    if body.get("return_token_ids"):
                        choice["token_ids"] = res.token_ids
                    return self._send(200, {"id": "cmpl-1", "object": "text_completion", "choices": [choice]})
                return self._send(404, {"error": {"message": f"no route {self.path}"}})

            def _stream(self, rid, res, content, routed):
                """vLLM's event stream: ``chunk`` tokens per event; the last event has the finish reason
                and the routes (vLLM fills them when the request finishes), then ``[DONE]``."""
                ids, step = res.token_ids, server.chunk
                events = []
                for at in range(0, max(len(ids), 1), step):
                    last = at + step >= len(ids)
                    choice = {
                        "index": 0,
                        "token_ids": ids[at : at + step],
                        "logprobs": {"content": content[at : at + step]},
                    }
                    if last:
                        choice.update(finish_reason=res.finish_reason, routed_experts=routed)
                    events.append({"request_id": rid, "output_mode": "tokens", "choices": [choice]})
                server.streamed.append(len(events))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                for event in events:
                    self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Quiet(ThreadingHTTPServer):
            def handle_error(self, request, client_address):  # a client that went away (cancel)
                pass

        self.httpd = Quiet(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def _start_problem(self, prompt, params: dict) -> str | None:
        """vLLM's check of ``routed_experts_prompt_start`` (input_processor.py), recording what was sent."""
        start = params.get("routed_experts_prompt_start")
        with self.lock:
            self.route_starts.append(start)
        if start is not None and not 0 <= int(start) <= len(prompt):
            return f"routed_experts_prompt_start must be between 0 and the prompt length ({len(prompt)}), inclusive."
        return None

    def _routes_of(self, req: GenerationRequest, res) -> str | None:
        """The ``routed_experts`` field of an answer: None unless the server has routes on."""
        routes = vllm_routes(req, res) if self.routes else None
        with self.lock:
            self.answered.append((list(req.prompt_ids), list(res.token_ids), req.routes_from))
            self.sent_routes.append(routes)
            turn = len(self.sent_routes)
        if routes is None:
            return None
        fault = self.routes_fault
        if fault == "length":
            routes = routes[:-1]
        elif fault == "dtype":
            routes = routes.astype(np.float32)
        elif fault == "layers" and turn >= 2:
            routes = np.concatenate([routes, routes[:, :1]], axis=1)
        elif fault == "garbage":
            return base64.b64encode(b"not an npy file").decode("ascii")
        return npy_base64(routes)

    def __enter__(self) -> StandinServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
