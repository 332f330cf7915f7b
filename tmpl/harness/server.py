"""An in-process :class:`~tmpl.gateway.Gateway` served for harness runs, on the rollout's own event loop.

:class:`LocalGateway` runs uvicorn as a task of the running loop, on 127.0.0.1 (a port it picks) and,
when asked, on a Unix socket too (what a sandbox binds in): the gateway's sessions are then touched from
one thread only, the loop's, both by the HTTP routes the harnesses call and by the rollout reading
episodes (``gateway.finish``), so nothing needs a lock. Between the server and the app sits a small
ASGI layer that notes, for the sessions being watched, each model call the gateway answered with an
error (status and message): a harness that floods the gateway past ``max_session_tokens`` is told 400
and the rollout can say so.

>>> async def main(gateway):                                                      # doctest: +SKIP
...     async with LocalGateway(gateway) as local:
...         print(local.url)
http://127.0.0.1:41235
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["LocalGateway", "Refusals"]

log = logging.getLogger("tmpl.harness")

#: the model routes whose error answers count as refused calls (the rest: listing models, health...)
_MODEL_ROUTES = ("/chat/completions", "/responses", "/messages", ":generateContent", ":streamGenerateContent")
#: refusals kept per session (the first ones: a flooding harness repeats the same answer)
_KEEP = 8


class Refusals:
    """ASGI middleware: error answers to model calls of the watched sessions (``/s/{key}/...``)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: dict[str, list[str]] = {}

    def watch(self, key: str) -> None:
        self.seen[key] = []

    def take(self, key: str) -> list[str]:
        """The refusals noted for ``key`` (and stop watching it)."""
        return self.seen.pop(key, [])

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope.get("type") == "http" else ""
        key = path[3:].split("/", 1)[0] if path.startswith("/s/") else None
        if key is None or key not in self.seen or not path.endswith(_MODEL_ROUTES):
            await self.app(scope, receive, send)
            return
        state: dict[str, Any] = {"status": 200, "body": b""}

        async def noting(message: Any) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
            elif message["type"] == "http.response.body" and state["status"] >= 400 and len(state["body"]) < 4096:
                state["body"] += message.get("body", b"")
            await send(message)

        await self.app(scope, receive, noting)
        if state["status"] >= 400 and len(self.seen.get(key, ())) < _KEEP:
            self.seen.setdefault(key, []).append(f"{state['status']}: {_message(state['body'])}")


def _message(body: bytes) -> str:
    """The error message of an answer in any dialect's shape (``{"error": {"message": ...}}``...)."""
    try:
        data = json.loads(body)
    except ValueError:
        return body[:300].decode("utf-8", "replace")
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])[:500]
    return json.dumps(data)[:300]


class LocalGateway:
    """``gateway`` served on 127.0.0.1 (and on ``uds``, a Unix socket path, when given) by uvicorn, as a
    task of the running event loop, from ``async with`` to its end. ``url``: its root URL."""

    def __init__(self, gateway: Any, *, uds: Path | None = None, admin_token: str | None = None) -> None:
        from ..gateway import create_app

        self.gateway = gateway
        self.refusals = Refusals(create_app(gateway, admin_token=admin_token))
        self.uds = uds
        self.url = ""
        self._servers: list[Any] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> LocalGateway:
        import uvicorn

        class Quiet(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:  # the trainer's Ctrl-C stays the trainer's
                yield

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        listeners: list[tuple[dict[str, Any], list[socket.socket] | None]] = [({}, [sock])]
        if self.uds is not None:
            listeners.append(({"uds": str(self.uds)}, None))
        for extra, sockets in listeners:
            config = uvicorn.Config(
                self.refusals, log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=30, **extra
            )
            server = Quiet(config)
            self._servers.append(server)
            self._tasks.append(asyncio.create_task(server.serve(sockets=sockets)))
        while not all(s.started for s in self._servers):
            for task in self._tasks:
                if task.done():
                    await self._stop()
                    task.result()
                    raise RuntimeError("the gateway's server stopped as it started")
            await asyncio.sleep(0.005)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._stop()

    async def _stop(self) -> None:
        for server in self._servers:
            server.should_exit = True
        for task in self._tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 15)
        self._servers, self._tasks = [], []
