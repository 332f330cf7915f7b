"""The workers of :class:`tmpl.DistributedRollout`: local processes, or Ray actors.

Both pools speak the same events to the driver (:class:`Event`): a worker is ``ready`` (with its
template's fingerprint and process id) or failed its ``setup``; a shard is ``done`` (its
:class:`~.worker.ShardOutput`, pickled once by the worker: :class:`Packed`, which the driver
unpickles after handing that worker its next shard), ``failed`` (the exception it raised) or
``cancelled`` (with the request ids the worker cancelled); a worker ``died`` (how). A pool runs at most one shard per
worker at a time; the driver decides which shard goes where.

- :class:`ProcessPool`: ``multiprocessing`` with the spawn start method (a worker shares nothing
  with the caller but what it is sent: safe with threads, tokenizers and CUDA in the caller). A
  worker is one process with a pipe to the driver; it exits when the driver closes the pipe, or
  when the driver's process ends (the pipe closes with it). Ctrl-C is the driver's: workers
  ignore SIGINT and are cancelled by the driver.
- :class:`RayPool`: one async Ray actor per worker (``ray.remote(**options)``, ``num_cpus=1``
  unless ``options`` say otherwise), on the cluster ``ray.init`` connected to; a cancel is a call
  the actor runs while its shard runs.

>>> pool = ProcessPool(pickle.dumps(make_rollout), 2)     # doctest: +SKIP
>>> pool.start(0); pool.start(1); pool.submit(0, shard)    # doctest: +SKIP
>>> pool.poll(1.0)                                         # doctest: +SKIP
[Event(kind='ready', slot=0, ...), Event(kind='ready', slot=1, ...)]
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import os
import pickle
import signal
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Literal

from ...errors import WorkerError
from ..collector import fewer_collections
from .worker import Shard, WorkerRuntime, runtime_for

EventKind = Literal["ready", "setup", "done", "failed", "cancelled", "died"]


@dataclass
class Event:
    """Something a worker did: ``payload`` is the fingerprint (ready), an error text (setup, died),
    a ShardOutput, maybe :class:`Packed` (done), an exception (failed) or the cancelled request ids
    (cancelled)."""

    kind: EventKind
    slot: int
    shard: int | None = None
    payload: Any = None
    pid: int | None = None


def portable(exc: BaseException, worker: str) -> BaseException:
    """``exc`` if it pickles (it is re-raised in the driver), else a WorkerError with its traceback."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any failure to pickle: send the text instead
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return WorkerError(worker, f"a shard raised {type(exc).__name__}: {exc}\n{text}")


def setup_text(exc: BaseException) -> str:
    """What a worker says when it could not set up: the error, and the traceback for a surprise."""
    from ...errors import WorkerSetupError

    if isinstance(exc, WorkerSetupError):
        return exc.reason
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-6))
    return f"{type(exc).__name__}: {exc}\n{text}"


@dataclass(frozen=True)
class Packed:
    """A shard's output pickled by its worker (protocol 5): it travels as one bytes object, and the
    driver unpickles it only after handing that worker its next shard (:func:`unpacked`)."""

    data: bytes


def _pack(output: Any) -> Packed:
    """``output`` pickled once by the standard pickler (raises where it does not pickle)."""
    with fewer_collections():  # see conns_recv
        return Packed(pickle.dumps(output, protocol=5))


def packed(output: Any) -> Any:
    """``output`` as :class:`Packed` where the standard pickler takes it, else as is (the transport's
    own pickler then takes it: Ray's cloudpickle). Ray's serializer walks a shard's results 1.5x
    slower than ``pickle.dumps`` (measured on benchmarks/rollout_scale.py's results: 2,048 of them,
    54 MB, 368-402 ms against 243-252 ms)."""
    try:
        return _pack(output)
    except Exception:  # noqa: BLE001 - a value only cloudpickle takes (a lambda in a result, say)
        return output


def done_message(output: Any, shard: Shard, worker: str) -> tuple[Any, ...]:
    """A process worker's answer for a finished shard: ``done`` with its output packed, or ``failed``
    with a WorkerError naming the shard where the output does not pickle (a pipe has no other
    pickler; the driver would otherwise wait for an answer that never comes)."""
    try:
        return ("done", shard.index, _pack(output), None)
    except Exception as exc:  # noqa: BLE001 - its words go to the driver
        reason = (
            f"the results of {shard.describe()} cannot be sent back: they do not pickle ({type(exc).__name__}: {exc})"
        )
        return ("failed", shard.index, WorkerError(worker, reason), None)


def unpacked(payload: Any) -> Any:
    """A ``done`` event's payload as the shard's output (unpickled where it came :class:`Packed`)."""
    if not isinstance(payload, Packed):
        return payload
    with fewer_collections():  # see conns_recv
        return pickle.loads(payload.data)


# -- local processes ------------------------------------------------------------------------------
def _process_main(conn: Connection, blob: bytes, name: str) -> None:
    """A worker process: build the rollout, say ready, then run the shards the driver sends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's, which cancels the workers
    try:
        runtime = runtime_for(pickle.loads(blob), name)
    except BaseException as exc:  # noqa: BLE001 - the driver raises it as WorkerSetupError
        conn.send(("setup", None, setup_text(exc), os.getpid()))
        return
    conn.send(("ready", None, runtime.fingerprint, os.getpid()))
    try:
        asyncio.run(_serve(conn, runtime))
    finally:
        runtime.close()


async def _serve(conn: Connection, runtime: WorkerRuntime) -> None:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()

    def read() -> None:  # a thread: the event loop keeps running the shard while it waits
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the driver closed the pipe or its process ended
                message = ("stop",)
            loop.call_soon_threadsafe(inbox.put_nowait, message)
            if message[0] == "stop":
                return

    threading.Thread(target=read, name="tmpl-worker-inbox", daemon=True).start()
    # SIGTERM (the driver stopping a worker that did not answer) stops as "stop" does: the running shard is
    # cancelled, so its samples' environments are closed before the process ends
    loop.add_signal_handler(signal.SIGTERM, inbox.put_nowait, ("stop",))
    current: asyncio.Task[Any] | None = None

    def reply(task: asyncio.Task[Any], shard: Shard) -> None:
        try:
            if task.cancelled():
                conn.send(("cancelled", shard.index, runtime.cancelled, None))
            elif task.exception() is not None:
                exc = task.exception()
                assert exc is not None
                conn.send(("failed", shard.index, portable(exc, runtime.name), None))
            else:
                conn.send(done_message(task.result(), shard, runtime.name))
        except (BrokenPipeError, OSError):  # the driver is gone: nothing to tell
            pass

    while True:
        message = await inbox.get()
        if message[0] == "run":
            shard = message[1]
            current = asyncio.ensure_future(runtime.run_shard(shard))
            current.add_done_callback(functools.partial(_reply_to, reply, shard))
        elif message[0] == "cancel":
            if current is not None and not current.done():
                current.cancel()
        elif message[0] == "stop":
            if current is not None and not current.done():
                current.cancel()
                await asyncio.gather(current, return_exceptions=True)
            return


def _reply_to(reply: Callable[[asyncio.Task[Any], Shard], None], shard: Shard, task: asyncio.Task[Any]) -> None:
    reply(task, shard)


@dataclass
class _Process:
    process: Any  # multiprocessing.Process (spawn context)
    conn: Connection


class ProcessPool:
    """``size`` local worker processes (spawn), each running the pickled factory ``blob``."""

    kind = "process"

    def __init__(self, blob: bytes, size: int) -> None:
        self.blob = blob
        self.slots: list[_Process | None] = [None] * size
        self._context = multiprocessing.get_context("spawn")

    def name(self, slot: int) -> str:
        return f"process {slot}"

    def live(self) -> list[int]:
        return [i for i, p in enumerate(self.slots) if p is not None]

    def start(self, slot: int) -> None:
        parent, child = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=_process_main, args=(child, self.blob, self.name(slot)), name=f"tmpl-rollout-worker-{slot}"
        )
        process.start()
        child.close()  # the driver's copy: the pipe then ends when the worker does
        self.slots[slot] = _Process(process, parent)

    def pid(self, slot: int) -> int | None:
        p = self.slots[slot]
        return p.process.pid if p is not None else None

    def submit(self, slot: int, shard: Shard) -> None:
        p = self.slots[slot]
        assert p is not None
        try:
            p.conn.send(("run", shard))
        except (BrokenPipeError, OSError):
            pass  # it died: poll() reports it, and the shard runs elsewhere

    def cancel(self, slot: int) -> None:
        p = self.slots[slot]
        if p is not None:
            try:
                p.conn.send(("cancel",))
            except (BrokenPipeError, OSError):
                pass

    def poll(self, timeout: float) -> list[Event]:
        live = {i: p for i, p in enumerate(self.slots) if p is not None}
        if not live:
            return []
        conns = {p.conn: i for i, p in live.items()}
        sentinels = {p.process.sentinel: i for i, p in live.items()}
        ready = wait([*conns, *sentinels], timeout)
        events: list[Event] = []
        dead = set()
        for obj in ready:
            if obj in conns:
                slot = conns[obj]
                try:
                    events.append(self._event(slot, conns_recv(obj)))
                except (EOFError, OSError):
                    dead.add(slot)
            else:
                dead.add(sentinels[obj])
        for slot in sorted(dead):
            p = live[slot]
            # what it sent before it died counts: a shard it finished is not run again
            while True:
                try:
                    if not p.conn.poll():
                        break
                    events.append(self._event(slot, conns_recv(p.conn)))
                except (EOFError, OSError):
                    break
            p.process.join(5)
            events.append(Event("died", slot, payload=_exit_text(p.process.exitcode), pid=p.process.pid))
            p.conn.close()
            self.slots[slot] = None
        return events

    @staticmethod
    def _event(slot: int, message: tuple[Any, ...]) -> Event:
        kind, shard, payload, pid = message
        return Event(kind, slot, shard, payload, pid)

    def stop(self, slot: int, timeout: float = 10.0) -> None:
        """Ask the worker to finish (its running shard is cancelled), then make sure it is gone."""
        p = self.slots[slot]
        if p is None:
            return
        self.slots[slot] = None
        try:
            p.conn.send(("stop",))
        except (BrokenPipeError, OSError):
            pass
        p.process.join(timeout)
        if p.process.is_alive():
            p.process.terminate()
            p.process.join(5)
        if p.process.is_alive():
            p.process.kill()
            p.process.join(5)
        p.conn.close()

    def close(self) -> None:
        for slot in self.live():
            self.stop(slot)


def conns_recv(conn: Connection) -> tuple[Any, ...]:
    """One message from a worker, unpickled with the garbage collector held back (a shard's results
    are a few hundred thousand new objects: measured, 2,048 results unpickled in 117-136 ms that way,
    130-430 ms under the default thresholds)."""
    with fewer_collections():
        message: tuple[Any, ...] = conn.recv()
    return message


def _exit_text(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


# -- Ray actors -----------------------------------------------------------------------------------
def import_ray() -> Any:
    """The ray module, or RayNotInstalledError."""
    try:
        import ray
    except ImportError as exc:
        from ...errors import RayNotInstalledError

        raise RayNotInstalledError() from exc
    return ray


class RayWorker:
    """The body of one Ray actor (``ray.remote`` is applied by :class:`RayPool`): an async actor."""

    def __init__(self, factory: Callable[[], Any], name: str) -> None:
        self.error: str | None = None
        self.runtime: WorkerRuntime | None = None
        self.task: asyncio.Future[Any] | None = None
        try:
            self.runtime = runtime_for(factory, name)
        except BaseException as exc:  # noqa: BLE001 - reported by ready() and run(), raised by the driver
            self.error = setup_text(exc)

    async def ready(self) -> tuple[Any, ...]:
        if self.runtime is None:
            return ("setup", None, self.error, os.getpid())
        return ("ready", None, self.runtime.fingerprint, os.getpid())

    async def run(self, shard: Shard) -> tuple[Any, ...]:
        runtime = self.runtime
        if runtime is None:
            return ("setup", shard.index, self.error, os.getpid())
        self.task = asyncio.ensure_future(runtime.run_shard(shard))
        try:
            return ("done", shard.index, packed(await self.task), None)
        except asyncio.CancelledError:
            return ("cancelled", shard.index, runtime.cancelled, None)
        except Exception as exc:  # noqa: BLE001 - the driver re-raises it
            return ("failed", shard.index, portable(exc, runtime.name), None)
        finally:
            self.task = None

    async def cancel(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()

    async def close(self) -> None:
        if self.runtime is not None:
            self.runtime.close()


class RayPool:
    """``size`` Ray actors running ``factory`` (sent by Ray's cloudpickle), one shard at a time each."""

    kind = "ray"

    def __init__(self, factory: Callable[[], Any], size: int, options: dict[str, Any] | None = None) -> None:
        self.ray = import_ray()
        self.factory = factory
        self.options = {"num_cpus": 1, **(options or {})}
        self.actor_class = self.ray.remote(**self.options)(RayWorker)
        self.slots: list[Any] = [None] * size
        self.pids: list[int | None] = [None] * size
        self.calls: dict[Any, tuple[int, str]] = {}  # object ref -> (slot, "ready" | "run")

    def name(self, slot: int) -> str:
        return f"ray actor {slot}"

    def live(self) -> list[int]:
        return [i for i, a in enumerate(self.slots) if a is not None]

    def start(self, slot: int) -> None:
        actor = self.actor_class.remote(self.factory, self.name(slot))
        self.slots[slot] = actor
        self.pids[slot] = None  # known once it answers ready()
        self.calls[actor.ready.remote()] = (slot, "ready")

    def pid(self, slot: int) -> int | None:
        return self.pids[slot]

    def submit(self, slot: int, shard: Shard) -> None:
        self.calls[self.slots[slot].run.remote(shard)] = (slot, "run")

    def cancel(self, slot: int) -> None:
        actor = self.slots[slot]
        if actor is not None:
            actor.cancel.remote()

    def poll(self, timeout: float) -> list[Event]:
        if not self.calls:
            return []
        ray = self.ray
        ready, _ = ray.wait(list(self.calls), num_returns=1, timeout=timeout)
        if ready:
            more, _ = ray.wait([r for r in self.calls if r not in ready], num_returns=len(self.calls) - 1, timeout=0)
            ready += more
        events: list[Event] = []
        for ref in ready:
            slot, what = self.calls.pop(ref)
            if self.slots[slot] is None:
                continue  # an answer of an actor already given up
            try:
                kind, shard, payload, pid = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                events.append(Event("died", slot, payload=f"the actor died: {_first_line(exc)}", pid=self.pids[slot]))
                self._forget(slot)
                continue
            if pid is not None:
                self.pids[slot] = pid
            events.append(Event(kind, slot, shard, payload, pid))
        return events

    def _forget(self, slot: int) -> None:
        self.slots[slot] = None
        for ref, (s, _) in list(self.calls.items()):
            if s == slot:
                del self.calls[ref]

    def stop(self, slot: int, timeout: float = 10.0) -> None:
        actor = self.slots[slot]
        if actor is None:
            return
        self._forget(slot)
        try:
            self.ray.get(actor.close.remote(), timeout=timeout)
        except Exception:  # noqa: BLE001, S110 - it is killed next in any case
            pass
        self.ray.kill(actor)

    def close(self) -> None:
        for slot in self.live():
            self.stop(slot)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
