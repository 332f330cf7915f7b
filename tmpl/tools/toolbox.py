"""``Toolbox``: run a batch of tool calls concurrently, safely, and turn results into tool messages.

    tools = tmpl.Toolbox([get_weather, async_search], timeout=10.0, max_concurrency=64)
    tpl.prompt_ids(messages, tools=tools.schemas)
    parsed = [parse_completion(tpl, ids, tools=tools) for ids in completions]
    result = tools.run_batch(parsed)          # or: await tools.run_batch_async(parsed)
    result.messages[b]                        # tool messages of sample b, in call order
    result.stop[b]                            # with on_error="stop": a call of sample b failed
    result.metrics.as_dict()                  # calls, failures by kind, timeouts, latency

All calls of a batch run at once on an event loop (at most ``max_concurrency`` at a time),
async tools as tasks and sync tools on reused daemon worker threads (:mod:`.workers`: one
worker drains a batch of fast calls; more start while every worker is stuck in a call), every
call under its timeout. Nothing is dropped: a malformed call, an unknown tool, arguments that do not fit, an
exception or a timeout each give a tool message that says so plainly (``on_error="message"``,
the default); with ``on_error="stop"`` the sample is also flagged to stop.

A sync tool that hangs cannot be killed from Python: at its timeout the call is answered with
a timeout message and the batch goes on; the thread keeps running until the function returns
(it is a daemon thread, so it does not keep the process alive). :attr:`Toolbox.hung_threads`
counts such threads; once ``max_hung`` calls of one tool hang, its further calls are refused
with a message instead of starting more threads. An async tool is cancelled at its timeout.

``isolation="process"`` runs every call in a fixed pool of worker processes instead
(:mod:`.procpool`): killed at its timeout, limited in memory and CPU time, a crash answered as a
message, every process the call started killed with its worker; ``isolation="sandbox"`` runs the
same workers in bubblewrap sandboxes (:mod:`.sandbox`: no network, a read-only view of the system,
a private size-limited scratch, a bounded number of processes); see docs/tools.md for what each
mode guarantees and costs.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import json
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ToolboxError
from ..toolcalls.arguments import coerce_arguments, read_arguments
from ..toolcalls.schema import tool_name, tool_schema
from ..toolcalls.types import CallProblem, ParsedCompletion, ToolCall, new_call_id
from .loopthread import start_loop_thread
from .metrics import CallOutcome, ToolMetrics
from .outputs import cut_chars
from .procpool import Answer, ProcessPool, pack_tools
from .procworker import content_of
from .reply import ToolReply
from .sandbox import Sandbox
from .workers import WorkerPool

ON_ERROR = ("message", "stop")
#: the tool call an async tool was started for, readable inside it (a sub-agent names its run by it)
CURRENT_CALL: contextvars.ContextVar[ToolCall] = contextvars.ContextVar("tmpl_current_tool_call")
ISOLATION = ("thread", "process", "sandbox")


@dataclass(frozen=True)
class _Tool:
    name: str
    fn: Any
    schema: dict[str, Any]
    is_async: bool
    signature: inspect.Signature | None
    timeout: float
    #: (names keyword arguments may take, names that must be given) when the signature is that
    #: simple (no positional-only, *args or **kwargs): arguments are checked without ``bind``
    keywords: tuple[frozenset[str], frozenset[str]] | None = None

    def check(self, args: Mapping[str, Any]) -> None:
        """Raise TypeError when ``args`` do not fit the signature (as ``signature.bind`` would)."""
        if self.keywords is not None:
            allowed, required = self.keywords
            names = args.keys()
            if names <= allowed and required <= names:
                return
        if self.signature is not None:
            self.signature.bind(**args)


@dataclass(frozen=True)
class BatchResult:
    """Outcome of :meth:`Toolbox.run_batch`.

    ``messages[b]``: sample b's tool messages, one per call in the order the model wrote them
    (failed calls included: their content states the error). ``stop[b]``: with
    ``on_error="stop"``, True when a call of sample b failed (its messages are still there, for
    logging); always False with ``on_error="message"``. ``outcomes[b]``: the per-call records
    (error kind, latency, the tool's return value). ``metrics``: the batch's counts and latencies.
    """

    messages: list[list[dict[str, Any]]]
    stop: list[bool]
    outcomes: list[list[CallOutcome]]
    metrics: ToolMetrics

    def __len__(self) -> int:
        return len(self.messages)


def _short(text: str, n: int = 300) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


class Toolbox:
    """A set of tools (sync or async callables) with their JSON schemas, and a safe batch runner.

    ``tools``: callables (schema from type hints and docstring, as transformers'
    ``get_json_schema`` builds it) or ``(callable, schema)`` pairs. ``timeout``: seconds per call
    (``timeouts`` overrides it per tool name). ``max_concurrency``: calls running at once.
    ``on_error``: ``"message"`` (errors become tool messages) or ``"stop"`` (also flag the sample).
    ``max_output_chars``: a result longer than this is cut to it, with a marker the model sees
    (None: never; the rollout also cuts each result to its sample's remaining token budget).

    ``isolation``: ``"thread"`` (the default: sync tools on reused threads of this process, a
    few microseconds a call; for tools you trust) or ``"process"`` (a pool of ``workers``
    processes, default ``max(2, cpu_count)``; ~0.1-0.3 ms a call; each call killed at its
    timeout, ``memory_mb`` of address space per worker, ``cpu_seconds`` of CPU per call (default
    its timeout), a crash or an exit answered as a message: for code the model chose). With
    processes the tools reach the workers pickled, so each must be a module-level function (or
    picklable object) of an importable module; otherwise pass ``worker_tools``, a module-level
    function returning the tools, called once in each worker (``tools`` then only give the
    schemas). What cannot be sent raises :class:`~tmpl.errors.ToolIsolationError` naming the
    tool. ``max_hung`` (threads only): calls of one tool that may hang past their timeout before
    its next calls are refused with a message. ``isolation="sandbox"``: the same worker processes,
    each in a bubblewrap sandbox configured by ``sandbox`` (a :class:`~tmpl.tools.sandbox.Sandbox`;
    default ``Sandbox()``): no network, the system read-only, a private ``/scratch`` tmpfs of its
    own removed with it, a bounded number of processes (docs/environments.md).

    >>> def add(a: int, b: int) -> int:
    ...     '''Add two numbers.
    ...
    ...     Args:
    ...         a: First number.
    ...         b: Second number.
    ...     '''
    ...     return a + b
    >>> box = Toolbox([add], timeout=5)
    >>> result = box.run_batch([[{"name": "add", "arguments": {"a": 2, "b": "3"}}], []])
    >>> result.messages[0][0]["content"], result.messages[1], result.metrics.calls
    ('5', [], 1)
    >>> box.run_batch([[{"name": "mul", "arguments": {}}]]).messages[0][0]["content"]
    "Error: unknown tool 'mul'; available: add"
    """

    _mcp: Any = None  #: the MCP servers' sessions of a Toolbox made by :meth:`from_mcp`

    def __init__(
        self,
        tools: Sequence[Any],
        *,
        timeout: float = 10.0,
        max_concurrency: int = 64,
        on_error: str = "message",
        timeouts: Mapping[str, float] | None = None,
        isolation: str = "thread",
        workers: int | None = None,
        worker_tools: Callable[[], Sequence[Any]] | None = None,
        memory_mb: int | None = 1024,
        cpu_seconds: float | None = None,
        max_hung: int = 8,
        max_output_chars: int | None = 1_000_000,
        sandbox: Sandbox | None = None,
    ) -> None:
        if isolation not in ISOLATION:
            raise ToolboxError(f"isolation must be one of {ISOLATION}, not {isolation!r}")
        if sandbox is not None and isolation != "sandbox":
            raise ToolboxError(f"sandbox= is for isolation='sandbox', not {isolation!r}")
        for what, value in (("workers", workers), ("memory_mb", memory_mb), ("max_output_chars", max_output_chars)):
            if value is not None and not (isinstance(value, int) and value >= 1):
                raise ToolboxError(f"{what} must be a positive integer or None, not {value!r}")
        if not (isinstance(max_hung, int) and max_hung >= 1):
            raise ToolboxError(f"max_hung must be a positive integer, not {max_hung!r}")
        if cpu_seconds is not None and not (isinstance(cpu_seconds, (int, float)) and cpu_seconds > 0):
            raise ToolboxError(f"cpu_seconds must be a positive number or None, not {cpu_seconds!r}")
        if on_error not in ON_ERROR:
            raise ToolboxError(f"on_error must be one of {ON_ERROR}, not {on_error!r}")
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ToolboxError(f"timeout must be a positive number of seconds, not {timeout!r}")
        if not (isinstance(max_concurrency, int) and max_concurrency >= 1):
            raise ToolboxError(f"max_concurrency must be a positive integer, not {max_concurrency!r}")
        if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
            raise ToolboxError(f"tools must be a list of callables, not {type(tools).__name__}")
        self.timeout = float(timeout)
        self.max_concurrency = max_concurrency
        self.on_error = on_error
        self.isolation = isolation
        self.max_hung = max_hung
        self.max_output_chars = max_output_chars
        self._tools: dict[str, _Tool] = {}
        timeouts = dict(timeouts or {})
        for i, item in enumerate(tools):
            fn, schema = (
                item if isinstance(item, tuple) and len(item) == 2 else (item, getattr(item, "tool_schema", None))
            )
            if not callable(fn):
                raise ToolboxError(f"tools[{i}] is not callable ({type(fn).__name__})")
            schema = tool_schema(schema if schema is not None else fn)
            name = tool_name(schema)
            if name in self._tools:
                raise ToolboxError(f"tools[{i}]: two tools are named {name!r}")
            try:
                sig: inspect.Signature | None = inspect.signature(fn)
            except (TypeError, ValueError):
                sig = None
            is_async = inspect.iscoroutinefunction(fn) or (
                callable(fn) and inspect.iscoroutinefunction(type(fn).__call__)
            )
            self._tools[name] = _Tool(
                name,
                fn,
                schema,
                is_async,
                sig,
                float(timeouts.pop(name, getattr(fn, "tool_timeout", self.timeout))),
                _keywords(sig),
            )
        if timeouts:
            raise ToolboxError(f"timeouts given for tools that do not exist: {', '.join(sorted(timeouts))}")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_lock = threading.Lock()
        self._hung: dict[str, set[concurrent.futures.Future[Any]]] = {}  # by tool: calls hung in threads
        self._workers = WorkerPool()  # sync calls: reused daemon threads, grown when all are stuck
        self._processes: ProcessPool | None = None
        if isolation in ("process", "sandbox"):
            bound = [name for name, t in self._tools.items() if getattr(t.fn, "in_process_only", False)]
            if bound:
                raise ToolboxError(
                    f"tools {', '.join(bound)} run in the caller's event loop (sub-agents): "
                    f"isolation={isolation!r} cannot run them"
                )
            size = workers or min(max_concurrency, max(2, os.cpu_count() or 2))
            fns = {name: t.fn for name, t in self._tools.items()}
            blob = pack_tools(fns, worker_tools)
            launcher = None
            if isolation == "sandbox":
                modules = [getattr(f, "__module__", None) or "" for f in (*fns.values(), worker_tools) if f is not None]
                launcher = (sandbox or Sandbox()).launcher(modules)
            self._processes = ProcessPool(
                blob, size=size, memory_mb=memory_mb, cpu_seconds=cpu_seconds, launcher=launcher
            )
            self._processes.check(list(self._tools))
            weakref.finalize(self, self._processes.close)  # a Toolbox dropped unclosed leaves no workers

    @classmethod
    def from_mcp(cls, *servers: Any, tools: Sequence[Any] | None = None, **options: Any) -> Toolbox:
        """The tools of MCP servers (a command line run over stdio, or a streamable HTTP URL), one
        long-lived session each, closed with the Toolbox (:mod:`tmpl.tools.mcp`, docs/environments.md).

        ``tools``: every tool the servers list (None), or a list of server tool names,
        :class:`tmpl.tools.mcp.Adapter` s (a tool under another name and argument shape) and tools of
        this process (functions, as for ``Toolbox``).
        ``connect_timeout``, ``probe_timeout``, ``retry_after``, ``structured`` are the servers'
        options; the rest are the Toolbox's (``timeout``, ``on_error``...).

        >>> box = Toolbox.from_mcp("python -m mcp_server_time --local-timezone UTC")  # doctest: +SKIP
        """
        from .mcp import MCPToolset, split_options

        ours, theirs = split_options(options)
        toolset = MCPToolset(servers, **ours)
        try:
            box = cls(toolset.tools(tools), **theirs)
        except BaseException:
            toolset.close()
            raise
        box._mcp = toolset
        weakref.finalize(box, toolset.close)  # a Toolbox dropped unclosed leaves no server running
        return box

    @property
    def mcp(self) -> Any:
        """The MCP servers' sessions of a Toolbox made by :meth:`from_mcp` (None otherwise)."""
        return self._mcp

    # -- tools ------------------------------------------------------------------------
    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The tools' JSON schemas, for ``tools=`` of a chat template."""
        return [t.schema for t in self._tools.values()]

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.schemas)

    @property
    def hung_threads(self) -> int:
        """Sync calls that timed out and are still running in their threads (0 with processes: they are killed)."""
        return sum(self._hung_calls(name) for name in list(self._hung))

    @property
    def pool(self) -> ProcessPool | None:
        """The worker processes with ``isolation="process"`` or ``"sandbox"`` (None with threads)."""
        return self._processes

    def _hung_calls(self, name: str) -> int:
        hung = self._hung.get(name)
        if not hung:
            return 0
        live = {f for f in hung if not f.done()}
        self._hung[name] = live
        return len(live)

    # -- running ------------------------------------------------------------------------
    def run_batch(self, samples: Sequence[Any]) -> BatchResult:
        """Run every call of every sample concurrently; returns when all are answered.

        ``samples``: one entry per sample, a :class:`ParsedCompletion` or a list of calls
        (:class:`ToolCall`, :class:`CallProblem`, or dicts ``{"name", "arguments", "id"?}`` /
        OpenAI ``{"id", "function": {"name", "arguments"}}``). Safe to call from inside a running
        event loop (the calls run on the Toolbox's own loop thread).
        """
        plan = self._plan(samples)
        future = asyncio.run_coroutine_threadsafe(self._run(plan), self._ensure_loop())
        return future.result()

    async def run_batch_async(self, samples: Sequence[Any]) -> BatchResult:
        """:meth:`run_batch` for callers already on an event loop (the calls run on that loop)."""
        plan = self._plan(samples)
        return await self._run(plan)

    def close(self) -> None:
        """Stop the Toolbox's loop thread (a later run starts a new one)."""
        with self._loop_lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        self._workers.close()
        if self._processes is not None:
            self._processes.close()
        if self._mcp is not None:
            self._mcp.close()

    def __enter__(self) -> Toolbox:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._loop_lock:
            if self._loop is None or self._loop.is_closed():
                self._loop = start_loop_thread("tmpl-toolbox-loop", close=False)
            return self._loop

    # -- planning ---------------------------------------------------------------------
    def _plan(self, samples: Sequence[Any]) -> list[list[ToolCall | CallProblem]]:
        if isinstance(samples, (ParsedCompletion, str, bytes, Mapping)) or not isinstance(samples, Sequence):
            raise ToolboxError(f"run_batch takes a list with one entry per sample, not {type(samples).__name__}")
        plan: list[list[ToolCall | CallProblem]] = []
        for b, sample in enumerate(samples):
            if isinstance(sample, ParsedCompletion):
                plan.append(list(sample.items))
                continue
            if isinstance(sample, (str, bytes, Mapping)) or not isinstance(sample, Sequence):
                raise ToolboxError(
                    f"samples[{b}] must be a ParsedCompletion or a list of calls, not {type(sample).__name__}"
                )
            plan.append([self._as_call(item, b, j) for j, item in enumerate(sample)])
        return plan

    @staticmethod
    def _as_call(item: Any, b: int, j: int) -> ToolCall | CallProblem:
        if isinstance(item, (ToolCall, CallProblem)):
            return item
        if not isinstance(item, Mapping):
            raise ToolboxError(f"samples[{b}][{j}] must be a ToolCall, CallProblem or dict, not {type(item).__name__}")
        function = item.get("function")
        fn: Mapping[str, Any] = function if isinstance(function, Mapping) else item
        name = fn.get("name")
        given = item.get("id")
        cid: str = given if isinstance(given, str) and given else new_call_id()
        raw = json.dumps(dict(item), default=str)
        if not isinstance(name, str) or not name:
            return CallProblem("missing_name", "the call has no tool name", raw=raw, id=cid)
        args = read_arguments(fn.get("arguments", fn.get("parameters")))
        if args.value is None:
            return CallProblem("bad_json", args.error or "unreadable arguments", raw=raw, name=name, id=cid)
        return ToolCall(id=cid, name=name, arguments=args.value, raw=raw, repairs=args.repairs)

    # -- execution --------------------------------------------------------------------
    def start_batch(
        self,
        samples: Sequence[Any],
        on_done: OnDone | None = None,
    ) -> list[asyncio.Future[list[CallOutcome]]]:
        """Start every call of every sample on the running loop; one future per sample, done when
        all of that sample's calls are answered (a sample never waits for another's calls).

        ``samples`` as in :meth:`run_batch`. For a rollout that hands each sample on as soon as
        its own calls are done; :meth:`run_batch_async` waits for all of them. ``on_done(i,
        future)`` is called the moment sample ``i``'s future is done (no callback scheduled on the
        loop; maybe before this method returns, for a sample whose calls all failed at once).
        """
        plan = self._plan(samples)
        loop = asyncio.get_running_loop()
        batch = _Batch(self, loop)
        out: list[asyncio.Future[list[CallOutcome]]] = []
        with batch.together():  # the sync calls of every sample go to the worker pool as one lot
            for i, sample in enumerate(plan):
                calls = [batch.start(item) for item in sample]
                done: asyncio.Future[list[CallOutcome]] = loop.create_future()
                out.append(done)
                batch.gather(_Gather(calls, done, on_done, i))
        return out

    async def _run(self, plan: list[list[ToolCall | CallProblem]]) -> BatchResult:
        start = time.perf_counter()
        batch = _Batch(self, asyncio.get_running_loop())
        with batch.together():
            futures = [[batch.start(item) for item in sample] for sample in plan]
        outcomes = [[await f for f in sample] for sample in futures]
        stop = [self.on_error == "stop" and any(not o.ok for o in sample) for sample in outcomes]
        metrics = ToolMetrics.from_outcomes(
            outcomes, wall_time=time.perf_counter() - start, stopped=sum(stop), hung_threads=self.hung_threads
        )
        messages = [[o.message() for o in sample] for sample in outcomes]
        return BatchResult(messages=messages, stop=stop, outcomes=outcomes, metrics=metrics)

    def _check(self, item: ToolCall | CallProblem) -> CallOutcome | tuple[_Tool, ToolCall, dict[str, Any]]:
        """The call's failure outcome when it cannot run, else the tool and the coerced arguments."""
        if isinstance(item, CallProblem):
            what = f" to '{item.name}'" if item.name else ""
            return CallOutcome(
                item.id,
                item.name or "unknown",
                "malformed_call",
                f"Error: the tool call{what} could not be read ({item.message}); it was not run.",
                None,
            )
        tool = self._tools.get(item.name)
        if tool is None:
            available = ", ".join(self._tools) or "(none)"
            return CallOutcome(
                item.id, item.name, "unknown_tool", f"Error: unknown tool '{item.name}'; available: {available}", None
            )
        params = tool.schema.get("function", {}).get("parameters")
        args, _ = coerce_arguments(item.arguments, params if isinstance(params, Mapping) else None)
        if tool.signature is not None:
            try:
                tool.check(args)
            except TypeError as exc:
                return CallOutcome(
                    item.id, item.name, "bad_arguments", f"Error: wrong arguments for {item.name}: {exc}", None
                )
        return tool, item, args

    async def _execute_async(self, tool: _Tool, call: ToolCall, args: dict[str, Any]) -> CallOutcome:
        """Run an async tool as a task under its timeout (cancelled at the timeout)."""
        began = time.perf_counter()
        task: asyncio.Future[Any] = asyncio.ensure_future(tool.fn(**args))
        done, _ = await asyncio.wait({task}, timeout=tool.timeout)
        if not done:
            task.cancel()
            return _timed_out(call, tool)
        try:
            value = task.result()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - the tool raised (SystemExit, its own CancelledError too): a message
            return _raised(call, exc, time.perf_counter() - began)
        return await self._returned(tool, call, value, began, time.perf_counter() - began)

    async def _returned(
        self, tool: _Tool, call: ToolCall, value: Any, began: float, latency: float | None
    ) -> CallOutcome:
        """The outcome of a call that returned ``value`` (awaited first, within the timeout, if awaitable)."""
        if inspect.isawaitable(value):  # a sync callable that returned a coroutine
            left = max(tool.timeout - (time.perf_counter() - began), 0.001)
            inner = asyncio.ensure_future(value)
            done, _ = await asyncio.wait({inner}, timeout=left)
            if not done:
                inner.cancel()
                return _timed_out(call, tool)
            try:
                value = inner.result()
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: BLE001 - as above: the awaited value raised, a message
                return _raised(call, exc, time.perf_counter() - began)
            latency = time.perf_counter() - began
        return _ok(call, value, latency, self.max_output_chars)


def as_toolbox(tools: Toolbox | Iterable[Any] | None) -> Toolbox | None:
    """``tools`` as a :class:`Toolbox`: a Toolbox as it is, callables wrapped in one, None as None.

    >>> as_toolbox(None) is None
    True
    """
    if tools is None or isinstance(tools, Toolbox):
        return tools
    return Toolbox(list(tools))


class _Batch:
    """The calls of one :meth:`Toolbox.run_batch`: started at most ``max_concurrency`` at a time.

    Sync calls go to the Toolbox's :class:`WorkerPool` with a timer at their timeout, those
    started inside :meth:`together` as one lot (:meth:`WorkerPool.put`: one lock, one wake-up).
    Their answers come back to the event loop through an inbox: a worker that finds it empty
    wakes the loop once (``call_soon_threadsafe``), and the calls answered until the loop runs
    are handled in that one callback, in the order they were answered (no task, no waiter, no
    wake-up per call). Async calls run as tasks. While sync calls are in flight a ticker asks
    the pool to add workers when every worker is stuck (see :mod:`.workers`).
    """

    def __init__(self, box: Toolbox, loop: asyncio.AbstractEventLoop) -> None:
        self.box, self.loop = box, loop
        self.free = box.max_concurrency
        self.waiting: collections.deque[Any] = collections.deque()  # launches waiting for a free slot
        self.sync_in_flight = 0
        self.ticking = False
        #: sync calls started inside :meth:`together`, handed to the pool when it ends
        self.lot: list[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] | None = None
        self.inbox: list[_SyncCall] = []  # answered by a worker, not yet handled on the loop
        self.inbox_lock = threading.Lock()
        self.gathers: dict[int, _Gather] = {}  # id of a call's future -> its sample's group (start_batch)

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """Hand the sync calls started inside the block to the worker pool as one lot, at its end
        (inside another such block: with that block's lot)."""
        if self.lot is not None:
            yield
            return
        self.lot = []
        try:
            yield
        finally:
            lot, self.lot = self.lot, None
            if lot:
                self.box._workers.put(lot)

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """``fn`` for the worker pool: now, or with the lot of :meth:`together`."""
        if self.lot is None:
            return self.box._workers.submit(fn)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.lot.append((fn, future))
        return future

    def answered(self, call: _SyncCall) -> None:
        """In a worker's thread: ``call`` has its answer; wake the loop unless a wake-up is pending."""
        with self.inbox_lock:
            self.inbox.append(call)
            if len(self.inbox) > 1:
                return  # the loop was woken for the first one and has not drained yet
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is gone (the call hung past its batch): nothing waits for it
            pass

    def _drain(self) -> None:
        with self.inbox_lock:
            calls, self.inbox = self.inbox, []
        with self.together():  # calls waiting for a free slot, launched as these finish: one lot too
            for call in calls:
                try:
                    call.on_result()
                except Exception as exc:  # noqa: BLE001 - one call's failure must not keep the others unanswered
                    self.loop.call_exception_handler({"message": "tool call answer failed", "exception": exc})
                    call.settle(_raised(call.call, exc, None))  # nor itself (e.g. a result whose str() raises)

    def start(self, item: ToolCall | CallProblem) -> asyncio.Future[CallOutcome]:
        out: asyncio.Future[CallOutcome] = self.loop.create_future()
        checked = self.box._check(item)
        if isinstance(checked, CallOutcome):
            out.set_result(checked)
            return out
        tool, call, args = checked
        box = self.box
        if box._processes is not None:
            how = self._launch_process
        elif tool.is_async:
            how = self._launch_async
        elif box._hung_calls(tool.name) >= box.max_hung:
            out.set_result(_refused(call, box.max_hung))
            return out
        else:
            how = self._launch_sync
        launch = functools.partial(how, tool, call, args, out)
        if self.free > 0:
            self.free -= 1
            launch()
        else:
            self.waiting.append(launch)
        return out

    def gather(self, group: _Gather) -> None:
        """Complete the group's sample future with the outcomes of its calls (in order) once every
        one is answered: counted in :meth:`_finish` as each is set, not by a done-callback per call
        (one callback scheduled on the loop per call and per sample, 2 of the 7 per sample and turn)."""
        for f in group.calls:
            if f.done():
                group.left -= 1
            else:
                self.gathers[id(f)] = group
        if not group.left:
            group.complete()

    def _finish(self, out: asyncio.Future[CallOutcome], outcome: CallOutcome | BaseException) -> None:
        if not out.done():
            if isinstance(outcome, BaseException):
                out.set_exception(outcome)
            else:
                out.set_result(outcome)
        group = self.gathers.pop(id(out), None)
        if group is not None:
            group.left -= 1
            if not group.left:
                group.complete()
        if self.waiting:
            self.waiting.popleft()()
        else:
            self.free += 1

    # -- async tools ------------------------------------------------------------------
    def _launch_async(
        self, tool: _Tool, call: ToolCall, args: dict[str, Any], out: asyncio.Future[CallOutcome]
    ) -> None:
        def start() -> asyncio.Task[CallOutcome]:  # in a context of its own, where the tool reads its call
            CURRENT_CALL.set(call)
            return self.loop.create_task(self.box._execute_async(tool, call, args))

        task = contextvars.copy_context().run(start)

        def done(t: asyncio.Future[CallOutcome]) -> None:
            self._finish(out, t.exception() or t.result())

        task.add_done_callback(done)

    # -- worker processes -------------------------------------------------------------
    def _launch_process(
        self, tool: _Tool, call: ToolCall, args: dict[str, Any], out: asyncio.Future[CallOutcome]
    ) -> None:
        box, loop = self.box, self.loop
        assert box._processes is not None
        future = box._processes.submit(tool.name, args, tool.timeout, box.max_output_chars)

        def answered(f: concurrent.futures.Future[Answer]) -> None:  # in the pool's thread
            try:
                loop.call_soon_threadsafe(self._finish, out, _from_worker(call, tool, f.result()))
            except RuntimeError:  # the loop is gone: nothing waits for the call
                pass

        future.add_done_callback(answered)

    # -- sync tools -------------------------------------------------------------------
    def _launch_sync(self, tool: _Tool, call: ToolCall, args: dict[str, Any], out: asyncio.Future[CallOutcome]) -> None:
        _SyncCall(self, tool, call, out).start(args)
        if not self.ticking:
            self.ticking = True
            self.loop.call_later(self.box._workers.stuck_after, self._tick)

    def _tick(self) -> None:
        if not self.sync_in_flight:
            self.ticking = False
            return
        self.box._workers.unstick()
        self.loop.call_later(self.box._workers.stuck_after, self._tick)


#: ``on_done(i, future)`` of :meth:`Toolbox.start_batch`: sample ``i``'s future is done
OnDone = Callable[[int, "asyncio.Future[list[CallOutcome]]"], None]

#: return types that are never awaitable (no ``inspect.isawaitable`` for the common results)
_PLAIN = frozenset({str, dict, list, tuple, int, float, bool, type(None), bytes})


class _SyncCall:
    """One sync call in flight: the worker's future, the timer at the tool's timeout, the answer.

    Settled once, by whichever comes first (the worker's answer or the timer); settling drops the
    references to the future and the timer. Closures sharing cells did the same job but left every
    call in a reference cycle (future -> done callback -> closure -> future): ~30 objects a call
    that only the garbage collector could free, 15-18% of a 4096-sample rollout's time outside
    the engine (benchmarks/rollout_scale.py).
    """

    __slots__ = ("batch", "tool", "call", "out", "began", "future", "timer")

    def __init__(self, batch: _Batch, tool: _Tool, call: ToolCall, out: asyncio.Future[CallOutcome]) -> None:
        self.batch, self.tool, self.call = batch, tool, call
        self.out: asyncio.Future[CallOutcome] | None = out
        self.began = 0.0
        self.future: concurrent.futures.Future[Any] | None = None
        self.timer: asyncio.TimerHandle | None = None

    def start(self, args: dict[str, Any]) -> None:
        batch = self.batch
        self.began = time.perf_counter()
        future = batch.submit(functools.partial(self.tool.fn, **args))
        batch.sync_in_flight += 1
        self.future = future
        self.timer = batch.loop.call_later(self.tool.timeout, self.on_timeout)
        future.add_done_callback(self.from_worker)

    def from_worker(self, _: concurrent.futures.Future[Any]) -> None:
        """In the worker's thread: hand the answer to the loop (through the batch's inbox)."""
        self.batch.answered(self)

    def on_timeout(self) -> None:
        future = self.future
        if future is None:
            return
        if not future.cancel() and not future.done():  # running: its thread hangs on
            self.batch.box._hung.setdefault(self.tool.name, set()).add(future)
        self.settle(_timed_out(self.call, self.tool))

    def on_result(self) -> None:
        future, call = self.future, self.call
        if future is None:
            return
        try:  # one read of the finished future (each read takes its lock)
            value = future.result(0)
        except BaseException as exc:  # noqa: BLE001 - the tool's own exception, answered as its outcome
            if isinstance(exc, concurrent.futures.CancelledError) and future.cancelled():
                return  # cancelled before it ran (its timeout came first): already answered
            self.timer_off()
            latency = getattr(future, "ran_for", None)
            self.settle(exc if isinstance(exc, KeyboardInterrupt) else _raised(call, exc, latency))
            return
        self.timer_off()
        latency = getattr(future, "ran_for", None)
        if type(value) in _PLAIN or not inspect.isawaitable(value):
            self.settle(_ok(call, value, latency, self.batch.box.max_output_chars))
            return
        box, loop = self.batch.box, self.batch.loop
        task = asyncio.ensure_future(box._returned(self.tool, call, value, self.began, latency), loop=loop)
        task.add_done_callback(self.awaited)

    def awaited(self, task: asyncio.Future[CallOutcome]) -> None:
        self.settle(task.exception() or task.result())

    def timer_off(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def settle(self, outcome: CallOutcome | BaseException) -> None:
        if self.out is None:
            return
        self.timer_off()
        self.future = None
        out, self.out = self.out, None
        self.batch.sync_in_flight -= 1
        self.batch._finish(out, outcome)


class _Gather:
    """One sample's calls in :meth:`Toolbox.start_batch`: how many are still unanswered, and what
    to complete when none is."""

    __slots__ = ("calls", "done", "on_done", "index", "left")

    def __init__(
        self,
        calls: list[asyncio.Future[CallOutcome]],
        done: asyncio.Future[list[CallOutcome]],
        on_done: OnDone | None,
        index: int,
    ) -> None:
        self.calls, self.done, self.on_done, self.index = calls, done, on_done, index
        self.left = len(calls)

    def complete(self) -> None:
        done = self.done
        if done.done():
            return
        for f in self.calls:
            if f.cancelled():
                done.cancel()
                break
            exc = f.exception()
            if exc is not None:
                done.set_exception(exc)
                break
        else:
            done.set_result([f.result() for f in self.calls])
        if self.on_done is not None:
            self.on_done(self.index, done)


def _keywords(sig: inspect.Signature | None) -> tuple[frozenset[str], frozenset[str]] | None:
    """Names a call may pass by keyword and the ones it must, when only those rules apply."""
    if sig is None:
        return None
    allowed, required = set(), set()
    for p in sig.parameters.values():
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            return None
        allowed.add(p.name)
        if p.default is p.empty:
            required.add(p.name)
    return frozenset(allowed), frozenset(required)


def _timed_out(call: ToolCall, tool: _Tool) -> CallOutcome:
    return CallOutcome(
        call.id, call.name, "timeout", f"Error: {call.name} timed out after {tool.timeout:g} s", tool.timeout
    )


def _raised(call: ToolCall, exc: BaseException, latency: float | None) -> CallOutcome:
    """The outcome of a call that raised: the exception in words (its traceback is dropped: the
    frames it holds, the awaiting task's among them, would keep a reference cycle alive)."""
    text = _short(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    exc.__traceback__ = None
    return CallOutcome(call.id, call.name, "exception", f"Error: {call.name} raised {text}", latency)


def _ok(call: ToolCall, value: Any, latency: float | None, max_chars: int | None) -> CallOutcome:
    """The outcome of a call that returned ``value``: its content, cut to ``max_chars`` with a marker."""
    if type(value) is ToolReply:  # a tool that says more than a value (an MCP server's result)
        return value.outcome(call.id, call.name, latency, max_chars)
    content = content_of(value)
    if max_chars is None or len(content) <= max_chars:
        return CallOutcome(call.id, call.name, None, content, latency, value)
    return CallOutcome(call.id, call.name, None, cut_chars(content, max_chars), latency, value, chars=len(content))


def _refused(call: ToolCall, max_hung: int) -> CallOutcome:
    return CallOutcome(
        call.id,
        call.name,
        "refused",
        f"Error: {call.name} was not run: {max_hung} earlier calls of it still hang past their timeout",
        None,
    )


def _from_worker(call: ToolCall, tool: _Tool, answer: Answer) -> CallOutcome:
    """A worker process's answer as the call's outcome."""
    if answer.kind == "ok":
        if answer.chars > len(answer.content):
            content = cut_chars(answer.content, len(answer.content), answer.chars)
            return CallOutcome(call.id, call.name, None, content, answer.latency, None, chars=answer.chars)
        return CallOutcome(call.id, call.name, None, answer.content, answer.latency, answer.value)
    if answer.kind == "timeout":
        return _timed_out(call, tool)
    if answer.kind == "raised":
        return CallOutcome(
            call.id, call.name, "exception", f"Error: {call.name} raised {_short(answer.content)}", answer.latency
        )
    return CallOutcome(call.id, call.name, "crashed", f"Error: {call.name} crashed: {answer.content}", answer.latency)
