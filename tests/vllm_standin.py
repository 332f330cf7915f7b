"""Stand-ins for vLLM in tests: a fake ``vllm`` module for the offline adapter, and a local
HTTP server that speaks vLLM's JSON (tokens API and completions API) and generates with any
tmpl backend (the torch backend in the tests)."""

from __future__ import annotations

import json
import threading
import types
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tmpl.backends.base import GenerationRequest, Sampling

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
    """``generate`` answers through a tmpl backend; every call is recorded."""

    backend: object
    calls: list = field(default_factory=list)

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        self.calls.append((prompts, sampling_params, use_tqdm))
        requests = [
            _request(str(i), p["prompt_token_ids"], sp.kwargs)
            for i, (p, sp) in enumerate(zip(prompts, sampling_params))
        ]
        outputs = []
        for res in self.backend.generate_batch(requests):
            steps = [{t: Logprob(lp)} for t, lp in zip(res.token_ids, res.logprobs)]
            completion = types.SimpleNamespace(
                token_ids=tuple(res.token_ids), logprobs=steps, finish_reason=res.finish_reason, text=""
            )
            outputs.append(types.SimpleNamespace(outputs=[completion]))
        return outputs


def _request(rid: str, ids, params: dict) -> GenerationRequest:
    sampling = Sampling(
        temperature=params.get("temperature", 1.0),
        top_p=params.get("top_p", 1.0),
        top_k=params.get("top_k", 0) or 0,
        seed=params.get("seed"),
    )
    return GenerationRequest(
        rid, list(ids), int(params.get("max_tokens", 16)), frozenset(params.get("stop_token_ids") or ()), sampling
    )


# -- a local server speaking vLLM's HTTP JSON ---------------------------------------------------


class StandinServer:
    """``POST /inference/v1/generate``, ``POST /v1/completions``, ``POST /[inference/v1/]abort_requests``.

    ``drop_first`` closes the connection without an answer on the first N generation requests
    (a flaky server); ``aborted`` collects the ids posted to /abort_requests, answered with
    ``abort_status``.
    """

    def __init__(self, backend, *, drop_first: int = 0, delay: float = 0.0, abort_status: int = 200) -> None:
        self.backend = backend
        self.abort_status = abort_status
        self.drop_first = drop_first
        self.delay = delay
        self.requests = 0
        self.aborted: list[str] = []
        self.request_ids: list[str] = []  # ids of the tokens-API requests answered
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
                    req = _request(body["request_id"], body["token_ids"], body["sampling_params"])
                    [res] = server.backend.generate_batch([req])
                    content = [{"token": f"token_id:{t}", "logprob": lp} for t, lp in zip(res.token_ids, res.logprobs)]
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
                                }
                            ],
                        },
                    )
                if self.path == "/v1/completions":
                    req = _request("c", body["prompt"], body)
                    [res] = server.backend.generate_batch([req])
                    choice = {
                        "index": 0,
                        "text": "",
                        "finish_reason": res.finish_reason,
                        "logprobs": {
                            "token_logprobs": res.logprobs,
                            "tokens": [f"token_id:{t}" for t in res.token_ids],
                        },
                    }
                    if body.get("return_token_ids"):
                        choice["token_ids"] = res.token_ids
                    return self._send(200, {"id": "cmpl-1", "object": "text_completion", "choices": [choice]})
                return self._send(404, {"error": {"message": f"no route {self.path}"}})

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

    def __enter__(self) -> StandinServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
