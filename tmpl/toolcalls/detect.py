"""Which parser reads a template's tool calls: found by rendering dummy calls and reading them back.

The probe renders a conversation whose assistant turn makes two calls (one when the template
accepts only one) with sentinel arguments of two types, cuts the assistant turn out of the
render, tokenizes it, and runs every parser on it. A parser that gives back exactly the calls
that were rendered (names, argument values and types, nothing else) recognises the format; the
first such parser in :data:`~tmpl.toolcalls.parsers.PARSERS` order wins. The template's source
text is never matched.

A template that renders no calls at all (DeepSeek V3's own, Phi-4-mini, SmolLM3) falls back to
the tokenizer's vocabulary: the one parser whose signature tokens are all added tokens of the
tokenizer (``how="vocabulary"``). A template that renders calls no parser can read gets none.

>>> detection = detect(tpl)     # doctest: +SKIP
>>> detection.parser, detection.how
('hermes', 'render')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import _compat
from ..errors import TmplError
from ..render import Renderer
from ..sentinels import (
    CONTENT_SENTINEL,
    DETECT_TOOLS,
    REASONING_KEYS,
    REASONING_SENTINEL,
    arg_sentinel,
    assistant_calling,
    assistant_reply,
    probe_calls,
    user_turn,
)
from ..tokenize import Codec
from .learn import learn_syntax
from .parsers import PARSERS, get_parser
from .probing import completion_ids

if TYPE_CHECKING:
    from ..chat_template import ChatTemplate


@dataclass(frozen=True)
class Detection:
    """Outcome of parser detection for one template.

    ``parser`` is the chosen parser's name or None; ``how`` is ``"render"`` (read back from a
    render), ``"vocabulary"`` (the template renders no calls; chosen from the tokenizer's
    tokens) or ``"none"``; ``candidates`` are all parsers that read the render back;
    ``calls`` is how many calls the probe rendered; ``detail`` says why, in words;
    ``reasoning_key`` is the message key the template renders reasoning from (None if none);
    ``think`` is the (open, close) of the template's reasoning when it differs from the format's
    (Apriel's ``[BEGIN FINAL RESPONSE]``), passed on to the parser.
    """

    parser: str | None
    how: str
    candidates: tuple[str, ...] = ()
    calls: int = 0
    detail: str = ""
    reasoning_key: str | None = None
    think: tuple[str, str] | None = None
    #: the verified :class:`~tmpl.toolcalls.parsers.learned.LearnedParser` when ``how == "learned"``
    learned: Any = None

    @property
    def is_learned(self) -> bool:
        """True when the parser was learned from the template's renders (no hand-written one reads them)."""
        return self.learned is not None


def _matches(parsed, expected: Sequence[dict[str, Any]]) -> bool:
    if parsed.errors or len(parsed.tool_calls) != len(expected):
        return False
    for call, want in zip(parsed.tool_calls, expected):
        if call.name != want["name"] or call.arguments != want["arguments"]:
            return False
        if any(type(call.arguments[k]) is not type(v) for k, v in want["arguments"].items()):
            return False
    return True


def detect_with(renderer: Renderer, codec: Codec, *, hand_written: bool = True, learn: bool = True) -> Detection:
    """Detect the parser for a template (see the module docstring). Never raises on template errors.

    Hand-written parsers are tried first; when none reads the render back, the call syntax is
    learned from the template's renders (:func:`~tmpl.toolcalls.learn.learn_syntax`) and used
    once verified (``how="learned"``). ``hand_written=False`` / ``learn=False`` turn either off.
    """
    key, layout = reasoning_probe(renderer, codec)
    history = [user_turn()]
    rendered_any = False
    reasons: list[str] = []
    for k, as_text in ((2, False), (2, True), (1, False), (1, True)):
        calls = probe_calls(k)
        # some templates want arguments as a JSON string (OpenAI's wire format)
        assistant = assistant_calling(calls, as_text=as_text)
        how = f"{k} call(s) with arguments as {'JSON text' if as_text else 'a dict'}"
        try:
            ids = completion_ids(renderer, codec, history, assistant, DETECT_TOOLS)
        except TmplError as exc:
            reasons.append(f"{how} do not render ({exc})")
            continue
        text = codec.decode(ids)
        if arg_sentinel(0) not in text:
            reasons.append(f"{how} render as nothing")
            continue
        rendered_any = True
        found = []
        for name in PARSERS if hand_written else ():
            try:
                parsed = get_parser(name, codec).parse(ids, tools=DETECT_TOOLS)
            except Exception as exc:  # noqa: BLE001 - a parser bug must not break detection; tests hold parsers to no-raise
                reasons.append(f"{name} raised {type(exc).__name__}: {exc}")
                continue
            if _matches(parsed, calls):
                found.append(name)
        if found:
            return Detection(
                found[0],
                "render",
                tuple(found),
                k,
                f"the render of {k} call(s) reads back with {found[0]}",
                key,
                think_override(found[0], layout),
            )
        reasons.append(f"no parser reads back the render of {how}: {text[:120]!r}")
    if rendered_any and learn:
        learned, why = learn_syntax(renderer, codec, layout if layout and layout[1] else None)
        if learned is not None:
            return Detection(
                "learned", "learned", ("learned",), 2, f"learned from the template's renders: {why}", key, None, learned
            )
        reasons.append(f"no call syntax could be learned: {why}")
    if rendered_any or not hand_written:
        return Detection(None, "none", (), 0, "; ".join(reasons), key)
    by_vocab = [
        name for name, cls in PARSERS.items() if cls.signature and all(t in codec.added_by_text for t in cls.signature)
    ]
    if len(by_vocab) == 1:
        return Detection(
            by_vocab[0],
            "vocabulary",
            tuple(by_vocab),
            0,
            f"the template renders no calls; the tokenizer has {by_vocab[0]}'s tokens "
            f"{', '.join(PARSERS[by_vocab[0]].signature)}",
            key,
            think_override(by_vocab[0], layout),
        )
    why = "; ".join(reasons)
    if by_vocab:
        why += f"; the vocabulary fits several parsers ({', '.join(by_vocab)})"
    return Detection(None, "none", tuple(by_vocab), 0, why, key)


def reasoning_probe(renderer: Renderer, codec: Codec) -> tuple[str | None, tuple[str, str] | None]:
    """(message key the template renders reasoning from, (open, close) around it in the completion).

    Renders an assistant message with a reasoning sentinel and a content sentinel; the text
    before the reasoning (after the generation prompt) is the open, the text between the
    two is the close. (None, None) when no key renders; (key, None) when the layout is unusable.
    """
    history = [user_turn()]
    for key in REASONING_KEYS:
        assistant = assistant_reply(CONTENT_SENTINEL, reasoning_key=key)
        try:
            prompt = codec.encode(renderer.text(history, add_generation_prompt=True))
            full = codec.encode(renderer.text(history + [assistant], add_generation_prompt=False))
        except TmplError:
            continue
        text = codec.decode(full[_compat.ids.common_prefix_len(prompt, full) :])
        if REASONING_SENTINEL not in codec.decode(full):
            continue
        r = text.find(REASONING_SENTINEL)
        c = text.find(CONTENT_SENTINEL, r + 1)
        if r < 0 or c < 0:
            return key, None
        return key, (text[:r].strip(), text[r + len(REASONING_SENTINEL) : c].strip())
    return None, None


def think_override(parser: str, layout: tuple[str, str] | None) -> tuple[str, str] | None:
    """The reasoning delimiters to give ``parser`` when the template's differ from the format's."""
    default = PARSERS[parser].think
    if default is None or layout is None:
        return None
    open_, close = layout
    if not close or len(close) > 64 or len(open_) > 64:
        return None
    if close == default[1] and (not open_ or default[0] in open_):
        return None
    return (open_, close)


def detect(tpl: ChatTemplate) -> Detection:
    """Detection for a :class:`~tmpl.ChatTemplate`, kept in its per-fingerprint state."""
    return tpl.engine.state.memo("detection", lambda: detect_with(tpl.renderer, tpl.codec))
