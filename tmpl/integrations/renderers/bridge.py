"""How a renderer bridges to the next turn: bridge_to_next_turn in template mode (the template's render with the\nsampled IDs spliced back) and append mode (the previous prompt, the completion and tmpl's suffix), and the\nconversation state it keeps for that."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from renderers.base import (
    Message,
    RenderedTokens,
    ToolSpec,
    extract_message_tool_names,
)

from ...errors import HistoryRequiredError, HistorySpliceError, NoToolParserError, TmplError
from ...messages import TOOL_ROLES
from ...report import SAFE
from ...rollout.history import SampledTurn, splice, view
from ...toolcalls import parse_completion
from .branches import _branch, _describe, _edit, _ends_open, _normalized, _reasoning_gone
from .conversations import RESOLVING, Known, State


class Bridge:
    """TmplRenderer's methods of this module (a mixin: its attributes are TmplRenderer's)."""

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
        indices, content = self._attribute(added, new_messages, truncated=_ends_open(self.tpl, previous_completion_ids))
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
