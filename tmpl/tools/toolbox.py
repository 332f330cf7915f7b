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

A batch's running calls are :mod:`.batch`'s, each call's outcome :mod:`.outcomes`'s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
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
from .batch import CURRENT_CALL as CURRENT_CALL  # the call being run: tmpl.tools.toolbox's name for it
from .batch import OnDone, _Batch, _Gather
from .loopthread import start_loop_thread
from .metrics import CallOutcome, ToolMetrics
from .outcomes import _keywords, _ok, _raised, _timed_out, _Tool
from .procpool import ProcessPool, pack_tools
from .sandbox import Sandbox
from .workers import WorkerPool

ON_ERROR = ("message", "stop")


ISOLATION = ("thread", "process", "sandbox")


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
