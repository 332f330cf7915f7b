"""``Gateway``: sessions in front of one tmpl backend, whatever API dialect the client speaks.

The dialects (:mod:`tmpl.gateway.dialects`) turn a request into canonical messages and tools and a
:class:`CallParams`; :meth:`Gateway.complete` plans the prompt IDs (:meth:`Session.plan`), asks the
backend for ``n`` generations, parses each with the template's tool-call parser, and records every one
as a call of the session's episode. The same backend objects a :class:`tmpl.Rollout` takes serve here
(vLLM servers, SGLang, offline vLLM, Torch, Scripted), with their weight versions.

>>> gateway = Gateway(tpl, VLLMServer("http://127.0.0.1:8000"))                          # doctest: +SKIP
>>> replies = asyncio.run(gateway.complete("s1", [{"role": "user", "content": "Hi"}], None, CallParams()))  # doctest: +SKIP
>>> gateway.episode("s1").sequences[0].ids[-len(replies[0].result.token_ids):].tolist() == replies[0].result.token_ids  # doctest: +SKIP
True
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import itertools
import logging
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..backends.base import GenerationRequest, GenerationResult, Sampling
from ..errors import (
    BackendUnavailableError,
    GatewayError,
    GatewayRequestError,
    GatewayTimeoutError,
    HistorySpliceError,
    NoToolParserError,
    TmplError,
)
from ..toolcalls.api import CompletionReader
from ..vision.template import VisionTemplate
from .roles import place_roles
from .session import Plan, Reply, Session
from .store import SessionStore
from .vision import served_messages

if TYPE_CHECKING:
    from ..backends.base import Backend
    from ..chat_template import ChatTemplate
    from .durable import Durable

__all__ = ["CallParams", "Completion", "Gateway"]
from .trainer_side import TrainerSide

log = logging.getLogger("tmpl.gateway")


@dataclass(frozen=True)
class CallParams:
    """What a request asks of a generation, read by its dialect (None: the gateway's default)."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    #: top-k sampling (None: none)
    top_k: int | None = None
    n: int = 1
    seed: int | None = None
    #: stop strings: a reply ends with the token that completes the first one (the string left out of its
    #: text); the engine's tokens after it are dropped, as an engine that stopped there would not have them
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Completion:
    """A call answered: the session, the prompt it was sent (how it was made) and its replies."""

    session: str
    plan: Plan
    replies: list[Reply]


#: a lineage name a client may give (``X-Tmpl-Lineage``)
_LINEAGE = re.compile(r"[A-Za-z0-9._:@/-]{1,200}")

#: seconds an engine request may take to answer once it was stopped (its partial tokens), before it is cancelled
STOP_WAIT = 10.0

#: the live stream of the call running in this context (:meth:`Gateway.complete_streamed`), else None
_LIVE: contextvars.ContextVar[Any] = contextvars.ContextVar("tmpl_gateway_live", default=None)


class Gateway(TrainerSide):
    """Sessions of agent episodes over ``backend``, rendered with ``tpl``.

    - ``max_tokens``: a call's default and ceiling of sampled tokens; ``max_context``: prompt plus
      sampled tokens at most (a longer prompt is refused with a 400 naming its length).
    - ``temperature``/``top_p``: defaults where a request names none; ``max_n``: choices per call at most.
    - ``ttl``, ``max_sessions``, ``max_finished``, ``create_sessions``: see :class:`SessionStore`.
    - ``strict``: a history holding an assistant turn the gateway never returned is refused (409)
      instead of starting a branch.
    - ``model``: the name ``/v1/models`` lists (default: the template's name).
    - ``call_timeout``: seconds an engine request may take (None: no limit); past it the engine request
      is stopped (its sampled tokens recorded where the backend can stop it keeping them, else it is
      cancelled), the call noted aborted in its session, and the client answered 504.
    - ``max_session_tokens``: tokens (prompt plus sampled, every call) a session's episode may hold: a
      call whose prompts (``n`` of them) would take the session past it is refused (400) before it reaches
      the engine, so a session ends at most one call's samples (``n * max_tokens``) over it; one agent
      cannot grow the gateway's memory without end (finish the session and start another).
    - ``tpl`` a :class:`tmpl.vision.VisionTemplate`: requests may hold images (every dialect's image
      blocks, sent inline), their prompts the processor's own expansion (:mod:`tmpl.gateway.vision`);
      not with ``store=`` (the durable store keeps no images: a ValueError). A text template answers a
      request with an image 400, naming its block.
    - ``env_factory``: one :class:`tmpl.env.Env` per session, driven by the harness through
      :meth:`env_reset` and :meth:`env_step` (``/s/{session}/env/reset``, ``/env/step``); see
      :mod:`tmpl.gateway.envs`.
    """

    def __init__(
        self,
        tpl: ChatTemplate | VisionTemplate,
        backend: Backend,
        *,
        model: str | None = None,
        max_tokens: int = 1024,
        max_context: int = 32_768,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_n: int = 16,
        ttl: float = 3600.0,
        max_sessions: int = 10_000,
        max_finished: int = 10_000,
        create_sessions: bool = True,
        strict: bool = False,
        max_heads: int = 16,
        call_timeout: float | None = 600.0,
        max_session_tokens: int = 4_000_000,
        env_factory: Callable[[], Any] | None = None,
        store: str | None = None,
        max_store_bytes: int | None = None,
        redeliver: float = 300.0,
    ) -> None:
        if call_timeout is not None and not call_timeout > 0:
            raise ValueError(f"call_timeout must be positive seconds or None, not {call_timeout!r}")
        if max_session_tokens < 1:
            raise ValueError(f"max_session_tokens must be positive, not {max_session_tokens!r}")
        if env_factory is not None and not callable(env_factory):
            raise TypeError(f"env_factory must be callable, not {type(env_factory).__name__}")
        #: a :class:`tmpl.vision.VisionTemplate` given as ``tpl``: requests may hold images (``tpl`` is then
        #: its text template); None for a text template, whose requests with images get a 400
        self.vision = vision = tpl if isinstance(tpl, VisionTemplate) else None
        if isinstance(tpl, VisionTemplate):
            tpl = tpl.chat
            if store is not None:
                raise ValueError(
                    "store= with a VisionTemplate: the durable store keeps no images (a resumed session could "
                    "not rebuild its prompts' image inputs); serve a vision template without store="
                )
        self.call_timeout = call_timeout
        self.max_session_tokens = max_session_tokens
        self.env_factory = env_factory
        self._schemas: dict[str, list[dict[str, Any]]] = {}  # environments' tool schemas, one object per list
        self.tpl = tpl
        self.backend = backend
        self.model = model or tpl.name
        self.max_tokens = max_tokens
        self.max_context = max_context
        self.temperature = temperature
        self.top_p = top_p
        self.max_n = max_n
        self.strict = strict
        self.sessions = SessionStore(
            lambda key: Session(key, tpl, max_heads=max_heads, strict=strict, vision=vision),
            ttl=ttl,
            max_sessions=max_sessions,
            max_finished=max_finished,
            create=create_sessions,
        )
        self._reader = CompletionReader(tpl)
        self._tool_lists: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self._has_parser: bool | None = None
        self._ids = itertools.count()
        self._prefix = f"gw{os.getpid():x}"
        #: calls answered, and calls whose prompt continued a head by a suffix (the rest were rendered)
        self.calls = 0
        self.appended = 0
        #: one entry per weight update: version, mode, seconds
        self.updates: list[dict[str, Any]] = []
        self._gate: asyncio.Event | None = None  # set while a weight update holds new calls back
        self._updating: asyncio.Lock | None = None  # one weight update at a time (made on the loop)
        self._inflight = 0  # engine requests under way
        self._idle: asyncio.Event | None = None  # set when the last of them ends (a drain waits for it)
        #: the durable store (``store=PATH``: :mod:`tmpl.gateway.durable`), its sessions resumed; else None
        self.durable: Durable | None = None
        if store is not None:
            from .durable import Durable

            self.durable = Durable(store, max_bytes=max_store_bytes, redeliver=redeliver)
            self.durable.attach(self)

    # -- calls -----------------------------------------------------------------------
    async def complete(
        self,
        session_key: str,
        messages: Sequence[Mapping[str, Any]],
        tools: list[dict[str, Any]] | None,
        params: CallParams,
        lineage: str | None = None,
    ) -> Completion:
        """Generate ``params.n`` replies to ``messages`` (canonical) in session ``session_key``, each
        recorded (see :meth:`_complete`); with a durable store, kept on disk before the answer, a retried
        request answered once and the calls of one lineage run one at a time (:mod:`tmpl.gateway.durable`)."""
        if self.durable is None:
            return await self._complete(session_key, messages, tools, params, lineage)
        return await self.durable.complete(self._complete, session_key, messages, tools, params, lineage)

    async def _complete(
        self,
        session_key: str,
        messages: Sequence[Mapping[str, Any]],
        tools: list[dict[str, Any]] | None,
        params: CallParams,
        lineage: str | None = None,
    ) -> Completion:
        """Generate ``params.n`` replies to ``messages`` (canonical) in session ``session_key``, each recorded.
        ``lineage``: the name the client gave the call's lineage (``X-Tmpl-Lineage``; None: the session
        infers it from the system prompt and the tool names, see :mod:`tmpl.gateway.session`).

        Raises GatewayRequestError (400), SessionNotFoundError (404), HistoryConflictError (409, strict) or
        BackendUnavailableError (503); nothing is recorded for a call that raises but the tokens an engine
        request sampled before it ended unanswered (the client went away, a timeout, the engine lost
        mid-stream): an aborted call of the episode.
        """
        if lineage is not None and not _LINEAGE.fullmatch(lineage):
            raise GatewayRequestError(
                session_key,
                f"the lineage name {lineage[:64]!r} is not 1 to 200 of the characters A-Z a-z 0-9 . _ : @ / -",
                param="X-Tmpl-Lineage",
            )
        messages = served_messages(self.vision, session_key, messages)  # images: a 400 on a text template
        session = self.sessions.get(session_key)
        tools = self._intern(tools)
        if not 1 <= params.n <= self.max_n:
            raise GatewayRequestError(session_key, f"n must be between 1 and {self.max_n}, got {params.n}", param="n")
        placed = place_roles(self.tpl, messages)  # developer and system turns where the template renders them
        try:
            plan = session.plan(placed.messages, tools, lineage)
            if placed.notes:
                plan = dataclasses.replace(plan, roles=placed.notes)
        except GatewayError:
            raise
        except HistorySpliceError as exc:  # the gateway's own failure, not the client's
            raise GatewayError(session_key, 500, f"{type(exc).__name__}: {exc}") from exc
        except TmplError as exc:  # the template cannot render the history (a role it refuses...)
            raise GatewayRequestError(session_key, f"{type(exc).__name__}: {exc}", param="messages") from exc
        room = self.max_context - len(plan.prompt_ids)
        if room <= 0:
            raise GatewayRequestError(
                session_key,
                f"the prompt is {len(plan.prompt_ids)} tokens, at or over the context limit {self.max_context}",
                param="messages",
            )
        max_tokens = min(params.max_tokens or self.max_tokens, self.max_tokens, room)
        if max_tokens < 1:
            raise GatewayRequestError(session_key, "max_tokens must be at least 1", param="max_tokens")
        held = session.tokens_held + params.n * len(plan.prompt_ids)
        if held > self.max_session_tokens:
            raise GatewayRequestError(
                session_key,
                f"the session's episode would hold {held} tokens (its calls' prompts and samples), over the "
                f"limit of {self.max_session_tokens}: finish it and start another",
            )
        try:
            sampling = Sampling(
                temperature=self.temperature if params.temperature is None else params.temperature,
                top_p=self.top_p if params.top_p is None else params.top_p,
                top_k=params.top_k or 0,
                seed=params.seed,
            )
        except ValueError as exc:
            raise GatewayRequestError(session_key, str(exc)) from exc
        while self._gate is not None:  # a weight update under way: calls wait for the new weights
            await self._gate.wait()
        version = self.backend.weight_version
        self._inflight += params.n  # counted before any await: an update that drains sees them
        session.inflight += 1
        try:
            results = await self._choices(session, plan, max_tokens, sampling, version, params.n)
        finally:  # also when the call is cancelled (its tasks may not have started)
            session.inflight -= 1
            self._inflight -= params.n
            if self._inflight == 0 and self._idle is not None:
                self._idle.set()
        replies: list[Reply] = []
        for call_id, result in results:
            result, cut = _cut_at_stop(self.tpl, result, params.stop)
            reply = self._reply(call_id, plan, result, tools, cut)
            try:
                session.record(plan, reply, version=version)
            except TmplError as exc:  # e.g. a logprob the engine gave that is not finite: not trainable
                if self.durable is not None and replies:  # the choices recorded before it are kept
                    await self.durable.record_call(session, plan, replies, version)
                raise GatewayError(session_key, 502, f"the engine's output cannot be recorded: {exc}") from exc
            replies.append(reply)
        if self.durable is not None:  # on disk before the answer is sent
            await self.durable.record_call(session, plan, replies, version)
        self.calls += 1
        self.appended += plan.mode == "append"
        return Completion(session_key, plan, replies)

    def _intern(self, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        """The one list object of tools equal to ``tools``: the suffix engine keeps a tool list's digest by
        identity, and a request's tools are a new list each time (``repr`` is the key: a client sends its
        tools in the same order call after call; at most 64 kept)."""
        if tools is None:
            return None
        key = repr(tools)
        found = self._tool_lists.get(key)
        if found is None:
            found = self._tool_lists[key] = tools
            while len(self._tool_lists) > 64:
                self._tool_lists.popitem(last=False)
        else:
            self._tool_lists.move_to_end(key)
        return found

    async def _choices(
        self, session: Session, plan: Plan, max_tokens: int, sampling: Sampling, version: int, n: int
    ) -> list[tuple[str, GenerationResult]]:
        """The ``n`` generations of a call. Where one fails (or the call is cancelled) none is lost: the
        others still running are stopped (their sampled tokens recorded as aborted calls, see :meth:`_stop`),
        and those already done are recorded as aborted calls (sampled, never returned); then it raises."""
        tasks = [
            asyncio.ensure_future(self._generate(session, plan, max_tokens, sampling, version, k)) for k in range(n)
        ]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException as exc:
            for task in tasks:
                task.cancel()  # a running one stops its engine request and records what it sampled
            await asyncio.shield(asyncio.gather(*tasks, return_exceptions=True))
            for task in tasks:
                if task.cancelled() or task.exception() is not None:
                    continue
                call_id, result = task.result()
                kept: GenerationResult | None = result
                why = f"another choice of the call failed ({type(exc).__name__})"
                if result.logprobs is None:
                    session.ended[call_id] = f"aborted: {why}; its tokens have no logprobs and are not recorded"
                    continue
                try:
                    session.record_aborted(plan, call_id, result, version=version)
                except TmplError as bad:
                    session.ended[call_id] = f"aborted: {why}; its sampled tokens could not be recorded ({bad})"
                    kept = None
                else:
                    session.ended[call_id] = (
                        f"aborted: {why}; its {len(result.token_ids)} sampled tokens are recorded (never returned)"
                    )
                if self.durable is not None:
                    await asyncio.shield(self.durable.record_aborted(session, plan, call_id, kept, version))
            raise

    async def _generate(
        self, session: Session, plan: Plan, max_tokens: int, sampling: Sampling, version: int, k: int
    ) -> tuple[str, GenerationResult]:
        call_id = f"{self._prefix}-{next(self._ids)}"
        request = GenerationRequest(
            call_id,
            plan.prompt_ids,
            max_tokens,
            self.tpl.stop_token_ids,
            sampling=sampling if sampling.seed is None else dataclasses.replace(sampling, seed=sampling.seed + k),
            version=version,
            sample=session.key,
            images=plan.images,
            image_sources=list(plan.sources) if plan.sources else None,
        )
        # the engine request runs as its own task: a client that goes away (or a timeout) stops it and
        # keeps what it sampled (see _stop) instead of cancelling it with the call
        generation = asyncio.ensure_future(self._engine(request, _LIVE.get() if k == 0 else None))
        try:
            result = await asyncio.wait_for(asyncio.shield(generation), self.call_timeout)
        except asyncio.CancelledError:
            await asyncio.shield(self._stop(session, plan, call_id, generation, version, "the client went away"))
            raise
        except TimeoutError:
            why = f"no reply within {self.call_timeout:g} s"
            await asyncio.shield(self._stop(session, plan, call_id, generation, version, why))
            raise GatewayTimeoutError(
                session.key, f"the engine gave no reply within call_timeout={self.call_timeout:g} s"
            ) from None
        except Exception as exc:  # noqa: BLE001 - any backend failure is the client's 503
            raise BackendUnavailableError(session.key, f"{type(exc).__name__}: {exc}") from exc
        if result.finish_reason == "error" or not result.token_ids:
            why = result.error or f"the backend returned no tokens ({result.finish_reason})"
            if result.token_ids:  # the engine died mid-stream: the tokens it gave are kept, as a stopped call's
                kept = dataclasses.replace(result, finish_reason="abort", error=None)
                await asyncio.shield(self._keep(session, plan, call_id, kept, version, f"the engine failed ({why})"))
            raise BackendUnavailableError(session.key, why)
        if result.logprobs is None:
            raise BackendUnavailableError(
                session.key, "the backend returned no logprobs: the call could not be trained"
            )
        return call_id, result

    async def complete_streamed(self, live: Any, *args: Any, **kwargs: Any) -> Completion:
        """:meth:`complete` (same arguments, same recording) with the engine's tokens handed to ``live`` as
        they come (:class:`tmpl.gateway.streaming.LiveText`: ``live.started(request)`` when the engine request
        starts, ``live.tokens(ids)`` for each piece, from :meth:`Backend.astream`). For one choice: with
        ``n`` above 1 only the first choice is streamed. A call cancelled mid-stream (the client went away)
        records the tokens sampled so far as an aborted call, as :meth:`complete` does.

        >>> done = await gateway.complete_streamed(live, "s1", messages, None, CallParams())  # doctest: +SKIP
        """
        token = _LIVE.set(live)  # the engine requests this call starts (tasks: copies of this context) see it
        try:
            return await self.complete(*args, **kwargs)
        finally:
            _LIVE.reset(token)

    async def _engine(self, request: GenerationRequest, live: Any) -> GenerationResult:
        """The backend's generation of ``request``: :meth:`Backend.agenerate`, or with ``live``, its stream
        (:meth:`Backend.astream`), each piece handed to ``live``. Cancelled mid-stream, the tokens sampled
        so far come back as an aborted result (where every piece had logprobs)."""
        if live is None:
            return await self.backend.agenerate(request)
        ids: list[int] = []
        lps: list[float] | None = []
        live.started(request)
        stream = self.backend.astream(request)
        try:
            async for piece in stream:
                if piece.token_ids:  # (the last piece may carry no tokens, and so no logprobs)
                    ids += piece.token_ids
                    lps = None if lps is None or piece.logprobs is None else lps + list(piece.logprobs)
                    live.tokens(piece.token_ids)
                if piece.result is not None:
                    if piece.result.finish_reason == "error" and ids and lps is not None and len(lps) == len(ids):
                        # failed after tokens were streamed (the server died): they come back with the failure
                        return dataclasses.replace(piece.result, token_ids=ids, logprobs=lps)
                    return piece.result
        except asyncio.CancelledError:
            if ids and lps is not None and len(lps) == len(ids):
                return GenerationResult(request.request_id, ids, lps, "abort", request.sampling.logprobs)
            raise
        finally:
            with contextlib.suppress(Exception):  # an iterator left mid-way: its engine request ends
                await stream.aclose()  # type: ignore[attr-defined]
        return GenerationResult.failed(request.request_id, "the backend's stream ended without a result")

    async def _stop(
        self,
        session: Session,
        plan: Plan,
        call_id: str,
        generation: asyncio.Future[GenerationResult],
        version: int,
        why: str,
    ) -> None:
        """End an engine request nobody waits for any more. Where the backend can stop it keeping what it
        sampled (:meth:`Backend.stop`), those tokens are recorded as a call of the episode (trained: they
        were sampled by the policy, with their logprobs) that no reply continues; else the request is
        cancelled. Either way the session notes the call aborted, and why."""
        result = None
        if generation.done() or await self.backend.stop(call_id):
            try:
                result = await asyncio.wait_for(generation, STOP_WAIT)
            except Exception:  # noqa: BLE001 - no answer after the stop: cancelled below, noted
                result = None
        if not generation.done():
            generation.cancel()
            await self.backend.cancel(call_id)
            # a streamed request, cancelled, gives back the tokens it had (finish "abort"); others are cancelled
            await asyncio.wait({generation}, timeout=STOP_WAIT)
            if generation.done() and not generation.cancelled() and generation.exception() is None:
                result = generation.result()
        await self._keep(session, plan, call_id, result, version, why)

    async def _keep(
        self, session: Session, plan: Plan, call_id: str, result: GenerationResult | None, version: int, why: str
    ) -> None:
        """Record the tokens an engine request sampled before it ended unanswered (stopped, cancelled, or
        the engine lost mid-stream) as an aborted call of the episode (on disk with a store); with none (or
        none recordable), the session notes only why it ended."""
        if result is not None and result.token_ids and result.logprobs is not None and result.finish_reason != "error":
            try:
                session.record_aborted(plan, call_id, result, version=version)
            except TmplError as exc:  # e.g. a logprob that is not finite: nothing recorded, said why
                session.ended[call_id] = f"aborted: {why}; its sampled tokens could not be recorded ({exc})"
                result = None
            else:
                session.ended[call_id] = (
                    f"aborted: {why}; its {len(result.token_ids)} sampled tokens are recorded (never returned to "
                    "the client)"
                )
        else:
            result = None
            session.ended[call_id] = f"aborted: {why} (the engine request was cancelled; nothing sampled came back)"
        if self.durable is not None:
            await self.durable.record_aborted(session, plan, call_id, result, version)

    def _reply(self, call_id: str, plan: Plan, result: GenerationResult, tools: Any, stop: str | None = None) -> Reply:
        """The assistant message of a generation: content, reasoning and calls from the template's parser;
        where a call the model wrote cannot be read, the text it wrote, the problem recorded. ``stop``: the
        stop string that ended it (left out of the content)."""
        parsed = None
        if self._has_parser is not False:
            try:
                parsed = self._reader(result.token_ids, tools=tools)
                self._has_parser = True
            except NoToolParserError:
                self._has_parser = False
        problems = [f"{e.kind}: {e.message}" for e in parsed.errors if e.is_call] if parsed is not None else []
        if parsed is None or problems:
            message: dict[str, Any] = {"role": "assistant", "content": self._text(result.token_ids)}
        else:
            message = parsed.to_message(reasoning_key="reasoning_content")
        if stop is not None:
            content = message.get("content") or ""
            at = content.find(stop)
            message["content"] = (content[:at] if at >= 0 else content).rstrip()
        return Reply(call_id, plan.prompt_ids, result, message, parsed, problems, stop=stop)

    def _text(self, ids: Sequence[int]) -> str:
        """What the model wrote, stop token left out."""
        ids = list(ids)
        if ids and ids[-1] in self.tpl.stop_token_ids:
            ids.pop()
        return self.tpl.codec.decode(ids)


def _cut_at_stop(
    tpl: ChatTemplate, result: GenerationResult, stops: Sequence[str]
) -> tuple[GenerationResult, str | None]:
    """``result`` ending with the token that completes the first stop string it holds (and which string),
    or as it is when it holds none. Binary search over prefixes: containing a string only grows with them."""
    if not stops:
        return result, None
    ids = result.token_ids
    text = tpl.codec.decode(ids)
    found = [(text.find(s), s) for s in stops if s and s in text]
    if not found:
        return result, None
    lo, hi = 1, len(ids)  # the shortest prefix whose text holds a stop string
    while lo < hi:
        mid = (lo + hi) // 2
        head = tpl.codec.decode(ids[:mid])
        if any(s in head for _, s in found):
            hi = mid
        else:
            lo = mid + 1
    head = tpl.codec.decode(ids[:lo])
    first = min((head.find(s), s) for _, s in found if s in head)[1]
    cut = dataclasses.replace(
        result,
        token_ids=list(ids[:lo]),
        logprobs=None if result.logprobs is None else list(result.logprobs[:lo]),
        versions=None if result.versions is None else list(result.versions[:lo]),
        finish_reason="stop",
    )
    return cut, first
