"""Inside one tool worker process: limits, then call after call read from a pipe.

The parent (:mod:`.procpool`) starts the worker, sends ``(name, arguments, max_chars, cpu_seconds)`` per
call and reads one :class:`Reply` back. The worker runs with

- ``RLIMIT_AS`` at the address space it had when it started plus ``memory_mb``: an allocation
  past it raises ``MemoryError`` in the tool (reported, then the worker exits so that a fresh
  one replaces it) or, in native code that aborts, kills the worker (reported as a crash);
- ``RLIMIT_CPU`` (soft) at the CPU seconds used so far plus ``cpu_seconds``, reset before each
  call: a tool that spins past it gets ``SIGXCPU`` and dies; a backstop to the parent's
  wall-clock kill that holds even if the parent is gone;
- its standard output sent to ``/dev/null`` (a tool's prints are not its result and must not
  mix into the trainer's logs); standard error is left as is;
- under a keeper (:func:`kept`, :mod:`.proctree`) that kills every process it started when it
  ends, and a process a tool forks that returns from the tool exits there (it never answers).

A result is made message content here (text as is, the rest as JSON) and cut to ``max_chars``
before it is pickled, so a tool returning 50 MB sends kilobytes through the pipe.

>>> serve  # doctest: +ELLIPSIS
<function serve at ...>
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import pickle
import resource
import sys
import time
from dataclasses import dataclass
from typing import Any

from .proctree import keep


@dataclass(frozen=True)
class Reply:
    """One call's answer from a worker.

    ``kind``: ``"ok"``, ``"raised"`` (``content`` is ``"Type: message"``) or ``"memory"`` (the tool
    ran out of its memory limit). ``chars``: the full content's length before the cut.
    ``value``: the tool's return value when it pickles and was not cut (else None).
    """

    kind: str
    content: str
    latency: float
    chars: int = 0
    value: Any = None


def content_of(value: Any) -> str:
    """A tool's return value as message content: text as is, None as "", the rest as JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def address_space() -> int:
    """Bytes of address space this process holds now (``VmSize``), 0 when unknown."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _limit_memory(memory_mb: int | None) -> None:
    if memory_mb is None:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = address_space() + memory_mb * 2**20
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _limit_cpu(cpu_seconds: float | None) -> None:
    if cpu_seconds is None:
        return
    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(used.ru_utime + used.ru_stime + cpu_seconds) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _quiet_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the worker


def _tools(blob: bytes) -> dict[str, Any]:
    """The tools by name: pickled ``{name: fn}``, or a pickled factory whose list is named here."""
    loaded = pickle.loads(blob)
    if isinstance(loaded, dict):
        return loaded
    from ..toolcalls.schema import tool_name, tool_schema

    tools: dict[str, Any] = {}
    for item in loaded():
        fn, schema = item if isinstance(item, tuple) and len(item) == 2 else (item, None)
        tools[tool_name(tool_schema(schema if schema is not None else fn))] = fn
    return tools


def _describe(exc: BaseException, limit: int = 1000) -> str:
    """``"Type: message"`` of an exception, at most ``limit`` characters (its ``str`` may fail or be huge)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ still names the type
        text = ""
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _call(fn: Any, args: dict[str, Any]) -> Any:
    value = fn(**args)
    if inspect.isawaitable(value):

        async def wait() -> Any:
            return await value

        value = asyncio.run(wait())
    return value


def _only_the_worker(me: int) -> None:
    """A process the tool forked that came back here (its fork returned into the tool's code):
    it is not the worker and must not answer on the worker's pipe, so it exits."""
    if os.getpid() != me:
        os._exit(0)


def kept(conn: Any, blob: bytes, memory_mb: int | None, lifeline: Any = None) -> None:
    """:func:`serve` in a process of its own under a keeper that kills all it leaves (:func:`.proctree.keep`);
    ``lifeline``: the read end of a pipe the trainer holds open while it lives."""
    keep(serve, conn, blob, memory_mb, lifeline=lifeline)


def serve(conn: Any, blob: bytes, memory_mb: int | None) -> None:
    """The worker's main: load the tools, say ready (or why not), then answer calls until EOF."""
    _quiet_stdout()
    try:
        tools = _tools(blob)
        _limit_memory(memory_mb)
    except BaseException as exc:  # noqa: BLE001 - told to the parent, which answers the call with it
        conn.send(("broken", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", sorted(tools)))
    me = os.getpid()
    while True:
        try:
            name, args, max_chars, cpu_seconds = conn.recv()
        except (EOFError, OSError):
            return
        _limit_cpu(cpu_seconds)
        began = time.perf_counter()
        try:
            value = _call(tools[name], args)
        except MemoryError:
            _only_the_worker(me)
            conn.send(Reply("memory", "MemoryError", time.perf_counter() - began))
            os._exit(0)  # its heap may be in any state: a fresh worker takes over
        except BaseException as exc:  # noqa: BLE001 - the tool raised: its message goes back
            _only_the_worker(me)
            conn.send(Reply("raised", _describe(exc), time.perf_counter() - began))
            continue
        _only_the_worker(me)
        latency = time.perf_counter() - began
        content = content_of(value)
        chars = len(content)
        cut = max_chars is not None and chars > max_chars
        reply = Reply("ok", content[:max_chars] if cut else content, latency, chars, None if cut else value)
        try:
            conn.send(reply)
        except Exception:  # noqa: BLE001 - the value does not pickle: its content is enough
            conn.send(Reply("ok", reply.content, latency, chars))
