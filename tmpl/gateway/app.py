"""The gateway's HTTP API: an ASGI app (FastAPI) over a :class:`~tmpl.gateway.Gateway`.

Routes (each dialect also at ``/v1/...``, its session then from the ``X-Tmpl-Session`` header, or a
new one whose key the response header names):

- ``POST /s/{session}/v1/chat/completions``: OpenAI Chat Completions (:mod:`.dialects.openai_chat`);
- ``POST /s/{session}/v1/responses``: OpenAI Responses (:mod:`.dialects.responses`);
- ``POST /s/{session}/v1/messages``: Anthropic Messages (:mod:`.dialects.anthropic`);
- ``POST /s/{session}/v1/messages/count_tokens`` (and ``/v1/...``): Anthropic's token count, the
  template's render of the request (no session touched);
- ``POST /s/{session}/v1beta/models/{model}:generateContent``, ``:streamGenerateContent`` (SSE with
  ``?alt=sse``, else a JSON array) and ``:countTokens`` (also under ``v1``, the google-genai SDK's
  default): the Gemini API (:mod:`.dialects.gemini`); ``GET /v1beta/models/{model}`` and
  ``/v1beta/models``: its model resource;
- ``GET /v1/models``, ``GET /v1/models/{id}`` (any id), ``GET /health``, ``GET /metrics`` (the event loop's
  pauses, :mod:`.loopwatch`, and the collector's passes per generation); ``GET`` and ``HEAD`` on ``/``,
  ``/v1`` and ``/s/{session}``: the probes clients send at start-up (Claude Code: ``HEAD /s/{session}``);
- ``GET /s/{session}/episode``: the session's training sequences (IDs, mask, logprobs, versions,
  branches), its episode record (:func:`tmpl.episode.records.to_record`) and its ``notes`` (what the
  gateway left out of its requests: hosted tools...);
- ``POST /s/{session}/reward`` ``{"reward": 1.0, "call": null}``; ``POST /s/{session}/finish``;
- ``GET /episodes/drain?limit=N``: finished episodes, each given once;
- ``GET /episodes/stream?limit=N&idle=S``: the same as JSON Lines, sent as sessions end (expired ones
  too), until ``limit`` episodes or ``S`` seconds (default 30) with none; each line is what
  :func:`tmpl.export.episode_from_entry` reads. An episode is given once: a line a client never
  read (it went away mid-stream) is not sent again.

Errors come in each API's own shape with the status of the :class:`~tmpl.errors.GatewayError`: 400 for
malformed JSON or a wrong schema, 413 for a body over ``max_body`` bytes, 404 for an ended session, 409
for a history the gateway never produced (strict mode), 503 when the backend fails. A client that
disconnects while its call runs has the engine request stopped (the tokens it sampled are recorded,
where the backend can stop it keeping them; else cancelled), and the session notes the call aborted.

>>> import uvicorn                                                   # doctest: +SKIP
>>> uvicorn.run(create_app(Gateway(tpl, backend)), port=8100)        # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

try:
    import fastapi
    from fastapi import Request
    from fastapi.responses import JSONResponse, StreamingResponse
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("tmpl's gateway needs FastAPI and uvicorn: pip install 'tmpl[gateway]'") from exc

from ..errors import GatewayError, GatewayRequestError
from . import streaming
from .counting import prompt_tokens
from .dialects import anthropic, gemini, openai_chat, responses
from .jsonio import loads, strict_dumps
from .loopwatch import LoopWatch
from .service import Completion, Gateway
from .trainer_routes import add_trainer_routes, episode_json

__all__ = ["LINEAGE_HEADER", "SESSION_HEADER", "create_app", "episode_json"]

log = logging.getLogger("tmpl.gateway")


class FastJSONResponse(JSONResponse):
    """A ``JSONResponse`` written by msgspec (:func:`~tmpl.gateway.jsonio.strict_dumps`; where msgspec is
    missing or refuses, ``JSONResponse``'s own body: the gateway's replies hold no float that is not
    finite, their logprobs are checked finite when recorded).

    >>> FastJSONResponse({"ok": True}).body
    b'{"ok":true}'
    """

    def render(self, content: Any) -> bytes:
        body = strict_dumps(content)
        return body if body is not None else bytes(super().render(content))


SESSION_HEADER = "x-tmpl-session"
#: names the lineage of a call (its main loop, a title generator, a sub-agent): docs/gateway.md, "Side calls and lineages"
LINEAGE_HEADER = "x-tmpl-lineage"
_KEY = re.compile(r"[A-Za-z0-9._:@-]{1,200}")
#: seconds a 503 (the engine failed or cannot be reached) asks a client to wait before it retries (``Retry-After``)
RETRY_AFTER = 2


def create_app(
    gateway: Gateway,
    *,
    max_body: int = 8 * 2**20,
    poll: float = 0.25,
    admin_token: str | None = None,
    keepalive: float = 5.0,
    watch_loop: bool = False,
) -> Any:
    """The FastAPI app. ``max_body``: request bytes at most (413 past it); ``poll``: seconds between
    checks that a waiting streamed call's client is still connected (a whole answer's call waits on the
    server's ``http.disconnect`` instead); ``admin_token``: enables ``POST /admin/weights``
    (``{"version": 3, "path": "/ckpt/step-3", "mode": "keep"}`` with ``Authorization: Bearer <token>``),
    a trainer's weight update (:meth:`Gateway.update_weights_async`); without a token it is not served;
    ``keepalive``: seconds without an event after which a stream sends a keep-alive (see :mod:`.streaming`);
    ``watch_loop``: measure the event loop's pauses from the first call (``tmpl serve`` does; else from the
    first ``GET /metrics``: a timer every 5 ms is CPU an in-process gateway, e.g. a harness rollout's, spends)."""
    if not keepalive > 0:
        raise ValueError(f"keepalive must be positive seconds, not {keepalive!r}")
    app = fastapi.FastAPI(title="tmpl gateway", docs_url=None, redoc_url=None)
    if gateway.durable is not None:  # a retried request answered once (docs/gateway.md, "Durable sessions")
        from .durable import RetryHeaders

        app.add_middleware(RetryHeaders)

    watch = app.state.loopwatch = LoopWatch()  # the event loop's pauses (GET /metrics)

    async def read_json(request: Any) -> Any:
        if watch_loop:  # from the first body read (on the server's own loop)
            watch.start()
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_body:
            raise GatewayRequestError(None, f"the body is {length} bytes, over the limit of {max_body}", status=413)
        size, parts = 0, []
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body:
                raise GatewayRequestError(None, f"the body is over the limit of {max_body} bytes", status=413)
            parts.append(chunk)
        try:
            return loads(b"".join(parts))
        except ValueError as exc:
            raise GatewayRequestError(None, f"the body is not valid JSON: {exc}") from None
        except RecursionError:
            raise GatewayRequestError(None, "the body is not valid JSON: nested too deep") from None

    anonymous: set[str] = set()  # keys made for calls that named no session: ended after their one call

    def session_of(request: Any, session: str | None) -> str:
        key = session or request.headers.get(SESSION_HEADER)
        if key is None:
            key = f"anon-{uuid.uuid4().hex}"
            anonymous.add(key)
        if not _KEY.fullmatch(key):
            raise GatewayRequestError(
                None, "a session key is 1-200 characters of A-Z a-z 0-9 . _ : @ -", param="session"
            )
        return key

    def done_with(key: str | None) -> None:
        """A call that named no session is an episode of one call: ended at once (to the drain queue), so
        such calls never crowd named sessions out."""
        if key in anonymous:
            anonymous.discard(key)
            with contextlib.suppress(GatewayError):
                gateway.finish(key)

    async def gone(request: Any) -> None:
        """Returns when the client has gone away: once the body is read, the ASGI server's next message
        is ``http.disconnect`` (one wait per call, woken by the server; polling ``is_disconnected``
        every ``poll`` seconds cost ~0.2 ms of the loop's CPU each time, a millisecond per call of 2 s)."""
        while (await request.receive())["type"] != "http.disconnect":
            await asyncio.sleep(poll)  # a server that sends something else: asked again after ``poll``

    async def run(request: Any, call: Callable[[], Awaitable[Completion]]) -> Completion:
        """Await the call, cancelling it (and its engine requests) when the client goes away."""
        task: asyncio.Future[Completion] = asyncio.ensure_future(call())
        leaving: asyncio.Future[Any] = asyncio.ensure_future(gone(request))
        either: set[asyncio.Future[Any]] = {task, leaving}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not leaving.done():
                leaving.cancel()
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise _ClientGone

    def error(dialect: Any, exc: GatewayError, key: str | None) -> Any:
        headers = {SESSION_HEADER: key} if key else {}
        if exc.status == 503:  # the engine is away (restarting...): the SDKs wait this long before a retry
            headers["Retry-After"] = str(RETRY_AFTER)
        return JSONResponse(dialect.error_body(exc), status_code=exc.status, headers=headers)

    def unexpected(dialect: Any, exc: Exception, key: str | None) -> Any:
        log.exception("gateway: unexpected error in session %r", key)
        wrapped = GatewayError(key, 500, f"internal error: {type(exc).__name__}: {exc}")
        wrapped.kind = "api_error"
        return error(dialect, wrapped, key)

    def chat_body(key: str, done: Completion, req: Any, model: str) -> dict[str, Any]:
        return openai_chat.response(key, done.plan, done.replies, model=model, logprobs=req.logprobs, tpl=gateway.tpl)

    def chat_sse(key: str, done: Completion, req: Any, model: str) -> Iterator[str]:
        chunks = openai_chat.chunks(
            key, done.plan, done.replies, model=model, include_usage=req.include_usage, logprobs=req.logprobs,
            tpl=gateway.tpl,
        )  # fmt: skip
        for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    def named_events(events: Iterator[tuple[str, dict[str, Any]]]) -> Iterator[str]:
        for event, data in events:
            yield f"event: {event}\ndata: {json.dumps(data)}\n\n"

    #: each dialect: its module (parse, error_body), its response body and its stream, from a finished call
    dialects: dict[str, tuple[Any, Callable[..., dict[str, Any]], Callable[..., Iterator[str]]]] = {
        "chat": (openai_chat, chat_body, chat_sse),
        "messages": (
            anthropic,
            lambda key, done, req, model: anthropic.response(
                key, done.plan, done.replies[0], model=model, notes=req.notes
            ),
            lambda key, done, req, model: named_events(
                anthropic.events(key, done.plan, done.replies[0], model=model, notes=req.notes)
            ),
        ),
        "responses": (
            responses,
            lambda key, done, req, model: responses.response(
                key, done.plan, done.replies[0], model=model, echo=req.echo, request=req
            ),
            lambda key, done, req, model: named_events(
                responses.events(key, done.plan, done.replies[0], model=model, echo=req.echo, request=req)
            ),
        ),
    }

    def note(key: str, req: Any) -> None:
        """What the gateway left out of a request (a dialect's ``notes``: hosted tools...), kept once each in
        the session's ``notes`` (``GET /s/{session}/episode``)."""
        notes = getattr(req, "notes", ())
        if not notes:
            return
        with contextlib.suppress(GatewayError):  # an anonymous call's session has ended already
            session = gateway.sessions.get(key, create=False)
            session.notes += [n for n in notes if n not in session.notes]

    async def handle(request: Any, session: str | None, name: str) -> Any:
        """One call in dialect ``name``: parse, complete (cancelled if the client goes), answer or stream."""
        dialect, body_of, stream_of = dialects[name]
        key = None
        try:
            key = session_of(request, session)
            req = dialect.parse(await read_json(request))
            if req.stream and req.params.n == 1:  # sent as the engine samples it
                return await stream_live(request, key, name, req)
            try:
                lineage = request.headers.get(LINEAGE_HEADER)
                done = await run(request, lambda: gateway.complete(key, req.messages, req.tools, req.params, lineage))
            finally:
                done_with(key)
        except _ClientGone:
            return fastapi.Response(status_code=499)
        except GatewayError as exc:
            return error(dialect, exc, key)
        except Exception as exc:  # noqa: BLE001 - answered in the API's shape, logged
            return unexpected(dialect, exc, key)
        note(key, req)
        model = req.model or gateway.model
        headers = {SESSION_HEADER: key}
        if not req.stream:
            return FastJSONResponse(body_of(key, done, req, model), headers=headers)

        async def sse() -> AsyncIterator[str]:
            for piece in stream_of(key, done, req, model):
                yield piece

        return StreamingResponse(sse(), media_type="text/event-stream", headers=headers)

    async def stream_live(request: Any, key: str, name: str, req: Any, body_of: Any = None) -> Any:
        """A streamed call of one choice, its text sent as the engine samples it (:mod:`.streaming`). Errors
        before the engine request starts (the plan's, a refused call) are answered as usual; later ones go
        in the stream. A client that goes away mid-stream has the call cancelled: the engine request stops,
        the tokens it sampled are recorded as an aborted call (:meth:`Gateway.complete_streamed`).
        ``body_of``: the dialect's whole answer (default: that of ``dialects[name]``)."""
        body_of = body_of or dialects[name][1]
        live = streaming.LiveText(gateway.tpl, req.params.stop)
        lineage = request.headers.get(LINEAGE_HEADER)
        task = asyncio.ensure_future(gateway.complete_streamed(live, key, req.messages, req.tools, req.params, lineage))
        task.add_done_callback(lambda _: done_with(key))
        started = asyncio.ensure_future(live.started_event.wait())
        try:
            while not (task.done() or started.done()):
                await asyncio.wait({task, started}, timeout=poll, return_when=asyncio.FIRST_COMPLETED)
                if not (task.done() or started.done()) and await request.is_disconnected():
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    return fastapi.Response(status_code=499)
        finally:
            started.cancel()
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]  # answered in the API's shape by handle
        note(key, req)
        model = req.model or gateway.model

        def final(done: Completion) -> dict[str, Any]:
            body: dict[str, Any] = body_of(key, done, req, model)
            return body

        events = streaming.follow(live, task, keepalive)
        sse_form = name != "gemini" or request.query_params.get("alt") == "sse"  # Gemini's other form: a JSON array
        if name == "chat":
            encoded = streaming.chat_sse(live, events, final, model=model, include_usage=req.include_usage)
        elif name == "messages":
            encoded = streaming.anthropic_sse(key, live, events, final, model=model)
        elif name == "gemini":
            encoded = streaming.gemini_stream(live, events, final, model=model, sse=sse_form)
        else:  # responses
            encoded = streaming.responses_sse(key, live, events, final, model=model, echo=req.echo)
        media = "text/event-stream" if sse_form else "application/json"

        async def sse() -> AsyncIterator[str]:
            try:
                async for piece in encoded:
                    yield piece
            finally:  # the client went away mid-stream (or the stream ended): stop what still runs
                if not task.done():
                    task.cancel()

        return StreamingResponse(sse(), media_type=media, headers={SESSION_HEADER: key})

    def routes(name: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """The two routes of a dialect (a closure each: a default argument would be a query parameter)."""

        async def anywhere(request: Request) -> Any:
            return await handle(request, None, name)

        async def in_session(session: str, request: Request) -> Any:
            return await handle(request, session, name)

        return anywhere, in_session

    for name, path in (("chat", "chat/completions"), ("messages", "messages"), ("responses", "responses")):
        anywhere, in_session = routes(name)
        app.post(f"/v1/{path}")(anywhere)
        app.post(f"/s/{{session}}/v1/{path}")(in_session)

    def model_object(name: str) -> dict[str, Any]:
        """A model as OpenAI's and Anthropic's model routes describe one (the fields of both)."""
        return {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "tmpl",
            "type": "model",
            "display_name": name,
            "created_at": "1970-01-01T00:00:00Z",
        }

    def models() -> Any:
        one = model_object(gateway.model)
        return {"object": "list", "data": [one], "has_more": False, "first_id": one["id"], "last_id": one["id"]}

    def model(model_id: str) -> Any:
        """Any model id: the gateway serves its one model under whatever name a client gives it."""
        return model_object(model_id)

    app.get("/v1/models")(models)
    app.get("/s/{session}/v1/models")(models)
    app.get("/v1/models/{model_id:path}")(model)
    app.get("/s/{session}/v1/models/{model_id:path}")(model)

    async def count_tokens(request: Request, session: str | None = None) -> Any:
        """Anthropic's ``count_tokens``: the token count of the template's render of the request (its
        system and developer turns placed as a call's would be, with the generation prompt); no session
        is touched."""
        try:
            req = anthropic.parse(await read_json(request), count=True)
            return anthropic.count_body(prompt_tokens(gateway, session, req.messages, req.tools, param="messages"))
        except GatewayError as exc:
            return error(anthropic, exc, None)

    app.post("/v1/messages/count_tokens")(count_tokens)
    app.post("/s/{session}/v1/messages/count_tokens")(count_tokens)

    async def probe(request: Request, session: str | None = None) -> Any:
        """What clients send at start-up to see the server is up (Claude Code: ``HEAD /s/{session}``):
        answered 200, no session touched."""
        if request.method == "HEAD":
            return fastapi.Response(status_code=200)
        return {"status": "ok", "service": "tmpl gateway", "model": gateway.model, "session": session}

    for path in ("/", "/s/{session}", "/s/{session}/", "/v1", "/s/{session}/v1"):
        app.api_route(path, methods=["GET", "HEAD"])(probe)

    @app.get("/health")
    async def health() -> Any:
        return {"status": "ok", "sessions": len(gateway.sessions), "calls": gateway.calls}

    @app.get("/metrics")
    async def metrics() -> Any:
        """The event loop's pauses (:class:`~tmpl.gateway.loopwatch.LoopWatch`) and the collector's passes."""
        watch.start()
        passes = [s["collections"] for s in gc.get_stats()]
        return {"sessions": len(gateway.sessions), "calls": gateway.calls, "loop": watch.report(), "gc": passes}

    add_trainer_routes(app, gateway, read_json, admin_token)

    async def gemini_call(request: Request, target: str, session: str | None = None) -> Any:
        """Gemini's ``models/{model}:generateContent``, ``:streamGenerateContent`` (SSE with ``?alt=sse``,
        else a JSON array sent as it is made) and ``:countTokens``."""
        model, _, method = target.partition(":")
        key = None
        try:
            if method == "countTokens":
                req = gemini.parse(await read_json(request), model=model, stream=False, count=True)
                return gemini.count_body(prompt_tokens(gateway, session, req.messages, req.tools, param="contents"))
            if method not in ("generateContent", "streamGenerateContent"):
                raise GatewayError(None, 404, f"models/{model}:{method} is not served")
            key = session_of(request, session)
            req = gemini.parse(await read_json(request), model=model, stream=method == "streamGenerateContent")
            if req.stream and req.params.n == 1:  # sent as the engine samples it

                def whole(key: str, done: Completion, req: Any, name: str) -> dict[str, Any]:
                    return gemini.response(key, done.plan, done.replies, model=name, notes=req.notes)

                return await stream_live(request, key, "gemini", req, whole)
            try:
                lineage = request.headers.get(LINEAGE_HEADER)
                done = await run(request, lambda: gateway.complete(key, req.messages, req.tools, req.params, lineage))
            finally:
                done_with(key)
        except _ClientGone:
            return fastapi.Response(status_code=499)
        except GatewayError as exc:
            return error(gemini, exc, key)
        except Exception as exc:  # noqa: BLE001 - answered in the API's shape, logged
            return unexpected(gemini, exc, key)
        note(key, req)
        name = req.model or gateway.model
        headers = {SESSION_HEADER: key}
        if not req.stream:
            return JSONResponse(
                gemini.response(key, done.plan, done.replies, model=name, notes=req.notes), headers=headers
            )
        chunks = gemini.stream_chunks(key, done.plan, done.replies, model=name, notes=req.notes)
        if request.query_params.get("alt") == "sse":

            async def sse() -> AsyncIterator[str]:
                for chunk in chunks:
                    yield f"data: {json.dumps(chunk)}\r\n\r\n"

            return StreamingResponse(sse(), media_type="text/event-stream", headers=headers)

        async def array() -> AsyncIterator[str]:
            for k, chunk in enumerate(chunks):
                yield ("[" if k == 0 else ",\r\n") + json.dumps(chunk)
            yield "]"

        return StreamingResponse(array(), media_type="application/json", headers=headers)

    def gemini_model(model: str) -> Any:
        return gemini.model_object(model, context=gateway.max_context, output=gateway.max_tokens)

    def gemini_models() -> Any:
        return {"models": [gemini_model(gateway.model)]}

    for version in ("v1beta", "v1"):  # Gemini CLI calls v1beta; the google-genai SDK's default is v1
        app.post(f"/{version}/models/{{target}}")(gemini_call)
        app.post(f"/s/{{session}}/{version}/models/{{target}}")(gemini_call)
    app.get("/v1beta/models/{model}")(gemini_model)
    app.get("/s/{session}/v1beta/models/{model}")(gemini_model)
    app.get("/v1beta/models")(gemini_models)
    app.get("/s/{session}/v1beta/models")(gemini_models)

    app.state.gateway = gateway
    return app


class _ClientGone(Exception):
    """The client disconnected before its call was answered."""
