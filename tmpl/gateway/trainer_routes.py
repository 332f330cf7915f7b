"""The trainer's routes of the gateway's app (:func:`add_trainer_routes`): a session's episode, its reward, its end,
its environment (reset, step), the drain, ack and stream of finished episodes, and weight updates, each behind the
admin token when one is set; :func:`episode_json`, what ``GET /s/{session}/episode`` answers."""

from __future__ import annotations

import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..episode.records import to_record
from ..errors import GatewayError, GatewayRequestError, TmplError
from .dialects import openai_chat
from .service import Gateway

__all__ = ["add_trainer_routes", "episode_json"]


def episode_json(gateway: Gateway, key: str) -> dict[str, Any]:
    """What ``GET /s/{session}/episode`` answers: the sequences, the record, the session's counters."""
    session = gateway.session(key)
    episode = session.episode
    return {
        "session": key,
        "calls": session.calls,
        "sequences": [
            {
                "index": s.index,
                "ids": s.ids.tolist(),
                "mask": s.mask.tolist(),
                "logprobs": s.logprobs.tolist(),
                "versions": s.versions.tolist(),
                "calls": list(s.calls),
                "agent": s.agent,
                "branch": {
                    "kind": s.branch.kind,
                    "text": str(s.branch),
                    "message": s.branch.message,
                    "field": s.branch.field,
                    "edit": s.branch.edit,
                },
                "status": s.status.name,
            }
            for s in episode.sequences
        ],
        "ended": dict(session.ended),
        "problems": [{"call": c, "problem": p} for c, p in session.problems],
        "notes": list(session.notes),
        "tokens": {"encoded": session.encoded_tokens, "reused": session.reused_tokens},
        "record": to_record(episode),
    }


def add_trainer_routes(
    app: FastAPI, gateway: Gateway, read_json: Callable[[Any], Awaitable[Any]], admin_token: str | None
) -> None:
    """The trainer's routes on ``app`` (see the module); ``read_json`` reads a body within the app's size limit."""

    def plain_error(exc: GatewayError) -> Any:
        return JSONResponse(openai_chat.error_body(exc), status_code=exc.status)

    def trainer_only(request: Any) -> Any:
        """With an admin token, the trainer's routes (episode, reward, finish, drain, weights) need it: the
        agent under training talks to the same server and must not read other sessions, reward itself or
        drain the queue. None when the request may go on, else the 401 answer."""
        if not admin_token:
            return None
        given = request.headers.get("authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {admin_token}".encode()):
            return None
        return plain_error(GatewayError(None, 401, "this route needs the admin token (Authorization: Bearer)"))

    @app.get("/s/{session}/episode")
    async def episode(session: str, request: Request) -> Any:
        if (refused := trainer_only(request)) is not None:
            return refused
        try:
            return JSONResponse(episode_json(gateway, session))
        except GatewayError as exc:
            return plain_error(exc)

    @app.post("/s/{session}/reward")
    async def reward(session: str, request: Request) -> Any:
        if (refused := trainer_only(request)) is not None:
            return refused
        try:
            body = await read_json(request)
            if (
                not isinstance(body, dict)
                or "reward" not in body
                or not isinstance(body.get("call"), (str, type(None)))
            ):
                raise GatewayRequestError(
                    session, 'the body must be {"reward": <number>, "call": <id or null>}', param="reward"
                )
            try:
                gateway.reward(session, body["reward"], call=body.get("call"))
            except TmplError as exc:
                if isinstance(exc, GatewayError):
                    raise
                raise GatewayRequestError(session, str(exc), param="reward") from exc
            if gateway.durable is not None:  # in the store before the answer
                await gateway.durable.flush()
            return {"session": session, "reward": body["reward"], "call": body.get("call")}
        except GatewayError as exc:
            return plain_error(exc)

    @app.post("/s/{session}/finish")
    async def finish(session: str, request: Request) -> Any:
        if (refused := trainer_only(request)) is not None:
            return refused
        try:
            done = gateway.finish(session)
        except GatewayError as exc:
            return plain_error(exc)
        if gateway.durable is not None:  # in the store before the answer
            await gateway.durable.flush()
        return finished_entry(done)

    @app.post("/s/{session}/env/reset")
    async def env_reset(session: str, request: Request) -> Any:
        """The session's environment, reset on the body's ``task``: its opening messages and tools."""
        try:
            body = await read_json(request)
            if not isinstance(body, dict):
                raise GatewayRequestError(session, 'the body must be {"task": <any JSON>}', param="task")
            opened, tools = await gateway.env_reset(session, body.get("task"))
            return {"session": session, "messages": opened.messages, "tools": tools}
        except GatewayError as exc:
            return plain_error(exc)

    @app.post("/s/{session}/env/step")
    async def env_step(session: str, request: Request) -> Any:
        """The assistant message the harness got, to the session's environment: its turns, reward, done."""
        try:
            body = await read_json(request)
            if not isinstance(body, dict) or not isinstance(body.get("message"), dict):
                raise GatewayRequestError(
                    session, 'the body must be {"message": <the assistant message>}', param="message"
                )
            out = await gateway.env_step(session, body["message"])
            return {
                "session": session,
                "messages": out.messages,
                "reward": out.reward,
                "done": out.done,
                "truncated": out.truncated,
                "info": json.loads(json.dumps(out.info, default=str)),
            }
        except GatewayError as exc:
            return plain_error(exc)

    def finished_entry(done: Any) -> dict[str, Any]:
        entry = {"session": done.key, "reason": done.reason, "record": to_record(done.episode)}
        if done.images is not None:  # a vision template's: each sequence's image inputs (tmpl.vision.ImageInputs)
            from ..trajectory.images import to_record as image_record

            entry["images"] = [None if im is None else image_record(im) for im in done.images]
        if done.ack is not None:  # a durable store keeps it until acknowledged (POST /episodes/ack)
            entry["ack"] = done.ack
        if done.env is not None:  # the environment's name, state, summed reward, info, error (as JSON)
            entry["env"] = json.loads(json.dumps(done.env, default=str))
        return entry

    @app.get("/episodes/drain")
    async def drain(request: Request, limit: int | None = None) -> Any:
        if (refused := trainer_only(request)) is not None:
            return refused
        out = gateway.drain(limit)
        return {"episodes": [finished_entry(f) for f in out]}

    @app.post("/episodes/ack")
    async def ack(request: Request) -> Any:
        """Acknowledge episodes read: ``{"acks": [ack ids]}``; a durable store then lets them go."""
        if (refused := trainer_only(request)) is not None:
            return refused
        try:
            body = await read_json(request)
            acks = body.get("acks") if isinstance(body, dict) else None
            if not isinstance(acks, list) or not all(isinstance(a, str) for a in acks):
                raise GatewayRequestError(None, 'the body must be {"acks": [<ack id>, ...]}', param="acks")
            acked = gateway.ack(acks)
            if gateway.durable is not None:
                await gateway.durable.flush()
            return {"acked": acked}
        except GatewayError as exc:
            return plain_error(exc)

    @app.get("/episodes/stream")
    async def stream(request: Request, limit: int | None = None, idle: float = 30.0) -> Any:
        if (refused := trainer_only(request)) is not None:
            return refused
        if (limit is not None and limit < 1) or not 0 < idle <= 3600:
            return plain_error(GatewayRequestError(None, "limit must be at least 1 and idle in (0, 3600] seconds"))

        async def lines() -> AsyncIterator[bytes]:
            async for done in gateway.stream(limit=limit, idle=idle):
                yield json.dumps(finished_entry(done)).encode() + b"\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    if admin_token:

        @app.post("/admin/weights")
        async def weights(request: Request) -> Any:
            if (refused := trainer_only(request)) is not None:
                return refused
            try:
                body = await read_json(request)
                if not isinstance(body, dict) or not isinstance(body.get("version"), int):
                    raise GatewayRequestError(None, 'the body must be {"version": <int>, "path": <folder or null>, '
                                              '"mode": "keep" | "abort" | "drain"}', param="version")  # fmt: skip
                mode = body.get("mode", "keep")
                if mode not in ("keep", "abort", "drain"):
                    raise GatewayRequestError(None, f"mode must be keep, abort or drain, got {mode!r}", param="mode")
                await gateway.update_weights_async(body["version"], body.get("path"), mode=mode)
            except GatewayError as exc:
                return plain_error(exc)
            except TmplError as exc:  # the engine refused or failed the update
                return plain_error(GatewayError(None, 502, f"{type(exc).__name__}: {exc}"))
            return {"version": body["version"], "mode": mode, "updates": len(gateway.updates)}
