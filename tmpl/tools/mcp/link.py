"""One server's long-lived session on the MCP loop thread (:class:`_Link`): opened, called, probed when a call
times out, restarted when the server crashes or hangs, with the server's stderr kept for the error."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import IO, Any, Protocol, TypeVar

from ...errors import MCPServerError
from ..mcp_results import reply_of
from ..reply import ToolReply
from .servers import Server, sdk


class LinkOwner(Protocol):
    """What a link reads of the :class:`~tmpl.tools.mcp.toolset.MCPToolset` that owns it (which imports this
    module): its timeouts and how results are shown."""

    connect_timeout: float
    probe_timeout: float
    retry_after: float
    structured: Any


log = logging.getLogger(__name__)


T = TypeVar("T")


#: the JSON-RPC code the SDK gives a request whose connection closed (the server exited or dropped it)
CONNECTION_CLOSED = -32000


#: bytes of a server's standard error kept (a file per server, emptied past this size)
STDERR_KEEP = 1 << 20


@dataclass
class _Session:
    """One connection to a server: its holder task, the client once connected, the event that ends it."""

    ready: asyncio.Future[Any]
    stop: asyncio.Event
    task: asyncio.Task[None] | None = None
    dead: bool = False
    probing: bool = False
    timed_out: bool = False


@dataclass
class _Link:
    """One server's session, kept on the toolset's loop: opened, checked, restarted, closed."""

    server: Server
    owner: LinkOwner
    current: _Session | None = None
    starts: int = 0  #: sessions opened (the first, then one per restart)
    failed: tuple[float, str] | None = None  #: when the last start failed, and why
    errlog: IO[str] | None = None
    retiring: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def name(self) -> str:
        return self.server.label

    # -- sessions ---------------------------------------------------------------------------
    async def client(self) -> tuple[_Session, Any]:
        """The live session and its client, opened (again) if there is none; raises MCPServerError."""
        s = self.current
        if s is None or s.dead:
            if self.failed is not None and time.monotonic() - self.failed[0] < self.owner.retry_after:
                raise MCPServerError(self.name, self.failed[1])
            s = self.start()
        try:
            return s, await asyncio.shield(s.ready)
        except MCPServerError as exc:
            self.failed = (time.monotonic(), exc.reason)
            raise

    def start(self) -> _Session:
        loop = asyncio.get_running_loop()
        s = _Session(loop.create_future(), asyncio.Event())
        s.task = loop.create_task(self._hold(s), name=f"tmpl-mcp {self.name}")
        self.current, self.failed = s, None
        self.starts += 1
        return s

    async def _hold(self, s: _Session) -> None:
        """Open the session, hand out its client, hold it open until ``s.stop``; close it in this same task
        (the SDK's sessions must end in the task that opened them)."""
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.owner.connect_timeout, self._too_slow, s)
        try:
            async with contextlib.AsyncExitStack() as stack:
                client = await stack.enter_async_context(self._client(stack))
                timer.cancel()
                s.ready.set_result(client)
                await s.stop.wait()
        except BaseException as exc:  # noqa: BLE001 - a server's failure (an exception group too) is its calls' message
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            if not s.ready.done():
                failed = "could not be reached" if self.server.url is not None else "did not start"
                why = f"{failed} within {self.owner.connect_timeout:g} s" if s.timed_out else f"{failed}: {_said(exc)}"
                tail = self.stderr_tail()
                s.ready.set_exception(MCPServerError(self.name, why + (f" (its stderr ends: {tail})" if tail else "")))
                s.ready.exception()  # retrieved: nobody may be waiting
            elif not s.stop.is_set():
                log.warning("MCP server %r: its session ended: %s", self.name, _said(exc))
        finally:
            timer.cancel()
            s.dead = True

    def _too_slow(self, s: _Session) -> None:
        if not s.ready.done() and s.task is not None:
            s.timed_out = True
            s.task.cancel()

    def _client(self, stack: contextlib.AsyncExitStack) -> Any:
        mcp = sdk()
        from mcp.types import Implementation

        spec = self.server
        if spec.url is not None:
            from mcp.client.streamable_http import streamable_http_client

            http = None
            if spec.headers:
                from mcp.shared._httpx_utils import create_mcp_http_client

                http = create_mcp_http_client(headers=dict(spec.headers))
                stack.push_async_callback(http.aclose)
            transport = streamable_http_client(spec.url, http_client=http)
        else:
            assert spec.command is not None
            params = mcp.StdioServerParameters(
                command=spec.command[0], args=list(spec.command[1:]), env=dict(spec.env or {}) or None, cwd=spec.cwd
            )
            transport = mcp.stdio_client(params, errlog=self._errlog())
        return mcp.Client(transport, cache=None, client_info=Implementation(name="tmpl", version="1"))

    def _errlog(self) -> IO[str]:
        """The file the server's standard error goes to (appended, so it can be emptied while written)."""
        if self.errlog is None:
            self.errlog = tempfile.TemporaryFile("a+", encoding="utf-8", errors="replace")  # noqa: SIM115 - closed in close()
        elif os.fstat(self.errlog.fileno()).st_size > STDERR_KEEP:
            self.errlog.truncate(0)
        return self.errlog

    def stderr_tail(self, lines: int = 3) -> str:
        """The last lines the server wrote to its standard error (stdio servers; '' when none)."""
        f = self.errlog
        if f is None:
            return ""
        with contextlib.suppress(OSError, ValueError):
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - 4096))
            text = [line.strip() for line in f.read().splitlines() if line.strip()]
            return " | ".join(text[-lines:])[-400:]
        return ""

    def restart(self, s: _Session, why: str) -> None:
        """End session ``s`` (in the background) and open a new one now, unless that was done already."""
        if s is not self.current:
            return
        tail = self.stderr_tail()
        log.warning("MCP server %r restarted: %s%s", self.name, why, f" (its stderr ends: {tail})" if tail else "")
        self.retire(s)
        self.start()

    def retire(self, s: _Session) -> None:
        s.dead = True
        s.stop.set()
        if s.task is not None and not s.task.done():
            self.retiring.add(s.task)
            s.task.add_done_callback(self.retiring.discard)

    async def close(self, wait: float) -> None:
        s, self.current = self.current, None
        if s is not None:
            self.retire(s)
        tasks = set(self.retiring)
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=wait)
            for t in late:
                t.cancel()
            if late:
                await asyncio.wait(late, timeout=wait)
        if self.errlog is not None:
            self.errlog.close()
            self.errlog = None

    # -- calls ------------------------------------------------------------------------------
    async def call(self, tool: str, arguments: dict[str, Any], shown: str) -> ToolReply:
        """Call the server's ``tool``; every outcome is a :class:`ToolReply` (a cancel is re-raised)."""
        try:
            s, client = await self.client()
        except MCPServerError as exc:
            return ToolReply(
                f"Error: {shown} could not run: the MCP server {self.name!r} {exc.reason}", failure="crashed"
            )
        try:
            result = await client.call_tool(tool, arguments)
        except asyncio.CancelledError:
            self.probe_later(s)  # the call's timeout: is the server still answering?
            raise
        except Exception as exc:  # noqa: BLE001 - every failure of a call is its message
            if s.dead or getattr(_leaf(exc), "code", None) == CONNECTION_CLOSED or _transport_failed(exc):
                again = "it was restarted" if self.server.command is not None else "a new session was opened"
                self.restart(s, f"the connection closed during a call of {tool} ({_said(exc)})")
                return ToolReply(
                    f"Error: {shown} crashed: the MCP server {self.name!r} closed the connection during the call; {again}",
                    failure="crashed",
                )
            return ToolReply(f"Error: {shown} failed: {_said(exc)}", failure="exception")
        return reply_of(result, shown, structured=self.owner.structured)

    def probe_later(self, s: _Session) -> None:
        if not (s.probing or s.dead):
            s.probing = True
            asyncio.get_running_loop().create_task(self._probe(s))

    async def _probe(self, s: _Session) -> None:
        try:
            client = s.ready.result()
            await asyncio.wait_for(client.list_tools(cache_mode="refresh"), self.owner.probe_timeout)
        except asyncio.TimeoutError:
            self.restart(s, f"a call timed out and it did not answer tools/list within {self.owner.probe_timeout:g} s")
        except Exception as exc:  # noqa: BLE001 - any failure to answer: a new session
            self.restart(s, f"a call timed out and tools/list then failed ({_said(exc)})")
        finally:
            s.probing = False


def _leaf(exc: BaseException) -> BaseException:
    """An exception group's first leaf (anyio's task groups wrap what failed in them); else ``exc``."""
    while isinstance(getattr(exc, "exceptions", None), tuple) and exc.exceptions:  # type: ignore[attr-defined]
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    return exc


def _said(exc: BaseException) -> str:
    """An exception in a few words (an exception group by its first leaf)."""
    exc = _leaf(exc)
    text = str(exc)
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


def _transport_failed(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection itself failed (not the server's answer to the call)."""
    exc = _leaf(exc)
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(
        names
        & {
            "ConnectError",
            "RemoteProtocolError",
            "ReadError",
            "WriteError",
            "ClosedResourceError",
            "BrokenResourceError",
        }
    ) or isinstance(exc, (ConnectionError, EOFError))


async def _awaited(work: Awaitable[T]) -> T:
    return await work
