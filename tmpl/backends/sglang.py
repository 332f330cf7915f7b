"""``tmpl.backends.SGLang``: an SGLang server (or router) over its native ``/generate``, token IDs in and out.

>>> backend = tmpl.backends.SGLang("http://127.0.0.1:30000")  # doctest: +SKIP

Request (SGLang 0.5.23, ``GenerateReqInput``): ``{"input_ids": [...], "rid": id, "return_logprob":
true, "sampling_params": {"max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids",
"skip_special_tokens": false, "no_stop_trim": true}}``. Answer: ``output_ids``, ``meta_info``
with ``finish_reason`` (``{"type": "stop" | "length" | "abort", ...}``) and
``output_token_logprobs``, one ``[logprob, token_id, text-or-null]`` per generated token. The IDs
are taken from ``output_token_logprobs`` (as slime does) and checked against ``output_ids``. A
missing or short ``output_token_logprobs`` fails the generation (``logprobs_required=True``: the
sample aborts rather than train on made-up logprobs). :meth:`SGLang.cancel` posts the request id
to ``/abort_request``.

Routing replay (``SGLang(url, routes=(layers, top_k))``, the server started with
``--enable-return-routed-experts``): a request with ``routes_from`` also sends ``return_routed_experts:
true`` and ``routed_experts_start_len`` (SGLang's ``GenerateReqInput``: the routes cover
``[routed_experts_start_len, seqlen - 1)``, the last sampled token not forwarded). The answer's
``meta_info["routed_experts"]`` is base64 of the flat row-major expert IDs, int32 unless
``meta_info["routed_experts_dtype"]`` says uint16 or uint8, so the shape is the caller's to give;
``meta_info["routed_experts_start_len"]`` says where they start (absent: 0, from an SGLang that sends the
whole sequence: the rows before ``routes_from`` are dropped). ``routes_start_len=False`` leaves the start
out of the request, for an SGLang whose ``GenerateReqInput`` has no such field.

What has run: only against a local HTTP server answering in these shapes (tests/test_sglang_backend.py;
the routes: tests/test_routes_server.py): SGLang 0.5.23 needs CUDA (torch 2.14.1, flashinfer,
sglang-kernel) and does not run on the CPU machines tmpl is tested on.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..errors import HTTPConnectionError
from .base import Backend, GenerationRequest, GenerationResult
from .http import HTTPClient
from .routes import RoutesDecodeError, decode_flat, from_position

__all__ = ["SGLang", "sglang_payload"]


def sglang_payload(
    request: GenerationRequest, rid: str, *, routes: bool = False, routes_start_len: bool = True
) -> dict[str, Any]:
    """The ``/generate`` body for one request (``routes``: ask for its routes when it has ``routes_from``).

    >>> from tmpl.backends import GenerationRequest, Sampling
    >>> body = sglang_payload(GenerationRequest("r1", [1, 2], 8, frozenset({7}), Sampling(temperature=0.5)), "r1")
    >>> body["input_ids"], body["sampling_params"]["max_new_tokens"], body["sampling_params"]["stop_token_ids"]
    ([1, 2], 8, [7])
    """
    s = request.sampling
    params: dict[str, Any] = {
        "max_new_tokens": int(request.max_tokens),
        "temperature": float(s.temperature),
        "top_p": float(s.top_p),
        "stop_token_ids": sorted(int(t) for t in request.stop_token_ids),
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if s.top_k:
        params["top_k"] = int(s.top_k)
    if s.seed is not None:
        params["sampling_seed"] = int(s.seed)
    body: dict[str, Any] = {
        "input_ids": list(request.prompt_ids),
        "rid": rid,
        "return_logprob": True,
        "sampling_params": params,
    }
    if routes and request.routes_from is not None:
        body["return_routed_experts"] = True
        if routes_start_len:
            body["routed_experts_start_len"] = int(request.routes_from)
    return body


def parse_sglang(
    request_id: str,
    body: Any,
    *,
    logprobs_required: bool = True,
    routes: tuple[int, int] | None = None,
    routes_from: int | None = None,
) -> GenerationResult:
    """A :class:`GenerationResult` from a ``/generate`` answer (errors become a failed result).

    ``routes``: ``(layers, top_k)`` of the model, to shape ``meta_info["routed_experts"]`` (kept from
    ``routes_from`` on; None: no routes read).
    """
    try:
        meta = body["meta_info"]
        finish = meta.get("finish_reason") or {}
        kind = finish.get("type") if isinstance(finish, dict) else str(finish)
        pairs = meta.get("output_token_logprobs")
        out_ids = body.get("output_ids")
        if pairs is None:
            if logprobs_required:
                return GenerationResult.failed(request_id, "SGLang returned no output_token_logprobs (return_logprob)")
            ids, lps = [int(t) for t in out_ids or []], None
        else:
            ids = [int(p[1]) for p in pairs]
            lps = [float(p[0]) for p in pairs]
            if out_ids is not None and [int(t) for t in out_ids] != ids:
                return GenerationResult.failed(
                    request_id, f"output_ids ({len(out_ids)}) and output_token_logprobs ({len(ids)}) disagree"
                )
        routed, start = _routes(meta, routes, routes_from)
    except RoutesDecodeError as exc:
        return GenerationResult.failed(request_id, f"SGLang: {exc}")
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        return GenerationResult.failed(request_id, f"malformed SGLang response ({exc}): {str(body)[:200]}")
    reason = kind if kind in ("stop", "length", "abort") else "error"
    error = finish.get("message") if isinstance(finish, dict) and reason == "abort" else None
    return GenerationResult(
        request_id,
        ids,
        lps,
        reason,  # type: ignore[arg-type]
        error=error,
        routes=routed,
        routes_start=start,
    )


def _routes(meta: dict[str, Any], shape: tuple[int, int] | None, routes_from: int | None) -> tuple[Any, int]:
    """``(routes, start)`` of ``meta_info`` (``(None, 0)`` when none were asked or sent)."""
    sent = meta.get("routed_experts")
    if shape is None or routes_from is None or sent is None:
        return None, 0
    if not isinstance(sent, str):
        raise RoutesDecodeError(f"routed_experts is a {type(sent).__name__}, not base64 of expert IDs")
    start = int(meta.get("routed_experts_start_len") or 0)
    return from_position(decode_flat(sent, meta.get("routed_experts_dtype"), *shape), start, routes_from)


class SGLang(Backend):
    """Send each request to an SGLang server's or router's ``/generate`` as soon as it is ready.

    ``retries``: tries again after a lost connection or a 5xx answer (under ``<rid>~a<try>``).
    """

    batching = False

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 600.0,
        retries: int = 2,
        headers: dict[str, str] | None = None,
        logprobs_required: bool = True,
        max_connections: int = 256,
        routes: tuple[int, int] | None = None,
        routes_start_len: bool = True,
    ) -> None:
        self.url = url.rstrip("/")
        #: ``(layers, top_k)`` of the model when the server returns routes (--enable-return-routed-experts)
        self.routes = None if routes is None else (int(routes[0]), int(routes[1]))
        self.gives_routes = self.routes is not None
        self.routes_start_len = routes_start_len
        self.retries = retries
        self.logprobs_required = logprobs_required
        self.http = HTTPClient(timeout=timeout, max_connections=max_connections, headers=headers)
        self._inflight: dict[str, tuple[asyncio.Task[Any] | None, str]] = {}
        #: request ids aborted on the server, in order
        self.aborted: list[str] = []

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        """One generation; retried on a lost connection or a 5xx answer. Requests with images fail
        (not wired for SGLang: sending the IDs alone would generate from placeholders without pixels)."""
        if request.images is not None and request.images.count:
            return GenerationResult.failed(
                request.request_id,
                "SGLang: requests with images are not supported (use Torch, VLLM or VLLMServer)",
            )
        last = ""
        for attempt in range(self.retries + 1):
            rid = request.request_id if attempt == 0 else f"{request.request_id}~a{attempt}"
            self._inflight[request.request_id] = (asyncio.current_task(), rid)
            try:
                payload = sglang_payload(request, rid, routes=self.gives_routes, routes_start_len=self.routes_start_len)
                status, body = await self.http.post_json(self.url + "/generate", payload)
            except HTTPConnectionError as exc:
                last = str(exc)
                continue
            except asyncio.TimeoutError as exc:
                await self._abort(rid)
                last = f"timed out ({exc})"
                continue
            finally:
                self._inflight.pop(request.request_id, None)
            if status >= 500:
                last = f"HTTP {status}: {str(body)[:200]}"
                continue
            if status != 200:
                return GenerationResult.failed(request.request_id, f"{self.url}: HTTP {status}: {str(body)[:300]}")
            return parse_sglang(
                request.request_id,
                body,
                logprobs_required=self.logprobs_required,
                routes=self.routes,
                routes_from=request.routes_from,
            )
        return GenerationResult.failed(request.request_id, f"gave up after {self.retries + 1} attempt(s): {last}")

    async def _abort(self, rid: str) -> None:
        self.aborted.append(rid)
        try:
            await self.http.post_json(self.url + "/abort_request", {"rid": rid}, timeout=10.0)
        except (HTTPConnectionError, asyncio.TimeoutError):
            pass

    async def cancel(self, request_id: str) -> None:
        """Abort an in-flight request: ``POST /abort_request {"rid": ...}``, then cancel its task."""
        entry = self._inflight.get(request_id)
        if entry is None:
            return
        task, rid = entry
        await self._abort(rid)
        if task is not None and task is not asyncio.current_task():
            task.cancel()
