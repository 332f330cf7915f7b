"""A :class:'s control of its servers beside generation: weight updates (the RL endpoints), the\nprefix-cache counters, stopping and aborting requests, what is in flight and each server's state."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from ..errors import HTTPConnectionError, WeightUpdateError
from .base import (
    UpdateMode,
    WeightSource,
)
from .vllm_wire import prometheus_counters


@dataclass
class ServerState:
    """One server as the client sees it: load, outcomes, and whether it is believed alive."""

    url: str
    outstanding: int = 0
    completed: int = 0
    failures: int = 0
    #: requests whose connection this server refused or dropped (each one retried elsewhere)
    lost: int = 0
    #: abort notices sent to this server (cancelled or abandoned requests)
    aborts: int = 0
    #: abort notices by id (``api="generate"``) this server did not acknowledge: no answer within 5 s,
    #: unreachable, or an error status (the closed connection is then the only notice it got)
    abort_errors: int = 0
    #: ``time.monotonic()`` before which no new request is sent here (after a lost connection)
    down_until: float = 0.0
    #: why this server gets no request ever again (it missed a weight update: its weights are old)
    retired: str | None = None

    @property
    def healthy(self) -> bool:
        return self.retired is None and time.monotonic() >= self.down_until


class ServerControl:
    """VLLMServer's methods of this module (a mixin: its attributes are VLLMServer's)."""

    # -- weight updates ---------------------------------------------------------------
    async def update_weights(
        self,
        version: int,
        apply: WeightSource = None,
        *,
        mode: UpdateMode = "keep",
        reset_prefix_cache: bool = True,
    ) -> None:
        """Pause every server, apply the update, reset the prefix cache, set the label, resume.

        vLLM's RL endpoints (the server started with ``VLLM_SERVER_DEV_MODE=1``): ``POST /pause``
        (``mode`` keep, abort, or wait for drain), ``POST /collective_rpc`` ``reload_weights`` when
        ``apply`` is a folder (a callable runs once, after every server paused), ``POST
        /reset_prefix_cache``, ``POST /update_weight_version`` with ``str(version)``, ``POST /resume``.
        A server that cannot be reached, at the pause or later (killed while paused), is retired (it
        would come back with old weights; ``stats`` says why) and the others are updated and resumed
        (WeightUpdateError when none is left); a server that answers with an error fails the update
        (WeightUpdateError naming it and the step), after the paused servers were resumed.

        >>> await backend.update_weights(3, "/ckpt/step-3", mode="keep")   # doctest: +SKIP
        """
        pause = {"keep": "keep", "abort": "abort", "drain": "wait"}[mode]
        clear = "true" if reset_prefix_cache else "false"
        live = [s for s in self.servers if s.retired is None]
        paused: list[ServerState] = []
        try:
            outcomes = await asyncio.gather(
                *(self._rl(s, "pause", f"/pause?mode={pause}&clear_cache={clear}") for s in live),
                return_exceptions=True,
            )
            paused += [server for server, outcome in zip(live, outcomes) if outcome is None]
            refused = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
            if refused:
                raise refused[0]
            if not paused:
                raise WeightUpdateError(
                    ", ".join(s.url for s in live) or "no server", "pause", "no server could be reached"
                )
            if callable(apply):
                out = apply()
                if asyncio.iscoroutine(out):
                    await out
            steps: list[tuple[str, str, Any]] = []
            if apply is not None and not callable(apply):
                steps.append(
                    ("apply", "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(apply)}})
                )
            if reset_prefix_cache:
                steps.append(("reset_prefix_cache", "/reset_prefix_cache", None))
            steps.append(("label", "/update_weight_version", {"new_version": str(version)}))
            for server in paused:
                for step, path, body in steps:
                    await self._rl(server, step, path, body, strict=True)
                    if server.retired is not None:  # died during the pause: retired, the others are updated
                        break
            if all(s.retired is not None for s in paused):
                raise WeightUpdateError(", ".join(s.url for s in paused), "apply", "every paused server was lost")
        finally:
            resuming = [s for s in paused if s.retired is None]
            errors = await asyncio.gather(*(self._rl(s, "resume", "/resume") for s in resuming))
        # a server lost at resume is retired (it got the update, but gets no request any more)
        failed = [(s, e) for s, e in zip(resuming, errors) if e is not None and s.retired is None]
        if failed:
            raise WeightUpdateError(failed[0][0].url, "resume", failed[0][1] or "")
        self.weight_version = version

    async def _rl(
        self, server: ServerState, step: str, path: str, body: Any = None, *, strict: bool = False
    ) -> str | None:
        """POST to one of vLLM's RL endpoints; None when it answered 200, else why not.

        An unreachable server is retired (never raised); an error answer, or no answer within the
        timeout, raises WeightUpdateError when ``strict`` (a server slow to reload is alive: it is
        resumed with the others, not retired).
        """
        try:
            status, answer = await self.http.post_json(
                server.url + path, body if body is not None else {}, timeout=self.timeout
            )
        except asyncio.TimeoutError as exc:
            if strict:  # a slow step (a reload longer than the timeout) of a live server: fail, resume all
                raise WeightUpdateError(server.url, step, f"no answer within {self.timeout:g} s ({exc})") from exc
            server.retired = f"unreachable during the weight update to a new version ({step}: timed out)"
            return f"timed out ({exc})"
        except HTTPConnectionError as exc:
            # retired, not raised, even when ``strict``: a server lost during the pause must not keep the
            # others from their update (they are updated and resumed; this one gets no request any more)
            server.retired = f"unreachable during the weight update to a new version ({step}: {exc})"
            return str(exc)
        if status != 200:
            detail = f"HTTP {status} from {path}: {str(answer)[:300]}"
            if status == 404:
                detail += " (start the server with VLLM_SERVER_DEV_MODE=1 for its RL endpoints)"
            if strict or step == "pause":
                raise WeightUpdateError(server.url, step, detail)
            return detail
        return None

    async def prefix_cache_counters(self) -> tuple[float, float] | None:
        """``(queried, hit)`` prefix-cache tokens summed over the servers, from each one's ``/metrics``
        (``vllm:prefix_cache_queries_total``, ``vllm:prefix_cache_hits_total``; every client's traffic
        counts). Servers that do not answer are left out; None when none answers."""
        answers = await asyncio.gather(
            *(self.http.get_text(s.url + "/metrics", timeout=10.0) for s in self.servers if s.retired is None),
            return_exceptions=True,
        )
        totals = [prometheus_counters(a[1]) for a in answers if isinstance(a, tuple) and a[0] == 200]
        if not totals:
            return None
        return sum(q for q, _ in totals), sum(h for _, h in totals)

    async def cancel(self, request_id: str) -> None:
        """Abort an in-flight request on its server (a no-op once it has finished).

        The request's task is cancelled, which closes its connection: vLLM aborts a request whose
        client disconnected (both APIs). With ``api="generate"`` the server is also told by id
        (``POST /inference/v1/abort_requests``).
        """
        entry = self._inflight.get(request_id)
        if entry is None:
            return
        entry.cancelled = True
        if entry.task is not None and entry.task is not asyncio.current_task() and not entry.task.done():
            entry.task.cancel()
        await self._abort(entry.server, entry.attempt_id)

    async def stop(self, request_id: str) -> bool:
        """End an in-flight request on its server keeping what it sampled (``api="generate"``): the
        server is told by id (``POST /inference/v1/abort_requests``) and its answer to the request,
        ``finish_reason="abort"`` with the tokens sampled so far and their logprobs (vLLM 0.32), is
        what ``agenerate`` returns. False with ``api="completions"`` (no abort by id) or once the request
        has finished."""
        entry = self._inflight.get(request_id)
        if entry is None or self.api != "generate":
            return False
        await self._abort(entry.server, entry.attempt_id)
        return True

    def _abort_soon(self, server: ServerState, rid: str) -> None:
        """Send an abort notice without waiting for it (from a cancelled or failed try)."""
        if self.api != "generate":
            self._note_abort(server, rid)  # the closed connection is the notice
            return
        task = asyncio.get_running_loop().create_task(self._abort(server, rid))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abort(self, server: ServerState, rid: str) -> None:
        """Best effort: ask ``server`` to drop request ``rid`` (vLLM 0.32 names it ``generate-tokens-<rid>``)."""
        self._note_abort(server, rid)
        if self.api != "generate":
            return  # /v1/completions has no abort endpoint: the closed connection aborts it
        ids = {"request_ids": [rid, f"generate-tokens-{rid}"]}
        for path in ("/inference/v1/abort_requests", "/abort_requests"):  # the second: --tokens-only servers
            try:
                status, _ = await self.http.post_json(server.url + path, ids, timeout=5.0)
            except (HTTPConnectionError, asyncio.TimeoutError):
                server.abort_errors += 1  # unreachable or busy: the closed connection is the only notice
                return
            if status != 404:
                if status != 200:
                    server.abort_errors += 1
                return
        server.abort_errors += 1  # neither path exists on this server

    def _note_abort(self, server: ServerState, rid: str) -> None:
        server.aborts += 1
        self.aborted.append(rid)

    @property
    def in_flight(self) -> list[str]:
        """Ids of the requests waiting for a server right now (what :meth:`cancel` can reach)."""
        return list(self._inflight)

    @property
    def stats(self) -> list[dict[str, Any]]:
        """Per-server counts: in flight, completed, failures, lost connections, abort notices (and those not
        acknowledged); health."""
        return [
            {
                "url": s.url,
                "outstanding": s.outstanding,
                "completed": s.completed,
                "failures": s.failures,
                "lost": s.lost,
                "aborts": s.aborts,
                "abort_errors": s.abort_errors,
                "healthy": s.healthy,
                "retired": s.retired,
            }
            for s in self.servers
        ]
