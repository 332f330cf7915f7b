"""Suffix frames: the suffix of one tool-turn shape, as cached IDs around the tool contents.

A frame is built once per (tools, tool-message shape) from renders of a dummy
conversation. The suffix text after the turn close is cut at atoms (added
tokens that split text cleanly, see :mod:`tmpl.tokenize.codec`). Runs between atoms that
hold no tool content are static: their IDs come straight from the probe's
render. Runs that hold a content (or a call id) are dynamic: each call encodes
only those runs, each together with the atom on its left, and splices the IDs.

A frame is trusted only after it reproduces the IDs of full renders for hard
contents (quotes, newlines, unicode, JSON, padding, empty, 10k characters), per
*content class*. A content whose class did not verify, or that is not a string,
goes through the per-call path: one real render, still exact.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring, encode_basestring_ascii
from typing import Any

from .. import _compat
from ..errors import MessageError, TemplateError, TemplateRenderError, UnsupportedTemplateError
from ..render import Renderer
from ..sentinels import (
    EARLIER_REPLY_SENTINEL,
    EARLIER_USER_SENTINEL,
    PRIOR_ARG_SENTINEL,
    PRIOR_RESULT_SENTINEL,
    PROBE_TOOL_NAME,
    SYSTEM_SENTINEL,
    USER_SENTINEL,
    arg_sentinels,
    assistant_reply,
    assistant_with_calls,
    call_id,
    call_ids,
    content_sentinel,
    content_sentinels,
    dummy_tool_turn,
    probe_call,
    tool_result,
    user_turn,
)
from ..tokenize import Codec
from .cuts import Cut, head_cuts, tail_cuts
from .probe import Close, CloseLocator, count_anchors, find_close

#: Transforms a template may apply to a tool content, tried in this order. Contents are str
#: here, for which ``json.dumps(s, ensure_ascii=...)`` is exactly the encoder's string
#: function (the C one), called directly: no encoder object per call.
TRANSFORMS: dict[str, Callable[[str], str]] = {
    "identity": lambda s: s,
    "tojson": encode_basestring,
    "trim": lambda s: s.strip(),
    "tojson_ascii": encode_basestring_ascii,
    "trim_tojson": lambda s: encode_basestring(s.strip()),
}

#: Verification contents per content class.
HARD_CONTENTS: dict[str, tuple[str, ...]] = {
    "plain": (
        "Result: 21.5 C, sunny; humidity 40%",
        'He said "hi" \\ \'ok\' \\" \\\\n end',
        "unicode: é ñ 漢字 🙂 ∑ ß Ωmega",
        '{"nested": {"a": [1, 2.5, null, true]}, "s": "x\\"y", "u": "é"}',
        "line1\nline2\n\n\tindented\r\nwindows",
        "<b>tags</b> &amp; {{ not jinja }} {% raw %} [brackets] <|fake|>",
        ("0123456789 abcdefghij " * 455)[:10000],
    ),
    "padded": ("  leading spaces", "trailing newline\n", "\n\n both \n\n", " \t mixed \r\n"),
    "empty": ("",),
}

#: Call ids that can be spliced as text (others go through the per-call path).
ID_SAFE = re.compile(r"[A-Za-z0-9_.:\-]+\Z")


def content_class(content: str) -> str:
    """Class of a tool content for frame verification: ``plain``, ``padded`` or ``empty``."""
    if not content:
        return "empty"
    if content[0].isspace() or content[-1].isspace():
        return "padded"
    return "plain"


@dataclass(frozen=True)
class Slot:
    """A place in a dynamic run filled from tool message ``message``'s ``field``."""

    message: int
    field: str  # "content" or "tool_call_id"


def _joined(
    pieces: Sequence[str | Slot], messages: Sequence[Mapping[str, Any]], fns: Sequence[Callable[[str], str]]
) -> str:
    """The text of a run's pieces: literals as they are, slots filled from the messages."""
    parts = []
    for piece in pieces:
        if isinstance(piece, str):
            parts.append(piece)
        elif piece.field == "content":
            parts.append(fns[piece.message](messages[piece.message]["content"]))
        else:
            parts.append(messages[piece.message]["tool_call_id"])
    return "".join(parts)


@dataclass
class DynamicRun:
    """Text between two atoms that holds slots; encoded per call together with its left anchor.

    ``head`` is the anchor text plus the literal text before the first slot (``lead``);
    ``rest`` alternates slots and literal text. A run with one slot (the common case) is
    built by three string concatenations. ``head_cuts`` and ``tail_cuts`` (see
    :mod:`tmpl.suffix.cuts`) let a call encode the content without the frame text around it.
    """

    anchor: str  # text of the atom on the left (encoded with the run, its IDs then dropped)
    anchor_len: int  # number of IDs the anchor encodes to
    pieces: tuple[str | Slot, ...]
    head_cuts: tuple[Cut, ...] = ()
    tail_cuts: tuple[Cut, ...] = ()

    def __post_init__(self) -> None:
        pieces = list(self.pieces)
        head = self.anchor
        while pieces and isinstance(lead := pieces[0], str):
            head += lead
            pieces.pop(0)
        self.head = head
        self.lead = head[len(self.anchor) :]
        self.rest = tuple(pieces)
        first = pieces[0] if pieces else None
        tail = [p for p in pieces[1:] if isinstance(p, str)]
        #: (the only slot, the literal text after it) when the run has one slot
        self.single: tuple[Slot, str] | None = (
            (first, "".join(tail)) if isinstance(first, Slot) and len(tail) == len(pieces) - 1 else None
        )
        #: the content slot right after the lead, where a head cut can apply
        self.first: Slot | None = first if isinstance(first, Slot) and first.field == "content" else None

    def text(self, messages: Sequence[Mapping[str, Any]], fns: Sequence[Callable[[str], str]]) -> str:
        if self.single is not None:
            slot, tail = self.single
            if slot.field == "content":
                return self.head + fns[slot.message](messages[slot.message]["content"]) + tail
            cid: str = messages[slot.message]["tool_call_id"]
            return self.head + cid + tail
        return self.head + _joined(self.rest, messages, fns)

    def _after_first(self, messages: Sequence[Mapping[str, Any]], fns: Sequence[Callable[[str], str]]) -> str:
        """The run's text after its first slot."""
        if self.single is not None:
            return self.single[1]
        return _joined(self.rest[1:], messages, fns)

    def plan(self, messages: Sequence[Mapping[str, Any]], fns: Sequence[Callable[[str], str]]) -> RunPlan:
        """What to encode for this run: (text, cached IDs before it, IDs to drop from its
        encoding, cached IDs after it). Cuts are taken where the content's edges allow."""
        first = self.first
        if first is None or not (self.head_cuts or self.tail_cuts):
            return self.text(messages, fns), _NO_IDS, self.anchor_len, _NO_IDS
        x = fns[first.message](messages[first.message]["content"])
        after = self.single[1] if self.single is not None else self._after_first(messages, fns)
        if not x:
            return self.head + after, _NO_IDS, self.anchor_len, _NO_IDS
        post = _NO_IDS
        char = x[-1]
        for cut in self.tail_cuts:
            if cut.allows(char):
                after = after[: cut.pos]
                post = cut.ids
                break
        char = x[0]
        for cut in self.head_cuts:
            if cut.allows(char):
                return self.lead[cut.pos :] + x + after, cut.ids, 0, post
        return self.head + x + after, _NO_IDS, self.anchor_len, post

    def probe_fill(self, x: str) -> str:
        """The run's text after the lead with ``x`` as its first content (other slots filled
        with probe values): what cut verification encodes."""
        assert self.first is not None
        parts = [x]
        for piece in self.rest[1:]:
            if isinstance(piece, str):
                parts.append(piece)
            elif piece.field == "content":
                parts.append(content_sentinel(piece.message))
            else:
                parts.append(call_id(0, piece.message))
        return "".join(parts)

    def add_cuts(self, codec: Codec) -> None:
        """Find and verify the cuts of this run (see :mod:`tmpl.suffix.cuts`), memoised per codec."""
        if self.first is None:
            return
        key = (self.anchor, self.lead, tuple(p if isinstance(p, str) else (p.field, p.message) for p in self.rest))
        memo = codec.memo.setdefault("suffix_cuts", {})
        found = memo.get(key)
        if found is None:
            heads = head_cuts(codec, self.anchor, self.anchor_len, self.lead, self.probe_fill)
            tails: tuple[Cut, ...] = ()
            if self.single is not None:
                tails = tail_cuts(codec, self.anchor, self.anchor_len, self.lead, self.single[1], heads)
            found = memo[key] = (heads, tails)
        self.head_cuts, self.tail_cuts = found


#: (text to encode, cached IDs before it, leading IDs of its encoding to drop, cached IDs after it)
RunPlan = tuple[str, list[int], int, list[int]]
_NO_IDS: list[int] = []


class Layout:
    """A suffix as static ID segments around dynamic runs: ``seg0 run0 seg1 run1 ... segN``.

    ``chunks`` keeps the atom-by-atom cut for inspection; ``segments`` merges the static
    chunks between runs, so filling is one join of the segments and each run's pieces.
    """

    __slots__ = ("chunks", "segments", "runs")

    def __init__(self, chunks: list[list[int] | DynamicRun]) -> None:
        self.chunks = chunks
        segments: list[list[int]] = [[]]
        runs: list[DynamicRun] = []
        for chunk in chunks:
            if isinstance(chunk, DynamicRun):
                runs.append(chunk)
                segments.append([])
            else:
                segments[-1].extend(chunk)
        self.segments = segments
        self.runs = tuple(runs)

    def plans(self, messages: Sequence[Mapping[str, Any]], fns: Sequence[Callable[[str], str]]) -> list[RunPlan]:
        return [run.plan(messages, fns) for run in self.runs]

    def texts(self, messages: Sequence[Mapping[str, Any]], fns: Sequence[Callable[[str], str]]) -> list[str]:
        """The text each run encodes per call (after any cuts)."""
        return [plan[0] for plan in self.plans(messages, fns)]

    def assemble(self, plans: Sequence[RunPlan], encoded: Sequence[list[int]]) -> list[int]:
        segments = self.segments
        parts = [segments[0]]
        for j, (_, pre, drop, post) in enumerate(plans):
            ids = encoded[j]
            parts.append(pre)
            parts.append(ids[drop:] if drop else ids)
            parts.append(post)
            parts.append(segments[j + 1])
        return _compat.ids.join_ids(parts)

    def fill(
        self, codec: Codec, messages: Sequence[Mapping[str, Any]], fns: Sequence[Callable[[str], str]]
    ) -> list[int]:
        """The suffix IDs for ``messages`` (one encode per run; the common single-run case inline)."""
        runs = self.runs
        if len(runs) == 1:
            text, pre, drop, post = runs[0].plan(messages, fns)
            ids = codec.encode_many([text])[0]
            segments = self.segments
            return _compat.ids.join_ids((segments[0], pre, ids[drop:] if drop else ids, post, segments[1]))
        plans = self.plans(messages, fns)
        return self.assemble(plans, codec.encode_many([p[0] for p in plans]))


@dataclass
class Frame:
    """The cached suffix of one tool-turn shape.

    ``layouts`` maps a transform name to the layout for it; ``transforms`` maps each
    verified content class to the transform that reproduces the template for it.
    """

    k: int
    close: Close
    locator: CloseLocator
    layouts: dict[str, Layout]
    transforms: dict[str, str]
    calls_visible: bool
    id_slots: tuple[bool, ...]
    history_dependence: str | None = None  # why the suffix depends on earlier messages, if it does
    notes: list[str] = field(default_factory=list)

    def fill(
        self, codec: Codec, layout: Layout, messages: Sequence[Mapping[str, Any]], fns: Sequence[Callable[[str], str]]
    ) -> list[int]:
        return layout.fill(codec, messages, fns)


def _find_all(text: str, needle: str, start: int) -> list[int]:
    out, pos = [], text.find(needle, start)
    while pos >= 0:
        out.append(pos)
        pos = text.find(needle, pos + len(needle))
    return out


def _slots(text: str, start: int, patterns: Sequence[tuple[str, Slot]]) -> list[tuple[int, int, Slot]] | None:
    spans = []
    for needle, slot in patterns:
        for pos in _find_all(text, needle, start):
            spans.append((pos, pos + len(needle), slot))
    spans.sort(key=lambda s: s[0])
    for (_, e1, _), (s2, _, _) in zip(spans, spans[1:]):
        if s2 < e1:
            return None  # overlapping slots: ambiguous
    return spans


def _layout(
    codec: Codec,
    text: str,
    ids: Sequence[int],
    offsets: Sequence[tuple[int, int]],
    close: Close,
    slots: list[tuple[int, int, Slot]],
) -> Layout | None:
    """Cut the suffix (text after ``close``) into static ID chunks and dynamic runs.

    Returns None when a slot does not lie inside one run (it straddles an atom).
    """
    n = len(ids)
    atoms = [t for t in range(close.token_end, n) if ids[t] in codec.atom_ids and offsets[t][1] > offsets[t][0]]
    # runs: (left atom token index or -1 for the close, first token, end token, char start, char end)
    runs = []
    left_t, first, c_start = close.token_end - 1, close.token_end, close.char_end
    for t in atoms:
        runs.append((left_t, first, t, c_start, offsets[t][0]))
        left_t, first, c_start = t, t + 1, offsets[t][1]
    runs.append((left_t, first, n, c_start, len(text)))

    chunks: list[list[int] | DynamicRun] = []
    placed = 0
    for left_t, first, end_t, c_start, c_end in runs:
        if left_t >= close.token_end:
            chunks.append([ids[left_t]])  # the atom itself
        inside = [(s - c_start, e - c_start, sl) for s, e, sl in slots if s >= c_start and e <= c_end]
        placed += len(inside)
        if not inside:
            if end_t > first:
                chunks.append(list(ids[first:end_t]))
            continue
        anchor = codec.token_text(ids[left_t])
        pieces: list[str | Slot] = []
        pos, run_text = 0, text[c_start:c_end]
        for s, e, sl in inside:
            if s > pos:
                pieces.append(run_text[pos:s])
            pieces.append(sl)
            pos = e
        if pos < len(run_text):
            pieces.append(run_text[pos:])
        anchor_len = len(codec.encode(anchor)) if anchor else 0
        run = DynamicRun(anchor=anchor, anchor_len=anchor_len, pieces=tuple(pieces))
        run.add_cuts(codec)
        chunks.append(run)
    return Layout(chunks) if placed == len(slots) else None


# Transforms sharing the same sentinel pattern share one layout.
_PATTERN_OF = {"identity": "raw", "trim": "raw", "tojson": "json", "tojson_ascii": "json", "trim_tojson": "json"}


class FrameBuilder:
    """Builds and verifies frames for one template (renderer + codec)."""

    def __init__(self, renderer: Renderer, codec: Codec) -> None:
        self.renderer = renderer
        self.codec = codec
        self.name = renderer.name

    # -- rendering the dummy conversation ---------------------------------------------
    def _render(
        self,
        shapes: Sequence[Mapping[str, Any]],
        contents: Sequence[Any],
        variant: int,
        id_slots: Sequence[bool],
        tools: Sequence[Any] | None,
    ) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
        history, assistant, tool_msgs = dummy_tool_turn(shapes, contents, call_ids(variant, id_slots))
        text = self.renderer.text(history + [assistant] + tool_msgs, tools=tools, add_generation_prompt=True)
        return text, history, assistant

    def per_call(self, frame: Frame, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None) -> list[int]:
        """Suffix IDs by one real render (exact for any content; the slow path)."""
        cids = [m.get("tool_call_id") if has else None for m, has in zip(messages, frame.id_slots)]
        history, assistant, tool_msgs = dummy_tool_turn(messages, [m.get("content") for m in messages], cids)
        text = self.renderer.text(history + [assistant] + tool_msgs, tools=tools, add_generation_prompt=True)
        return self._suffix_of(frame, text, cids)

    def _suffix_of(self, frame: Frame, text: str, ids: Sequence[str | None]) -> list[int]:
        """IDs after the close, encoding only the text after it (with the close as anchor)."""
        ce = frame.locator.char_end(text, ids)
        if ce < 0:
            raise TemplateError(
                self.name, "the assistant turn renders differently for these tool messages; cannot locate its close"
            )
        return self.codec.encode(frame.close.text + text[ce:])[len(frame.close.ids) :]

    def _expected(self, frame: Frame, text: str, ids: Sequence[str | None]) -> list[int]:
        """Ground truth: the IDs after the close in the full tokenization of ``text``."""
        ce = frame.locator.char_end(text, ids)
        if ce < 0:
            raise UnsupportedTemplateError(
                self.name, "the assistant turn renders differently depending on the tool results that follow it"
            )
        token_ids, offsets = self.codec.encode_with_offsets(text)
        for t, (s, e) in enumerate(offsets):
            if e == ce and e > s:
                return token_ids[t + 1 :]
        raise UnsupportedTemplateError(self.name, "the turn close does not end on a token boundary")

    # -- building ---------------------------------------------------------------------
    def build(self, shapes: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None, tool_close: Close) -> Frame:
        """Build and verify the frame of one tool-message shape.

        ``tool_close`` is the template-level close of a tool-call turn; the frame's own
        close must be the same token.
        """
        k = len(shapes)
        id_slots = tuple(m.get("tool_call_id") is not None for m in shapes)
        base_contents = content_sentinels(k)
        try:
            full, history, _ = self._render(shapes, base_contents, 0, id_slots, tools)
        except TemplateRenderError as exc:
            raise UnsupportedTemplateError(
                self.name, f"cannot render an assistant turn with {k} tool call(s) and its results: {exc.reason}"
            ) from exc
        anchors = arg_sentinels(k)
        visible = count_anchors(full, USER_SENTINEL, anchors)
        if 0 < visible < k:
            raise UnsupportedTemplateError(
                self.name, f"renders only {visible} of {k} tool calls of one assistant turn (the others would be lost)"
            )
        prompt = None
        if visible == 0:
            prompt = self.renderer.text(history, tools=tools, add_generation_prompt=True)
        close = find_close(self.codec, self.name, full, anchors, tool_close.ids[0], prompt_text=prompt)
        probe_ids = tuple(call_ids(0, id_slots))
        locator = CloseLocator(tuple(anchors), close, probe_ids)
        transformed = False
        for i, sentinel in enumerate(base_contents):
            if sentinel in full[: close.char_end]:
                raise UnsupportedTemplateError(
                    self.name, "the template renders tool results before the assistant turn closes"
                )
            if sentinel not in full[close.char_end :]:
                # not there verbatim: visible only if changing it changes the render
                other = list(base_contents)
                other[i] = "Other tool result, with Different words 7"
                text, _, _ = self._render(shapes, other, 0, id_slots, tools)
                ce = locator.char_end(text, probe_ids)
                if ce >= 0 and text[ce:] == full[close.char_end :]:
                    raise UnsupportedTemplateError(
                        self.name, f"tool result {i} of {k} is not rendered (dropped silently)"
                    )
                transformed = True
        suffix_text = full[close.char_end :]
        for i, shape in enumerate(shapes):
            if not shape.get("name") and PROBE_TOOL_NAME in suffix_text:
                raise MessageError(
                    i,
                    f"tool message has no 'name', and template {self.name!r} writes the called function's "
                    "name into the tool result; give each tool message the name of the call it answers",
                    where="tool_messages",
                )
        ids, offsets = self.codec.encode_with_offsets(full)

        layouts: dict[str, Layout] = {}
        by_pattern: dict[str, Layout | None] = {}
        for tname, fn in ({} if transformed else TRANSFORMS).items():
            pattern = _PATTERN_OF[tname]
            if pattern not in by_pattern:
                pats: list[tuple[str, Slot]] = [(fn(s), Slot(i, "content")) for i, s in enumerate(base_contents)]
                pats += [(call_id(0, i), Slot(i, "tool_call_id")) for i, has in enumerate(id_slots) if has]
                spans = _slots(full, close.char_end, pats)
                by_pattern[pattern] = None if spans is None else _layout(self.codec, full, ids, offsets, close, spans)
            layout = by_pattern[pattern]
            if layout is not None:
                layouts[tname] = layout
        frame = Frame(
            k=k,
            close=close,
            locator=locator,
            layouts=layouts,
            transforms={},
            calls_visible=visible == k,
            id_slots=id_slots,
        )
        if not frame.calls_visible:
            frame.notes.append("the template does not render the assistant's tool calls")
        frame.history_dependence = self._history_dependence(frame, shapes, tools, full[close.char_end :])
        self._verify(frame, shapes, tools)
        return frame

    def _history_dependence(
        self, frame: Frame, shapes: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None, suffix_text: str
    ) -> str | None:
        """Re-render the dummy turn after other histories; the suffix text must not change."""
        _, assistant, tool_msgs = dummy_tool_turn(shapes, content_sentinels(frame.k), call_ids(0, frame.id_slots))
        prior_id = call_id(999, 0) if frame.id_slots[0] else None
        prior_call = probe_call(PRIOR_ARG_SENTINEL, shapes[0].get("name"), prior_id)
        prior_result = tool_result(shapes[0], PRIOR_RESULT_SENTINEL)
        if prior_id is not None:
            prior_result["tool_call_id"] = prior_id  # after the content, as this probe has always rendered it
        user, system = user_turn(), {"role": "system", "content": SYSTEM_SENTINEL}
        prior_round = [assistant_with_calls([prior_call]), prior_result]
        alternatives = {
            "a system message": [system, user],
            "an earlier assistant reply": [
                user_turn(EARLIER_USER_SENTINEL),
                assistant_reply(EARLIER_REPLY_SENTINEL),
                user,
            ],
            "an earlier tool round": [user, *prior_round],
            "a system message and an earlier tool round": [system, user, *prior_round],
        }
        anchors = arg_sentinels(frame.k)
        for label, history in alternatives.items():
            try:
                text = self.renderer.text(history + [assistant] + tool_msgs, tools=tools, add_generation_prompt=True)
                prompt = (
                    None
                    if frame.calls_visible
                    else self.renderer.text(history, tools=tools, add_generation_prompt=True)
                )
            except TemplateRenderError:
                continue  # the template refuses that history: nothing to compare
            try:
                close = find_close(self.codec, self.name, text, anchors, frame.close.ids[0], prompt_text=prompt)
            except UnsupportedTemplateError:
                return f"after {label} the turn close is not found the same way"
            if text[close.char_end :] != suffix_text:
                return f"the tool results render differently after {label}"
        return None

    def per_call_with_history(
        self,
        frame: Frame,
        history: Sequence[Mapping[str, Any]],
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Any] | None,
    ) -> list[int]:
        """Suffix IDs by one render that includes the real history (for history-dependent templates)."""
        cids = [m.get("tool_call_id") if has else None for m, has in zip(messages, frame.id_slots)]
        _, assistant, tool_msgs = dummy_tool_turn(messages, [m.get("content") for m in messages], cids)
        history = list(history)
        text = self.renderer.text([*history, assistant, *tool_msgs], tools=tools, add_generation_prompt=True)
        prompt = None if frame.calls_visible else self.renderer.text(history, tools=tools, add_generation_prompt=True)
        anchors = arg_sentinels(frame.k)
        close = find_close(self.codec, self.name, text, anchors, frame.close.ids[0], after="", prompt_text=prompt)
        return self.codec.encode(close.text + text[close.char_end :])[len(close.ids) :]

    def _verify(self, frame: Frame, shapes: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None) -> None:
        """Choose, per content class, the first transform whose fills equal full renders."""
        k = frame.k
        variant = 1
        for cls, samples in HARD_CONTENTS.items():
            candidates = list(frame.layouts)
            for j in range(len(samples)):
                contents = [samples[(j + i) % len(samples)] for i in range(k)]
                text, _, _ = self._render(shapes, contents, variant, frame.id_slots, tools)
                cids = call_ids(variant, frame.id_slots)
                expected = self._expected(frame, text, cids)
                messages = [{"content": c, "tool_call_id": cid} for c, cid in zip(contents, cids)]
                variant += 1
                if j == 0 and self._suffix_of(frame, text, cids) != expected:
                    raise TemplateError(self.name, "the per-call render path disagrees with the full render")
                # transforms that give the same texts on the same layout give the same IDs: fill those once
                filled: dict[tuple[int, tuple[str, ...]], bool] = {}
                kept = []
                for t in candidates:
                    layout, fn = frame.layouts[t], TRANSFORMS[t]
                    key = (id(layout), tuple(fn(c) for c in contents))
                    if key not in filled:
                        filled[key] = frame.fill(self.codec, layout, messages, [fn] * k) == expected
                    if filled[key]:
                        kept.append(t)
                candidates = kept
                if not candidates:
                    break
            if candidates:
                frame.transforms[cls] = candidates[0]
            else:
                frame.notes.append(f"{cls} contents go through the per-call render path")
