"""A live call's text (:class:`LiveText`): the engine's tokens decoded as they come, whole characters only, held back
while they could begin a parser marker or a stop string; each template's markers (:func:`live_markers`), and
:func:`follow`, a call's pieces and keep-alives as they happen."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from ...errors import GatewayError, NoToolParserError

if TYPE_CHECKING:
    from ...backends.base import GenerationRequest
    from ...chat_template import ChatTemplate
    from ..service import Completion


#: a dialect's whole answer to a finished call (its non-streamed body): what the end of a stream is built from
Final = Callable[["Completion"], dict[str, Any]]


log = logging.getLogger("tmpl.gateway")


#: parsers whose every call starts with one of their delimiters: text before a delimiter is content
_MARKED = frozenset(
    {"hermes", "tool_calls_tag", "nemotron", "phi4", "qwen3_xml", "glm4", "deepseek_v3", "kimi_k2", "mistral", "gemma4"}
)


_Profile = tuple[bool, tuple[str, ...], bool, "tuple[str, str] | None"]


_MARKERS: weakref.WeakKeyDictionary[Any, _Profile] = weakref.WeakKeyDictionary()


def live_markers(tpl: ChatTemplate) -> tuple[bool, tuple[str, ...], bool]:
    """``(live, markers, strip)`` of a template: whether its content can be sent before the turn ends, the
    texts that end the live part (its parser's delimiters and reasoning open and close), and whether the
    reply's content is stripped (it is by every parser; a template with no parser gets its text as is).

    >>> live_markers(tpl)                               # doctest: +SKIP
    (True, ('<tool_call>', '</tool_call>', '<think>', '</think>'), True)
    """
    live, markers, strip, _ = _profile(tpl)
    return live, markers, strip


def _profile(tpl: ChatTemplate) -> _Profile:
    """:func:`live_markers` and the parser's reasoning open and close (None: it has none, or the prompt
    opens the block)."""
    try:
        return _MARKERS[tpl]
    except (KeyError, TypeError):
        pass
    from ...toolcalls.api import parser_for

    try:
        parser = parser_for(tpl)
    except NoToolParserError:
        found: _Profile = (True, (), False, None)
    else:
        think = tuple(t for t in (parser.think or ()) if t)
        opened = parser.think is not None and not parser.think[0]  # the prompt opened the reasoning
        live = parser.name in _MARKED and not opened
        pair = parser.think if parser.think is not None and len(think) == 2 else None
        found = (live, tuple(dict.fromkeys((*parser.delimiters, *think))), True, pair)
    try:
        _MARKERS[tpl] = found
    except TypeError:
        pass
    return found


class LiveText:
    """The live text of one streamed call: token IDs in (:meth:`tokens`), content text out (:attr:`queue`).

    ``stops``: the call's stop strings (each also held back and ending the live part). Events on
    :attr:`queue`: ``("started", request)`` when the engine request starts, ``("content", text)`` for
    each new piece of content. :attr:`sent` is the content sent so far.

    >>> live = LiveText(tpl)                            # doctest: +SKIP
    >>> live.tokens(tok.encode("Hello, wor")); live.sent  # doctest: +SKIP
    'Hello,'
    """

    def __init__(self, tpl: ChatTemplate, stops: Sequence[str] = ()) -> None:
        self.codec = tpl.codec
        self.stop_ids = frozenset(tpl.stop_token_ids)
        self.live, markers, self.strip, self.think = _profile(tpl)
        self.markers = tuple(m for m in (*markers, *stops) if m)
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.started_event = asyncio.Event()
        #: the engine request (set when it starts): its id names the call, its prompt the input tokens
        self.request: GenerationRequest | None = None
        self.ids: list[int] = []
        self.text = ""  # the complete characters decoded so far
        self.sent = ""
        self.frozen = not self.live  # from the first marker (or a special token) on, nothing is sent live
        self._prefix = 0
        self._read = 0
        self._start = 0  # where the content begins in ``text`` (its leading whitespace skipped)
        self._scanned = 0  # ``text`` searched for markers up to here
        self._longest = max((len(m) for m in self.markers), default=0)
        #: a reply that opens with the reasoning block has it sent live too (``("reasoning", text)``) up to
        #: its close; ``phase``: "start" (not decided yet), "reasoning", "content"
        self.phase = "start" if self.think is not None else "content"
        self.reasoning_sent = ""
        self._r0 = 0  # where the reasoning begins in ``text``
        self._c0 = 0  # where the content's region begins (after the reasoning's close)

    def started(self, request: GenerationRequest) -> None:
        """The engine request has started (the prompt is planned): the stream may begin."""
        self.request = request
        self.started_event.set()
        self.queue.put_nowait(("started", request))

    def replay(self, done: Completion) -> None:
        """A call answered before (a retried request, :mod:`tmpl.gateway.durable`): the stream starts under the
        recorded call's id and prompt, and sends nothing live; its end sends the recorded reply whole."""
        from ...backends.base import GenerationRequest

        reply = done.replies[0]
        request = GenerationRequest(reply.call, done.plan.prompt_ids, max(1, len(reply.result.token_ids)),
                                    self.stop_ids)  # fmt: skip
        self.frozen = True
        self.started(request)

    def tokens(self, ids: Sequence[int]) -> None:
        """New sampled IDs: their complete text decoded, the part surely content queued. Never raises."""
        if self.frozen or not ids:
            return
        try:
            self._tokens(list(ids))
        except Exception:  # noqa: BLE001 - the stream's text is a courtesy: the recorded call never depends on it
            log.exception("gateway: the live text of %s failed; the rest is sent at the end", self.call_id)
            self.frozen = True

    @property
    def call_id(self) -> str | None:
        return None if self.request is None else self.request.request_id

    def _tokens(self, ids: list[int]) -> None:
        ends = [k for k, t in enumerate(ids) if t in self.stop_ids or (self.strip and t in self.codec.special_ids)]
        if ends:  # a turn end or another special token: the text before it is the last that can be live
            ids = ids[: ends[0]]
        self.ids += ids
        window = self.codec.decode(self.ids[self._prefix : self._read])
        text = self.codec.decode(self.ids[self._prefix :])
        if len(text) > len(window) and not text.endswith("\ufffd"):  # only complete characters
            self.text += text[len(window) :]
            self._prefix, self._read = self._read, len(self.ids)
        self._send(final=bool(ends))

    def _send(self, *, final: bool) -> None:
        if self.phase != "content" and not self._reasoning(final=final):
            return
        t = self.text
        cut = len(t)
        since = max(self._c0, self._scanned - self._longest)  # a marker not found before ends in the new text
        self._scanned = len(t)
        for m in self.markers:
            at = t.find(m, since)
            if at >= 0:
                cut, final = min(cut, at), True
        if not final:  # hold back a tail that may grow into a marker
            for m in self.markers:
                for k in range(min(len(m) - 1, len(t)), 0, -1):
                    if t.endswith(m[:k]):
                        cut = min(cut, len(t) - k)
                        break
        if final:
            self.frozen = True
        start = self._start
        if self.strip:  # the parser strips the content: leading whitespace never sent, trailing held back
            while start < cut and t[start].isspace():
                start += 1
            if not self.sent:
                self._start = start
            while cut > start and t[cut - 1].isspace():
                cut -= 1
        end = self._start + len(self.sent)  # where the text sent so far ends in ``t``
        if cut > end:
            piece = t[end:cut]
            self.sent += piece
            self.queue.put_nowait(("content", piece))

    def _reasoning(self, *, final: bool) -> bool:
        """Send the new reasoning of a reply that opens with the block; True once its content may follow."""
        assert self.think is not None
        opener, closer = self.think
        t = self.text
        if self.phase == "start":
            lead = len(t) - len(t.lstrip())
            head = t[lead:]
            if head.startswith(opener):
                self.phase, self._r0 = "reasoning", lead + len(opener)
            elif opener.startswith(head) and not final:
                return False  # may still become the open marker
            else:
                self.phase = "content"
                return True
        at = t.find(closer, self._r0)
        end = at if at >= 0 else len(t)
        if at < 0 and not final:
            for k in range(min(len(closer) - 1, len(t)), 0, -1):
                if t.endswith(closer[:k]):
                    end = len(t) - k
                    break
        start = self._r0
        while start < end and t[start].isspace():
            start += 1
        while end > start and t[end - 1].isspace():
            end -= 1
        sent_end = start + len(self.reasoning_sent)
        if end > sent_end:
            piece = t[sent_end:end]
            self.reasoning_sent += piece
            self.queue.put_nowait(("reasoning", piece))
        if at < 0:
            if final:
                self.frozen = True
            return False
        self.phase = "content"
        self._start = self._scanned = self._c0 = at + len(closer)
        return True

    def rest_reasoning(self, reasoning: str) -> str:
        """The part of the reply's final ``reasoning`` not sent live (as :meth:`rest`)."""
        if reasoning.startswith(self.reasoning_sent):
            return reasoning[len(self.reasoning_sent) :]
        log.warning("gateway: call %s sent reasoning %r live, which does not begin it", self.call_id,
                    self.reasoning_sent[:80])  # fmt: skip
        return ""

    def rest(self, content: str) -> str:
        """The part of the reply's final ``content`` not sent live ("" when the live part does not begin
        it, which a parser that rewrites text could cause: logged, nothing more can be done)."""
        if content.startswith(self.sent):
            return content[len(self.sent) :]
        log.warning("gateway: call %s sent %r live, which does not begin its content", self.call_id, self.sent[:80])
        return ""


async def follow(live: LiveText, task: asyncio.Future[Completion], keepalive: float) -> AsyncIterator[tuple[str, Any]]:
    """A streamed call's events: ``("ping", None)`` after ``keepalive`` seconds without any,
    ``("reasoning", text)`` and ``("content", text)``, then ``("done", Completion)`` or ``("error", GatewayError)`` once the call ends."""
    task.add_done_callback(lambda _: live.queue.put_nowait(("end", None)))
    while True:
        try:
            kind, value = await asyncio.wait_for(live.queue.get(), keepalive)
        except asyncio.TimeoutError:
            yield "ping", None
            continue
        if kind == "end":
            break
        if kind in ("content", "reasoning"):
            yield kind, value
    if task.cancelled():
        yield "error", GatewayError(None, 500, "the call was cancelled")
        return
    exc = task.exception()
    if exc is None:
        yield "done", task.result()
    elif isinstance(exc, GatewayError):
        yield "error", exc
    else:
        log.error("gateway: a streamed call failed", exc_info=exc)
        wrapped = GatewayError(None, 500, f"internal error: {type(exc).__name__}: {exc}")
        wrapped.kind = "api_error"
        yield "error", wrapped
