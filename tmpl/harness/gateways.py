"""How a harness rollout reaches its gateway: in this process (:class:`Local`) or at a URL (:class:`Remote`).

Both give the same four things for a session key: the episode its calls made (None when the gateway
has no such session: the harness never called), the reward set on it, the session finished (its
episode, once), and the error answers the gateway gave its model calls (:class:`.server.Refusals`;
a remote gateway's are not seen).

With a URL the trainer's routes are used (``GET /s/{key}/episode``, ``POST /s/{key}/reward``,
``POST /s/{key}/finish``, with ``Authorization: Bearer <admin_token>`` when the gateway has one); the
finished episode then also stays in that gateway's ``/episodes/drain`` queue, as every finished session
does there (bounded by its ``max_finished``). An in-process gateway's queue is left as it was: the
rollout takes its sessions' episodes out (:meth:`tmpl.gateway.store.SessionStore.forget`), so none is
recorded twice.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import GatewayError, SessionNotFoundError

if TYPE_CHECKING:
    from ..episode import Episode

__all__ = ["Local", "Remote"]

#: seconds a finish may wait for a call still in flight (the harness was killed mid-call; the gateway
#: stops that engine request and records what it sampled)
FINISH_WAIT = 30.0


class Local:
    """An in-process :class:`~tmpl.gateway.Gateway`, served on this loop (:class:`.server.LocalGateway`)."""

    def __init__(self, gateway: Any, *, uds: Path | None = None, admin_token: str | None = None) -> None:
        from .server import LocalGateway

        self.gateway = gateway
        self.server = LocalGateway(gateway, uds=uds, admin_token=admin_token)
        self.model = gateway.model
        #: how a sandboxed harness reaches it, and the batch's keeper server (set by the rollout), or None
        self.inside: Any = None
        self.keepers: Any = None

    @property
    def url(self) -> str:
        return self.server.url

    async def __aenter__(self) -> Local:
        await self.server.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.server.__aexit__(*exc)

    def watch(self, key: str) -> None:
        self.server.refusals.watch(key)

    def refused(self, key: str) -> list[str]:
        return self.server.refusals.take(key)

    async def episode(self, key: str) -> Episode | None:
        try:
            return self.gateway.session(key).episode  # type: ignore[no-any-return]
        except SessionNotFoundError:
            return None

    async def reward(self, key: str, value: float) -> None:
        self.gateway.reward(key, value)

    async def finish(self, key: str) -> Episode | None:
        until = time.monotonic() + FINISH_WAIT
        while True:
            try:
                done = self.gateway.finish(key)
            except SessionNotFoundError:
                return None
            except GatewayError as exc:
                if exc.status != 409 or time.monotonic() > until:
                    raise
                await asyncio.sleep(0.02)
                continue
            self.gateway.sessions.forget(done)
            return done.episode  # type: ignore[no-any-return]


class Remote:
    """A gateway at ``url`` (``tmpl serve``), reached through its HTTP routes."""

    def __init__(self, url: str, *, model: str | None = None, admin_token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.model = model or ""
        self.headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        self.client: Any = None
        #: how a sandboxed harness reaches it, and the batch's keeper server (set by the rollout), or None
        self.inside: Any = None
        self.keepers: Any = None

    async def __aenter__(self) -> Remote:
        import httpx

        self.client = httpx.AsyncClient(base_url=self.url, headers=self.headers, timeout=120.0)
        if not self.model:
            answer = await self.client.get("/v1/models")
            answer.raise_for_status()
            self.model = answer.json()["data"][0]["id"]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.client.aclose()

    def watch(self, key: str) -> None:
        pass

    def refused(self, key: str) -> list[str]:  # noqa: ARG002 - a remote gateway's refusals are not seen
        return []

    async def episode(self, key: str) -> Episode | None:
        from ..episode.records import from_record

        answer = await self.client.get(f"/s/{key}/episode")
        if answer.status_code == 404:
            return None
        _check(answer, key, "episode")
        return from_record(answer.json()["record"], sample_id=key)

    async def reward(self, key: str, value: float) -> None:
        _check(await self.client.post(f"/s/{key}/reward", json={"reward": value, "call": None}), key, "reward")

    async def finish(self, key: str) -> Episode | None:
        from ..episode.records import from_record

        until = time.monotonic() + FINISH_WAIT
        while True:
            answer = await self.client.post(f"/s/{key}/finish")
            if answer.status_code == 404:
                return None
            if answer.status_code == 409 and time.monotonic() < until:
                await asyncio.sleep(0.02)
                continue
            _check(answer, key, "finish")
            return from_record(answer.json()["record"], sample_id=key)


def _check(answer: Any, key: str, route: str) -> None:
    """A trainer route's error answer as a GatewayError naming the route and the gateway's message."""
    if answer.status_code < 400:
        return
    try:
        message = answer.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = answer.text[:300]
    raise GatewayError(key, answer.status_code, f"the gateway's {route} route answered {answer.status_code}: {message}")
