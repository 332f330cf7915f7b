"""Verifiers: the reward of a harness run, read from its working directory (and its episode) once it ended.

A verifier is either

- a :class:`CommandVerifier`: a command run in the working directory (the task's tests), under a keeper
  like the harness (a test that hangs is killed with every process it started). Exit 0 gives 1.0, any
  other exit 0.0; a command that wants a graded reward prints it as the **last line of its stdout**, a
  number alone (``0.75``), read when it exits 0. Past its timeout, or when it cannot be started, it gives
  no reward: the run's status is ``VERIFIER_FAILED``, the error says why;
- any callable ``(workdir: Path, episode: Episode) -> float`` (a coroutine function too). It runs on a
  thread of its own, bounded by the rollout's ``verifier_timeout``; one that raises, returns something
  that is not a finite number, or does not return in time gives ``VERIFIER_FAILED`` (a thread cannot be
  stopped: a hung function's thread is left behind, a daemon, and named in the error).

>>> import asyncio, tempfile
>>> d = Path(tempfile.mkdtemp()); _ = (d / "out.txt").write_text("42")
>>> asyncio.run(verify(CommandVerifier(["grep", "-q", "42", "out.txt"]), d, None, 30.0))
1.0
>>> asyncio.run(verify(CommandVerifier("echo 0.25"), d, None, 30.0))
0.25
>>> asyncio.run(verify(lambda workdir, episode: (workdir / "out.txt").read_text() == "42", d, None, 30.0))
1.0
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import numbers
import os
import shlex
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import HarnessVerifierError
from .process import KeeperPool, KeeperServer, run_kept, tail

__all__ = ["CommandVerifier", "verifier_name", "verify"]


class CommandVerifier:
    """A command run in the run's working directory: exit 0 -> 1.0 (or the number its stdout's last line
    holds), else 0.0. ``argv``: a sequence, or a string run by ``sh -c``; ``timeout``: seconds before its
    process tree is killed (the run then ``VERIFIER_FAILED``); ``env``: variables added to the
    environment it inherits.

    >>> CommandVerifier("pytest -q tests").argv
    ('sh', '-c', 'pytest -q tests')
    """

    def __init__(self, argv: Sequence[str] | str, timeout: float = 300.0, env: Mapping[str, str] | None = None) -> None:
        if isinstance(argv, str):
            argv = ("sh", "-c", argv)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise HarnessVerifierError(repr(argv), "argv must be a non-empty sequence of strings, or a string")
        if not timeout > 0:
            raise HarnessVerifierError(shlex.join(argv), f"timeout must be positive seconds, not {timeout!r}")
        self.argv = tuple(argv)
        self.timeout = float(timeout)
        self.env = dict(env or {})

    def __repr__(self) -> str:
        return f"CommandVerifier({shlex.join(self.argv)!r}, timeout={self.timeout:g})"

    async def __call__(self, workdir: Path, episode: Any = None) -> float:  # noqa: ARG002 - a verifier's signature
        return await self.run(workdir)

    async def run(
        self, workdir: Path, server: KeeperServer | KeeperPool | None = None, logs: Path | None = None
    ) -> float:
        """The reward (``server``: fork its keeper from this :class:`~.process.KeeperServer`; ``logs``: a
        directory for its output, ``verifier.stdout`` and ``verifier.stderr``: a temporary one by default)."""
        name = verifier_name(self)
        with contextlib.nullcontext(str(logs)) if logs else tempfile.TemporaryDirectory(prefix="tmpl-verifier-") as at:
            out, err = Path(at) / "verifier.stdout", Path(at) / "verifier.stderr"
            env = {**os.environ, **self.env} if self.env else None
            try:
                ran = await run_kept(
                    self.argv, cwd=workdir, env=env, timeout=self.timeout, out=out, err=err, server=server
                )
            except OSError as exc:
                raise HarnessVerifierError(name, f"could not start: {exc}") from None
            if ran.timed_out:
                raise HarnessVerifierError(
                    name, f"did not finish within {self.timeout:g} s (its process tree was killed)"
                )
            if ran.exit_code in (126, 127):  # the keeper could not execute it
                why = tail(err, 300).strip().splitlines()
                raise HarnessVerifierError(name, why[-1] if why else f"exit {ran.exit_code}: could not run")
            if ran.exit_code != 0:
                return 0.0
            lines = [line.strip() for line in tail(out, 2000).splitlines() if line.strip()]
            if lines:
                try:
                    value = float(lines[-1])
                except ValueError:
                    return 1.0
                if not math.isfinite(value):
                    raise HarnessVerifierError(name, f"printed a reward that is not finite: {lines[-1]!r}")
                return value
            return 1.0


def verifier_name(verifier: Any) -> str:
    """How errors name a verifier: its argv, or its function's qualified name.

    >>> verifier_name(CommandVerifier(["pytest", "-q"])), verifier_name(len)
    ('pytest -q', 'len')
    """
    if isinstance(verifier, CommandVerifier):
        return shlex.join(verifier.argv)
    return getattr(verifier, "__qualname__", None) or type(verifier).__name__


async def verify(
    verifier: Any,
    workdir: Path,
    episode: Any,
    timeout: float,
    server: KeeperServer | KeeperPool | None = None,
    logs: Path | None = None,
) -> float:
    """The reward ``verifier`` gives the run in ``workdir`` (HarnessVerifierError when it gives none).
    ``timeout``: seconds a callable may take (a :class:`CommandVerifier` has its own); ``server``: where a
    command's keeper is forked from; ``logs``: where a command's output goes (the run's directory)."""
    name = verifier_name(verifier)
    if isinstance(verifier, CommandVerifier):
        return await verifier.run(workdir, server, logs)
    try:
        if inspect.iscoroutinefunction(verifier) or inspect.iscoroutinefunction(type(verifier).__call__):
            value = await asyncio.wait_for(verifier(workdir, episode), timeout)
        else:
            value = await asyncio.wait_for(_on_thread(verifier, workdir, episode, name), timeout)
    except TimeoutError:
        raise HarnessVerifierError(
            name, f"did not return within {timeout:g} s (its thread, which Python cannot stop, was left running)"
        ) from None
    except HarnessVerifierError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the user's verifier raised, named in the result
        raise HarnessVerifierError(name, f"raised {type(exc).__name__}: {exc}") from None
    if isinstance(value, bool) or (isinstance(value, numbers.Real) and not isinstance(value, complex)):
        reward = float(value)
        if math.isfinite(reward):
            return reward
    raise HarnessVerifierError(name, f"returned {value!r}, not a finite number")


def _on_thread(fn: Callable[..., Any], workdir: Path, episode: Any, name: str) -> asyncio.Future[Any]:
    """``fn(workdir, episode)`` on a daemon thread of its own (a hung one holds no pool's worker)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            (future.set_result if ok else future.set_exception)(value)

    def work() -> None:
        try:
            value, ok = fn(workdir, episode), True
        except BaseException as exc:  # noqa: BLE001 - carried to the awaiting task
            value, ok = exc, False
        try:
            loop.call_soon_threadsafe(settle, ok, value)
        except RuntimeError:  # the loop closed meanwhile (the run ended without it)
            pass

    threading.Thread(target=work, name=f"tmpl-verifier {name}", daemon=True).start()
    return future
