"""History modes: the next prompt rendered by the deployed template, sampled IDs spliced back in.

With ``Rollout(history="template")`` (or an ``edit_history`` hook) each turn's prompt is what the
template renders for the conversation so far, with ``add_generation_prompt=True``: reasoning dropped
wherever the stock template drops it, and whatever the hook rewrote. The model's own IDs are never
re-tokenized where the render keeps their text: :func:`splice` renders the messages to text, walks the
earlier sampled turns in order, finds each turn's sampled bytes (or the longest part of them that
starts and ends at token boundaries, e.g. the answer after a dropped ``</think>``) in the render, puts
those sampled IDs there, and encodes only the text between them with the template's codec. The result
must decode to the render byte for byte, else :class:`tmpl.errors.HistorySpliceError` names the
template, the sample and the turn.

>>> turns = [SampledTurn.of(tpl.codec, "turn-0", 1, sampled_ids)]               # doctest: +SKIP
>>> out = splice(tpl, text, turns, {}, sample="0/0", turn=1)                     # doctest: +SKIP
>>> out.ids[out.kept[0].at : out.kept[0].at + out.kept[0].size] == sampled_ids[out.kept[0].start :]  # doctest: +SKIP
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..episode import Call
from ..errors import HistorySpliceError
from ..toolcalls.bytedecode import byte_table

if TYPE_CHECKING:
    from ..chat_template import ChatTemplate
    from ..tokenize import Codec

__all__ = ["HISTORY_MODES", "HistoryContext", "KeptSpan", "SampledTurn", "Spliced", "splice"]

#: The values of ``Rollout(history=...)``.
HISTORY_MODES = ("append", "template")

#: Message fields that hold a turn's reasoning (dropped by Qwen3, DeepSeek R1, gpt-oss...).
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


@dataclass(frozen=True, slots=True)
class SampledTurn:
    """One earlier generation as the splice reads it: its sampled IDs and their bytes.

    ``call``: the episode call id; ``message``: the index of its assistant message in the history.
    ``offsets``: the byte offset of each token boundary (``len(ids) + 1`` entries), or None where the
    tokenizer's bytes per token are not known (not byte-level BPE): only the whole turn can be kept.
    ``atoms``: which tokens are added tokens that split text on both sides (a span kept must hold one
    that is not, so a bare ``<|im_end|>`` never counts as the turn's text kept).
    ``after``: text the render holds before the turn (the message before it), searched for first, so
    that the turn's own text is not taken from inside an earlier message that happens to hold it
    (a user asking "say OK" before a reply ``OK``); empty, or not found: the search starts where the
    previous turn ended.
    """

    call: str
    message: int
    ids: tuple[int, ...]
    data: bytes
    offsets: tuple[int, ...] | None
    atoms: tuple[bool, ...]
    after: bytes = b""

    @classmethod
    def of(cls, codec: Codec, call: str, message: int, ids: Sequence[int]) -> SampledTurn:
        """The record of ``ids`` sampled by ``call`` (bytes from the codec's byte table, else its decode).

        >>> t = SampledTurn.of(tpl.codec, "turn-0", 1, tpl.codec.encode("Hi.<|im_end|>"))  # doctest: +SKIP
        >>> t.data                                                                         # doctest: +SKIP
        b'Hi.<|im_end|>'
        """
        ids = tuple(int(t) for t in ids)
        atoms = tuple(t in codec.atom_ids for t in ids)
        pieces = _token_bytes(codec, ids)
        if pieces is None:
            return cls(call, message, ids, codec.decode(list(ids)).encode("utf-8"), None, atoms)
        offsets = [0]
        for piece in pieces:
            offsets.append(offsets[-1] + len(piece))
        return cls(call, message, ids, b"".join(pieces), tuple(offsets), atoms)


def _token_bytes(codec: Codec, ids: Sequence[int]) -> list[bytes] | None:
    """Each token's bytes (added tokens: their text), or None where the codec has no byte table."""
    table = byte_table(codec)
    if table is None:
        return None
    try:
        table.fill(ids)
        out: list[bytes] = []
        for tid in ids:
            entry = table[tid]
            if not isinstance(entry, bytes):
                info = codec.added.get(tid)
                if info is None:
                    return None
                entry = info.content.encode("utf-8")
            out.append(entry)
    except IndexError:
        return None
    return out


@dataclass(frozen=True, slots=True)
class KeptSpan:
    """Where an earlier turn's sampled IDs came back in a prompt.

    ``call``/``message``: the turn; ``start``/``end``: the sampled tokens kept (``ids[start:end]``, all
    of them when ``start == 0 and end == total``; ``start == end``: none, its text rendered anew);
    ``at``: their position in the prompt.
    """

    call: str
    message: int
    start: int
    end: int
    total: int
    at: int

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.end == self.total


@dataclass(frozen=True, slots=True)
class Spliced:
    """One prompt built from a render: its IDs, the earlier turns it kept, the tokens it encoded.

    ``dropped``: messages whose reasoning the render left out; ``rewritten``: messages whose sampled
    text the render did not keep whole for another reason; ``encoded``: tokens encoded from text.
    """

    ids: list[int]
    kept: tuple[KeptSpan, ...]
    dropped: tuple[int, ...]
    rewritten: tuple[int, ...]
    encoded: int

    @property
    def edit(self) -> str | None:
        """The label of what the template changed (None: every sampled turn kept whole)."""
        parts = []
        if self.dropped:
            parts.append("template dropped reasoning")
        if self.rewritten:
            parts.append("template rewrote sampled text")
        return "; ".join(parts) or None


def _is_char_start(data: bytes, pos: int) -> bool:
    return pos >= len(data) or not 0x80 <= data[pos] < 0xC0


def _occurs(turn: SampledTurn, data: bytes, cursor: int, i: int, e: int) -> int:
    assert turn.offsets is not None
    return data.find(turn.data[turn.offsets[i] : turn.offsets[e]], cursor)


def _find(turn: SampledTurn, data: bytes, cursor: int) -> tuple[int, int, int] | None:
    """``(start, end, position)``: the sampled tokens ``[start, end)`` of ``turn`` found in ``data`` at
    or after ``cursor`` (the whole turn, else the longest run ending at its last or next-to-last token:
    a turn close the render writes otherwise, as gpt-oss writes ``<|end|>`` for a sampled ``<|return|>``)."""
    n = len(turn.ids)
    pos = data.find(turn.data, cursor)
    if pos >= 0 and _is_char_start(data, pos) and _is_char_start(data, pos + len(turn.data)):
        return 0, n, pos
    if turn.offsets is None:
        return None
    offsets = turn.offsets
    best: tuple[int, int, int] | None = None
    for e in (n, n - 1):
        if e <= 0 or _occurs(turn, data, cursor, e - 1, e) < 0:
            continue
        lo, hi = 0, e - 1  # the smallest start whose run [start, e) occurs: found runs only grow shorter
        while lo < hi:
            mid = (lo + hi) // 2
            if _occurs(turn, data, cursor, mid, e) >= 0:
                hi = mid
            else:
                lo = mid + 1
        for i in range(lo, e):  # the longest run that starts and ends on characters and holds text
            if all(turn.atoms[i:e]):
                break
            at = _occurs(turn, data, cursor, i, e)
            if at >= 0 and _is_char_start(data, at) and _is_char_start(data, at + offsets[e] - offsets[i]):
                if best is None or e - i > best[1] - best[0]:
                    best = (i, e, at)
                break
    return best


def _reasoning(message: Mapping[str, Any]) -> str:
    for key in REASONING_FIELDS:
        value = message.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return ""


def splice(
    tpl: ChatTemplate,
    text: str,
    turns: Sequence[SampledTurn],
    gaps: dict[str, list[int]],
    *,
    sample: object,
    turn: int,
    messages: Sequence[Mapping[str, Any]] = (),
) -> Spliced:
    """The IDs of ``text`` (a render of the history) with every earlier turn's sampled IDs put back
    where the render keeps their text; the text between them encoded with ``tpl.codec``.

    ``gaps``: a cache of texts already encoded for this sample (the first prompt's text seeds it, so
    the prefix before the first sampled turn comes back as the very IDs the engine was sent).
    ``messages``: the history rendered (to tell a dropped reasoning from another rewrite).
    Raises :class:`tmpl.errors.HistorySpliceError` when the IDs do not decode to ``text``.
    """
    codec = tpl.codec
    data = text.encode("utf-8")
    ids: list[int] = []
    kept: list[KeptSpan] = []
    dropped: list[int] = []
    rewritten: list[int] = []
    encoded = 0
    cursor = 0

    def gap(upto: int) -> None:
        nonlocal encoded
        if upto <= cursor:
            return
        piece = data[cursor:upto].decode("utf-8")
        got = gaps.get(piece)
        if got is None:
            got = codec.encode(piece)
            gaps[piece] = got
            encoded += len(got)
        ids.extend(got)

    for t in turns:
        if t.message < 0:  # an edit of the history removed or changed its message
            kept.append(KeptSpan(t.call, t.message, 0, 0, len(t.ids), len(ids)))
            continue
        start = cursor
        if t.after:
            at = data.find(t.after, cursor)
            if at >= 0:
                start = at + len(t.after)
        found = _find(t, data, start)
        if found is None:
            kept.append(KeptSpan(t.call, t.message, 0, 0, len(t.ids), len(ids)))
            rewritten.append(t.message)
            continue
        start, end, pos = found
        size = len(t.data) if t.offsets is None else t.offsets[end] - t.offsets[start]
        region = data[cursor : pos + size]
        gap(pos)
        kept.append(KeptSpan(t.call, t.message, start, end, len(t.ids), len(ids)))
        ids.extend(t.ids[start:end])
        cursor = pos + size
        if start == 0 and end == len(t.ids):
            continue
        reasoning = _reasoning(messages[t.message]) if t.message < len(messages) else ""
        if reasoning and reasoning.encode("utf-8") not in region:
            dropped.append(t.message)
        else:
            rewritten.append(t.message)
    gap(len(data))
    back = codec.decode(ids)
    if back != text:
        at = next((k for k, (a, b) in enumerate(zip(back, text)) if a != b), min(len(back), len(text)))
        raise HistorySpliceError(
            tpl.name,
            sample,
            turn,
            f"the spliced IDs decode to {len(back)} characters, the render has {len(text)}; "
            f"first difference at character {at}: {back[at : at + 40]!r} against {text[at : at + 40]!r}",
        )
    return Spliced(ids, tuple(kept), tuple(dropped), tuple(rewritten), encoded)


@dataclass(eq=False)
class HistoryContext:
    """What an ``edit_history`` hook is told, and what it may hand back besides the messages.

    - ``index``/``sample``: which conversation and which of its samples; ``turn``: the turn just done.
    - ``answered``: the model answered without tool calls. Return messages ending with a ``user``
      message to go on (a simulated user's next question); anything else ends the sample FINISHED.
    - ``label``: set it to name the edit (``"window"``, ``"compaction"``): a branch it causes says
      ``edit: edit_history: <label>``.
    - :meth:`record_call`: a model call the hook made (a summary), kept in the episode untrained.

    >>> def window(messages, ctx):                                   # doctest: +SKIP
    ...     ctx.label = "window"
    ...     tools = [i for i, m in enumerate(messages) if m["role"] == "tool"]
    ...     return [dict(m, content="[omitted]") if i in tools[:-2] else m for i, m in enumerate(messages)]
    """

    index: int
    sample: int
    turn: int
    answered: bool
    label: str | None = None
    calls: list[Call] = field(default_factory=list)

    def record_call(
        self,
        prompt_ids: Sequence[int],
        completion_ids: Sequence[int],
        logprobs: Sequence[float] | None = None,
        *,
        agent: str = "edit_history",
    ) -> None:
        """Record a model call the hook made (e.g. a summarizer): an untrained call of the episode, in a
        lineage (``agent``) of its own, so it never merges with the policy's sequences.

        >>> ctx.record_call(summary_prompt_ids, summary_ids)   # doctest: +SKIP
        """
        k = len(self.calls)
        self.calls.append(
            Call(
                prompt_ids,
                completion_ids,
                logprobs,
                trained=False,
                agent=agent,
                id=f"edit-{self.turn}-{k}",
                turn=self.turn,
            )
        )


def view(messages: Sequence[Mapping[str, Any]], dropped: Sequence[int]) -> list[dict[str, Any]]:
    """``messages`` as a prompt shows them: the reasoning of the ``dropped`` messages left out.

    >>> view([{"role": "assistant", "content": "A", "reasoning_content": "r"}], [0])
    [{'role': 'assistant', 'content': 'A'}]
    """
    out = [dict(m) for m in messages]
    for k in dropped:
        for key in REASONING_FIELDS:
            out[k].pop(key, None)
    return out
