"""Where an assistant turn closes inside a full render of a dummy conversation.

The probe renders a conversation made of sentinels (strings that appear nowhere
else; :mod:`tmpl.sentinels` builds it) and finds the assistant turn's close
**inside the full render** of ``history + [assistant] + tool messages``. It does
not assume that the render ending with the assistant is a prefix of the full
render (stock Qwen3 adds an empty ``<think>`` block only when the assistant
message is last). Instead it reads both renders after the assistant's last
sentinel: their common part is the end of the assistant turn, and the last atom
(a cleanly-splitting added token) in that common part is the turn close.
Whitespace after the close (the ``\\n`` after ``<|im_end|>``) belongs to the suffix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import SpliceError, TemplateRenderError, UnsupportedTemplateError
from ..render import Renderer
from ..sentinels import (
    NEXT_USER_SENTINEL,
    PROBE_TOOLS,
    TEXT_SENTINEL,
    USER_SENTINEL,
    arg_sentinels,
    assistant_reply,
    sentinel_tool_turn,
    user_turn,
)

# The probe's vocabulary lives in :mod:`tmpl.sentinels`; these names stay importable from here.
from ..sentinels import PROBE_TOOL_NAME as PROBE_TOOL_NAME
from ..sentinels import arg_sentinel as arg_sentinel
from ..sentinels import call_id as call_id
from ..sentinels import content_sentinel as content_sentinel
from ..sentinels import dummy_tool_turn as dummy_tool_turn
from ..tokenize import Codec


@dataclass(frozen=True)
class Close:
    """Where an assistant turn closes in a full render.

    ``ids`` are the close's token IDs (one atom); ``tail`` is the text from the end of the
    assistant's last sentinel to the end of the close, which locates the close again in
    other renders of the same conversation shape.
    """

    ids: tuple[int, ...]
    text: str
    char_end: int
    token_end: int
    tail: str
    how: str


@dataclass
class CloseLocator:
    """Finds the close again in another render of the same dummy conversation shape.

    The close's ``tail`` may contain the probe's call ids (Mistral writes them into the
    assistant turn); they are replaced by the ids of the render being searched.
    """

    anchors: tuple[str, ...]
    close: Close
    probe_ids: tuple[str | None, ...] = ()
    after: str = USER_SENTINEL

    def tail_for(self, ids: Sequence[str | None]) -> str:
        tail = self.close.tail
        for old, new in zip(self.probe_ids, ids):
            if old is not None and new is not None and old != new:
                tail = tail.replace(old, new)
        return tail

    def char_end(self, text: str, ids: Sequence[str | None] = ()) -> int:
        """Character position just after the close in ``text``; -1 when the shape does not match."""
        end = anchor_end(text, self.after, self.anchors)
        tail = self.tail_for(ids) if ids else self.close.tail
        if end < 0 or not text.startswith(tail, end):
            return -1
        return end + len(tail)


def anchor_end(text: str, after: str, anchors: Sequence[str]) -> int:
    """End of the last of ``anchors`` found after ``after`` (end of ``after`` itself when none is found)."""
    start = text.find(after)
    if start < 0:
        return -1
    start += len(after)
    best = start
    for anchor in anchors:
        pos = text.find(anchor, start)
        if pos >= 0:
            best = max(best, pos + len(anchor))
    return best


def count_anchors(text: str, after: str, anchors: Sequence[str]) -> int:
    start = text.find(after)
    if start < 0:
        return 0
    return sum(1 for a in anchors if text.find(a, start) >= 0)


def _tokens_from(offsets: Sequence[tuple[int, int]], char_pos: int) -> int:
    """Index of the first token that starts at or after ``char_pos``."""
    for t, (s, e) in enumerate(offsets):
        if s >= char_pos and e > s:
            return t
    return len(offsets)


def find_close(
    codec: Codec,
    name: str,
    full_text: str,
    anchors: Sequence[str],
    close_id: int,
    *,
    after: str = USER_SENTINEL,
    prompt_text: str | None = None,
) -> Close:
    """Locate a close already known by its token (the template-level tool close) in ``full_text``:
    its first occurrence after the assistant's last anchor (or after the generation prompt)."""
    ids, offsets = codec.encode_with_offsets(full_text)
    a_full = anchor_end(full_text, after, anchors)
    if a_full < 0:
        raise UnsupportedTemplateError(name, "the user message of the probe conversation is not rendered")
    if a_full == len(after) and after == "" and not prompt_text:
        raise UnsupportedTemplateError(name, "cannot locate the assistant turn: its calls are not rendered")
    start = a_full
    if prompt_text and full_text.startswith(prompt_text):
        start = max(a_full, len(prompt_text))
    for t in range(_tokens_from(offsets, start), len(ids)):
        if ids[t] == close_id:
            char_end = offsets[t][1]
            return Close(
                ids=(close_id,),
                text=codec.token_text(close_id),
                char_end=char_end,
                token_end=t + 1,
                tail=full_text[a_full:char_end],
                how="first occurrence of the template's tool-turn close",
            )
    raise UnsupportedTemplateError(
        name, f"the turn close {codec.token_text(close_id)!r} does not follow this shape of tool turn"
    )


def _pick_close(candidates: Sequence[int], ids: Sequence[int], codec: Codec) -> int:
    """The first special candidate (what generation stops on), else the last candidate."""
    for t in candidates:
        if ids[t] in codec.special_ids:
            return t
    return candidates[-1] if candidates else -1


def locate_close(
    codec: Codec,
    name: str,
    full_text: str,
    alone_text: str | None,
    anchors: Sequence[str],
    *,
    after: str = USER_SENTINEL,
    prompt_text: str | None = None,
) -> Close:
    """Find the assistant turn's close in ``full_text``.

    ``alone_text`` is the render that ends with the assistant message (no generation
    prompt), or None when that render failed. ``anchors`` are sentinels inside the
    assistant turn (argument values, content). The two renders are compared token by
    token after the assistant's last anchor; the last closing atom they share is the close.
    A token that also occurs between the anchors (between two calls) cannot close the
    turn: as a stop token it would end generation after the first call.

    Raises :class:`SpliceError` when the turn visibly closes with text that is not a
    single token of this tokenizer (a template written for another model), and
    :class:`UnsupportedTemplateError` when no close can be found at all.
    """
    ids, offsets = codec.encode_with_offsets(full_text)
    a_full = anchor_end(full_text, after, anchors)
    if a_full < 0:
        raise UnsupportedTemplateError(name, "the user message of the probe conversation is not rendered")
    region_start = a_full
    if prompt_text and full_text.startswith(prompt_text) and (alone_text or prompt_text).startswith(prompt_text):
        region_start = max(a_full, len(prompt_text))
    t_full = _tokens_from(offsets, region_start)
    u_end = full_text.find(after) + len(after)
    first_anchor = min((p for p in (full_text.find(a, u_end) for a in anchors) if p >= 0), default=a_full)
    inside = {ids[t] for t in range(_tokens_from(offsets, first_anchor), _tokens_from(offsets, a_full))}

    def closing(tid: int) -> bool:
        return tid in codec.close_ids and tid not in inside

    close_t, how = -1, ""
    common_text = ""
    if alone_text is not None:
        a_alone = anchor_end(alone_text, after, anchors)
        if a_alone >= 0 and region_start > a_full:
            a_alone = region_start
        if a_alone >= 0:
            alone_ids, alone_offsets = codec.encode_with_offsets(alone_text)
            t_alone = _tokens_from(alone_offsets, a_alone)
            n = 0
            while t_full + n < len(ids) and t_alone + n < len(alone_ids) and ids[t_full + n] == alone_ids[t_alone + n]:
                n += 1
            shared = [t for t in range(t_full, t_full + n) if closing(ids[t])]
            if n:
                common_text = full_text[region_start : offsets[t_full + n - 1][1]]
            if shared:
                close_t, how = _pick_close(shared, ids, codec), "common end of the full and assistant-last renders"
            else:
                alone_cands = [t for t in range(t_alone, len(alone_ids)) if closing(alone_ids[t])]
                pick = _pick_close(alone_cands, alone_ids, codec)
                found = [t for t in range(t_full, len(ids)) if pick >= 0 and ids[t] == alone_ids[pick]]
                if found:
                    close_t, how = found[0], "close of the assistant-last render"
    if close_t < 0 and not common_text.strip():
        specials = [t for t in range(t_full, len(ids)) if closing(ids[t]) and ids[t] in codec.special_ids]
        if specials:
            close_t, how = specials[0], "first special token after the assistant turn"
    if close_t < 0:
        if common_text.strip():
            raise SpliceError(
                name,
                f"after the assistant turn ({common_text.strip()[-32:]!r})",
                "the turn closes with text that is not a single token of this tokenizer, so no stop token "
                "can end the turn and IDs cannot be spliced there",
            )
        raise UnsupportedTemplateError(name, "cannot find where the assistant turn closes in the full render")
    char_end = offsets[close_t][1]
    if ids[close_t] not in codec.special_ids and common_text:
        # an ordinary added token followed by more closing text: the turn really closes with text
        after_close = full_text[char_end : region_start + len(common_text)]
        if after_close.strip():
            raise SpliceError(
                name,
                f"after the assistant turn ({common_text.strip()[-32:]!r})",
                "the turn closes with text that is not a single token of this tokenizer, so no stop token "
                "can end the turn and IDs cannot be spliced there",
            )
    return Close(
        ids=(ids[close_t],),
        text=codec.token_text(ids[close_t]),
        char_end=char_end,
        token_end=close_t + 1,
        tail=full_text[a_full:char_end],
        how=how,
    )


@dataclass
class TurnProbe:
    """How one kind of assistant turn (plain text, or tool calls) closes."""

    close: Close
    stop_id: int | None  # the token the model is trained to end this turn with
    k: int = 0  # number of calls probed (0 for a plain turn)
    tools_needed: bool = False  # the template renders only when given a tools list


@dataclass
class TurnInfo:
    """The template-level probe: plain and tool-call turns, or why each failed."""

    plain: TurnProbe | None
    plain_error: Exception | None
    tool: TurnProbe | None
    tool_error: Exception | None


def _trained_stop(codec: Codec, alone: str, close: Close, inside: set[int], start: int) -> int | None:  # noqa: ARG001
    """The token that ends the turn in the assistant-last render (the training target)."""
    ids, offsets = codec.encode_with_offsets(alone)
    cands = [t for t, (s, e) in enumerate(offsets) if s >= start and e > s and ids[t] in codec.close_ids]
    cands = [t for t in cands if ids[t] not in inside]
    pick = _pick_close(cands, ids, codec)
    return ids[pick] if pick >= 0 else None


def _turn(
    renderer: Renderer,
    codec: Codec,
    history: list[dict[str, Any]],
    assistant: dict[str, Any],
    after_msgs: list[dict[str, Any]],
    anchors: list[str],
    tools: list[dict[str, Any]] | None,
) -> TurnProbe:
    full = renderer.text(history + [assistant] + after_msgs, tools=tools, add_generation_prompt=True)
    if 0 < count_anchors(full, USER_SENTINEL, anchors) < len(anchors):
        raise UnsupportedTemplateError(
            renderer.name, f"renders only some of the {len(anchors)} tool calls of one assistant turn"
        )
    try:
        alone: str | None = renderer.text(history + [assistant], tools=tools, add_generation_prompt=False)
    except TemplateRenderError:
        alone = None
    prompt = None
    if count_anchors(full, USER_SENTINEL, anchors) == 0:
        prompt = renderer.text(history, tools=tools, add_generation_prompt=True)
    close = locate_close(codec, renderer.name, full, alone, anchors, prompt_text=prompt)
    stop = None
    if alone is not None:
        a = anchor_end(alone, USER_SENTINEL, anchors)
        if prompt and alone.startswith(prompt):
            a = max(a, len(prompt))
        stop = _trained_stop(codec, alone, close, _inside_ids(codec, full, anchors), a)
    return TurnProbe(close=close, stop_id=stop if stop is not None else close.ids[0])


def _inside_ids(codec: Codec, text: str, anchors: Sequence[str]) -> set[int]:
    """IDs between the first and the last anchor (tokens written between two calls)."""
    u = text.find(USER_SENTINEL) + len(USER_SENTINEL)
    starts = [p for p in (text.find(a, u) for a in anchors) if p >= 0]
    if len(starts) < 2:
        return set()
    ids, offsets = codec.encode_with_offsets(text)
    lo, hi = min(starts), anchor_end(text, USER_SENTINEL, anchors)
    return {ids[t] for t, (s, e) in enumerate(offsets) if s >= lo and e <= hi}


def probe_plain_turn(renderer: Renderer, codec: Codec) -> TurnProbe:
    """Probe how a plain (text-only) assistant turn closes.

    Templates that render only when given a tools list are probed with the probe tool.
    """
    history = [user_turn()]
    assistant = assistant_reply(TEXT_SENTINEL)
    follow = [user_turn(NEXT_USER_SENTINEL)]
    try:
        return _turn(renderer, codec, history, assistant, follow, [TEXT_SENTINEL], None)
    except TemplateRenderError:
        probe = _turn(renderer, codec, history, assistant, follow, [TEXT_SENTINEL], PROBE_TOOLS)
        probe.tools_needed = True
        return probe


def probe_tool_turn(renderer: Renderer, codec: Codec, k: int = 2) -> TurnProbe:
    """Probe how an assistant turn with ``k`` tool calls closes (falls back to one call).

    Two calls are probed first, so that a token written between calls is never taken
    for the turn's close. The probe tool is passed as the tools list.
    """
    last_error: Exception | None = None
    for n in sorted({k, 1}, reverse=True):
        history, assistant, tool_msgs = sentinel_tool_turn(n)
        try:
            probe = _turn(renderer, codec, history, assistant, tool_msgs, arg_sentinels(n), PROBE_TOOLS)
        except (TemplateRenderError, UnsupportedTemplateError) as exc:
            last_error = exc
            continue
        probe.k = n
        return probe
    assert last_error is not None
    raise last_error


def probe_turns(renderer: Renderer, codec: Codec) -> TurnInfo:
    """Probe plain and tool-call turns; errors are kept, not raised (see :class:`TurnInfo`)."""
    from ..errors import TmplError

    plain = tool = None
    plain_error = tool_error = None
    try:
        plain = probe_plain_turn(renderer, codec)
    except TmplError as exc:
        plain_error = exc
    try:
        tool = probe_tool_turn(renderer, codec)
    except TmplError as exc:
        if isinstance(exc, TemplateRenderError):
            exc = UnsupportedTemplateError(renderer.name, f"cannot render a tool conversation: {exc.reason}")
        tool_error = exc
    return TurnInfo(plain=plain, plain_error=plain_error, tool=tool, tool_error=tool_error)
