"""A minimal asyncio HTTP/1.1 JSON client (stdlib only) for talking to inference servers.

One connection per request (``Connection: close``): cancelling the task closes the socket,
which is how vLLM's servers learn that a client gave up (they abort the request).

>>> status, body = await post_json("http://127.0.0.1:8000/v1/completions", {...}, timeout=60)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any
from urllib.parse import urlsplit


class HTTPConnectionError(ConnectionError):
    """The server could not be reached, or dropped the connection before a full response."""


async def post_json(url: str, payload: Any, *, timeout: float, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """POST ``payload`` as JSON; return ``(status, parsed JSON or text)``.

    Raises :class:`HTTPConnectionError` for refused, reset or truncated connections, and
    ``asyncio.TimeoutError`` when the whole exchange takes longer than ``timeout``.
    """
    return await asyncio.wait_for(_post(url, payload, headers or {}), timeout)


async def _post(url: str, payload: Any, headers: dict[str, str]) -> tuple[int, Any]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"unsupported URL scheme in {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    body = json.dumps(payload).encode("utf-8")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    head = [
        f"POST {path} HTTP/1.1",
        f"Host: {parts.hostname}:{port}",
        "Content-Type: application/json",
        "Accept: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ] + [f"{k}: {v}" for k, v in headers.items()]
    try:
        reader, writer = await asyncio.open_connection(
            parts.hostname, port, ssl=ssl.create_default_context() if parts.scheme == "https" else None
        )
    except OSError as exc:
        raise HTTPConnectionError(f"cannot connect to {parts.hostname}:{port}: {exc}") from exc
    try:
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()
        status_line = await reader.readline()
        if not status_line:
            raise HTTPConnectionError(f"{url}: connection closed before a response")
        try:
            status = int(status_line.split()[1])
        except (IndexError, ValueError) as exc:
            raise HTTPConnectionError(f"{url}: malformed status line {status_line[:80]!r}") from exc
        fields: dict[str, str] = {}
        while True:
            line = await reader.readline()
            if not line:
                raise HTTPConnectionError(f"{url}: connection closed in the response headers")
            if line in (b"\r\n", b"\n"):
                break
            key, _, value = line.decode("latin-1").partition(":")
            fields[key.strip().lower()] = value.strip()
        data = await _read_body(reader, fields, url)
    except (ConnectionError, asyncio.IncompleteReadError) as exc:
        if isinstance(exc, HTTPConnectionError):
            raise
        raise HTTPConnectionError(f"{url}: connection dropped: {exc}") from exc
    finally:
        writer.close()
    text = data.decode("utf-8", errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


async def _read_body(reader: asyncio.StreamReader, fields: dict[str, str], url: str) -> bytes:
    if fields.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise HTTPConnectionError(f"{url}: connection dropped in a chunked body")
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return b"".join(chunks)
            chunks.append(await reader.readexactly(size))
            await reader.readline()
    if "content-length" in fields:
        return await reader.readexactly(int(fields["content-length"]))
    return await reader.read()
