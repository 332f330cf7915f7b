"""Budgets: every check of a template tmpl did not ship ends within a bounded time and memory.

A chat template is code written by strangers. ``{% for i in range(99999) %}{% for j in range(99999) %}``
runs for hours, ``{{ 'x' * 1000000000 }}`` asks for a gigabyte; Jinja's sandbox stops neither. So a
report, a fix or a matrix row on such a template runs as one *job* under a :class:`Budget`:

- **a forked worker process** (``os.fork``: the template, tokenizer and imports are inherited, nothing is
  pickled on the way in) with ``RLIMIT_AS`` set, when a job starts, to the address space the worker
  has then plus ``memory_mb`` (a large allocation fails with ``MemoryError`` in the worker, never in
  the caller; a native library that aborts instead is reported as out of memory), and ``RLIMIT_CPU``
  as a backstop should the parent die;
- **a wall-clock deadline** kept by the parent, which ``SIGKILL``s the worker at ``seconds``: a loop
  inside one C call (``str * int``, ``re``) cannot be interrupted from inside, a process can;
- **Jinja hooks** in the worker (installed only there, so nothing changes in the caller): ``*``, ``+`` and
  ``**`` on strings, lists and numbers are intercepted and refused before they build a value of more than
  ``output_chars`` items, and a render's output is counted as Jinja yields it, so a template that doubles
  its output or loops a billion times emitting text stops at ``output_chars`` within milliseconds,
  instead of growing until the memory limit;
- the result comes back pickled through a pipe (an exception as its class, args and attributes).

Exceeded: :class:`~tmpl.errors.BudgetExceededError` naming the template, the budget that ran out and its
limit; :func:`tmpl.report.check` turns it into a report whose verdicts are ``UNPROVEN (budget exceeded:
...)``. A worker killed by a signal (a C stack overflow on a deeply nested template, a native library
aborting when out of memory) is reported as such, never as a pass.

Why a worker process and not only in-process hooks: only a process can be stopped in the middle of a
C call, and only a process limit covers memory the hooks do not see (an intermediate list, a regex, a
tokenizer call). What it costs, measured on the 2-core development machine (Python 3.11,
transformers 5.23): a fork, an empty job and its answer take 3.7 ms from a process with tmpl imported,
7 ms with one tokenizer loaded (medians of 30-50), 18 ms when the machine was loaded by other work;
``check`` of qwen2.5-instruct took 261 ms in a worker against 226 ms in process (median of 7, loaded
machine, caches cleared each time). The cost grows with the parent's size: from a process holding
40 tokenizers (1.2 GB resident) a fork took 35 ms and the worker's exit 53 ms, and a worker that
inherits a big heap pays copy-on-write faults (the collector is frozen in workers so that it does not
touch every inherited object). So the matrix does not fork per template from a parent that loads
every tokenizer: its parent loads nothing, and each of its 2 workers loads and checks template after
template (a tokenizer stays loaded in the worker that loaded it, and templates sharing a tokenizer go
to that worker), with the budget and limits reset per template; a worker that ran out of budget or
crashed is replaced by a fresh fork. The rollout's hot path never calls this module.

Defaults (:data:`DEFAULT_BUDGET`), far above the slowest real template, measured by running each of
the 97 catalog templates (``../shared/tokenizers/templates/catalog.json``; 95 load), the 11 families
in ``../shared/tokenizers`` with their own templates and the 5 templates tmpl ships, one at a time,
each in a fresh worker that loads its tokenizer and checks it (2 cores, load average ~4 from other
work at the time):

- slowest ``check``: 1.63 s (``gemma4_e2b_chat_template.jinja`` @ gemma-4-it; median 0.21 s); slowest
  job with its tokenizer load: 9.1 s (``google-gemma-4.jinja`` @ gemma-4-it: the 262k-token Gemma 4
  tokenizer loads in ~7 s); the default, 60 s, is 6.6x the slowest job and 37x the slowest check;
- most address space a job added: 947 MB (the Gemma 4 tokenizer's load; checks on loaded tokenizers
  add far less); the default is 4096 MB;
- biggest single render: 16,288 characters (``unsloth-mistral-Devstral-Small-2507.jinja``); the
  default, 10,000,000 characters (10M), is 600x that.

Change them with ``tmpl.report.check(tpl, budget=Budget(seconds=10))``, or ``Budget.parse("10s,1GB,1M")``
for a command-line flag (``--budget``).
"""

from __future__ import annotations

import functools
import gc
import math
import os
import pickle
import re
import resource
import select
import signal
import struct
import sys
import time
import traceback
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ..errors import BudgetExceededError, TemplateError

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741 - an item of imap_budgeted
P = TypeVar("P")

_MB = 1 << 20


@dataclass(frozen=True)
class Budget:
    """What one job (a report, a fix, a matrix row) may spend: wall-clock ``seconds``, ``memory_mb`` of
    address space beyond what the process held when the worker forked, and ``output_chars``, the longest
    text (or list) one render may build.

    >>> Budget.parse("30s,2GB,10M")
    Budget(seconds=30.0, memory_mb=2048, output_chars=10000000)
    >>> str(Budget(seconds=3, memory_mb=1024))
    '3s,1GB,10M'
    """

    seconds: float = 60.0
    memory_mb: int = 4096
    output_chars: int = 10_000_000

    def __post_init__(self) -> None:
        for name in ("seconds", "memory_mb", "output_chars"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"Budget.{name} must be a positive number, not {value!r}")

    _UNITS = {
        "ms": ("seconds", 0.001),
        "s": ("seconds", 1.0),
        "min": ("seconds", 60.0),
        "h": ("seconds", 3600.0),
        "kb": ("memory_mb", 1 / 1024),
        "mb": ("memory_mb", 1.0),
        "gb": ("memory_mb", 1024.0),
        "tb": ("memory_mb", 1024.0 * 1024),
        "c": ("output_chars", 1),
        "chars": ("output_chars", 1),
        "k": ("output_chars", 1_000),
        "kchars": ("output_chars", 1_000),
        "m": ("output_chars", 1_000_000),
        "mchars": ("output_chars", 1_000_000),
        "g": ("output_chars", 1_000_000_000),
    }
    _PART = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]+)\s*")

    @classmethod
    def parse(cls, text: str) -> Budget:
        """A budget from a flag: comma-separated parts in any order, each a number and a unit; parts left
        out keep their defaults. Time: ``ms``, ``s``, ``min``, ``h``; memory: ``KB``, ``MB``, ``GB``, ``TB``
        (binary: 1GB = 1024MB); output characters: ``k``, ``M``, ``G`` or ``chars``.

        >>> Budget.parse("5s")
        Budget(seconds=5.0, memory_mb=4096, output_chars=10000000)
        >>> Budget.parse("2min, 512MB, 500k")
        Budget(seconds=120.0, memory_mb=512, output_chars=500000)
        >>> Budget.parse("30")
        Traceback (most recent call last):
        ...
        ValueError: budget '30': part '30' has no unit; write a time (30s, 500ms, 2min), a memory size (512MB, 2GB) or a number of output characters (500k, 10M)
        """
        example = (
            "write a time (30s, 500ms, 2min), a memory size (512MB, 2GB) or a number of output characters (500k, 10M)"
        )
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"budget {text!r} is empty; {example}")
        values: dict[str, float] = {}
        for part in text.split(","):
            m = cls._PART.fullmatch(part)
            if m is None:
                bare = part.strip()
                if re.fullmatch(r"\d+(?:\.\d*)?", bare):
                    raise ValueError(f"budget {text!r}: part {bare!r} has no unit; {example}")
                raise ValueError(f"budget {text!r}: cannot read {bare!r}; {example}")
            number, unit = float(m.group(1)), m.group(2)
            key = unit.lower()  # "M" and "m" are characters, "MB" memory, "ms" and "min" time
            if key not in cls._UNITS:
                raise ValueError(f"budget {text!r}: unknown unit {unit!r} in {part.strip()!r}; {example}")
            name, scale = cls._UNITS[key]
            if name in values:
                raise ValueError(f"budget {text!r}: {name} given twice; {example}")
            if number <= 0:
                raise ValueError(f"budget {text!r}: {part.strip()!r} must be more than zero; {example}")
            values[name] = number * scale
        kwargs: dict[str, Any] = {}
        if "seconds" in values:
            kwargs["seconds"] = float(values["seconds"])
        if "memory_mb" in values:
            kwargs["memory_mb"] = max(1, int(round(values["memory_mb"])))
        if "output_chars" in values:
            kwargs["output_chars"] = max(1, int(values["output_chars"]))
        return cls(**kwargs)

    def __str__(self) -> str:
        return f"{_fmt_seconds(self.seconds)},{_fmt_mb(self.memory_mb)},{_fmt_chars(self.output_chars)}"

    def describe(self, what: str) -> str:
        """One limit in words: ``describe("seconds")`` -> ``'60 s of wall time'``."""
        if what == "seconds":
            return f"{_fmt_seconds(self.seconds).removesuffix('s')} s of wall time"
        if what == "memory_mb":
            return f"{self.memory_mb:,} MB of memory"
        return f"{self.output_chars:,} characters of output"


def _fmt_seconds(s: float) -> str:
    return f"{s:g}s"


def _fmt_mb(mb: int) -> str:
    return f"{mb // 1024}GB" if mb % 1024 == 0 else f"{mb}MB"


def _fmt_chars(n: int) -> str:
    for unit, scale in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}chars"


#: the budget of a check of a template tmpl did not ship (see the module docstring for the measurements)
DEFAULT_BUDGET = Budget()


# -- the worker side -----------------------------------------------------------------------------

_IN_WORKER = False


def in_worker() -> bool:
    """Whether this process is a budgeted worker (jobs started inside one run inline: the limits hold)."""
    return _IN_WORKER


class _Exceeded(BaseException):
    """Raised in a worker by a hook; a ``BaseException`` so that no ``except Exception`` on the way
    (Jinja, transformers, tmpl's renderer) turns it into an ordinary render failure."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(what, detail)
        self.what = what
        self.detail = detail


@dataclass
class _Limits:
    budget: Budget
    max_render: int = 0  # the longest render seen (for measurements)


_LIMITS: _Limits | None = None


def _charge(size: int, what: str) -> None:
    assert _LIMITS is not None
    if size > _LIMITS.budget.output_chars:
        raise _Exceeded("output_chars", f"{what} of {size:,} items")


def _sized(x: Any) -> bool:
    return isinstance(x, (str, list, tuple))


def _call_binop(self: Any, _context: Any, operator: str, left: Any, right: Any) -> Any:
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if _sized(seq) and isinstance(n, int) and not isinstance(n, bool):
                _charge(len(seq) * max(n, 0), "a value built by '*'")
    elif operator == "+" and _sized(left) and _sized(right):
        _charge(len(left) + len(right), "a value built by '+'")
    elif operator == "**" and isinstance(left, (int, float)) and isinstance(right, (int, float)):
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            _charge(int(right * math.log10(abs(left))), "a number built by '**' (digits)")
    return self.binop_table[operator](left, right)


def _bounded_concat(parts: Iterable[str]) -> str:
    assert _LIMITS is not None
    limit, total, out = _LIMITS.budget.output_chars, 0, []
    try:
        for part in parts:
            total += len(part)
            if total > limit:
                raise _Exceeded("output_chars", f"a render longer than {limit:,} characters")
            out.append(part)
        text = "".join(out)
    except MemoryError:
        raise _Exceeded("memory_mb", "a render ran out of memory") from None
    _LIMITS.max_render = max(_LIMITS.max_render, total)
    return text


def _install_hooks(budget: Budget) -> None:
    """Jinja hooks for this (worker) process only: sized binary operators, counted output."""
    global _LIMITS
    _LIMITS = _Limits(budget)
    from jinja2.sandbox import SandboxedEnvironment

    SandboxedEnvironment.intercepted_binops = frozenset({"*", "+", "**"})
    SandboxedEnvironment.call_binop = _call_binop  # type: ignore[method-assign, assignment]
    SandboxedEnvironment.concat = staticmethod(_bounded_concat)
    try:  # templates compiled before the fork lack the hooks: only the shipped ones are taken from there
        from transformers.utils import chat_template_utils as ctu

        inherited, trusted = ctu._compile_jinja_template, _TRUSTED
        fresh = functools.lru_cache(maxsize=64)(ctu._cached_compile_jinja_template)

        def compile_template(text: str) -> Any:
            return inherited(text) if text in trusted else fresh(text)

        ctu._compile_jinja_template = compile_template  # type: ignore[assignment]
    except (ImportError, AttributeError):  # pragma: no cover - another transformers layout
        pass
    from ..errors import TemplateRenderError
    from ..render import Renderer

    text = Renderer.text

    def budgeted_text(self: Renderer, *args: Any, **kwargs: Any) -> str:
        try:
            return text(self, *args, **kwargs)
        except TemplateRenderError as exc:  # a MemoryError while compiling or rendering
            if isinstance(exc.__cause__, MemoryError):
                raise _Exceeded("memory_mb", "a render ran out of memory") from None
            raise

    Renderer.text = budgeted_text  # type: ignore[method-assign]


_TRUSTED: frozenset[str] = frozenset()


def _import_hooked_modules() -> None:
    """Once, in the parent: import what the hooks patch and compile the templates tmpl ships (trusted:
    workers use them as compiled here, without hooks), so that no worker pays for either."""
    global _TRUSTED
    if _TRUSTED:
        return
    import jinja2.sandbox  # noqa: F401

    from .. import render, templates  # noqa: F401

    texts = frozenset(templates.load(info.name) for info in templates.available())
    try:
        from transformers.utils import chat_template_utils as ctu

        for text in texts:
            ctu._compile_jinja_template(text)
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass
    _TRUSTED = texts


def _vm_kb(field_name: str) -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:  # pragma: no cover - not Linux
        pass
    return 0


def _set_limits(budget: Budget) -> int:
    """RLIMIT_AS (the address space now plus ``memory_mb``) and RLIMIT_CPU (a backstop); returns the
    address space at the start, in kB."""
    start_kb = _vm_kb("VmSize")
    if start_kb:
        cap = start_kb * 1024 + budget.memory_mb * _MB
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    cpu = int(math.ceil(budget.seconds)) + 5
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    used = int(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]))
    if hard == resource.RLIM_INFINITY or used + cpu <= hard:
        resource.setrlimit(resource.RLIMIT_CPU, (used + cpu, hard))
    return start_kb


def _encode_error(exc: BaseException) -> tuple[Any, ...]:
    """An exception as its class, args and attributes (exceptions with their own ``__init__`` do not
    survive plain pickling), or a description when those cannot be pickled."""
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    try:
        payload = (type(exc), exc.args, dict(vars(exc)))
        pickle.loads(pickle.dumps(payload))
        return ("error", payload, text)
    except Exception:  # noqa: BLE001 - whatever does not pickle is sent as text
        return ("error", None, text)


def _decode_error(payload: Any, text: str) -> BaseException:
    if payload is not None:
        cls, args, attrs = payload
        try:
            exc = cls.__new__(cls, *args)
            exc.args = args
            exc.__dict__.update(attrs)
            return exc  # type: ignore[no-any-return]
        except Exception:  # noqa: BLE001 - fall back to the text
            pass
    return RuntimeError(f"in the budgeted worker: {text}")


_FRAME = struct.Struct("<Q")
_STEAL_MIN = 4  # a worker takes items of a group another worker has loaded when this many wait
_STUCK_S = 1.0  # ... or when that worker has been on one job this long (a check takes 0.2 s, median)
_RESPONSE_FD = -1


def progress(value: Any) -> None:
    """In a worker, send ``value`` to the parent at once (``Outcome.info``: what is known about the job
    so far, e.g. the template's name and fingerprint once loaded); elsewhere, do nothing."""
    if _IN_WORKER and _RESPONSE_FD >= 0:
        _send(_RESPONSE_FD, ("info", value))


def _send(fd: int, message: Any) -> None:
    try:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - a value that does not pickle
        data = pickle.dumps(("done", ("error", None, f"the job's result cannot be sent back: {exc!r}"), {}))
    view = memoryview(_FRAME.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _run_one(task: Callable[[int], Any], index: int, budget: Budget) -> tuple[Any, dict[str, float]]:
    assert _LIMITS is not None
    start = time.perf_counter()
    start_kb = _set_limits(budget)
    _LIMITS.max_render = 0
    try:
        message: tuple[Any, ...] = ("ok", task(index))
    except _Exceeded as exc:
        message = ("exceeded", exc.what, exc.detail)
    except MemoryError:
        message = ("exceeded", "memory_mb", "an allocation failed")
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        message = _encode_error(exc)
    stats = {
        "seconds": time.perf_counter() - start,
        "memory_mb": max(0, _vm_kb("VmPeak") - start_kb) / 1024,
        "max_render_chars": _LIMITS.max_render,
    }
    return message, stats


def _serve(requests: int, responses: int, task: Callable[[int], Any], budget: Budget) -> None:
    """A worker's life: run ``task(index)`` for each index read from ``requests``, one at a time."""
    global _IN_WORKER, _RESPONSE_FD
    status = 1
    try:
        gc.freeze()  # the collector leaves inherited objects alone: no copy-on-write of the whole heap
        _IN_WORKER, _RESPONSE_FD = True, responses
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        _install_hooks(budget)
        while True:
            raw = os.read(requests, 4)
            if len(raw) < 4:
                break
            message, stats = _run_one(task, struct.unpack("<I", raw)[0], budget)
            try:
                _send(responses, ("done", message, stats))
            except MemoryError:
                _send(responses, ("done", ("exceeded", "memory_mb", "the result ran out of memory"), stats))
            if message[0] == "exceeded":
                break  # a fresh worker for the next job: this one may have run out of memory half-way
        status = 0
    except BaseException:  # noqa: BLE001 - never run the parent's code after this point
        status = 1
    finally:
        os._exit(status)


# -- the parent side -----------------------------------------------------------------------------


@dataclass
class Outcome(Generic[T]):
    """How a job ended: ``value`` or ``error`` (a :class:`~tmpl.errors.BudgetExceededError` among
    others), what the job sent with :func:`progress` (``info``), and what the worker measured
    (``seconds``, ``memory_mb`` of address space added, ``max_render_chars``; empty when killed)."""

    value: T | None = None
    error: BaseException | None = None
    stats: dict[str, float] = field(default_factory=dict)
    info: Any = None

    def get(self) -> T:
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


class Worker:
    """A forked worker process running ``task(index)`` for the indexes it is given, one at a time, each
    under ``budget``; the parent keeps the deadline and kills the worker when it passes."""

    def __init__(self, task: Callable[[int], Any], budget: Budget) -> None:
        _import_hooked_modules()
        self.budget = budget
        for stream in (sys.stdout, sys.stderr):  # or the child would print the parent's buffered text again
            try:
                stream.flush()
            except (AttributeError, ValueError, OSError):
                pass
        req_read, req_write = os.pipe()
        resp_read, resp_write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the worker (coverage does not follow it)
            os.close(req_write)
            os.close(resp_read)
            _serve(req_read, resp_write, task, budget)
        os.close(req_read)
        os.close(resp_write)
        self.pid, self.requests, self.responses = pid, req_write, resp_read
        self.alive = True
        self.groups: set[Any] = set()
        self.index: int | None = None
        self.name = ""
        self.started = self.deadline = math.inf
        self._buffer = bytearray()
        self._info: Any = None

    def fileno(self) -> int:
        return self.responses

    def submit(self, index: int, name: str) -> None:
        """Start job ``index`` (named ``name`` in errors); its deadline starts now."""
        self.index, self.name, self._info = index, name, None
        self.started = time.monotonic()
        self.deadline = self.started + self.budget.seconds
        os.write(self.requests, struct.pack("<I", index))

    def read(self) -> Outcome[Any] | None:
        """Read what the worker sent; the job's outcome once it is done (or the worker died), else None."""
        chunk = os.read(self.responses, 1 << 16)
        if not chunk:
            return self._end(self._died(self._reap()))
        self._buffer += chunk
        while len(self._buffer) >= _FRAME.size:
            (size,) = _FRAME.unpack_from(self._buffer)
            if len(self._buffer) < _FRAME.size + size:
                break
            message = pickle.loads(bytes(self._buffer[_FRAME.size : _FRAME.size + size]))
            del self._buffer[: _FRAME.size + size]
            if message[0] == "info":
                self._info = message[1]
                continue
            return self._end(self._decode(message[1], message[2]))
        return None

    def expire(self) -> Outcome[Any]:
        """The job's deadline passed: kill the worker; the wall-time outcome."""
        self.close()
        error = BudgetExceededError(
            self.name, "seconds", self.budget.describe("seconds"), "the check did not finish in time"
        )
        return self._end(Outcome(error=error))

    def close(self) -> None:
        """End the worker (at once: it holds nothing worth a clean exit)."""
        if self.alive:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:  # pragma: no cover - it just ended
                pass
            self._reap()

    def _reap(self) -> int:
        status = 0
        if self.alive:
            self.alive = False
            _, status = os.waitpid(self.pid, 0)
            os.close(self.requests)
            os.close(self.responses)
        return status

    def _end(self, outcome: Outcome[Any]) -> Outcome[Any]:
        outcome.info = self._info
        self.index, self.deadline = None, math.inf
        if isinstance(outcome.error, BudgetExceededError) or worker_crashed(outcome.error):
            self.close()  # the worker ends itself after a budget runs out; make sure
        return outcome

    def _decode(self, message: tuple[Any, ...], stats: dict[str, float]) -> Outcome[Any]:
        kind = message[0]
        if kind == "ok":
            return Outcome(value=message[1], stats=stats)
        if kind == "exceeded":
            error = BudgetExceededError(self.name, message[1], self.budget.describe(message[1]), message[2])
            return Outcome(error=error, stats=stats)
        return Outcome(error=_decode_error(message[1], message[2]), stats=stats)

    def _died(self, status: int) -> Outcome[Any]:
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            if sig == signal.SIGXCPU:
                return Outcome(
                    error=BudgetExceededError(self.name, "seconds", self.budget.describe("seconds"), "CPU time ran out")
                )
            if sig in (signal.SIGABRT, signal.SIGKILL):  # a native allocation failing under RLIMIT_AS aborts
                detail = f"the worker was ended by {name} (a native library out of memory)"
                return Outcome(
                    error=BudgetExceededError(self.name, "memory_mb", self.budget.describe("memory_mb"), detail)
                )
            return Outcome(
                error=_crashed(self.name, f"the worker checking it was ended by {name} (a crash in native code)")
            )
        return Outcome(error=_crashed(self.name, f"the worker checking it exited with status {os.WEXITSTATUS(status)}"))


def _crashed(name: str, reason: str) -> TemplateError:
    error = TemplateError(name, reason)
    error.worker_crashed = True  # type: ignore[attr-defined]
    return error


def worker_crashed(error: BaseException | None) -> bool:
    """Whether ``error`` says that a budgeted worker died without an answer (a crash in native code)."""
    return bool(getattr(error, "worker_crashed", False))


def _wait(busy: list[Worker], wake: float = math.inf) -> list[tuple[int, Outcome[Any]]]:
    """Block until some jobs are done or past their deadline, or until ``wake`` (``time.monotonic()``);
    return the indexes and outcomes of the jobs done."""
    done: list[tuple[int, Outcome[Any]]] = []
    while not done:
        now = time.monotonic()
        if now >= wake:
            break
        for worker in busy:
            if worker.deadline <= now and worker.index is not None:
                index = worker.index
                done.append((index, worker.expire()))
        if done:
            break
        timeout = max(0.0, min(min(w.deadline for w in busy), wake) - now)
        ready, _, _ = select.select(busy, [], [], timeout)
        for worker in ready:
            started = worker.index
            outcome = worker.read()
            if outcome is not None and started is not None:
                done.append((started, outcome))
    return done


def run_budgeted(fn: Callable[..., T], *args: Any, budget: Budget | None = None, name: str = "job", **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a forked worker under ``budget`` (default :data:`DEFAULT_BUDGET`).

    The value comes back pickled (so it must pickle); an exception raised by ``fn`` is raised here;
    a budget that runs out raises :class:`~tmpl.errors.BudgetExceededError` naming ``name`` (the
    template). Inside a worker, ``fn`` simply runs (the worker's limits already hold).

    >>> run_budgeted(sum, [1, 2, 3], budget=Budget(seconds=5))
    6
    """
    if _IN_WORKER:
        return fn(*args, **kwargs)
    return run_job(fn, *args, budget=budget, name=name, **kwargs).get()  # type: ignore[no-any-return]


def run_job(
    fn: Callable[..., Any], *args: Any, budget: Budget | None = None, name: str = "job", **kwargs: Any
) -> Outcome[Any]:
    """Like :func:`run_budgeted`, but returns the :class:`Outcome` (with the worker's measurements)."""
    worker = Worker(lambda _: fn(*args, **kwargs), budget or DEFAULT_BUDGET)
    try:
        worker.submit(0, name)
        return _wait([worker])[0][1]
    finally:
        worker.close()


def imap_budgeted(
    items: Sequence[I],
    work: Callable[[I], Any],
    *,
    budget: Budget | None = None,
    name: Callable[[I], str] = str,
    group: Callable[[I], Hashable] | None = None,
    workers: int = 2,
) -> Iterator[tuple[int, I, Outcome[Any]]]:
    """``work(item)`` for each item in budgeted workers, ``workers`` at a time; ``(index, item, outcome)``
    yielded as each finishes. One item that hangs or fails never holds up the others beyond its budget.

    A worker serves many items in turn (what it loads, a tokenizer, stays loaded for the next; each
    item gets the whole budget, memory counted from where the item starts); one that ran out of budget
    or crashed is replaced. With ``group``, a free worker takes the next item of a group it has served
    first (items sharing a tokenizer go to the worker that loaded it).
    """
    budget = budget or DEFAULT_BUDGET
    pending = list(range(len(items)))
    pool: list[Worker] = []

    def task(index: int) -> Any:
        return work(items[index])

    def pick(mine: set[Hashable], others: set[Hashable], stuck: set[Hashable]) -> int | None:
        """The next item for an idle worker that has loaded the groups ``mine``: one of those; else one of
        a group no other worker has; else one of the group with the most items waiting, when at least
        ``_STEAL_MIN`` wait (loading a tokenizer twice costs more than waiting for a few templates); else
        one of a group held only by workers ``stuck`` on a slow job (a template running out of its
        budget holds up nothing for longer than ``_STUCK_S``)."""
        if group is None:
            return pending.pop(0) if pending else None
        for rule in (mine.__contains__, lambda g: g not in others):
            for at, index in enumerate(pending):
                if rule(group(items[index])):
                    return pending.pop(at)
        waiting: dict[Hashable, int] = {}
        for index in pending:
            waiting[group(items[index])] = waiting.get(group(items[index]), 0) + 1
        biggest = max(waiting, key=waiting.__getitem__, default=None)
        if biggest is not None and waiting[biggest] >= _STEAL_MIN:
            return pick({biggest}, set(), set())
        if stuck:
            return pick(set(), others - stuck, set())
        return None

    try:
        while True:
            pool = [w for w in pool if w.alive]
            now = time.monotonic()
            slots: list[Worker | None] = [w for w in pool if w.index is None]
            slots += [None] * (max(1, workers) - len(pool))
            for worker in slots:
                mine = worker.groups if worker is not None else set()
                held = [w for w in pool if w is not worker]
                others: set[Hashable] = set().union(*(w.groups for w in held))
                free = set().union(*(w.groups for w in held if w.index is None or now - w.started < _STUCK_S))
                index = pick(mine, others, others - free)
                if index is None:
                    continue
                if worker is None:
                    worker = Worker(task, budget)
                    pool.append(worker)
                if group is not None:
                    worker.groups.add(group(items[index]))
                worker.submit(index, name(items[index]))
            busy = [w for w in pool if w.index is not None]
            if not busy:
                return
            idle = any(w.index is None for w in pool) or len(pool) < workers
            later = [w.started + _STUCK_S for w in busy if w.started + _STUCK_S > time.monotonic()]
            wake = min(later) if pending and idle and later else math.inf  # when a busy worker counts as stuck
            for index, outcome in _wait(busy, wake):
                yield index, items[index], outcome
    finally:
        for worker in pool:
            worker.close()
