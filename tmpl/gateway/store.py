"""Sessions by key: opened on first use, expired after a TTL idle, bounded in number; finished episodes queued.

>>> store = SessionStore(lambda key: Session(key, tpl), ttl=600, max_sessions=1000)   # doctest: +SKIP
>>> session = store.open("s1")                                                       # doctest: +SKIP
>>> store.finish("s1"); [key for key, _ in store.drain()]                             # doctest: +SKIP
['s1']
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..episode import Episode
from ..errors import BackendUnavailableError, GatewayError, SessionNotFoundError
from ..trajectory.types import Status
from .envs import close_env
from .session import Session

__all__ = ["Finished", "SessionStore"]

log = logging.getLogger("tmpl.gateway")


@dataclass(frozen=True)
class Finished:
    """A session's episode once it ended: by a finish call, a TTL, or room made for newer sessions."""

    key: str
    episode: Episode
    reason: str
    #: the session's environment's state, info and error (``Gateway(env_factory=...)``), else None
    env: dict[str, Any] | None = None
    #: with a durable store (``Gateway(store=...)``): the id to acknowledge it by once read (:meth:`Gateway.ack`)
    ack: str | None = None
    #: a vision template's: per episode sequence, its image inputs (:class:`tmpl.vision.ImageInputs`, spans in
    #: the sequence's IDs; None for one without images), from which a trainer rebuilds its model inputs;
    #: None on a text template
    images: list[Any] | None = None


class SessionStore:
    """The gateway's sessions (most recently used last) and the queue of finished episodes.

    - ``ttl``: seconds a session may stay idle before it ends (expired keys are remembered, bounded,
      so that a late call is told "expired", not given a fresh session).
    - ``max_sessions``: open sessions at most; the least recently used ends to make room.
    - ``max_finished``: finished episodes kept until drained; past it the oldest is dropped, counted
      in :attr:`dropped` and logged (drain them, or raise the bound).
    - ``create``: open a session on a call to an unknown key (False: only :meth:`open` does).
    """

    def __init__(
        self,
        factory: Callable[[str], Session],
        *,
        ttl: float = 3600.0,
        max_sessions: int = 10_000,
        max_finished: int = 10_000,
        create: bool = True,
    ) -> None:
        if ttl <= 0 or max_sessions < 1 or max_finished < 1:
            raise ValueError("ttl, max_sessions and max_finished must be positive")
        self.factory = factory
        self.ttl = ttl
        self.max_sessions = max_sessions
        self.create = create
        self._open: OrderedDict[str, Session] = OrderedDict()
        self._ended: OrderedDict[str, str] = OrderedDict()  # key -> why it ended (bounded)
        self._finished: deque[Finished] = deque()
        self.max_finished = max_finished
        #: finished episodes dropped unread because the queue was full
        self.dropped = 0
        self._arrived: asyncio.Event | None = None  # set when an episode is queued (made on the loop)
        #: a durable store's hooks (:mod:`tmpl.gateway.durable`): told of each session's end (returns
        #: the finished episode's ack id) and of each episode taken by :meth:`forget`
        self.on_end: Callable[[Session, str, dict[str, Any] | None, bool], str | None] | None = None
        self.on_forget: Callable[[Finished], None] | None = None

    def __len__(self) -> int:
        return len(self._open)

    def open(self, key: str) -> Session:
        """The session of ``key``, opened when new (SessionNotFoundError for an ended one)."""
        return self.get(key, create=True)

    def get(self, key: str, *, create: bool | None = None) -> Session:
        """The open session of ``key`` (its idle time restarts): opened when new if ``create`` (default: the
        store's setting); SessionNotFoundError for an ended one."""
        self.expire()
        session = self._open.get(key)
        if session is not None:
            self._open.move_to_end(key)
            session.touched = time.monotonic()
            return session
        if key in self._ended:
            raise SessionNotFoundError(key, f"the session ended ({self._ended[key]}); start a new one")
        if not (self.create if create is None else create):
            raise SessionNotFoundError(key, "no such session")
        if len(self._open) >= self.max_sessions:
            self._make_room(key)
        session = self._open[key] = self.factory(key)
        return session

    def _make_room(self, key: str) -> None:
        """End the least recently used session that has no call in flight (never one mid-call)."""
        for oldest, session in self._open.items():
            if not session.inflight:
                self._end(oldest, f"closed to make room: more than {self.max_sessions} open sessions")
                return
        raise BackendUnavailableError(key, f"all {self.max_sessions} open sessions have calls in flight")

    def finish(self, key: str, reason: str = "finished by the client") -> Finished:
        """End the session of ``key`` now: its episode goes to the queue :meth:`drain` reads (refused, 409,
        while a call of it is in flight: its tokens would have no episode to go to)."""
        busy = self._open.get(key)
        if busy is not None and busy.inflight:
            raise GatewayError(key, 409, f"{busy.inflight} call(s) of the session are in flight; finish it after them")
        if key not in self._open:
            raise SessionNotFoundError(
                key, f"the session ended ({self._ended[key]})" if key in self._ended else "no such session"
            )
        return self._end(key, reason)

    def expire(self) -> None:
        """End every session idle for longer than the TTL."""
        now = time.monotonic()
        ending = []
        for key, session in self._open.items():  # least recently used first: stop at the first fresh one
            if now - session.touched <= self.ttl:
                break
            if not session.inflight:  # a call in flight is not idle, however long it takes
                ending.append(key)
        for key in ending:
            self._end(key, f"expired after {self.ttl:g} s idle")

    def drain(self, limit: int | None = None) -> list[Finished]:
        """Finished episodes, oldest first, removed from the queue (at most ``limit``)."""
        out: list[Finished] = []
        while self._finished and (limit is None or len(out) < limit):
            out.append(self._finished.popleft())
        return out

    def forget(self, done: Finished) -> bool:
        """Take ``done`` out of the queue :meth:`drain` reads, when its reader took it another way (a
        :class:`tmpl.harness.HarnessRollout` reads its own sessions' episodes as they end): whether it was
        there. Nothing else of the store changes."""
        try:
            self._finished.remove(done)
        except ValueError:
            return False
        if self.on_forget is not None:
            self.on_forget(done)
        return True

    def close_all(self, reason: str = "the gateway shut down") -> None:
        """End every open session (their episodes stay to be drained)."""
        for key in list(self._open):
            self._end(key, reason)

    def _end(self, key: str, reason: str) -> Finished:
        session = self._open.pop(key)
        self._ended[key] = reason
        while len(self._ended) > 10 * self.max_sessions:
            self._ended.popitem(last=False)
        episode = session.episode
        if not episode.finished:
            episode.finish(Status.DONE if episode.calls else Status.ABORTED, reason)
        held = session.env
        close_env(held, reason)  # once, on every end of the session
        env = None
        if held is not None:
            env = {
                "name": held.name,
                "state": held.state,
                "reward": held.reward,
                "info": held.info,
                "error": held.error,
            }
        ack = self.on_end(session, reason, env, bool(episode.calls)) if self.on_end is not None else None
        images = session.sequence_images() if session.seq_images else None
        done = Finished(key, episode, reason, env, ack, images)
        if episode.calls:
            if len(self._finished) >= self.max_finished:
                lost = self._finished.popleft()
                self.dropped += 1
                log.warning("finished-episode queue full (%d): dropped session %r unread", self.max_finished, lost.key)
            self._finished.append(done)
            if self._arrived is not None:
                self._arrived.set()
        return done

    async def wait_finished(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a finished episode to be queued; whether one is."""
        if self._finished:
            return True
        if self._arrived is None:
            self._arrived = asyncio.Event()
        self._arrived.clear()
        try:
            await asyncio.wait_for(self._arrived.wait(), timeout)
        except TimeoutError:
            pass
        return bool(self._finished)
