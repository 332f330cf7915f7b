"""The trainer's side of a :class:: weight updates, each session's environment (reset, step), and the\nepisodes: a session's, its reward, its end, the drain and the stream of finished ones, their acks."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from ..backends.base import Backend, UpdateMode, WeightSource
from ..errors import (
    EnvError,
    GatewayError,
    GatewayRequestError,
)
from .session import Session
from .store import Finished, SessionStore

if TYPE_CHECKING:
    from ..env.protocol import EnvReset, EnvStep
    from ..episode import Episode
    from .durable import Durable


class TrainerSide:
    """Gateway's methods of this module (a mixin: its attributes are Gateway's, declared here for the checker)."""

    backend: Backend
    sessions: SessionStore
    durable: Durable | None
    call_timeout: float | None
    env_factory: Callable[[], Any] | None
    updates: list[dict[str, Any]]
    _schemas: dict[str, list[dict[str, Any]]]
    _gate: asyncio.Event | None
    _updating: asyncio.Lock | None
    _inflight: int
    _idle: asyncio.Event | None

    # -- weights ---------------------------------------------------------------------
    async def update_weights_async(
        self,
        version: int,
        apply: WeightSource = None,
        *,
        mode: UpdateMode = "keep",
        reset_prefix_cache: bool = True,
    ) -> None:
        """Move the backend to policy ``version``, as :meth:`tmpl.Rollout.update_weights_async` does: new
        calls wait until it is done; ``mode`` says what happens to engine requests in flight (``"keep"``:
        they go on under the new weights, their tokens' versions as the engine reports them; ``"abort"``:
        the engine stops them; ``"drain"``: the update waits for them). ``apply``: None (the label only), a
        folder of weights, or a callable doing the transfer.

        >>> await gateway.update_weights_async(3, apply="/ckpt/step-3", mode="drain")  # doctest: +SKIP
        """
        if mode not in ("keep", "abort", "drain"):
            raise ValueError(f"mode must be 'keep', 'abort' or 'drain', got {mode!r}")
        if self._updating is None:
            self._updating = asyncio.Lock()
        async with self._updating:  # one update at a time, in the order they came
            started = time.perf_counter()
            gate = self._gate = asyncio.Event()
            try:
                if mode == "drain" and self._inflight:
                    self._idle = asyncio.Event()
                    await self._idle.wait()
                    self._idle = None
                await self.backend.update_weights(int(version), apply, mode=mode, reset_prefix_cache=reset_prefix_cache)
                self.updates.append({"version": int(version), "mode": mode, "seconds": time.perf_counter() - started})
            finally:
                self._gate = None
                gate.set()

    # -- results ---------------------------------------------------------------------
    # -- environments (envs.py) ------------------------------------------------------
    async def env_reset(self, key: str, task: Any = None) -> tuple[EnvReset, list[dict[str, Any]] | None]:
        """Open session ``key`` with a new environment reset on ``task``: its opening messages and the
        schemas of its tools (None: no tools), for the harness to send with its first call.

        Raises GatewayRequestError (400: no ``env_factory``), GatewayError (409: the session has an
        environment or calls already; 502: the environment failed, the session then ended, the
        environment closed).
        """
        from ..rollout.envs import episode_schemas
        from .envs import make_env, reset

        if self.env_factory is None:
            raise GatewayRequestError(key, "this gateway has no environments (Gateway(env_factory=...))")
        session = self.sessions.open(key)
        if session.env is not None or session.episode.calls:
            raise GatewayError(key, 409, "the session has an environment or calls already: reset opens a new session")
        try:
            session.env = make_env(self.env_factory, key)
            opened = await asyncio.wait_for(reset(session.env, key, task), self.call_timeout)
            schemas = episode_schemas(opened.tools, self._schemas)
        except TimeoutError:
            self._env_failed(key, EnvError(key, f"reset took over call_timeout={self.call_timeout:g} s", phase="reset"))
        except (EnvError, TypeError) as exc:
            self._env_failed(key, exc)
        return opened, schemas

    async def env_step(self, key: str, assistant: Mapping[str, Any]) -> EnvStep:
        """Send the session's environment the assistant message the harness got (``assistant``, tool call
        arguments as JSON strings or dicts); its turns, reward and done. The reward is summed into the
        session's episode; an environment that is done (or truncated) finishes the session.

        Raises SessionNotFoundError (404), GatewayRequestError (400: no environment, not an assistant
        message), GatewayError (502: the environment failed or took over ``call_timeout``; the session then
        ended, the environment closed).
        """
        from .envs import assistant_for_env, step

        session = self.session(key)
        if session.env is None:
            raise GatewayRequestError(key, "the session has no environment: POST /s/{session}/env/reset first")
        message = assistant_for_env(assistant, key)
        try:  # an environment's step is bounded like an engine call (call_timeout)
            out = await asyncio.wait_for(step(session.env, key, message), self.call_timeout)
        except TimeoutError:
            late = EnvError(
                key, f"step took over call_timeout={self.call_timeout:g} s", env=session.env.name, phase="step"
            )
            self._env_failed(key, late)
        except EnvError as exc:
            self._env_failed(key, exc)
        if session.env.reward is not None:
            session.episode.reward = session.env.reward
        if out.done or out.truncated:
            how = "done" if out.done else "truncated"
            self.sessions.finish(key, f"the environment ended the episode ({how})")
        return out

    def _env_failed(self, key: str, exc: Exception) -> NoReturn:
        """End the session of an environment that failed (closing it) and answer 502, naming it."""
        session = self.sessions.get(key, create=False)
        if session.env is not None:
            session.env.error = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(GatewayError):
            self.sessions.finish(key, f"its environment failed: {type(exc).__name__}")
        raise GatewayError(key, 502, f"the session's environment failed: {type(exc).__name__}: {exc}") from exc

    def session(self, key: str) -> Session:
        """The open session of ``key`` (SessionNotFoundError when there is none)."""
        return self.sessions.get(key, create=False)

    def episode(self, key: str) -> Episode:
        """The episode of an open session: its calls merged into training sequences."""
        return self.session(key).episode

    def reward(self, key: str, value: float, *, call: str | None = None) -> None:
        """Attach a reward to the session's episode (or to one of its calls)."""
        episode = self.episode(key)
        if call is None:
            episode.reward = value
        else:
            episode.set_call_reward(call, value)
        if self.durable is not None:
            self.durable.reward(key, value, call)

    def finish(self, key: str) -> Finished:
        """End a session now; its episode goes to :meth:`drain`."""
        return self.sessions.finish(key)

    def drain(self, limit: int | None = None) -> list[Finished]:
        """Finished episodes (ended, expired or closed for room), oldest first, each given once."""
        self.sessions.expire()
        if self.durable is None:
            return self.sessions.drain(limit)
        self.sessions._finished.extendleft(reversed(self.durable.due()))  # given, never acknowledged
        out = self.sessions.drain(limit)
        self.durable.given(out)
        return out

    def ack(self, acks: Sequence[str]) -> int:
        """Acknowledge finished episodes read (their :attr:`Finished.ack` ids): with a durable store they
        leave it; until then one is given again after ``redeliver`` seconds and after a restart. How many
        of ``acks`` were waiting for it (0 without a store)."""
        return 0 if self.durable is None else self.durable.ack(acks)

    async def stream(self, *, limit: int | None = None, idle: float = 30.0) -> AsyncIterator[Finished]:
        """Finished episodes as they end (expired ones too), each given once, oldest first; stops after
        ``limit`` of them or ``idle`` seconds with none. Another reader (:meth:`drain`, a second stream)
        gets the ones this one has not taken.

        >>> async for done in gateway.stream(limit=8):                  # doctest: +SKIP
        ...     trainer.add(done.episode.rows())
        """
        given = 0
        last = time.monotonic()
        while limit is None or given < limit:
            batch = self.drain(None if limit is None else limit - given)
            for done in batch:
                yield done
            given += len(batch)
            if batch:
                last = time.monotonic()
                continue
            left = idle - (time.monotonic() - last)
            if left <= 0:
                return
            await self.sessions.wait_finished(min(left, 1.0))  # at least each second: TTLs end sessions

    def close(self) -> None:
        """End every session (their episodes stay to be drained) and close the backend. With a durable
        store the sessions stay open in it instead (resumed by the next gateway on the file)."""
        if self.durable is not None:
            self.durable.close()
        else:
            self.sessions.close_all()
        self.backend.close()
