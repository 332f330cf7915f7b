"""Pooled asyncio HTTP JSON client (httpx) for talking to inference servers.

One keep-alive connection pool per server and event loop, with a connection limit per server,
a connect timeout and a whole-request timeout; proxies and TLS settings come from httpx (and the
usual environment variables). Cancelling a request's task closes its connection, which is how
vLLM's servers learn that a client gave up (they abort the request).

>>> client = HTTPClient(timeout=60, max_connections=64)
>>> status, body = await client.post_json("http://127.0.0.1:8000/v1/completions", {...})  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

from ..errors import BackendError, HTTPConnectionError

__all__ = ["HTTPClient", "HTTPConnectionError"]  # the error lives in tmpl.errors; this path still works


def _httpx() -> Any:
    try:
        import httpx
    except ImportError as exc:  # pragma: no cover - a core dependency of tmpl since issue 22
        raise BackendError(
            "tmpl's HTTP backends (VLLMServer, SGLang) need httpx, a dependency of tmpl that is missing from this "
            "environment: pip install 'httpx>=0.27' (or reinstall tmpl)"
        ) from exc
    return httpx


class HTTPClient:
    """POST JSON to servers over pooled keep-alive connections (one pool per server and event loop).

    ``max_connections``: open connections per server (requests beyond it wait for one);
    ``timeout``: seconds for a whole request; ``connect_timeout``: seconds to open a connection.
    """

    def __init__(
        self,
        *,
        timeout: float,
        max_connections: int = 256,
        connect_timeout: float = 10.0,
        headers: dict[str, str] | None = None,
        verify: Any = True,
    ) -> None:
        self.timeout = timeout
        self.max_connections = max_connections
        self.connect_timeout = connect_timeout
        self.headers = dict(headers or {})
        self.verify = verify
        self._pools: dict[tuple[int, str], Any] = {}

    def _pool(self, url: str) -> Any:
        parts = urlsplit(url)
        key = (id(asyncio.get_running_loop()), f"{parts.scheme}://{parts.netloc}")
        pool = self._pools.get(key)
        if pool is None:
            httpx = _httpx()
            live = id(asyncio.get_running_loop())
            self._pools = {k: v for k, v in self._pools.items() if k[0] == live}  # pools of finished loops
            pool = httpx.AsyncClient(
                limits=httpx.Limits(
                    max_connections=self.max_connections, max_keepalive_connections=self.max_connections
                ),
                timeout=httpx.Timeout(self.timeout, connect=min(self.connect_timeout, self.timeout)),
                headers={"Accept": "application/json", **self.headers},
                verify=self.verify,
            )
            self._pools[key] = pool
        return pool

    async def post_json(
        self, url: str, payload: Any, *, timeout: float | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """POST ``payload`` as JSON (with extra ``headers``); return ``(status, parsed JSON or text)``.

        Raises :class:`HTTPConnectionError` for refused, reset or truncated connections, and
        ``asyncio.TimeoutError`` when the request takes longer than the timeout.
        """
        httpx = _httpx()
        extra = (
            {} if timeout is None else {"timeout": httpx.Timeout(timeout, connect=min(self.connect_timeout, timeout))}
        )
        try:
            response = await self._pool(url).post(url, json=payload, headers=headers, **extra)
        except httpx.TimeoutException as exc:
            raise asyncio.TimeoutError(f"{url}: {type(exc).__name__}") from exc
        except httpx.ConnectError as exc:
            raise HTTPConnectionError(url, f"cannot connect: {exc}") from exc
        except httpx.TransportError as exc:
            raise HTTPConnectionError(url, f"connection lost: {type(exc).__name__}: {exc}") from exc
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, response.text

    async def post_events(self, url: str, payload: Any, *, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """POST ``payload`` to a streaming (server-sent events) endpoint and read the stream to its end.

        Returns ``(200, [event, ...])``: each ``data:`` line parsed as JSON, up to ``data: [DONE]``; or, for
        another status, ``(status, parsed JSON or text)`` as :meth:`post_json`. Raises as :meth:`post_json`
        does (a stream cut before ``[DONE]`` is a lost connection).
        """
        events: list[Any] = []
        async with contextlib.aclosing(self.iter_events(url, payload, headers=headers)) as stream:
            async for status, event in stream:
                if status != 200:
                    return status, event
                events.append(event)
        return 200, events

    async def iter_events(
        self, url: str, payload: Any, *, headers: dict[str, str] | None = None
    ) -> AsyncIterator[tuple[int, Any]]:
        """POST ``payload`` to a streaming (server-sent events) endpoint and yield its events as they come.

        Yields ``(200, event)`` for each ``data:`` line parsed as JSON, up to ``data: [DONE]``; for another
        status, one ``(status, parsed JSON or text)``. Raises as :meth:`post_json` does (a stream cut
        before ``[DONE]`` is a lost connection). Closing the iterator early closes the connection.

        >>> async for status, event in client.iter_events(url, {"stream": True}):  # doctest: +SKIP
        ...     print(event["choices"][0]["token_ids"])
        """
        httpx = _httpx()
        count = 0
        try:
            async with self._pool(url).stream("POST", url, json=payload, headers=headers) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode("utf-8", "replace")
                    try:
                        yield response.status_code, json.loads(text)
                    except ValueError:
                        yield response.status_code, text
                    return
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:") :].strip()
                    if data == "[DONE]":
                        return
                    count += 1
                    try:
                        event = json.loads(data)
                    except ValueError:
                        event = {"error": {"message": f"an event that is not JSON: {data[:120]}"}}
                    yield 200, event
        except httpx.TimeoutException as exc:
            raise asyncio.TimeoutError(f"{url}: {type(exc).__name__}") from exc
        except httpx.ConnectError as exc:
            raise HTTPConnectionError(url, f"cannot connect: {exc}") from exc
        except httpx.TransportError as exc:
            raise HTTPConnectionError(url, f"connection lost: {type(exc).__name__}: {exc}") from exc
        raise HTTPConnectionError(url, f"the event stream ended without [DONE] after {count} event(s)")

    async def get_text(self, url: str, *, timeout: float | None = None) -> tuple[int, str]:
        """GET ``url``; return ``(status, body text)``. Raises as :meth:`post_json` does."""
        httpx = _httpx()
        extra = (
            {} if timeout is None else {"timeout": httpx.Timeout(timeout, connect=min(self.connect_timeout, timeout))}
        )
        try:
            response = await self._pool(url).get(url, **extra)
        except httpx.TimeoutException as exc:
            raise asyncio.TimeoutError(f"{url}: {type(exc).__name__}") from exc
        except httpx.ConnectError as exc:
            raise HTTPConnectionError(url, f"cannot connect: {exc}") from exc
        except httpx.TransportError as exc:
            raise HTTPConnectionError(url, f"connection lost: {type(exc).__name__}: {exc}") from exc
        return response.status_code, response.text

    async def aclose(self) -> None:
        """Close the pools of the running event loop."""
        live = id(asyncio.get_running_loop())
        for key in [k for k in self._pools if k[0] == live]:
            await self._pools.pop(key).aclose()
