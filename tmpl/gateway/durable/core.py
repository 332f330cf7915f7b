"""``Durable``: the gateway's sessions kept on disk, resumed on a restart, its episodes read at least once.

``Gateway(tpl, backend, store="gw.db")`` (``tmpl serve --store gw.db``) keeps every recorded call in
an SQLite file (:mod:`.sqlite`) before its reply is sent; a gateway started again on the file resumes
every open session (:mod:`.resume`) and queues again every finished episode no reader acknowledged.

- A call's records (its replies, its aborted engine requests, rewards, the session's end) are written
  in group commits; the reply goes out once they are in the file. A write that fails answers 507 and
  leaves the session as the file holds it.
- Finished episodes stay in the file until acknowledged (:meth:`Gateway.ack`, ``POST /episodes/ack``):
  ``drain`` and ``/episodes/stream`` give each with an ``ack`` id; one given and not acknowledged is
  given again after ``redeliver`` seconds, and after a restart.
- ``max_bytes``: past it, episodes given to a reader and not yet acknowledged are dropped (oldest
  first); with none left to drop, a new call is refused (507) before it reaches the engine.
- A retried request answered once: the same ``Idempotency-Key`` header, or an ``x-stainless-retry-count``
  above 0 on a request equal to the session's last (the OpenAI and Anthropic SDKs' retries), is given
  the recorded answer again, streamed or not (a stream replays it whole, in the request's dialect); one
  sent again while the first still runs waits for it, then gets its answer.
- Calls of one session's lineage run one at a time (two processes sending one session are serialized).

>>> gateway = Gateway(tpl, backend, store="/data/gw.db", max_store_bytes=2**30)   # doctest: +SKIP
>>> for done in gateway.drain(): trainer.add(done.episode); gateway.ack([done.ack])  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...errors import StoreFullError
from ..jsonio import exact_dumps
from ..session import Plan, Reply, Session, lineage_key
from .resume import call_body, digest, dumps, rebuild, reply_body, same_value
from .sqlite import SqliteLog

if TYPE_CHECKING:
    from ...backends.base import GenerationResult
    from ..service import CallParams, Completion, Gateway
    from ..store import Finished

__all__ = ["RETRY", "Durable"]

log = logging.getLogger("tmpl.gateway")

#: the request's retry headers, set by the app for the call running in this context: (idempotency key,
#: retry count)
RETRY: contextvars.ContextVar[tuple[str | None, int]] = contextvars.ContextVar("tmpl_gateway_retry", default=(None, 0))
#: the digest and idempotency key of the call running in this context (set by :meth:`Durable.complete`)
_PENDING: contextvars.ContextVar[tuple[str | None, str | None]] = contextvars.ContextVar(
    "tmpl_gateway_pending", default=(None, None)
)

#: idempotency keys remembered (the answers they were given), most recent last
MAX_IDEMPOTENCY = 4096


class Durable:
    """The store of one gateway (see the module docstring); made by ``Gateway(store=...)``."""

    def __init__(
        self,
        path: str,
        *,
        max_bytes: int | None = None,
        redeliver: float = 300.0,
        synchronous: str = "NORMAL",
    ) -> None:
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"max_store_bytes must be positive, not {max_bytes!r}")
        if not redeliver > 0:
            raise ValueError(f"redeliver must be positive seconds, not {redeliver!r}")
        self.log = SqliteLog(path, synchronous=synchronous)
        self.path = self.log.path
        self.max_bytes = max_bytes
        self.redeliver = redeliver
        self._uid: dict[str, str] = {}  # open session key -> the uid of its rows
        self._written: dict[str, set[str]] = {}  # uid -> digests of the messages and tools written
        #: uid -> its last plan's messages and their digests, its tools (the gateway's one list) and their digest
        self._recent: dict[str, tuple[Sequence[Any], list[str], Any, str | None]] = {}
        self._last: dict[str, tuple[str | None, Completion]] = {}  # session key -> its last call
        self._idem: OrderedDict[str, tuple[str, Completion]] = OrderedDict()
        self._given: OrderedDict[str, tuple[Finished, float]] = OrderedDict()  # ack id -> (episode, when)
        self._locks: dict[tuple[str, str], list[Any]] = {}  # lane -> [lock, calls using it]
        self.gateway: Gateway | None = None
        self._run = secrets.token_hex(4)  # uids: this start's random prefix and a count
        self._count = itertools.count()
        #: sessions and finished episodes found in the store on start
        self.resumed = 0
        self.requeued = 0

    # -- start -----------------------------------------------------------------------
    def attach(self, gateway: Gateway) -> None:
        """Resume the store's sessions into ``gateway`` and hook its session store."""
        from ...trajectory.types import Status
        from ..store import Finished

        self.gateway = gateway
        gateway._prefix = f"gw{secrets.token_hex(4)}"  # call ids never repeat across restarts
        by_uid: dict[str, tuple[str, list[tuple[int, str, bytes]]]] = {}
        for seq, uid, key, kind, body in self.log.load():
            by_uid.setdefault(uid, (key, []))[1].append((seq, kind, body))
        sessions = gateway.sessions
        for uid, (key, events) in by_uid.items():
            built = rebuild(gateway, key, events)
            self._written[uid] = built.digests
            if built.finished is None:
                sessions._open[key] = built.session
                self._uid[key] = uid
                if built.last is not None:
                    self._last[key] = built.last
                for idem, done in built.idem.items():
                    self._idem[idem] = (key, done)
                self.resumed += 1
            else:
                reason, env = built.finished
                episode = built.session.episode
                if not episode.finished:
                    episode.finish(Status.DONE if episode.calls else Status.ABORTED, reason)
                sessions._ended[key] = reason
                sessions._finished.append(Finished(key, episode, reason, env, uid))
                self.requeued += 1
        sessions.on_end = self._ended
        sessions.on_forget = self._forgotten
        if by_uid:
            log.warning(
                "store %s: resumed %d open sessions and %d finished episodes not acknowledged",
                self.path,
                self.resumed,
                self.requeued,
            )

    # -- calls -----------------------------------------------------------------------
    async def complete(
        self,
        inner: Callable[..., Awaitable[Completion]],
        key: str,
        messages: Sequence[Mapping[str, Any]],
        tools: list[dict[str, Any]] | None,
        params: CallParams,
        lineage: str | None,
    ) -> Completion:
        """Run the call ``inner`` once: answered from the store when it is a retry of a recorded one,
        after the other calls of its lineage, and refused (507) when the store is full."""
        idem, retries = RETRY.get()
        request = digest((messages, tools, params, lineage))
        found = self._answered(key, idem, retries, request)
        if found is not None:
            return found
        await self._room(key)
        lane = (key, lineage or lineage_key(messages, tools))
        held = self._locks.get(lane)
        if held is None:
            held = self._locks[lane] = [asyncio.Lock(), 0]
        held[1] += 1  # calls using the lane (it goes once none does)
        token = _PENDING.set((request, None if idem is None else f"{key}\0{idem}"))
        try:
            async with held[0]:
                found = self._answered(key, idem, retries, request)  # sent again while the first ran: it waited
                if found is not None:
                    return found
                return await inner(key, messages, tools, params, lineage)
        finally:
            _PENDING.reset(token)
            held[1] -= 1
            if not held[1]:
                del self._locks[lane]

    def _answered(self, key: str, idem: str | None, retries: int, request: str) -> Completion | None:
        """The recorded answer of a retried request (its ``Idempotency-Key`` answered in session ``key``, or
        a retry count above 0 on a request equal to the session's last), else None. A streamed call's live
        text (:data:`~tmpl.gateway.service._LIVE`) is told the answer's call: its stream replays it whole."""
        found = self._idem.get(f"{key}\0{idem}") if idem is not None else None
        done = found[1] if found is not None else None
        if done is None and retries > 0:
            last = self._last.get(key)
            if last is not None and last[0] == request:
                done = last[1]
        if done is not None:
            from ..service import _LIVE

            live = _LIVE.get()
            if live is not None:
                live.replay(done)
        return done

    async def record_call(self, session: Session, plan: Plan, replies: list[Reply], version: int | None) -> None:
        """Write a call whose replies the session recorded; on a failed write the session is put back
        as the store holds it and the call fails (507)."""
        request, idem = _PENDING.get()
        uid, rows = self._rows_for(session, plan)
        body = call_body(
            session,
            plan,
            replies,
            version,
            messages=self._messages,
            tools=self._tools,
            request=request,
            idem=idem,
        )
        rows.append((uid, session.key, "call", dumps(body)))
        await self._write(session, uid, rows)
        from ..service import Completion

        done = Completion(session.key, plan, replies)
        self._last[session.key] = (request, done)
        if idem is not None:
            self._idem[idem] = (session.key, done)
            while len(self._idem) > MAX_IDEMPOTENCY:
                self._idem.popitem(last=False)

    async def record_aborted(
        self, session: Session, plan: Plan, call_id: str, result: GenerationResult | None, version: int | None
    ) -> None:
        """Write an engine request nobody waits for: its sampled tokens where the session recorded them
        (an aborted call), else only why it ended."""
        uid, rows = self._rows_for(session, plan if result is not None else None)
        why = session.ended.get(call_id, "aborted")
        if result is None:
            rows.append((uid, session.key, "ended", dumps({"id": call_id, "why": why})))
        else:
            from .resume import base_of

            base, n = base_of(session, plan, set())
            body = reply_body(Reply(call_id, plan.prompt_ids, result, {}, None))
            body.update(
                messages=self._messages,
                base=base,
                base_len=n,
                tail=plan.prompt_ids[n:] if base is not None else list(plan.prompt_ids),
                version=version,
                edit=plan.edit,
                lineage=plan.lineage,
                why=why,
            )
            rows.append((uid, session.key, "abort", dumps(body)))
        await self._write(session, uid, rows)

    def reward(self, key: str, value: float | None, call: str | None) -> None:
        """Write a reward given to a session's episode or one of its calls (committed with the next batch)."""
        uid = self._uid.get(key)
        if uid is not None:
            self.log.send([(uid, key, "reward", exact_dumps({"value": value, "call": call}))])  # NaN kept

    async def flush(self) -> None:
        """Wait until everything queued is in the file."""
        done = self.log.submit([])
        if done is not None:
            await done

    def _rows_for(self, session: Session, plan: Plan | None) -> tuple[str, list[tuple[str, str, str, bytes]]]:
        """The session's uid and the ``m`` rows of the plan's messages and tools not yet written (their
        digests left in ``self._messages`` and ``self._tools``)."""
        uid = self._uid.get(session.key)
        if uid is None:
            uid = self._uid[session.key] = f"{self._run}-{next(self._count)}"
        written = self._written.setdefault(uid, set())
        rows: list[tuple[str, str, str, bytes]] = []
        self._messages: list[str] = []
        self._tools: str | None = None
        if plan is None:
            return uid, rows
        before, known, tools, tools_digest = self._recent.pop(uid, ((), [], None, None))
        for i, m in enumerate(plan.messages):  # what the last call sent again, not hashed again
            d = known[i] if i < len(known) and same_value(m, before[i]) else digest(m)
            self._messages.append(d)
            if d not in written:
                written.add(d)
                rows.append((uid, session.key, "m", dumps({"d": d, "v": m})))
        if plan.tools is not None:
            d = self._tools = tools_digest if plan.tools is tools and tools_digest else digest(plan.tools)
            if d not in written:
                written.add(d)
                rows.append((uid, session.key, "m", dumps({"d": d, "v": plan.tools})))
        self._recent[uid] = (plan.messages, self._messages, plan.tools, self._tools)
        return uid, rows

    async def _write(self, session: Session, uid: str, rows: list[tuple[str, str, str, bytes]]) -> None:
        try:
            done = self.log.submit(rows)
            if done is not None:
                await done
        except StoreFullError as exc:
            self._restore(session, uid)
            raise StoreFullError(self.path, exc.reason.split(": ", 1)[-1], session.key) from exc

    def _restore(self, session: Session, uid: str) -> None:
        """Put ``session`` back as the store holds it (after a write of it failed)."""
        assert self.gateway is not None
        events = [(seq, kind, body) for seq, _, _, kind, body in self.log.events_of(uid)]
        built = rebuild(self.gateway, session.key, events)
        self._written[uid] = built.digests
        self._recent.pop(uid, None)
        open_ = self.gateway.sessions._open
        if open_.get(session.key) is session:
            built.session.env = session.env
            open_[session.key] = built.session
        if built.last is not None:
            self._last[session.key] = built.last
        else:
            self._last.pop(session.key, None)

    async def _room(self, key: str) -> None:
        """Make room under ``max_bytes``: drop episodes given to a reader and not acknowledged, oldest
        first; with none left, refuse the call (507)."""
        if self.max_bytes is None or self.log.used <= self.max_bytes:
            return
        while self._given and self.log.used > self.max_bytes:
            ack, (done, _) = self._given.popitem(last=False)
            log.warning(
                "store %s over max_store_bytes: dropped session %r, read and not acknowledged", self.path, done.key
            )
            pending = self.log.delete([ack])
            if pending is not None:
                await pending
        if self.log.used > self.max_bytes:
            raise StoreFullError(
                self.path,
                f"it holds {self.log.used} bytes, over max_store_bytes={self.max_bytes}, and no episode a reader "
                "took is left to drop: drain and acknowledge finished episodes (POST /episodes/ack)",
                key,
            )

    # -- finished episodes ---------------------------------------------------------------
    def _ended(self, session: Session, reason: str, env: dict[str, Any] | None, queued: bool) -> str | None:
        """A session ended (SessionStore hook): its end written; its ack id when its episode is queued."""
        uid = self._uid.pop(session.key, None)
        self._last.pop(session.key, None)
        if uid is None:
            return None
        self._written.pop(uid, None)
        self._recent.pop(uid, None)
        if not queued:  # nothing recorded to read: its rows go
            self.log.send([(uid, "", "-delete", b"")])
            return None
        self.log.send([(uid, session.key, "finish", dumps({"reason": reason, "env": env}))])
        return uid

    def given(self, batch: Iterable[Finished]) -> None:
        """Episodes handed to a reader: kept until acknowledged (given again after ``redeliver`` s)."""
        now = time.monotonic()
        for done in batch:
            if done.ack is not None:
                self._given[done.ack] = (done, now)

    def due(self) -> list[Finished]:
        """Episodes given more than ``redeliver`` seconds ago and not acknowledged: to be given again."""
        now = time.monotonic()
        out = []
        while self._given:
            ack, (done, when) = next(iter(self._given.items()))
            if now - when < self.redeliver:
                break
            del self._given[ack]
            out.append(done)
        return out

    def ack(self, acks: Iterable[str]) -> int:
        """Acknowledge episodes read (their ack ids): their rows leave the store; how many were held."""
        known = [a for a in acks if self._given.pop(a, None) is not None]
        if known:
            self.log.send([(a, "", "-delete", b"") for a in known])
        return len(known)

    def _forgotten(self, done: Finished) -> None:
        """An episode its reader took another way (SessionStore.forget): acknowledged."""
        if done.ack is not None:
            self._given.pop(done.ack, None)
            self.log.send([(done.ack, "", "-delete", b"")])

    def close(self) -> None:
        """Commit what is queued and close the file."""
        self.log.close()


class RetryHeaders:
    """ASGI middleware: the request's ``Idempotency-Key`` and ``x-stainless-retry-count`` headers in
    :data:`RETRY` for the call it runs (what :meth:`Durable.complete` answers once).

    >>> app.add_middleware(RetryHeaders)   # doctest: +SKIP
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        idem = None
        retries = 0
        for name, value in scope.get("headers", ()):
            if name == b"idempotency-key":
                idem = value.decode("latin-1")[:200]
            elif name == b"x-stainless-retry-count":
                try:
                    retries = int(value)
                except ValueError:
                    retries = 0
        token = RETRY.set((idem, retries))
        try:
            await self.app(scope, receive, send)
        finally:
            RETRY.reset(token)
