"""Tools of MCP servers in a Toolbox: ``Toolbox.from_mcp(...)`` on the ``mcp`` SDK.

    box = tmpl.Toolbox.from_mcp(
        "python -m mcp_server_time --local-timezone UTC",      # stdio: a command line (str or list)
        "http://127.0.0.1:8000/mcp",                           # streamable HTTP: a URL
        tools=[Adapter("get_current_time", schema=get_time, arguments=lambda a: {"timezone": ZONES[a["city"]]})],
        timeout=10.0,
    )
    rollout = tmpl.Rollout(tpl, backend, tools=box)
    box.close()                                                 # the servers' sessions (and processes) end

Each server gets **one long-lived session** (a stdio server: one process), opened when the Toolbox is
built and shared by every call; ``list_tools`` gives the schemas the model sees. The sessions live on one
thread of their own with its event loop (``tmpl-mcp``): the SDK's sessions are bound to the loop and task
that opened them, and the Toolbox calls from its own loop or the caller's; a call crosses with
``run_coroutine_threadsafe``, and its cancellation (the Toolbox's timeout) crosses back.

What a call can become (all tool messages; the failure kinds are the Toolbox's, counted the same way):

- a result: text, structured content, images (content parts for a vision template), see
  :mod:`.mcp_results`; ``isError``: kind ``exception``, ``Error: <tool> failed: <the server's text>``;
- a protocol error (unknown tool, bad parameters): kind ``exception``, the server's message;
- the server exits or drops the connection during the call: kind ``crashed``, ``Error: <tool> crashed:
  the MCP server '<name>' closed the connection during the call; it was restarted``. A stdio server is
  started again at once (a new process; the old one is stopped as the SDK stops it), an HTTP one gets a new
  session;
- the call passes its timeout: the Toolbox's own ``timeout`` message; the call is cancelled, and the server
  is asked for its tool list (``probe_timeout``): a server that does not answer (its loop is stuck) is
  restarted as for a crash, one that answers (only that call hung) is kept;
- the server cannot be started or reached: kind ``crashed``, ``Error: <tool> could not run: ...``; a start
  is tried again at the next call, at most every ``retry_after`` seconds.

Calls of other servers, and other calls of the same server while it answers, go on meanwhile.

**Renaming and reshaping** (:class:`Adapter`): the model may have been trained on tools of another name
and argument shape (the test fixture calls ``get_time(city)``; ``mcp-server-time`` has
``get_current_time(timezone)``). An adapter shows a server's tool under the schema given (a callable's type
hints and docstring, as for any tool, or a schema dict) and maps the model's arguments to the server's with
a function. The mapping is plain Python because it is domain knowledge the server does not have (which
zone a city is in); the result is the server's, untouched.

>>> Server.of("python -m mcp_server_time --local-timezone UTC").label
'mcp_server_time'
>>> Server.of("http://127.0.0.1:8000/mcp").label
'127.0.0.1:8000/mcp'
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import keyword
import logging
import os
import shlex
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

from ..errors import MCPServerError, ToolboxError
from ..toolcalls.schema import tool_name, tool_schema
from .loopthread import start_loop_thread
from .mcp_results import reply_of
from .reply import ToolReply

log = logging.getLogger(__name__)
T = TypeVar("T")

#: options of ``Toolbox.from_mcp`` that are the servers' (the rest are the Toolbox's)
OPTIONS = ("connect_timeout", "probe_timeout", "retry_after", "structured")
#: the JSON-RPC code the SDK gives a request whose connection closed (the server exited or dropped it)
CONNECTION_CLOSED = -32000
#: bytes of a server's standard error kept (a file per server, emptied past this size)
STDERR_KEEP = 1 << 20


def sdk() -> Any:
    """The ``mcp`` package, imported lazily; a clear error names the extra to install when it is missing."""
    try:
        import mcp
    except ImportError as exc:
        raise ImportError(
            f"Toolbox.from_mcp needs the MCP SDK, which is not installed: pip install 'tmpl[mcp]' ({exc})"
        ) from exc
    return mcp


@dataclass(frozen=True)
class Server:
    """One MCP server: a ``command`` run over stdio, or a streamable HTTP ``url``.

    ``name`` labels it in messages and in :attr:`Adapter.server` (default: the command's module or
    script, or the URL without its scheme). ``env`` is added to the SDK's safe default environment;
    ``cwd`` is the command's working directory; ``headers`` go with every HTTP request.
    """

    command: tuple[str, ...] | None = None
    url: str | None = None
    name: str | None = None
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    headers: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ToolboxError("an MCP Server takes a command (stdio) or a url (streamable HTTP), one of the two")
        if self.command is not None and not (self.command and all(isinstance(a, str) for a in self.command)):
            raise ToolboxError(f"an MCP server's command must be a non-empty list of strings, not {self.command!r}")

    @classmethod
    def of(cls, spec: Any) -> Server:
        """A Server from what ``from_mcp`` takes: a Server, a URL (``http(s)://...``), a command line (a
        string, split as a shell would, or a list), or the SDK's ``StdioServerParameters``."""
        if isinstance(spec, Server):
            return spec
        if isinstance(spec, str):
            if spec.startswith(("http://", "https://")):
                return cls(url=spec)
            return cls(command=tuple(shlex.split(spec)))
        if isinstance(spec, (list, tuple)):
            return cls(command=tuple(spec))
        command = getattr(spec, "command", None)
        if isinstance(command, str):  # the SDK's StdioServerParameters
            cwd = getattr(spec, "cwd", None)
            return cls(command=(command, *spec.args), env=spec.env, cwd=None if cwd is None else str(cwd))
        raise ToolboxError(f"an MCP server is a URL, a command line or a tmpl.tools.mcp.Server, not {spec!r}")

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        if self.url is not None:
            return self.url.split("://", 1)[-1]
        assert self.command is not None
        args = list(self.command)
        if os.path.basename(args[0]).startswith("python"):
            if "-m" in args[:-1]:
                return args[args.index("-m") + 1]
            rest = [a for a in args[1:] if not a.startswith("-")]
            if rest:
                return os.path.basename(rest[0])
        return os.path.basename(args[0])


@dataclass(frozen=True)
class Adapter:
    """A server's ``tool`` shown to the model under another name and argument shape.

    ``schema``: what the model sees, a callable (schema from its type hints and docstring; it is never
    called) or a schema dict; default: the server's schema under ``name``. ``name``: the name the model
    calls (default: the schema's, else ``tool``). ``arguments``: the model's arguments to the server's
    (default: as they are). ``server``: which server's tool, when several have one of that name.

    >>> def get_time(city: str) -> str:
    ...     '''Current local time in a city.
    ...
    ...     Args:
    ...         city: City name
    ...     '''
    >>> a = Adapter("get_current_time", schema=get_time, arguments=lambda args: {"timezone": "UTC"})
    >>> a.shown
    'get_time'
    """

    tool: str
    schema: Any = None
    name: str | None = None
    arguments: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    server: str | None = None

    @property
    def shown(self) -> str:
        if self.schema is not None:
            return tool_name(tool_schema(self.schema))
        return self.name or self.tool


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
    owner: MCPToolset
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


def split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``from_mcp``'s options as (the toolset's, the Toolbox's); MCP tools run in their servers'
    processes, so the Toolbox runs them on its event loop (``isolation="thread"``)."""
    ours = {k: v for k, v in options.items() if k in OPTIONS}
    theirs = {k: v for k, v in options.items() if k not in OPTIONS}
    if theirs.get("isolation", "thread") != "thread":
        raise ToolboxError(
            "Toolbox.from_mcp runs its tools in the MCP servers' own processes: isolation must be 'thread' "
            f"(a server is restarted when it crashes or hangs), not {theirs['isolation']!r}"
        )
    for name in ("worker_tools", "workers", "memory_mb", "cpu_seconds"):
        if theirs.get(name) is not None and name in theirs:
            raise ToolboxError(
                f"Toolbox.from_mcp: {name} is an option of isolation='process', which MCP tools do not use"
            )
    return ours, theirs


def _signature(params: Any) -> inspect.Signature | None:
    """Keyword-only parameters for a JSON schema's properties (required ones without a default), so the
    Toolbox answers a call with missing or unknown arguments as ``bad_arguments`` before the server sees it;
    None when the schema allows more (``additionalProperties``) or a name is not a Python identifier."""
    if not isinstance(params, Mapping):
        return None
    props = params.get("properties") or {}
    if not isinstance(props, Mapping) or params.get("additionalProperties") not in (None, False):
        return None
    required = set(params.get("required") or ())
    if any(not (isinstance(n, str) and n.isidentifier() and not keyword.iskeyword(n)) for n in props):
        return None
    kind = inspect.Parameter.KEYWORD_ONLY
    return inspect.Signature(
        [inspect.Parameter(n, kind, **({} if n in required else {"default": None})) for n in props]
    )


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
