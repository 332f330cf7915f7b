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

import logging
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
from ...episode import Branch
from ...errors import NoToolParserError, TmplError, TrainerConfigError
from ...report import SAFE, Budget, check, training_safe
from ...report.report import TemplateReport
from ...rollout.history import HISTORY_MODES
from ...toolcalls import CallProblem, parse_completion
from .branches import _normalized
from .bridge import Bridge
from .conversations import Known, store_for

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


class TmplRenderer(Bridge):
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

    def _note(self, message: str) -> None:
        """Log ``message`` at INFO the first time, at DEBUG after that (a bridge runs every turn)."""
        if message in self._logged:
            logger.debug(message)
            return
        self._logged.add(message)
        logger.info(message)

    def __repr__(self) -> str:
        return f"TmplRenderer({self.tpl!r})"
