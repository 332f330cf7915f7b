"""One agent episode behind the gateway: its prompts built from token IDs, its calls kept as an episode.

A harness sends the whole conversation on every call. :meth:`Session.plan` matches it against the
*heads* the session holds (each reply it returned, with the conversation it ended and the IDs of its
sequence so far):

- **append**: the request is a head's conversation (its assistant reply as the client sent it back,
  see :func:`~tmpl.gateway.canonical.reply_difference`) followed by tool results only. The prompt is
  that head's IDs plus :meth:`ChatTemplate.suffix_ids` of the new results: the sampled IDs are kept and
  only the new messages are tokenized, as tmpl's own loop does.
- **render**: anything else (a new user turn, a compacted or edited history, a first call). The
  template renders the request; :func:`tmpl.rollout.history.splice` puts back the sampled IDs of every
  earlier reply the render holds unchanged, and encodes only the text between them.

Each generation is a :class:`tmpl.episode.Call` of the session's :class:`tmpl.episode.Episode`: a call
whose prompt extends a sequence continues it; any other starts a branch, whose record names the first
message and field that differ (``edit`` says what the gateway saw the client change).

**Lineages.** A harness makes calls besides its main loop through the same session (a title, a summary,
a sub-agent with a system prompt of its own). Each call belongs to a :class:`Lineage`, keyed by
:func:`lineage_key` (a digest of its leading system text and its tool names; a client may name it
instead, ``X-Tmpl-Lineage``), with heads of its own: a side call starts its own ``agent`` lineage of the
episode, and the main loop's next call still continues the main loop's head by a suffix. The session's
first lineage is its main one (agent label None); the others are labelled ``side-<digest>`` or by the
name the client gave.

>>> session = Session("s1", tpl)                                     # doctest: +SKIP
>>> plan = session.plan(messages, tools)                            # doctest: +SKIP
>>> plan.mode, len(plan.prompt_ids)                                 # doctest: +SKIP
('render', 312)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..episode import Call, Episode
from ..errors import GatewayRequestError, HistoryConflictError
from ..rollout.history import SampledTurn, splice
from .canonical import message_difference, reply_difference, tool_call
from .vision import has_images

if TYPE_CHECKING:
    from ..backends.base import GenerationResult
    from ..chat_template import ChatTemplate
    from ..toolcalls.types import ParsedCompletion
    from ..trajectory.images import ImageInputs
    from ..vision import VisionTemplate

__all__ = ["Head", "Lineage", "Plan", "Reply", "Session", "lineage_key"]

PlanMode = Literal["append", "render"]
#: texts between kept replies a session keeps encoded at most (a client whose history changes every call
#: adds one per call); past it they are dropped and encoded again when met
MAX_GAPS = 64
#: lineages a session keeps heads for (its main one besides); past it the least recently used is dropped
#: (its next call is rendered, the sampled IDs it holds spliced back, and continues its episode lineage)
MAX_LINEAGES = 32


@dataclass(frozen=True)
class Head:
    """A reply the session returned, as the next request can continue it."""

    call: str
    #: the conversation it ended, the reply included (canonical messages)
    messages: tuple[dict[str, Any], ...]
    #: the tools it was rendered with (canonical)
    tools: list[dict[str, Any]] | None
    #: the IDs of the sequence so far are ``prompt + sampled``: the call's prompt, then what it sampled
    #: (lists never changed; joined only when a request continues the head: one copy per call). Only a
    #: lineage's newest head keeps its prompt as a list (the very list its call's plan holds), older ones
    #: None: a list of Python ints per head (16 heads of a 16k-token history: 2 MB a session) is memory,
    #: and a walk for every full collection, that a retry of an older turn rarely needs (it reads ``array``)
    prompt: list[int] | None
    sampled: list[int]
    #: ``prompt + sampled`` as an int32 array: the next call's prompt array is this plus the suffix (no
    #: list of the whole history is converted again on each call)
    array: np.ndarray
    #: a vision template's: the image inputs of the sequence (spans in its IDs; None: no images) and the
    #: images themselves (PIL, in order)
    images: ImageInputs | None = None
    sources: tuple[Any, ...] = ()

    def ids(self) -> list[int]:
        """``prompt + sampled``, a new list (from ``array`` where the head no longer keeps its prompt)."""
        return self.prompt + self.sampled if self.prompt is not None else self.array.tolist()


@dataclass(frozen=True)
class Plan:
    """The prompt of the next call: its IDs, how they were made, and what the client changed."""

    prompt_ids: list[int]
    mode: PlanMode
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    #: what the client changed against the closest head (None: nothing, or a first call)
    edit: str | None = None
    #: tokens tokenized for this prompt (the rest are IDs the engine already saw or sampled)
    encoded: int = 0
    #: ``prompt_ids`` as an int32 array (made from the head's array on the append path)
    array: np.ndarray | None = None
    #: the lineage the call belongs to (:func:`lineage_key`, or the client's name for it)
    lineage: str = ""
    #: how the request's developer and system turns were placed (:func:`tmpl.gateway.roles.place_roles`'s notes)
    roles: Mapping[str, str] = field(default_factory=dict)
    #: a vision template's prompt with images: their image inputs (spans in ``prompt_ids``) and the images
    #: themselves (PIL, in order), for the engine request; None and () without images
    images: ImageInputs | None = None
    sources: tuple[Any, ...] = ()

    def prompt_array(self) -> np.ndarray:
        """``prompt_ids`` as an int32 array."""
        return self.array if self.array is not None else np.asarray(self.prompt_ids, dtype=np.int32)


@dataclass
class Reply:
    """One generated choice, parsed back into an assistant message."""

    call: str
    prompt_ids: list[int]
    result: GenerationResult
    message: dict[str, Any]
    parsed: ParsedCompletion | None
    #: calls the model wrote that could not be read: the reply carries its text instead
    problems: list[str] = field(default_factory=list)
    sequence: int = -1
    #: the stop string that ended it (None: the template's stop token or the length limit)
    stop: str | None = None


@dataclass
class Lineage:
    """The calls of one agent of a session (its main loop, a title generator, a sub-agent): the replies
    they returned that its next call may continue, and the ``agent`` label of its calls in the episode."""

    key: str
    agent: str | None
    heads: deque[Head]


def lineage_key(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> str:
    """The lineage of a call that names none: a digest of its leading system (and developer) text and of
    its tools' names. A harness's side calls (a title, a summary, a sub-agent) differ from its main loop
    in one or the other; the calls of one loop share both.

    >>> main = lineage_key([{"role": "system", "content": "You code."}, {"role": "user", "content": "Hi"}],
    ...                    [{"type": "function", "function": {"name": "bash"}}])
    >>> main == lineage_key([{"role": "system", "content": "You code."}, {"role": "user", "content": "Fix it"}],
    ...                     [{"type": "function", "function": {"name": "bash"}}])
    True
    >>> main == lineage_key([{"role": "system", "content": "Write a title."}, {"role": "user", "content": "Hi"}], None)
    False
    """
    system = []
    for m in messages:
        if m.get("role") not in ("system", "developer"):
            break
        system.append(m.get("content") or "")
    names = sorted(str(t.get("function", {}).get("name")) for t in tools or ())
    digest = hashlib.sha256(json.dumps([system, names], ensure_ascii=False).encode("utf-8")).hexdigest()
    return digest[:12]


class Session:
    """The state of one episode: its heads, the replies it returned, the call ids it issued, its episode.

    ``max_heads``: how many recent replies a request may continue (a client retrying an earlier turn,
    or choosing one of ``n`` choices); ``strict``: refuse (409) a history that holds an assistant turn
    the gateway never returned, instead of starting a branch.
    """

    def __init__(
        self,
        key: str,
        tpl: ChatTemplate,
        *,
        max_heads: int = 16,
        strict: bool = False,
        vision: VisionTemplate | None = None,
    ) -> None:
        self.key = key
        self.tpl = tpl
        #: the vision template (``tpl`` is its text template) whose processor plans prompts with images, or None
        self.vision = vision
        #: per episode sequence, the image inputs of the last call with images recorded on it
        self.seq_images: dict[int, ImageInputs] = {}
        self.strict = strict
        self.episode = Episode(sample_id=key)
        #: the session's environment (``Gateway(env_factory=...)``, a :class:`tmpl.gateway.envs.SessionEnv`), or None
        self.env: Any = None
        self.max_heads = max_heads
        #: the session's lineages by key, least recently used first (see :data:`MAX_LINEAGES`), and its
        #: main one's key (its first lineage; never dropped)
        self.lineages: dict[str, Lineage] = {}
        self.main: str | None = None
        #: every reply returned: (its canonical message, its call id, its sampled IDs), in order
        self.replies: list[tuple[dict[str, Any], str, tuple[int, ...]]] = []
        #: tool call ids the gateway issued, with their tool's name
        self.issued: dict[str, str] = {}
        #: calls that ended other than by a stop or a length (aborted, failed): call id -> reason
        self.ended: dict[str, str] = {}
        #: malformed tool calls the model wrote: (call id, what was wrong)
        self.problems: list[tuple[str, str]] = []
        #: what the gateway left out of the session's requests (hosted tools...), each once, in order
        self.notes: list[str] = []
        #: texts between kept replies already encoded (bounded: see :data:`MAX_GAPS`)
        self.gaps: dict[str, list[int]] = {}
        #: engine requests of this session under way (an ended session never has any)
        self.inflight = 0
        self.created = self.touched = time.monotonic()
        self.calls = 0
        #: tokens of all prompts that were tokenized, and that came as IDs (sampled or seen)
        self.encoded_tokens = 0
        self.reused_tokens = 0
        #: tokens the episode's calls hold (prompts and samples): what ``max_session_tokens`` bounds
        self.tokens_held = 0

    # -- the prompt ------------------------------------------------------------------
    def plan(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: list[dict[str, Any]] | None,
        lineage: str | None = None,
    ) -> Plan:
        """The prompt IDs for ``messages`` (canonical) and ``tools``; see the module docstring. ``lineage``:
        the name the client gave the call's lineage (None: :func:`lineage_key` of the request)."""
        if not messages:
            raise GatewayRequestError(self.key, "messages must hold at least one message", param="messages")
        request = [dict(m) for m in messages]
        self._check_call_ids(request)
        key = f"name:{lineage}" if lineage is not None else lineage_key(request, tools)
        found = self.lineages.get(key)
        heads: Sequence[Head] = () if found is None else found.heads
        plan = self._plan(request, tools, heads)
        return dataclasses.replace(plan, lineage=key)

    def _plan(self, request: list[dict[str, Any]], tools: list[dict[str, Any]] | None, heads: Sequence[Head]) -> Plan:
        """The plan of ``request`` against the heads of its lineage."""
        for head in reversed(heads):  # the same tools as before: the very list, whose digest the
            if head.tools == tools:  # suffix engine keeps by identity (a new list is hashed again)
                tools = head.tools
                break
        continued = False  # the request continues a head (a new user turn, say): no edit to name
        closest: tuple[int, str | None] | None = None  # else where it leaves the head it follows longest
        for head in sorted(reversed(heads), key=lambda h: not _same_ids(request, h)):
            n = len(head.messages)
            diff = _prefix_difference(request, head.messages)
            if head.tools is not tools and head.tools != tools:
                diff = (0, "tools")
            elif diff is None:
                new = request[n:]
                if new and all(m["role"] == "tool" for m in new):
                    if self.vision is not None and (head.images is not None or has_images(new)):
                        return self._append_images(request, tools, head, new)
                    suffix = self.tpl.suffix_ids(
                        new, completion_ids=head.sampled, tools=tools, history=list(head.messages[:-1])
                    )
                    array = np.concatenate([head.array, np.asarray(suffix, dtype=np.int32)])
                    ids = head.ids()
                    ids += suffix
                    return Plan(ids, "append", request, tools, None, len(suffix), array)
                continued = True
                continue
            if closest is None or diff[0] > closest[0]:
                closest = diff
        return self._render(request, tools, None if continued else closest)

    def _render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        closest: tuple[int, str | None] | None,
    ) -> Plan:
        """The template's render of ``messages`` with every returned reply it keeps spliced back as IDs."""
        turns: list[SampledTurn] = []
        used = 0  # replies are matched in order: a reply is kept once, where the history holds it
        rendered: list[dict[str, Any]] = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                rendered.append(m)
                continue
            found = self._reply_for(m, used)
            if found is None:
                if self.strict:
                    raise HistoryConflictError(
                        self.key, f"messages[{i}]: an assistant turn the gateway never returned (strict mode)"
                    )
                rendered.append(m)
                continue
            k, dropped = found
            ours, call_id, sampled = self.replies[k]
            used = k + 1
            # the reply as the gateway returned it (without its reasoning where the client dropped it: the
            # render then shows what the client sent, and the splice keeps the sampled IDs it still holds),
            # with the client's call ids (tool results cite them)
            mine = dict(ours)
            if dropped:
                mine.pop("reasoning_content", None)
            if m.get("tool_calls") and ours.get("tool_calls"):
                mine["tool_calls"] = [
                    tool_call(c["id"] or o["id"], o["function"]["name"], o["function"]["arguments"])
                    for c, o in zip(m["tool_calls"], ours["tool_calls"])
                ]
            rendered.append(mine)
            turn = SampledTurn.of(self.tpl.codec, call_id, i, sampled)
            before = next((t for x in reversed(messages[:i]) if (t := _text_of(x["content"]).strip())), "")
            turns.append(dataclasses.replace(turn, after=before.encode("utf-8")) if before else turn)
        if len(self.gaps) > MAX_GAPS:
            self.gaps.clear()
        with_images = None
        if self.vision is not None and has_images(rendered):  # the processor's render, images expanded
            from ..rollout.images import render_history

            with_images = render_history(self.vision, rendered, tools)
            text = with_images.text
        else:
            text = self.tpl.render(rendered, tools, add_generation_prompt=True)
        spliced = splice(self.tpl, text, turns, self.gaps, sample=self.key, turn=self.calls, messages=rendered)
        edit = None
        if closest is not None:
            index, what = closest
            edit = f"client changed messages[{index}]" + (f" ({what})" if what else "")
        if spliced.edit:
            edit = f"{edit}; {spliced.edit}" if edit else spliced.edit
        if with_images is not None:
            from ..rollout.images import placed

            ids = placed(with_images, spliced.ids, template=self.tpl.name, sample=self.key, turn=self.calls)
            images, sources = ids.images, tuple(with_images.sources)
            return Plan(list(ids), "render", rendered, tools, edit, spliced.encoded, images=images, sources=sources)
        return Plan(spliced.ids, "render", rendered, tools, edit, spliced.encoded)

    def _append_images(
        self, request: list[dict[str, Any]], tools: list[dict[str, Any]] | None, head: Head, new: list[dict[str, Any]]
    ) -> Plan:
        """The append plan of a vision template: :meth:`VisionTemplate.suffix_ids` of the new tool results
        (their images expanded by the processor) after the head's IDs, their images shifted after the head's."""
        from .vision import loaded, shifted_after

        assert self.vision is not None
        messages, pil = loaded(new, "tool_messages")
        suffix = self.vision.suffix_ids(
            messages, completion_ids=head.sampled, tools=tools, history=list(head.messages[:-1])
        )
        ids = head.ids()
        images = shifted_after(head.images, suffix.images, len(ids))
        ids += suffix.ids
        array = np.concatenate([head.array, np.asarray(suffix.ids, dtype=np.int32)])
        sources = head.sources + tuple(pil)
        return Plan(ids, "append", request, tools, None, len(suffix.ids), array, images=images, sources=sources)

    def sequence_images(self) -> list[ImageInputs | None]:
        """The image inputs of each of the episode's sequences (spans in that sequence's IDs), from which a
        trainer rebuilds its model inputs (``images.model_inputs(sequence.ids)``); None for a sequence
        without images. Empty-handed (all None) on a text template."""
        from .vision import sequence_images

        return sequence_images(self.seq_images, [len(s.ids) for s in self.episode.sequences])

    def _reply_for(self, message: Mapping[str, Any], start: int) -> tuple[int, bool] | None:
        """The reply (index into :attr:`replies`, from ``start``) a client's assistant message is, and
        whether the client dropped its reasoning; a reply whose call ids are the message's comes first
        (two choices may read alike once normalized)."""
        ids = [c["id"] for c in message.get("tool_calls", ()) if c["id"]]
        loose = None
        for k in range(start, len(self.replies)):
            ours = self.replies[k][0]
            what = reply_difference(message, ours)
            dropped = what == "reasoning_content" and not message.get("reasoning_content")
            if what is not None and not dropped:
                continue
            if not ids or ids == [c["id"] for c in ours.get("tool_calls", ())]:
                return k, dropped
            if loose is None:
                loose = (k, dropped)
        return loose

    def _check_call_ids(self, messages: list[dict[str, Any]]) -> None:
        """Every tool result answers a call id an assistant turn of the request holds, or one the gateway issued."""
        held: set[str] = set()
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                held.update(c["id"] for c in m.get("tool_calls", ()) if c["id"])
            elif m["role"] == "tool" and m["tool_call_id"] not in held and m["tool_call_id"] not in self.issued:
                raise GatewayRequestError(
                    self.key,
                    f"messages[{i}]: a tool result for call id {m['tool_call_id']!r} that no assistant turn "
                    "of the request holds and the gateway never issued",
                    param=f"messages[{i}].tool_call_id",
                )

    # -- the episode -----------------------------------------------------------------
    def record(self, plan: Plan, reply: Reply, *, version: int | None) -> None:
        """Keep a generated reply: a call of the episode, a head the next request may continue."""
        result = reply.result
        prompt = plan.prompt_array()
        sampled = list(result.token_ids)
        call = Call(
            prompt,
            sampled,
            result.logprobs,
            versions=result.versions if result.versions is not None else version,
            id=reply.call,
            turn=self.calls,
            agent=self._lineage(plan.lineage).agent,
        )
        # the conversation with the reply: a later branch names where the client left it
        reply.sequence = self._add(call, plan, [*plan.messages, reply.message])
        self.calls += 1
        self.encoded_tokens += plan.encoded
        self.reused_tokens += len(plan.prompt_ids) - plan.encoded
        self.tokens_held += len(prompt) + len(sampled)
        if result.finish_reason not in ("stop", "length"):
            self.ended[reply.call] = result.finish_reason + (f": {result.error}" if result.error else "")
        for c in reply.message.get("tool_calls", ()):
            self.issued[c["id"]] = c["function"]["name"]
        self.problems += [(reply.call, problem) for problem in reply.problems]
        self.replies.append((reply.message, reply.call, tuple(sampled)))
        heads = self._lineage(plan.lineage).heads
        if heads and heads[-1].prompt is not None:  # only the newest head keeps its prompt as a list
            heads[-1] = dataclasses.replace(heads[-1], prompt=None)
        heads.append(
            Head(
                reply.call,
                (*plan.messages, reply.message),
                plan.tools,
                plan.prompt_ids,
                sampled,
                np.concatenate([call.prompt_ids, call.completion_ids]),
                plan.images,
                plan.sources,
            )
        )
        self.touched = time.monotonic()

    def record_aborted(self, plan: Plan, call_id: str, result: GenerationResult, *, version: int | None) -> None:
        """Keep the tokens an engine sampled for a call whose client went away (or that timed out): a
        call of the episode, with the prompt it was sent, that no request can continue (no head, no reply:
        the client never saw them)."""
        sampled = list(result.token_ids)
        call = Call(
            plan.prompt_array(),
            sampled,
            result.logprobs,
            versions=result.versions if result.versions is not None else version,
            id=call_id,
            turn=self.calls,
            agent=self._lineage(plan.lineage).agent,
        )
        self._add(call, plan, plan.messages)
        self.calls += 1
        self.tokens_held += len(plan.prompt_ids) + len(sampled)
        self.touched = time.monotonic()

    def _add(self, call: Call, plan: Plan, messages: list[dict[str, Any]]) -> int:
        """Add ``call`` to the episode; the sequence it lands on. A call with images never continues a
        sequence its IDs extend whose images differ (same IDs, other pixels): it branches from it."""
        if plan.images is None:
            return self.episode.add_call(call, edit=plan.edit, messages=messages)
        from .vision import clashes

        apart = clashes(self.episode, self.seq_images, plan.prompt_ids, plan.images)
        index = self.episode.add_call(call, edit=plan.edit, messages=messages, apart=apart)
        self.seq_images[index] = plan.images
        return index

    def _lineage(self, key: str) -> Lineage:
        """The lineage ``key`` (made on its first recorded call), now the most recently used."""
        found = self.lineages.pop(key, None)
        if found is None:
            if self.main is None:
                self.main = key
            if key.startswith("name:"):
                agent: str | None = key[len("name:") :]
            else:
                agent = None if key == self.main else f"side-{key}"
            found = Lineage(key, agent, deque(maxlen=self.max_heads))
            others = [k for k in self.lineages if k != self.main]
            while len(others) >= MAX_LINEAGES:
                del self.lineages[others.pop(0)]
        self.lineages[key] = found
        return found


def _prefix_difference(
    messages: Sequence[Mapping[str, Any]], head: Sequence[Mapping[str, Any]]
) -> tuple[int, str | None] | None:
    """Where ``messages`` stop being a continuation of ``head`` (index, field), or None where they are one."""
    for i, ours in enumerate(head):
        if i >= len(messages):
            return i, None
        what = message_difference(messages[i], ours)
        if what is not None:
            return i, what
    return None


def _text_of(content: Any) -> str:
    """A canonical content's text: the string, or the text parts of a list (one with images) joined."""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or () if isinstance(p, Mapping) and p.get("type") == "text")


def _same_ids(request: Sequence[Mapping[str, Any]], head: Head) -> bool:
    """Whether the request holds the head's reply with the very call ids it was returned with."""
    n = len(head.messages)
    if len(request) < n:
        return False
    theirs = request[n - 1].get("tool_calls") or ()
    ours = head.messages[-1].get("tool_calls") or ()
    return bool(ours) and [c.get("id") for c in theirs] == [c.get("id") for c in ours]
