"""The Toolbox's side (:class:`MCPToolset`): every server's tools listed as tmpl tools, each call carried to its
server's link on the MCP loop thread and its answer made a tool reply."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ...errors import MCPServerError, ToolboxError
from ...toolcalls.schema import tool_name, tool_schema
from ..loopthread import start_loop_thread
from ..reply import ToolReply
from .link import T, _awaited, _Link, _said
from .servers import Adapter, Server, _signature, sdk


class MCPToolset:
    """The sessions of some MCP servers, on one thread and event loop of their own, and their tools.

    Built by ``Toolbox.from_mcp`` (which closes it with the Toolbox); :attr:`starts` counts each server's
    sessions (1 + its restarts). A call after :meth:`close` opens the sessions again.
    """

    def __init__(
        self,
        servers: Sequence[Any],
        *,
        connect_timeout: float = 30.0,
        probe_timeout: float = 5.0,
        retry_after: float = 1.0,
        structured: bool = False,
    ) -> None:
        for what, value in (
            ("connect_timeout", connect_timeout),
            ("probe_timeout", probe_timeout),
            ("retry_after", retry_after),
        ):
            if not (isinstance(value, (int, float)) and value >= 0):
                raise ToolboxError(f"{what} must be a number of seconds, not {value!r}")
        if not servers:
            raise ToolboxError("Toolbox.from_mcp needs at least one MCP server (a command line or a URL)")
        sdk()
        self.connect_timeout, self.probe_timeout = float(connect_timeout), float(probe_timeout)
        self.retry_after, self.structured = float(retry_after), structured
        specs = [Server.of(s) for s in servers]
        labels = [s.label for s in specs]
        self.links: dict[str, _Link] = {}
        for spec, label in zip(specs, labels):
            if labels.count(label) > 1:
                spec = Server(
                    spec.command, spec.url, f"{label}#{len(self.links) + 1}", spec.env, spec.cwd, spec.headers
                )
            self.links[spec.label] = _Link(spec, self)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self.listed: dict[str, list[Any]] = {}
        try:
            self.listed = self.run(self._list_all())
        except BaseException:
            self.close()
            raise

    @property
    def starts(self) -> dict[str, int]:
        """Sessions opened per server (1 + restarts)."""
        return {name: link.starts for name, link in self.links.items()}

    def stderr_tail(self, server: str, lines: int = 3) -> str:
        """The last lines a stdio server wrote to its standard error."""
        return self.links[server].stderr_tail(lines)

    # -- the loop ---------------------------------------------------------------------------
    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                self._loop = start_loop_thread("tmpl-mcp")
            return self._loop

    def run(self, work: Awaitable[T], timeout: float | None = None) -> T:
        """Run ``work`` on the toolset's loop and wait for it (from any thread but that loop's)."""
        return asyncio.run_coroutine_threadsafe(_awaited(work), self._ensure_loop()).result(timeout)

    async def call(self, server: str, tool: str, arguments: dict[str, Any], shown: str) -> ToolReply:
        """Call ``tool`` of ``server`` from any event loop; cancelling this cancels the call."""
        future = asyncio.run_coroutine_threadsafe(self.links[server].call(tool, arguments, shown), self._ensure_loop())
        return await asyncio.wrap_future(future)

    def close(self, wait: float = 10.0) -> None:
        """End every session (a stdio server's process with it) and the loop's thread."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None or loop.is_closed():
            return

        async def end() -> None:
            await asyncio.gather(*(link.close(wait) for link in self.links.values()))

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(end(), loop).result(3 * wait)
        loop.call_soon_threadsafe(loop.stop)

    # -- tools ------------------------------------------------------------------------------
    async def _list_all(self) -> dict[str, list[Any]]:
        async def listing(link: _Link) -> list[Any]:
            try:
                _, client = await link.client()
                tools: list[Any] = []
                cursor = None
                while True:
                    page = await client.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        return tools
            except MCPServerError:
                raise
            except Exception as exc:  # noqa: BLE001 - named for the caller
                raise MCPServerError(link.name, f"did not list its tools: {_said(exc)}") from exc

        names = list(self.links)
        found = await asyncio.gather(*(listing(self.links[n]) for n in names), return_exceptions=True)
        for got in found:
            if isinstance(got, BaseException):
                raise got
        return dict(zip(names, found))  # type: ignore[arg-type]

    def tools(self, select: Sequence[Any] | None = None) -> list[Any]:
        """Tools for a Toolbox, ``(callable, schema)`` pairs: every listed tool (``select`` None), or those
        in ``select``, in its order: a server tool's name, an :class:`Adapter`, or a tool of this process
        (a function or a ``(function, schema)`` pair, passed on as it is)."""
        where: dict[str, list[tuple[str, Any]]] = {}
        for server, tools in self.listed.items():
            for t in tools:
                where.setdefault(t.name, []).append((server, t))
        items = [t.name for ts in self.listed.values() for t in ts] if select is None else list(select)
        out: list[Any] = []
        for item in items:
            if callable(item) or (isinstance(item, tuple) and len(item) == 2 and callable(item[0])):
                out.append(item)  # a tool of this process beside the servers' (a function, or (function, schema))
                continue
            adapter = item if isinstance(item, Adapter) else Adapter(item) if isinstance(item, str) else None
            if adapter is None:
                raise ToolboxError(
                    f"Toolbox.from_mcp(tools=...) takes tool names, Adapters and functions, not {item!r}"
                )
            found = [(s, t) for s, t in where.get(adapter.tool, []) if adapter.server in (None, s)]
            if not found:
                servers = ", ".join(self.links)
                raise MCPServerError(adapter.server or servers, f"lists no tool {adapter.tool!r}", tool=adapter.tool)
            if len(found) > 1:
                raise MCPServerError(
                    " and ".join(s for s, _ in found),
                    f"both list a tool {adapter.tool!r}: pick one with Adapter({adapter.tool!r}, server=...)",
                    tool=adapter.tool,
                )
            server, listed = found[0]
            out.append(self._tool(server, listed, adapter))
        return out

    def _tool(self, server: str, listed: Any, adapter: Adapter) -> tuple[Callable[..., Any], dict[str, Any]]:
        if adapter.schema is not None:
            schema = tool_schema(adapter.schema)
            if adapter.name is not None and adapter.name != tool_name(schema):
                raise ToolboxError(f"Adapter({adapter.tool!r}): name {adapter.name!r} is not its schema's name")
        else:
            fn: dict[str, Any] = {"name": adapter.name or listed.name, "description": listed.description or ""}
            fn["parameters"] = dict(listed.input_schema or {"type": "object", "properties": {}})
            schema = {"type": "function", "function": fn}
        shown, remote, reshape, toolset = tool_name(schema), listed.name, adapter.arguments, self

        async def call(**arguments: Any) -> ToolReply:
            args = reshape(dict(arguments)) if reshape is not None else arguments
            return await toolset.call(server, remote, args, shown)

        call.__name__ = call.__qualname__ = shown
        call.__doc__ = schema["function"].get("description")
        signature = _signature(schema["function"].get("parameters"))
        if signature is not None:
            call.__signature__ = signature  # type: ignore[attr-defined]
        return call, schema
