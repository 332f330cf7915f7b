"""``HarnessRollout``: one harness run per sample, from the trainer's prompt to its training rows.

For each task, ``n`` runs (a GRPO group), at most ``concurrency`` at once; each run

1. opens a fresh gateway session (``<task id>-<sample>-<uuid>``) and lays the task's files into a fresh
   working directory (with a throwaway ``HOME`` beside it) under a temporary root;
2. renders the :class:`~tmpl.harness.Harness` (its ``{base_url}`` the session's), writes its files, runs
   its ``setup``, then starts it under a keeper (:mod:`.keeper`, forked from one keeper server per batch:
   :class:`~.process.KeeperServer`): past its ``timeout`` the harness's
   whole process tree is killed, a daemon it forked included; when it exits by itself, whatever it left
   running is killed too;
3. reads the session's episode, runs the task's verifier (:mod:`.verifier`) for the reward, sets it on the
   episode, and finishes the session (its episode taken now, so memory holds only finished runs' results);
4. removes the run's directory (``keep_workdirs=True`` keeps it: ``result.workdir``).

Each phase's seconds go into ``result.timings``: ``open`` (the session's key, the gateway told to watch
it), ``setup`` (directories, the task's files, the harness rendered and its files written, its ``setup``
command), ``start`` (until its keeper runs), ``harness`` (the harness's own time: the keeper's start
of it to its exit), ``kill`` (from its exit, or its timeout, to its whole tree reaped), ``verifier``,
``finish`` (its output's tails, its episode read, the reward set, the session finished) and ``cleanup``
(its directory removed). Filesystem work (the files laid out, the sandbox's command line, the
directory's removal) runs on a thread pool of the rollout's own (``concurrency`` threads, at most the
cores and 4): never on the event loop, which serves the gateway, nor on the loop's default pool,
which an engine's calls (``asyncio.to_thread``) may hold.

Each run ends as a :class:`~tmpl.harness.result.HarnessResult` with a status (``HARNESS_DONE``,
``HARNESS_TIMEOUT``, ``HARNESS_EXITED``, ``CALLS_REFUSED``, ``NO_CALLS``, ``VERIFIER_FAILED``,
``SETUP_FAILED``, ``GATEWAY_FAILED``): one run's failure never touches another's.

``gateway``: a :class:`~tmpl.gateway.Gateway` (served here, on 127.0.0.1, by uvicorn on the rollout's
event loop: :mod:`.server`) or the URL of one (``tmpl serve``; its trainer routes are used:
:mod:`.gateways`). ``isolation="sandbox"`` starts each harness in bubblewrap with only the gateway
reachable (:func:`tmpl.tools.sandbox.wrap_command`).

>>> rollout = HarnessRollout(harness, gateway, n=4, concurrency=8)                         # doctest: +SKIP
>>> results = rollout.run([HarnessTask("Fix the failing test", files="repo/", verifier=CommandVerifier("pytest -q"))])  # doctest: +SKIP
>>> batch = tmpl.collate([row for r in results for row in r.rows()], pad_id=0)             # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import HarnessError, HarnessTaskError, HarnessVerifierError, TmplError
from .gateways import Local, Remote
from .process import KeeperPool, KeeperServer, run_kept, tail
from .result import (
    CALLS_REFUSED,
    GATEWAY_FAILED,
    HARNESS_DONE,
    HARNESS_EXITED,
    HARNESS_TIMEOUT,
    NO_CALLS,
    SETUP_FAILED,
    VERIFIER_FAILED,
    HarnessResult,
)
from .spec import Harness, RenderedRun
from .task import HarnessTask
from .verifier import verify

__all__ = ["GATEWAY_FAILED", "HarnessRollout"]

#: the port a sandboxed harness reaches the gateway on (inside its own network namespace), when the
#: gateway's own port is a privileged one
SANDBOX_PORT = 8100

ISOLATIONS = ("process", "sandbox")
#: the most threads a rollout's pool has, past ``concurrency``: the cores and 4, as asyncio's own pool
#: (filesystem work is short calls between which a thread needs the GIL, which the event loop serving the
#: gateway needs too: 32 threads at concurrency 32 on 2 cores made the setup's p95 seconds, not ms)
MAX_THREADS = (os.cpu_count() or 1) + 4
#: runs at once per keeper server (:class:`~.process.KeeperPool`: one server forks one keeper at a time,
#: with one process's share of a busy machine), and the most servers a batch starts
RUNS_PER_KEEPER_SERVER = 8
MAX_KEEPER_SERVERS = 8
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class _Inside:
    """How a sandboxed harness reaches the gateway: the relay's Unix socket, the port it is forwarded
    to inside the sandbox, and the gateway's root URL there."""

    socket: str
    port: int
    url: str


class HarnessRollout:
    """Run ``harness`` once per sample through ``gateway`` (see the module docstring).

    - ``n``: runs per task (a group); ``concurrency``: runs at once; ``progress``: a tqdm bar on stderr;
    - ``isolation``: ``"process"`` (a keeper per run) or ``"sandbox"`` (bubblewrap, the gateway alone
      reachable); ``keep_workdirs``: keep each run's directory (its path in ``result.workdir``);
    - ``verifier_timeout``: seconds a callable verifier may take; ``tail_chars``: how much of the
      harness's stdout and stderr a result keeps; ``env``: variables added to every harness's
      environment (it inherits this process's, ``HOME`` replaced by the run's own);
    - ``model``: the model name harnesses are given (default: the gateway's); ``admin_token``: the
      gateway's, for its trainer routes; ``root``: where run directories go (default: the system's
      temporary directory).
    """

    def __init__(
        self,
        harness: Harness,
        gateway: Any,
        *,
        n: int = 1,
        concurrency: int = 8,
        isolation: str = "process",
        progress: bool = True,
        keep_workdirs: bool = False,
        verifier_timeout: float = 300.0,
        tail_chars: int = 4000,
        env: Mapping[str, str] | None = None,
        model: str | None = None,
        admin_token: str | None = None,
        root: str | os.PathLike[str] | None = None,
        sandbox: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(harness, Harness):
            raise HarnessError(
                repr(harness)[:60], f"harness must be a tmpl.harness.Harness, not {type(harness).__name__}"
            )
        if isolation not in ISOLATIONS:
            raise HarnessError(harness.name, f"isolation must be one of {', '.join(ISOLATIONS)}, not {isolation!r}")
        if n < 1 or concurrency < 1:
            raise HarnessError(harness.name, f"n and concurrency must be at least 1, not {n} and {concurrency}")
        if not isinstance(gateway, str) and not hasattr(gateway, "finish"):
            raise HarnessError(harness.name, f"gateway must be a tmpl.gateway.Gateway or a URL, not {gateway!r}")
        self.harness = harness
        self.gateway = gateway
        self.n = n
        self.concurrency = concurrency
        self.isolation = isolation
        self.progress = progress
        self.keep_workdirs = keep_workdirs
        self.verifier_timeout = verifier_timeout
        self.tail_chars = tail_chars
        self.env = dict(env or {})
        self.model = model
        self.admin_token = admin_token
        self.root = root
        self.sandbox = dict(sandbox or {})
        unknown = sorted(set(self.sandbox) - {"read_only", "scratch_mb", "max_processes"})
        if unknown:
            raise HarnessError(harness.name, f"sandbox options are read_only, scratch_mb, max_processes; not {unknown}")

    # -- the batch ---------------------------------------------------------------------------------
    def run(self, tasks: Iterable[HarnessTask | str]) -> list[HarnessResult]:
        """Every task's ``n`` runs; results task by task, each task's group in order. From inside a
        running event loop, the runs go on a thread of their own (await :meth:`arun` instead)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.arun(tasks))
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["out"] = asyncio.run(self.arun(tasks))
            except BaseException as exc:  # noqa: BLE001 - raised again on the caller's thread
                box["exc"] = exc

        thread = threading.Thread(target=work, name="tmpl-harness-rollout")
        thread.start()
        thread.join()
        if "exc" in box:
            raise box["exc"]
        return box["out"]  # type: ignore[no-any-return]

    async def arun(self, tasks: Iterable[HarnessTask | str]) -> list[HarnessResult]:
        """The async twin of :meth:`run` (the gateway, when in-process, is served on this loop meanwhile)."""
        batch = [self._task(t, k) for k, t in enumerate(tasks)]
        root = Path(tempfile.mkdtemp(prefix="tmpl-runs-", dir=self.root))
        bar = self._bar(len(batch) * self.n)
        counts: Counter[str] = Counter()
        slots = asyncio.Semaphore(self.concurrency)
        threads = concurrent.futures.ThreadPoolExecutor(min(self.concurrency, MAX_THREADS), "tmpl-harness")
        pool = functools.partial(asyncio.get_running_loop().run_in_executor, threads)
        try:
            # the keeper server first: its interpreter starts on another core while uvicorn starts here
            async with _keepers(self.concurrency) as keepers, self._gateway() as gw, self._relay(gw) as relay:
                gw.inside = relay  # per batch: one rollout may run several batches at once
                gw.keepers = keepers

                async def one(task: HarnessTask, sample: int) -> HarnessResult:
                    async with slots:
                        result = await self._run_one(gw, task, sample, root, pool)
                    counts[result.status] += 1
                    if bar is not None:
                        bar.set_postfix_str(" ".join(f"{k}={v}" for k, v in sorted(counts.items())), refresh=False)
                        bar.update(1)
                    return result

                return list(await asyncio.gather(*(one(t, s) for t in batch for s in range(self.n))))
        finally:
            if bar is not None:
                bar.close()
            if not self.keep_workdirs:
                await pool(shutil.rmtree, root, True)
            threads.shutdown(wait=False)

    def _task(self, task: HarnessTask | str, index: int) -> HarnessTask:
        if isinstance(task, str):
            return HarnessTask(task, id=f"task{index}")
        if not isinstance(task, HarnessTask):
            raise HarnessTaskError(
                f"task{index}", f"a task is a HarnessTask or a prompt string, not {type(task).__name__}"
            )
        if task.id is None:
            return HarnessTask(task.prompt, task.files, task.verifier, id=f"task{index}", timeout=task.timeout)
        return task

    def _gateway(self) -> Any:
        if isinstance(self.gateway, str):
            return Remote(self.gateway, model=self.model, admin_token=self.admin_token)
        local = Local(self.gateway, admin_token=self.admin_token)
        if self.model:
            local.model = self.model
        return local

    @contextlib.asynccontextmanager
    async def _relay(self, gw: Any) -> AsyncIterator[_Inside | None]:
        """With ``isolation="sandbox"``: a Unix socket on the host relaying to the gateway (bound into
        each sandbox, whose PID 1 forwards ``127.0.0.1:<port>`` inside to it); else nothing."""
        if self.isolation != "sandbox":
            yield None
            return
        from ..tools.sandbox import GatewayRelay

        url = urllib.parse.urlsplit(gw.url)
        port = url.port or (443 if url.scheme == "https" else 80)
        inner = port if port >= 1024 else SANDBOX_PORT
        relay = GatewayRelay(url.hostname or "127.0.0.1", port)
        try:
            yield _Inside(relay.path, inner, f"http://127.0.0.1:{inner}{url.path.rstrip('/')}")
        finally:
            relay.close()

    def _bar(self, total: int) -> Any:
        if not self.progress:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=f"harness {self.harness.name}", unit="run", file=sys.stderr)

    # -- one run -----------------------------------------------------------------------------------
    async def _run_one(self, gw: Any, task: HarnessTask, sample: int, root: Path, pool: Any) -> HarnessResult:
        """One run (``pool``: ``run_in_executor`` on the rollout's threads)."""
        began = time.perf_counter()
        key = f"{_UNSAFE.sub('_', str(task.id))[:80]}-{sample}-{uuid.uuid4().hex[:16]}"
        result = HarnessResult(
            status=HARNESS_DONE, session=key, task_id=str(task.id), sample=sample, harness=self.harness.name
        )
        run_dir = root / key
        workdir, home = run_dir / "work", run_dir / "home"
        reasons: list[str] = []
        timeout = task.timeout if task.timeout is not None else self.harness.timeout
        gw.watch(key)
        result.timings["open"] = time.perf_counter() - began
        try:
            t0 = time.perf_counter()
            try:
                rendered = await pool(self._prepare, task, key, workdir, home, gw)
                setup_failed = await self._setup(rendered, workdir, run_dir, timeout, gw)
            except (HarnessError, OSError) as exc:
                setup_failed = str(exc)
            if setup_failed is not None:
                result.timings["setup"] = time.perf_counter() - t0
                result.status, result.error = SETUP_FAILED, setup_failed
                with contextlib.suppress(Exception):
                    await gw.finish(key)
                return result

            try:
                if gw.inside is None:  # a dict merged: cheaper here than a thread's hop
                    argv, env = self._command(rendered.argv, rendered, workdir, home, gw)
                else:  # the sandbox's command line: paths checked, bwrap probed
                    argv, env = await pool(self._command, rendered.argv, rendered, workdir, home, gw)
                result.timings["setup"] = time.perf_counter() - t0
                ran = await run_kept(
                    argv,
                    cwd=workdir,
                    env=env,
                    timeout=timeout,
                    out=run_dir / "stdout",
                    err=run_dir / "stderr",
                    server=gw.keepers,
                )
            except (OSError, TmplError) as exc:
                result.status, result.error = SETUP_FAILED, f"the harness could not start: {exc}"
                with contextlib.suppress(Exception):
                    await gw.finish(key)
                return result
            result.timings["start"] = ran.start
            result.timings["harness"] = ran.seconds - ran.start - ran.kill
            result.timings["kill"] = ran.kill
            t0 = time.perf_counter()
            result.exit_code = ran.exit_code
            result.stdout_tail = tail(run_dir / "stdout", self.tail_chars)
            result.stderr_tail = tail(run_dir / "stderr", self.tail_chars)
            if ran.timed_out:
                reasons.append(f"it ran past its timeout of {timeout:g} s: its process tree was killed")
            elif ran.exit_code != 0:
                reasons.append(_exited(ran.exit_code))

            try:
                episode = await gw.episode(key)
            except Exception as exc:  # noqa: BLE001 - the gateway's failure (HTTP, a route's error): named
                return self._gateway_failed(result, reasons, "reading its episode", exc)
            result.refused = gw.refused(key)
            if result.refused:
                reasons.append(f"the gateway refused {len(result.refused)} of its calls ({result.refused[0]})")
            calls = len(episode.calls) if episode is not None else 0
            if calls == 0:
                reasons.append("it made no model call the gateway recorded")
            verifier_failed = False
            if calls and task.verifier is not None:
                t1 = time.perf_counter()
                try:
                    result.reward = await verify(
                        task.verifier, workdir, episode, self.verifier_timeout, server=gw.keepers, logs=run_dir
                    )
                except HarnessVerifierError as exc:
                    verifier_failed = True
                    reasons.append(str(exc))
                result.timings["verifier"] = time.perf_counter() - t1
                if result.reward is not None:
                    try:
                        await gw.reward(key, result.reward)
                    except Exception as exc:  # noqa: BLE001 - the gateway's failure: named
                        return self._gateway_failed(result, reasons, "setting its reward", exc)
            try:
                finished = await gw.finish(key)
            except Exception as exc:  # noqa: BLE001 - the gateway's failure (HTTP, a route's error): named
                return self._gateway_failed(result, reasons, "finishing its session", exc)
            if calls:
                result.episode = finished if finished is not None else episode
                result.calls = len(result.episode.calls) if result.episode is not None else calls
            result.timings["finish"] = time.perf_counter() - t0 - result.timings.get("verifier", 0.0)
            result.error = "; ".join(reasons)
            if ran.timed_out:
                result.status = HARNESS_TIMEOUT
            elif ran.exit_code != 0:
                result.status = HARNESS_EXITED
            elif result.refused:
                result.status = CALLS_REFUSED
            elif calls == 0:
                result.status = NO_CALLS
            elif verifier_failed:
                result.status = VERIFIER_FAILED
            return result
        finally:
            gw.refused(key)  # stop watching it, whatever happened
            t0 = time.perf_counter()
            if self.keep_workdirs:
                result.workdir = workdir
            else:
                await pool(shutil.rmtree, run_dir, True)
            result.timings["cleanup"] = time.perf_counter() - t0
            result.seconds = time.perf_counter() - began

    def _gateway_failed(
        self, result: HarnessResult, reasons: list[str], doing: str, exc: BaseException
    ) -> HarnessResult:
        reasons.append(f"the gateway failed {doing}: {type(exc).__name__}: {exc}")
        result.status, result.error = GATEWAY_FAILED, "; ".join(reasons)
        return result

    def _prepare(self, task: HarnessTask, key: str, workdir: Path, home: Path, gw: Any) -> RenderedRun:
        """The run's directories, the task's files laid out, the harness rendered and its files written."""
        workdir.mkdir(parents=True)
        home.mkdir()
        task.lay_out(workdir)
        rendered = self.harness.render(
            gateway=gw.inside.url if gw.inside else gw.url,
            session=key,
            task=task.prompt,
            workdir=str(workdir),
            home=str(home),
            model=gw.model,
        )
        for name, content in rendered.files.items():
            path = Path(name)
            target = path if path.is_absolute() else workdir / path
            if not _inside(target, home) and not _inside(target, workdir):
                raise HarnessError(
                    self.harness.name, f"its file {name!r} is neither under {{home}} nor in the working directory"
                )
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                target.write_bytes(content)
            else:
                target.write_text(content, encoding="utf-8")
        executable = rendered.argv[0]
        path_var = {**os.environ, **self.env, **rendered.env}.get("PATH")
        if os.sep not in executable and shutil.which(executable, path=path_var) is None:
            raise HarnessError(self.harness.name, f"the executable {executable!r} is not on PATH")
        return rendered

    async def _setup(self, rendered: RenderedRun, workdir: Path, run_dir: Path, timeout: float, gw: Any) -> str | None:
        """Run the harness's setup command; why it failed, or None."""
        if not rendered.setup:
            return None
        argv, env = self._command(rendered.setup, rendered, workdir, run_dir / "home", gw)
        ran = await run_kept(
            argv,
            cwd=workdir,
            env=env,
            timeout=timeout,
            out=run_dir / "setup.stdout",
            err=run_dir / "setup.stderr",
            server=gw.keepers,
        )
        if ran.timed_out:
            return f"its setup command did not finish within {timeout:g} s"
        if ran.exit_code != 0:
            said = tail(run_dir / "setup.stderr", 500).strip()
            return f"its setup command failed ({_exited(ran.exit_code)})" + (f": {said}" if said else "")
        return None

    def _command(
        self, argv: Sequence[str], rendered: RenderedRun, workdir: Path, home: Path, gw: Any
    ) -> tuple[list[str], dict[str, str] | None]:
        """The argv and environment that run ``argv`` for this run: as it is, its environment this
        process's with ``HOME`` the run's; or (sandbox) wrapped by :func:`tmpl.tools.sandbox.wrap_command`,
        its environment only the rollout's ``env`` and the harness's (SandboxError when it cannot be)."""
        if gw.inside is None:
            return list(argv), {**os.environ, "HOME": str(home), **self.env, **rendered.env}
        from ..tools.sandbox import wrap_command

        options = {k: v for k, v in self.sandbox.items() if k in ("read_only", "scratch_mb", "max_processes")}
        wrapped = wrap_command(
            list(argv),
            workdir=str(workdir),
            home=str(home),
            env={**self.env, **rendered.env, "HOME": str(home)},
            gateway_socket=gw.inside.socket,
            gateway_port=gw.inside.port,
            **options,
        )
        return wrapped, None


@contextlib.asynccontextmanager
async def _keepers(concurrency: int) -> AsyncIterator[KeeperServer | KeeperPool | None]:
    """The batch's keeper servers (each run's keeper forked warm from one of them): one per
    :data:`RUNS_PER_KEEPER_SERVER` runs at once, at most :data:`MAX_KEEPER_SERVERS`; or None when none
    can start (each keeper is then an interpreter of its own: slower, the same behaviour)."""
    size = min(MAX_KEEPER_SERVERS, -(-concurrency // RUNS_PER_KEEPER_SERVER))
    server = KeeperServer() if size <= 1 else KeeperPool(size)
    try:
        await server.__aenter__()
    except OSError:
        yield None
        return
    try:
        yield server
    finally:
        await server.__aexit__(None, None, None)


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True


def _exited(code: int) -> str:
    """How a process ended, in words (exit code, or the signal that killed it)."""
    if code >= 0:
        return f"it exited with code {code}"
    import signal

    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"it was killed by {name}"
