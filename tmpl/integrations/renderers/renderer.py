"""``TmplRenderer``: the ``renderers.base.Renderer`` protocol on top of :class:`tmpl.ChatTemplate`.

Imports ``renderers`` (go through :mod:`tmpl.integrations.renderers`, which says how to install it
when it is missing).

>>> from transformers import AutoTokenizer                                        # doctest: +SKIP
>>> renderer = TmplRenderer(AutoTokenizer.from_pretrained("Qwen/Qwen2.5-1.5B-Instruct"))  # doctest: +SKIP
>>> prompt = renderer.render_ids(messages, tools=tools, add_generation_prompt=True)    # doctest: +SKIP
>>> nxt = renderer.bridge_to_next_turn(prompt, completion_ids, tool_messages, tools=tools)  # doctest: +SKIP
>>> nxt.token_ids[: len(prompt) + len(completion_ids)] == prompt + completion_ids      # doctest: +SKIP
True
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict
from renderers.base import (
    Message,
    ParsedResponse,
    ParsedToolCall,
    RenderedTokens,
    ToolCallParseStatus,
    ToolSpec,
    extract_message_tool_names,
)
from renderers.configs import BaseRendererConfig

from ... import templates
from ...chat_template import ChatTemplate
from ...episode import Branch, BranchKind, first_difference
from ...errors import HistoryRequiredError, HistorySpliceError, NoToolParserError, TmplError, TrainerConfigError
from ...messages import TOOL_ROLES
from ...report import SAFE, Budget, check, training_safe
from ...report.report import TemplateReport
from ...rollout.history import HISTORY_MODES, REASONING_FIELDS, SampledTurn, splice, view
from ...toolcalls import CallProblem, parse_completion
from .conversations import RESOLVING, Known, State, store_for

logger = logging.getLogger(__name__)

#: tmpl's kinds of unreadable calls -> the status renderers gives the same failure
STATUS_OF_KIND: dict[str, ToolCallParseStatus] = {
    "malformed": ToolCallParseStatus.MALFORMED_STRUCTURE,
    "bad_json": ToolCallParseStatus.INVALID_JSON,
    "missing_name": ToolCallParseStatus.MISSING_NAME,
    "truncated": ToolCallParseStatus.UNCLOSED_BLOCK,
}


class TmplRendererConfig(BaseRendererConfig):  # type: ignore[misc]  # renderers ships no type information
    """Config of :class:`TmplRenderer`; every field not named here is a chat-template kwarg
    (``enable_thinking=False``...), passed to every render.

    - ``chat_template``: template text, a ``.jinja`` path, the name of one of the tokenizer's named
      templates or of a template tmpl ships (``"qwen3"``...), or None for the tokenizer's own.
    - ``training_safe``: use the training-safe template tmpl ships where the report says
      ``SAFE WITH tmpl TEMPLATE X`` (renders the last turn as the original does; see
      :func:`tmpl.report.training_safe`).
    - ``budget``: the budget of the check of a template tmpl does not ship (``"60s,4GB"``; see
      :class:`tmpl.report.Budget`), default tmpl's.
    - ``parser``: force a tool-call parser by name (default: the one detected for the template).
    - ``history``: what ``bridge_to_next_turn`` builds, tmpl's two history modes (docs/rollouts.md,
      "History modes"). ``"template"`` (the default): the template's own render of the conversation
      so far, returned exactly where it extends the previous prompt and completion, None where a
      branch starts (the template dropped reasoning...). ``"append"``: previous prompt + completion +
      tmpl's exact suffix for every tool round tmpl can suffix, whatever the template's verdict (one
      append-only sequence; where the verdict is not SAFE it is not what the deployed template renders).
      The default is ``"template"`` because every bridge it returns is the template's full render, as
      every bridge of earlier releases was, and it bridges all they bridged (a template whose
      ``tool_loop`` verdict is SAFE appends the same suffix); append mode trains some templates on
      contexts they never render, which only a caller who asks for it should get.

    >>> TmplRendererConfig(enable_thinking=False).model_extra                 # doctest: +SKIP
    {'enable_thinking': False}
    >>> TmplRendererConfig(history="append").history                          # doctest: +SKIP
    'append'
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    name: Literal["tmpl"] = "tmpl"
    chat_template: str | None = None
    training_safe: bool = False
    budget: str | None = None
    parser: str | None = None
    history: Literal["append", "template"] = "template"

    _internal_fields: ClassVar[frozenset[str]] = frozenset(
        {"chat_template", "training_safe", "budget", "parser", "history"}
    )
    _template_fields: ClassVar[frozenset[str]] = frozenset()
    _allow_opaque_template_kwargs: ClassVar[bool] = True


class TmplRenderer:
    """A ``renderers.base.Renderer`` backed by tmpl (see the module and ``docs/integrations.md``).

    - ``bridge_to_next_turn``, by ``config.history``: ``"template"``, the template's render of the
      conversation so far (the sampled IDs spliced back where it keeps their text, as
      ``tmpl.Rollout(history="template")`` builds its prompts), returned where it extends the
      previous prompt and completion, None where it does not (a branch: :attr:`last_branch` names the
      first differing message and field); ``"append"``, ``previous prompt + completion + tmpl's
      suffix`` for the tool results (a truncated completion gets the template's turn close first),
      None only where tmpl cannot build the suffix. :attr:`last_bridge_reason` and the log say why.
      The conversation before a prompt is known when this renderer (or another of the same template
      in this process) built that prompt: :mod:`tmpl.integrations.renderers.conversations`.
    - ``is_prefix_stable``: both of tmpl's verdicts (``tool_loop``, ``multi_user``) are SAFE (what it
      means in each mode: :attr:`is_prefix_stable`).
    - ``parse_response``: tmpl's parser for the template; unreadable calls get renderers' statuses.
    - ``get_stop_token_ids``: the template's turn closes (found by probing) and EOS.
    - ``render``: ``sampled_mask`` is tmpl's loss mask (1 on what the model generated: after each
      assistant turn's generation prompt, through its stop token); the bridge's is all False, as
      tmpl's mask is 0 on every appended token.

    >>> renderer = TmplRenderer.from_template(tmpl.ChatTemplate(tokenizer))   # doctest: +SKIP
    >>> renderer.is_prefix_stable                                             # doctest: +SKIP
    True
    """

    config_class: ClassVar[type[TmplRendererConfig]] = TmplRendererConfig

    def __init__(self, tokenizer: Any, config: TmplRendererConfig | None = None) -> None:
        cfg = config or TmplRendererConfig()
        if cfg.thinking_retention is not None:
            raise TrainerConfigError(
                "TmplRenderer",
                "thinking_retention",
                "tmpl bridges exactly what the template renders and never changes which reasoning it keeps; "
                "leave it unset (pass the template's own kwargs instead)",
            )
        kwargs = dict(cfg.model_extra or {})
        source, name = cfg.chat_template, None
        named = getattr(tokenizer, "chat_template", None)
        if source in {info.name for info in templates.available()} and not (
            isinstance(named, dict) and source in named
        ):
            source, name = templates.load(source), source
        tpl = ChatTemplate(tokenizer, source, name=name, **kwargs)
        self._init(tpl, cfg)

    @classmethod
    def from_template(cls, tpl: ChatTemplate, config: TmplRendererConfig | None = None) -> TmplRenderer:
        """A renderer for an existing :class:`tmpl.ChatTemplate` (its kwargs and stop tokens kept).

        >>> TmplRenderer.from_template(tmpl.ChatTemplate(tokenizer, "qwen3"))  # doctest: +SKIP
        """
        self = cls.__new__(cls)
        self._init(tpl, config or TmplRendererConfig())
        return self

    def _init(self, tpl: ChatTemplate, cfg: TmplRendererConfig) -> None:
        self.config = cfg
        self._budget = Budget.parse(cfg.budget) if cfg.budget else None
        self.tpl = training_safe(tpl) if cfg.training_safe else tpl
        self._tokenizer = self.tpl.tokenizer
        if cfg.history not in HISTORY_MODES:
            raise TrainerConfigError(
                "TmplRenderer", "history", f"must be one of {', '.join(map(repr, HISTORY_MODES))}, not {cfg.history!r}"
            )
        #: ``"template"`` or ``"append"`` (``config.history``)
        self.history: str = cfg.history
        #: why the last ``bridge_to_next_turn`` returned None (None when it bridged)
        self.last_bridge_reason: str | None = None
        #: template mode: the branch where the last ``bridge_to_next_turn`` returned None (else None)
        self.last_branch: Branch | None = None
        self._logged: set[str] = set()
        self._known = store_for(self.tpl.fingerprint)

    # -- tmpl's verdicts -------------------------------------------------------------------
    @property
    def report(self) -> TemplateReport:
        """tmpl's report on the template (:func:`tmpl.report.check`, kept per fingerprint)."""
        return check(self.tpl, self._budget)

    @property
    def is_prefix_stable(self) -> bool:
        """Whether tmpl proved that the template's render of a conversation, grown by a tool round or a
        new user turn, keeps the earlier render (prompt and sampled completion) as its prefix: both
        verdicts, ``tool_loop`` and ``multi_user``, SAFE. renderers asks it of full renders, which are
        the template's in both modes; what it means for the bridge:

        - template mode: True, the bridge never returns None at a branch (every tool round and user
          turn extends the sequence); False, it may (Qwen3 dropping earlier reasoning, gpt-oss its
          analysis), and the caller trains one sequence per branch.
        - append mode: True, every appended suffix is what the deployed template renders; False, the
          bridge still extends the sequence, but it may be a context the template never renders.

        >>> TmplRenderer.from_template(tpl).is_prefix_stable    # doctest: +SKIP
        True
        """
        verdicts = self.report.verdicts
        return all(verdicts[use].level == SAFE for use in ("tool_loop", "multi_user"))

    # -- rendering -------------------------------------------------------------------------
    def render(
        self,
        messages: list[Message],
        *,
        tools: list[ToolSpec] | None = None,
        add_generation_prompt: bool = False,
    ) -> RenderedTokens:
        """The template's tokens for ``messages`` with per-message attribution and tmpl's loss mask.

        ``message_indices``: a message owns the tokens its render adds to the render of the messages
        before it (the trailing generation prompt is -1). ``sampled_mask``: tmpl's loss mask (empty when
        an assistant turn's generation prompt is not a prefix of the full render: no mask can be
        proven there). ``is_content``: the sampled tokens, and the text of other messages' string
        contents where it appears verbatim in the render.
        """
        msgs = _normalized(messages)
        text = self.tpl.render(msgs, tools=tools, add_generation_prompt=add_generation_prompt)
        ids, offsets = self.tpl.codec.encode_with_offsets(text)
        if add_generation_prompt:  # a prompt: a later bridge renders its conversation
            self._known.put(ids, Known.root(msgs, text, ids))
        starts = [a for a, _ in offsets]
        n = len(ids)
        # message boundaries (characters): where each prefix render ends, when it is a prefix of this one
        ends: list[int | None] = []
        for j in range(len(msgs)):
            if j == len(msgs) - 1 and not add_generation_prompt:
                ends.append(len(text))
                continue
            try:
                part = self.tpl.render(msgs[: j + 1], tools=tools, add_generation_prompt=False)
            except TmplError:
                ends.append(None)
                continue
            ends.append(len(part) if text.startswith(part) else None)
        indices = [-1] * n
        t = 0
        for j, end in enumerate(ends):
            if end is None:
                continue  # its tokens go to the next message with a known end
            while t < n and starts[t] < end:
                indices[t] = j
                t += 1
        if t < n and ends and ends[-1] is None:  # the last message's end is unknown: give it the rest
            indices[t:] = [len(msgs) - 1] * (n - t)
        runs = self._generated_runs(msgs, tools, ids)
        sampled = [False] * n if runs is not None else []
        content = [False] * n
        for i, start, end in runs or ():
            # a sampled token belongs to its assistant turn, even where the next message's render closes it
            indices[start:end] = [i] * (end - start)
            sampled[start:end] = content[start:end] = [True] * (end - start)
        for j, m in enumerate(msgs):
            body = m.get("content")
            if m.get("role") == "assistant" or not isinstance(body, str) or not body:
                continue
            lo = next((starts[k] for k in range(n) if indices[k] == j), None)
            if lo is None:
                continue
            at = text.find(body, lo)
            if at < 0:
                continue
            for k in range(n):
                if indices[k] == j and offsets[k][1] > at and offsets[k][0] < at + len(body):
                    content[k] = True
        return RenderedTokens(
            token_ids=list(ids),
            message_indices=indices,
            sampled_mask=[bool(x) for x in sampled],
            is_content=content,
            message_roles=[str(m.get("role") or "") for m in msgs],
            message_tool_names=extract_message_tool_names(list(messages)),
        )

    def _generated_runs(
        self, msgs: list[dict[str, Any]], tools: Any, ids: list[int]
    ) -> list[tuple[int, int, int]] | None:
        """tmpl's trajectory mask over a full render, as ``(assistant index, start, end)`` runs: from
        after each assistant turn's generation prompt through its first stop token. None when a
        generation prompt is not a prefix of ``ids`` (token-in/token-out never builds this render)."""
        runs = []
        stops = self.tpl.stop_token_ids
        for i, m in enumerate(msgs):
            if m.get("role") != "assistant":
                continue
            try:
                prompt = self.tpl.codec.encode(self.tpl.render(msgs[:i], tools=tools, add_generation_prompt=True))
            except TmplError as exc:
                self._note(f"no loss mask: rendering the prompt of message {i} failed: {exc}")
                return None
            stop = next((t for t in range(len(prompt), len(ids)) if ids[t] in stops), None)
            if ids[: len(prompt)] != prompt or stop is None:
                self._note(f"no loss mask: the generation prompt of message {i} is not a prefix of the render")
                return None
            runs.append((i, len(prompt), stop + 1))
        return runs

    def render_ids(
        self,
        messages: list[Message],
        *,
        tools: list[ToolSpec] | None = None,
        add_generation_prompt: bool = False,
    ) -> list[int]:
        """The template's token IDs for ``messages`` (what ``apply_chat_template(tokenize=True)`` gives)."""
        msgs = _normalized(messages)
        text = self.tpl.render(msgs, tools=tools, add_generation_prompt=add_generation_prompt)
        ids = self.tpl.codec.encode(text)
        if add_generation_prompt:  # a prompt: a later bridge renders its conversation
            self._known.put(ids, Known.root(msgs, text, ids))
        return ids

    # -- completions -----------------------------------------------------------------------
    def parse_response(
        self,
        token_ids: list[int],
        *,
        tools: list[ToolSpec] | None = None,
        prompt_ids: list[int] | None = None,  # noqa: ARG002 - the protocol's; tmpl's parser does not need it
    ) -> ParsedResponse:
        """The completion read by tmpl's parser: content, reasoning, and one ``ParsedToolCall`` per
        attempted call in the order written (unreadable ones with renderers' status for the failure).
        ``prompt_ids`` is not needed: tmpl's parser knows from the template where reasoning starts."""
        try:
            parsed = parse_completion(self.tpl, token_ids, tools=tools, parser=self.config.parser)
        except NoToolParserError as exc:
            self._note(f"no tool-call parser: {exc}")
            text = self.tpl.codec.decode([t for t in token_ids if t not in self.tpl.stop_token_ids])
            return ParsedResponse(content=text.strip(), reasoning_content=None, tool_calls=[], reasoning_complete=None)
        calls: list[ParsedToolCall] = []
        for item in parsed.items:
            if isinstance(item, CallProblem):
                calls.append(
                    ParsedToolCall(
                        raw=item.raw,
                        name=item.name,
                        arguments=None,
                        token_span=item.token_span,
                        status=STATUS_OF_KIND.get(item.kind, ToolCallParseStatus.MALFORMED_STRUCTURE),
                    )
                )
            else:
                calls.append(
                    ParsedToolCall(
                        raw=item.raw,
                        name=item.name,
                        arguments=dict(item.arguments),
                        token_span=item.token_span,
                        status=ToolCallParseStatus.OK,
                        id=None if item.id_generated else item.id,
                    )
                )
        return ParsedResponse(
            content=parsed.content,
            reasoning_content=parsed.reasoning or None,
            tool_calls=calls,
            reasoning_complete=None,  # tmpl's parser does not say whether reasoning was closed
        )

    def get_stop_token_ids(self) -> list[int]:
        """The template's turn closes (plain and tool-call turns, found by probing) and EOS, sorted."""
        return sorted(self.tpl.stop_token_ids)

    # -- the bridge ------------------------------------------------------------------------
    def bridge_to_next_turn(
        self,
        previous_prompt_ids: list[int],
        previous_completion_ids: list[int],
        new_messages: list[Message],
        *,
        tools: list[ToolSpec] | None = None,
    ) -> RenderedTokens | None:
        """``previous_prompt_ids + previous_completion_ids`` (kept as they are) + the IDs of the next
        turn, by ``config.history``, or None (the reason is logged and kept in :attr:`last_bridge_reason`).

        - template mode: the template's render of the conversation so far with the generation prompt
          (the sampled IDs where it keeps their text), when it extends the previous IDs; None where it
          does not (a branch: :attr:`last_branch`), or where the conversation before the prompt is not
          known (a prompt no TmplRenderer of this template built in this process) and tmpl has not
          proven the template's tool rounds append (``tool_loop`` SAFE: then the suffix, as below).
        - append mode: tmpl's exact suffix for the tool results in ``new_messages``; None only where it
          cannot be built (other new messages, a suffix that needs a conversation not known here...).

        ``message_indices`` over the added tokens: the text before a new message's content (its
        opener, the previous one's close) belongs to it, what follows the last content (its close and
        the generation prompt) is -1; ``is_content`` marks the contents; ``sampled_mask`` is all False.

        >>> prompt = renderer.render_ids(messages, tools=tools, add_generation_prompt=True)     # doctest: +SKIP
        >>> renderer.bridge_to_next_turn(prompt, completion, tool_messages, tools=tools).token_ids  # doctest: +SKIP
        """
        prior = [*previous_prompt_ids, *previous_completion_ids]
        new = _normalized(new_messages)
        known = self._known.get(previous_prompt_ids)
        self.last_branch = None
        if self.history == "append":
            found = self._append(known, previous_completion_ids, new, tools)
        else:
            found = self._template(known, prior, previous_completion_ids, new, tools)
        if isinstance(found, str):
            self.last_bridge_reason = found
            self._note(f"bridge_to_next_turn returns None (the caller re-renders): {found}")
            return None
        added, node = found
        self.last_bridge_reason = None
        ids = prior + added
        if node is not None:
            self._known.put(ids, node)
        indices, content = self._attribute(added, new_messages, truncated=_ends_open(self, previous_completion_ids))
        return RenderedTokens(
            token_ids=ids,
            message_indices=[-1] * len(prior) + indices,
            sampled_mask=[False] * len(ids),
            is_content=[False] * len(prior) + content if content is not None else [],
            message_roles=[str(m.get("role") or "") for m in new_messages],
            message_tool_names=extract_message_tool_names(list(new_messages)),
        )

    def _append(
        self, known: Known | None, completion: Sequence[int], new: list[dict[str, Any]], tools: Any
    ) -> tuple[list[int], Known | None] | str:
        """Append mode: (the suffix, the new prompt's record), or why there is none."""
        if not new:
            return "no new messages"
        roles = sorted({str(m.get("role")) for m in new if m.get("role") not in TOOL_ROLES})
        if roles:
            return (
                f"append mode bridges tool results only (tmpl's suffix); new {', '.join(roles)} message(s) "
                "re-render (history='template' renders a user turn; an assistant message would re-tokenize sampled text)"
            )
        return self._suffix(known, completion, new, tools)

    def _suffix(
        self, known: Known | None, completion: Sequence[int], new: list[dict[str, Any]], tools: Any
    ) -> tuple[list[int], Known | None] | str:
        """tmpl's suffix for the tool results ``new`` (with the conversation, where the template needs it)."""
        name = self.tpl.name
        try:
            try:
                suffix = self.tpl.suffix_ids(new, completion_ids=completion, tools=tools)
            except HistoryRequiredError:
                state = self._state_of(known) if known is not None else None
                if state is None:
                    return (
                        f"{name}: its tool results render differently after earlier messages, and the "
                        "conversation before this prompt is not known (no TmplRenderer of this template built "
                        "it in this process)"
                    )
                suffix = self.tpl.suffix_ids(new, completion_ids=completion, tools=tools, history=state.messages)
        except TmplError as exc:
            return f"{name}: {type(exc).__name__}: {exc}"
        node = (
            None if known is None else Known(parent=known, completion=completion, added=new, tools=tools, tail=suffix)
        )
        return suffix, node

    def _template(
        self,
        known: Known | None,
        prior: list[int],
        completion: Sequence[int],
        new: list[dict[str, Any]],
        tools: Any,
    ) -> tuple[list[int], Known | None] | str:
        """Template mode: (the IDs the template's render adds, the new prompt's record), or why there are none."""
        name = self.tpl.name
        if not new:
            return "no new messages"
        if any(m.get("role") == "assistant" for m in new):
            return "an assistant message in new_messages would re-tokenize sampled text; the caller re-renders"
        if all(m.get("role") in TOOL_ROLES for m in new) and self.report.verdicts["tool_loop"].level == SAFE:
            found = self._suffix(known, completion, new, tools)  # proven: the suffix is the render's tail
            if not isinstance(found, str) or known is None:
                return found
        if known is None:
            return (
                f"{name}: template mode renders the conversation so far, and the one before this prompt is not "
                "known (no TmplRenderer of this template built the prompt in this process); the caller re-renders"
            )
        state = self._state_of(known)
        assistant = self._assistant(completion, new, tools)
        messages = [*state.messages, assistant, *new]
        turns = (*state.turns, self._sampled_turn(state, completion))
        gaps = dict(state.gaps)
        n = len(prior)
        try:
            text = self.tpl.render(messages, tools=tools, add_generation_prompt=True)
            spliced = splice(self.tpl, text, turns, gaps, sample="renderers", turn=len(turns), messages=messages)
        except HistorySpliceError as exc:
            # the tokenizer does not give the render's text back (e.g. it strips the spaces after an added
            # token): no sampled IDs can be placed in it, but its own IDs of the render may extend the prompt
            whole = self.tpl.codec.encode(text)
            if whole[:n] == prior:
                return whole[n:], Known(State(messages, messages, turns, gaps))
            return f"template mode: {exc}"
        except TmplError as exc:
            return f"{name}: template mode cannot render the conversation: {type(exc).__name__}: {exc}"
        ids = spliced.ids
        # a turn the splice found nowhere (a tokenizer without byte offsets keeps only whole turns) whose
        # reasoning is nowhere in the render either: its reasoning was dropped, as the splice says of a turn
        # it found in part
        dropped = [*spliced.dropped, *(k for k in spliced.rewritten if _reasoning_gone(messages[k], text))]
        shown = view(messages, dropped)
        if ids[:n] != prior:
            edit = (
                spliced.edit
                if len(dropped) == len(spliced.dropped)
                else _edit(dropped, len(spliced.rewritten) - (len(dropped) - len(spliced.dropped)))
            )
            self.last_branch = branch = _branch(prior, ids, [*state.view, assistant], shown, edit)
            return f"{name}: template mode: a branch starts ({_describe(branch)})"
        return ids[n:], Known(State(messages, shown, turns, gaps))

    def _assistant(self, completion: Sequence[int], new: Sequence[Mapping[str, Any]], tools: Any) -> dict[str, Any]:
        """The assistant message of ``completion`` as tmpl's loop records it (its parser's reading); call
        IDs the parser made up become the ``tool_call_id``s of the tool results that answer them."""
        try:
            parsed = parse_completion(self.tpl, list(completion), tools=tools, parser=self.config.parser)
        except NoToolParserError:
            text = self.tpl.codec.decode([t for t in completion if t not in self.tpl.stop_token_ids])
            return {"role": "assistant", "content": text}
        message = parsed.to_message()
        results = [m for m in new if m.get("role") in TOOL_ROLES]
        calls = message.get("tool_calls") or []
        if calls and len(calls) == len(results):
            for entry, call, result in zip(calls, parsed.tool_calls, results):
                answered = result.get("tool_call_id")
                if call.id_generated and isinstance(answered, str) and answered:
                    entry["id"] = answered
        return message

    def _sampled_turn(self, state: State, completion: Sequence[int]) -> SampledTurn:
        """The splice's record of ``completion``, sampled after the prompt of ``state`` (as tmpl's loop makes it)."""
        turn = SampledTurn.of(self.tpl.codec, f"turn-{len(state.turns)}", len(state.messages), completion)
        before = state.messages[-1].get("content") if state.messages else None
        if isinstance(before, str) and before.strip():  # searched first: the turn comes after it
            turn = dataclasses.replace(turn, after=before.strip().encode("utf-8"))
        return turn

    def _state_of(self, node: Known) -> State:
        """The conversation of a remembered prompt: a bridge's record built now from its parent's (its
        assistant message parsed from the completion), once."""
        with RESOLVING:  # one thread at a time builds records (renderers of a pool share them)
            return self._build_state(node)

    def _build_state(self, node: Known) -> State:
        chain = []
        while node.state is None:
            chain.append(node)
            assert node.parent is not None
            node = node.parent
        state = node.state
        for link in reversed(chain):
            assistant = self._assistant(link.completion, link.added, link.tools)
            gaps = dict(state.gaps)
            gaps[self.tpl.codec.decode(link.tail)] = list(link.tail)
            state = State(
                [*state.messages, assistant, *link.added],
                [*state.view, assistant, *link.added],
                (*state.turns, self._sampled_turn(state, link.completion)),
                gaps,
            )
            link.resolve(state)
        return state

    def _attribute(
        self, suffix: list[int], new_messages: Sequence[Mapping[str, Any]], truncated: bool
    ) -> tuple[list[int], list[bool] | None]:
        """Message indices and content flags over the suffix, from where each tool result's content
        is in its text (all -1 and None when a content cannot be found there verbatim)."""
        n = len(suffix)
        bodies = [m.get("content") for m in new_messages]
        if not all(isinstance(b, str) for b in bodies):
            return [-1] * n, None
        # fast: each token's own text, one call (byte-level pieces of a multibyte character do not join
        # back to it; the contents are then not found and the offsets of a full encode are used)
        pieces = self.tpl.codec.backend.decode_batch([[t] for t in suffix], skip_special_tokens=False)
        offsets, at = [], 0
        for piece in pieces:
            offsets.append((at, at + len(piece)))
            at += len(piece)
        found = self._spans("".join(pieces), bodies, truncated)
        if found is None:
            text = self.tpl.codec.decode(suffix)
            ids, offsets = self.tpl.codec.encode_with_offsets(text)
            found = self._spans(text, bodies, truncated) if ids == suffix else None
            if found is None:
                return [-1] * n, None
        lead, spans = found
        indices, content = [-1] * n, [False] * n
        j = 0
        for k, (a, b) in enumerate(offsets):
            if a < lead:
                continue
            while j < len(spans) and a >= spans[j][1] and not (spans[j][0] == spans[j][1] == a):
                j += 1
            if j == len(spans):
                break
            indices[k] = j
            content[k] = b > spans[j][0] and a < spans[j][1]
        return indices, content

    def _spans(self, text: str, bodies: list[Any], truncated: bool) -> tuple[int, list[tuple[int, int]]] | None:
        """Where the close tmpl put first ends (0 unless ``truncated``) and each content's span in ``text``."""
        lead = 0
        if truncated:  # the close tmpl put first belongs to the previous turn
            close = self.tpl.codec.decode(list(self.tpl.tool_close_ids))
            lead = len(close) if text.startswith(close) else 0
        spans, pos = [], lead
        for body in bodies:
            at = text.find(body, pos)
            if at < 0:
                return None
            spans.append((at, at + len(body)))
            pos = at + len(body)
        return lead, spans

    def _note(self, message: str) -> None:
        """Log ``message`` at INFO the first time, at DEBUG after that (a bridge runs every turn)."""
        if message in self._logged:
            logger.debug(message)
            return
        self._logged.add(message)
        logger.info(message)

    def __repr__(self) -> str:
        return f"TmplRenderer({self.tpl!r})"


def _branch(
    prior: list[int], ids: list[int], before: list[dict[str, Any]], after: list[dict[str, Any]], edit: str | None
) -> Branch:
    """The branch where the render ``ids`` leaves ``prior``, as tmpl's episode names it."""
    common = next((k for k, (a, b) in enumerate(zip(prior, ids)) if a != b), min(len(prior), len(ids)))
    kind = BranchKind.REWOUND if common == len(ids) else BranchKind.DIVERGED
    found = first_difference(before, after)
    message, field = found if found is not None else (None, None)
    return Branch(
        kind,
        token=common,
        expected=prior[common] if common < len(prior) else None,
        got=ids[common] if common < len(ids) else None,
        message=message,
        field=field,
        edit=edit,
    )


def _reasoning_gone(message: Mapping[str, Any], text: str) -> bool:
    """Whether ``message`` has reasoning and the render ``text`` holds none of it."""
    reasoning = next((v.strip() for k in REASONING_FIELDS if isinstance(v := message.get(k), str) and v.strip()), "")
    return bool(reasoning) and reasoning not in text


def _edit(dropped: Sequence[int], rewritten: int) -> str:
    """The edit label of a splice (``Spliced.edit``'s words), ``dropped`` and ``rewritten`` counted anew."""
    parts = ["template dropped reasoning"] if dropped else []
    if rewritten:
        parts.append("template rewrote sampled text")
    return "; ".join(parts)


def _describe(branch: Branch) -> str:
    """``branch`` in words, against the previous prompt and completion (a renderer has no sequence index)."""
    got = "render ends" if branch.got is None else f"render has {branch.got}"
    text = f"{branch.kind} from the previous prompt + completion at token {branch.token} ({got}, previous has {branch.expected})"
    if branch.message is not None:
        text += f"; message {branch.message}" + ("" if branch.field is None else f", field {branch.field!r}")
    if branch.edit is not None:
        text += f"; edit: {branch.edit}"
    return text


def _ends_open(renderer: TmplRenderer, completion: Sequence[int]) -> bool:
    return not completion or int(completion[-1]) not in renderer.tpl.stop_token_ids


def _normalized(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as templates read them: tool-call ``arguments`` given as JSON text (OpenAI's wire
    format, what verifiers sends) become dicts, as every template tmpl checks renders them."""
    out: list[dict[str, Any]] = []
    for m in messages:
        msg = dict(m)
        calls = msg.get("tool_calls")
        if calls:
            fixed = []
            for call in calls:
                call = dict(call)
                fn = call.get("function")
                if isinstance(fn, Mapping) and isinstance(fn.get("arguments"), str):
                    fn = dict(fn)
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except ValueError:
                        pass
                    call["function"] = fn
                fixed.append(call)
            msg["tool_calls"] = fixed
        out.append(msg)
    return out
