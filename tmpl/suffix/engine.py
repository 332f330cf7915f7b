"""The suffix engine: tool-result IDs to append after a completion, from cached frames.

Frames are cached per template fingerprint and per (tools, tool-message shape), in the
:class:`~tmpl.suffix.state.TemplateState` shared by every :class:`~tmpl.ChatTemplate` with
the same fingerprint. The per-call fast path is:
compute the shape key, look the frame up, build the text of the dynamic runs,
one call into the ``tokenizers`` backend, splice IDs in the compiled core.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import HistoryRequiredError, UnsupportedTemplateError
from ..render import Renderer
from ..tokenize import Codec
from .frames import ID_SAFE, TRANSFORMS, Frame, FrameBuilder, Layout, content_class
from .probe import TurnInfo, probe_turns
from .state import state_for

_SCALAR_TYPES = frozenset({str, int, float, bool, type(None)})


def shape_key(messages: Sequence[Mapping[str, Any]]) -> tuple[tuple[tuple[str, Any], ...], ...]:
    """Hashable description of tool messages with their contents and call ids left out.

    Runs on every call (the frame lookup key), so it is written flat.
    """
    out = []
    for m in messages:
        items: list[tuple[str, Any]] = []
        for k, v in m.items():
            if k == "content":
                items.append((k, type(v) is str))
            elif k == "tool_call_id":
                items.append((k, v is not None))
            elif type(v) in _SCALAR_TYPES:
                items.append((k, v))
            else:
                items.append((k, json.dumps(v, sort_keys=True, default=str)))
        out.append(tuple(items))
    return tuple(out)


class SuffixEngine:
    """Suffix IDs for one template. Use it through :class:`tmpl.ChatTemplate`."""

    def __init__(self, renderer: Renderer, codec: Codec, fingerprint: str) -> None:
        self.renderer = renderer
        self.codec = codec
        self.builder = FrameBuilder(renderer, codec)
        self.state = state_for(fingerprint)
        self._tools_memo: dict[int, tuple[Any, str]] = {}
        #: how many suffixes took the per-call render path (for reports and tests)
        self.per_call_count = 0

    @property
    def turns(self) -> TurnInfo:
        """How plain and tool-call turns close (probed once per fingerprint)."""
        turns = self.state.turns
        if turns is None:
            with self.state.lock:
                if self.state.turns is None:
                    self.state.turns = probe_turns(self.renderer, self.codec)
                turns = self.state.turns
        return turns

    # -- keys -------------------------------------------------------------------------
    def tools_key(self, tools: Sequence[Any] | None) -> str:
        """Digest of a tools list. Lists are treated as immutable: pass a new list after a change."""
        if tools is None:
            return ""
        memo = self._tools_memo.get(id(tools))
        if memo is not None and memo[0] is tools:
            return memo[1]
        digest = hashlib.sha1(json.dumps(_schemas(tools), sort_keys=True, default=str).encode("utf-8")).hexdigest()
        if len(self._tools_memo) > 256:
            self._tools_memo.clear()
        self._tools_memo[id(tools)] = (tools, digest)
        return digest

    def frame(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None) -> Frame:
        key = (self.tools_key(tools), shape_key(messages))
        found = self.state.frames.get(key)
        if found is None:
            turns = self.turns
            if turns.tool is None:
                assert turns.tool_error is not None
                raise turns.tool_error
            with self.state.lock:
                found = self.state.frames.get(key)
                if found is None:
                    try:
                        found = self.builder.build(
                            messages, _schemas(tools) if tools is not None else None, turns.tool.close
                        )
                    except UnsupportedTemplateError as exc:
                        found = exc
                    self.state.frames[key] = found
        if isinstance(found, Exception):
            raise found
        return found

    # -- one suffix -------------------------------------------------------------------
    def plan(
        self, frame: Frame, messages: Sequence[Mapping[str, Any]]
    ) -> tuple[Layout, list[Callable[[str], str]]] | None:
        """The layout and per-message transforms for a fast fill, or None for the per-call path."""
        fns = []
        layout_name = None
        for m, has_id in zip(messages, frame.id_slots):
            content = m["content"]
            if type(content) is not str:
                return None
            tname = frame.transforms.get(content_class(content))
            if tname is None:
                return None
            if layout_name is None:
                layout_name = tname
            elif frame.layouts[tname] is not frame.layouts[layout_name]:
                return None
            if has_id and not ID_SAFE.match(m["tool_call_id"]):
                return None
            fns.append(TRANSFORMS[tname])
        assert layout_name is not None, "a suffix has at least one tool message"
        return frame.layouts[layout_name], fns

    def suffix(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Any] | None,
        history: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        frame = self.frame(messages, tools)
        if frame.history_dependence:
            return self._with_history(frame, messages, _schemas(tools) if tools is not None else None, history)
        plan = self.plan(frame, messages)
        if plan is None:  # only the render paths need the tools as schemas: not the fast path
            self.per_call_count += 1
            return self.builder.per_call(frame, messages, _schemas(tools) if tools is not None else None)
        layout, fns = plan
        return layout.fill(self.codec, messages, fns)

    def _with_history(
        self,
        frame: Frame,
        messages: Sequence[Mapping[str, Any]],
        schemas: Sequence[Any] | None,
        history: Sequence[Mapping[str, Any]] | None,
    ) -> list[int]:
        if history is None:
            raise HistoryRequiredError(
                self.renderer.name,
                f"the suffix depends on earlier messages ({frame.history_dependence}); pass history= "
                "(the conversation before this assistant turn) to get it exactly",
            )
        self.per_call_count += 1
        return self.builder.per_call_with_history(frame, history, messages, schemas)

    def suffix_batch(
        self,
        batch: Sequence[Sequence[Mapping[str, Any]]],
        tools: Sequence[Any] | None,
        histories: Sequence[Sequence[Mapping[str, Any]] | None] | None = None,
    ) -> list[list[int]]:
        """Suffixes of many samples with one call into the tokenizer for all dynamic runs."""
        out: list[list[int] | None] = [None] * len(batch)
        pending = []  # (sample index, frame, layout, number of texts)
        texts: list[str] = []
        schemas = _schemas(tools) if tools is not None else None
        for b, messages in enumerate(batch):
            frame = self.frame(messages, tools)
            if frame.history_dependence:
                out[b] = self._with_history(frame, messages, schemas, histories[b] if histories else None)
                continue
            plan = self.plan(frame, messages)
            if plan is None:
                self.per_call_count += 1
                out[b] = self.builder.per_call(frame, messages, schemas)
                continue
            layout, fns = plan
            run_plans = layout.plans(messages, fns)
            pending.append((b, layout, run_plans))
            texts.extend(p[0] for p in run_plans)
        if texts:
            encoded = self.codec.encode_many(texts)
            pos = 0
            for b, layout, run_plans in pending:
                n = len(run_plans)
                out[b] = layout.assemble(run_plans, encoded[pos : pos + n])
                pos += n
        return out  # type: ignore[return-value]


def _schemas(tools: Sequence[Any]) -> list[Any]:
    """JSON schemas for a tools list (callables are converted like transformers does)."""
    if all(isinstance(t, Mapping) for t in tools):
        return list(tools)
    from transformers.utils.chat_template_utils import get_json_schema

    return [t if isinstance(t, Mapping) else get_json_schema(t) for t in tools]
