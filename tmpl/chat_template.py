"""``ChatTemplate``: a tokenizer and its chat template, with exact suffix IDs for tool turns.

>>> import tmpl
>>> tpl = tmpl.ChatTemplate.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct")  # doctest: +SKIP
>>> prompt = tpl.prompt_ids([{"role": "user", "content": "Weather in Paris?"}], tools=tools)  # doctest: +SKIP
>>> completion = model_generate(prompt)  # ends with <|im_end|>                                # doctest: +SKIP
>>> suffix = tpl.suffix_ids([{"role": "tool", "name": "get_weather", "content": "21 C"}],
...                         completion_ids=completion, tools=tools)                            # doctest: +SKIP
>>> next_prompt = prompt + completion + suffix  # what the template renders, token for token   # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from . import _compat
from .messages import validate_messages, validate_tool_messages
from .render import Renderer
from .sources import load_tokenizer, resolve_template
from .suffix.engine import SuffixEngine
from .tokenize import Codec, codec_for

Message = Mapping[str, Any]


def template_fingerprint(template: str, template_kwargs: Mapping[str, Any], codec: Codec, tokenizer: Any) -> str:
    """SHA-256 over everything that decides a render's IDs: template text, template kwargs,
    special tokens the template can read, and the whole tokenization pipeline."""
    h = hashlib.sha256()
    for part in (
        template,
        json.dumps(dict(template_kwargs), sort_keys=True, default=str),
        json.dumps(getattr(tokenizer, "special_tokens_map", {}), sort_keys=True, default=str),
        codec.content_hash,
    ):
        h.update(part.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()


class ChatTemplate:
    """A tokenizer with its chat template, ready for token-in/token-out tool loops.

    ``chat_template`` is template text, a path to a ``.jinja`` file, the name of one of the
    tokenizer's named templates, or None for the tokenizer's own. ``template_kwargs``
    (e.g. ``enable_thinking=False``) are passed to every render.

    >>> tpl = ChatTemplate(tokenizer)  # doctest: +SKIP
    >>> sorted(tpl.stop_token_ids)     # doctest: +SKIP
    [151645]
    """

    def __init__(
        self,
        tokenizer: Any,
        chat_template: str | os.PathLike[str] | None = None,
        *,
        name: str | None = None,
        extra_stop_token_ids: Iterable[int] = (),
        **template_kwargs: Any,
    ) -> None:
        self.tokenizer = tokenizer
        self.template, stem = resolve_template(tokenizer, chat_template)
        self.name = name or stem or _default_name(tokenizer, chat_template, self.template)
        self.template_kwargs = dict(template_kwargs)
        self.codec = codec_for(tokenizer)
        self.renderer = Renderer(tokenizer, self.template, name=self.name, template_kwargs=self.template_kwargs)
        self.extra_stop_token_ids: frozenset[int] = frozenset(int(t) for t in extra_stop_token_ids)
        self.fingerprint: str = template_fingerprint(self.template, self.template_kwargs, self.codec, tokenizer)
        self.engine = SuffixEngine(self.renderer, self.codec, self.fingerprint)

    @classmethod
    def from_pretrained(
        cls,
        path_or_id: str | os.PathLike[str],
        chat_template: str | os.PathLike[str] | None = None,
        *,
        hub_timeout: float | None = None,
        **template_kwargs: Any,
    ) -> ChatTemplate:
        """Load a tokenizer (a local folder, or a hub id ``owner/name``: see :func:`load_tokenizer`) and wrap it.

        Named after the folder (or the hub id), or after ``chat_template``'s file when one is given.
        ``hub_timeout`` is the seconds to wait for the hub per try (default ``TMPL_HUB_TIMEOUT``, 5).

        Stop tokens listed in the folder's ``generation_config.json`` (``eos_token_id``) are added
        to :attr:`stop_token_ids`. For the training-safe variant tmpl ships (when there is one),
        pass the result to :func:`tmpl.report.training_safe`.
        """
        tokenizer = load_tokenizer(path_or_id, hub_timeout=hub_timeout)
        extra = list(template_kwargs.pop("extra_stop_token_ids", ()))
        if Path(str(path_or_id)).is_dir():
            extra += _generation_config_eos(path_or_id)
        name = template_kwargs.pop("name", None)
        if name is None and chat_template is None:
            name = Path(str(path_or_id)).name if Path(str(path_or_id)).is_dir() else str(path_or_id)
        return cls(tokenizer, chat_template, name=name, extra_stop_token_ids=extra, **template_kwargs)

    # -- rendering --------------------------------------------------------------------
    def render(self, messages: Sequence[Message], tools: Sequence[Any] | None = None, **kwargs: Any) -> str:
        """The template's text for ``messages`` (a thin wrapper over ``apply_chat_template``)."""
        return self.renderer.text(messages, tools=tools, **kwargs)

    def render_many(
        self, conversations: Sequence[Sequence[Message]], tools: Sequence[Any] | None = None, **kwargs: Any
    ) -> list[str]:
        """:meth:`render` of each conversation, in one call into the template (a rollout's prompts)."""
        return self.renderer.texts(conversations, tools=tools, **kwargs)

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[Any] | None = None) -> list[int]:
        """Token IDs of ``messages`` rendered with the generation prompt."""
        validate_messages(messages)
        return self.codec.encode(self.renderer.text(messages, tools=tools, add_generation_prompt=True))

    # -- stop tokens ------------------------------------------------------------------
    @cached_property
    def stop_token_ids(self) -> frozenset[int]:
        """Tokens that end an assistant turn or a tool-call turn (from the template, plus EOS).

        Gemma's ``<end_of_turn>``/``<turn|>``, gpt-oss's ``<|call|>`` and ``<|return|>``,
        Llama's ``<|eot_id|>``... found by probing, never assumed to be ``eos_token_id`` alone.
        """
        turns = self.engine.turns
        stops = set(self.extra_stop_token_ids)
        for probe in (turns.plain, turns.tool):
            if probe is not None and probe.stop_id is not None:
                stops.add(probe.stop_id)
        if turns.tool is not None:
            stops.update(turns.tool.close.ids)
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(eos, int):
            stops.add(eos)
        stops.discard(None)
        return frozenset(stops)

    @property
    def tool_close_ids(self) -> tuple[int, ...]:
        """The canonical close of a tool-call turn (e.g. ``<|im_end|>``), found by probing."""
        turns = self.engine.turns
        if turns.tool is None:
            assert turns.tool_error is not None
            raise turns.tool_error
        return turns.tool.close.ids

    # -- suffixes ---------------------------------------------------------------------
    def suffix_ids(
        self,
        tool_messages: Sequence[Message],
        *,
        completion_ids: Sequence[int],
        tools: Sequence[Any] | None = None,
        history: Sequence[Message] | None = None,
    ) -> list[int]:
        """IDs to append after ``completion_ids``: the tool results and the next generation prompt.

        ``prompt + completion_ids + suffix`` equals the tokenization of the template's full
        render of ``history + [assistant turn] + tool_messages`` (with the generation prompt).
        When ``completion_ids`` does not end with a stop token (a truncated completion), the
        suffix starts with the template's canonical turn close.

        ``history`` (the messages before the assistant turn) is needed only by templates
        whose tool results render differently after earlier messages (e.g. DeepSeek V3's,
        which opens the tool-outputs block only once per conversation); they raise
        :class:`~tmpl.errors.HistoryRequiredError` without it. Passing it is always safe.
        """
        validate_tool_messages(tool_messages)
        ids = self.engine.suffix(tool_messages, tools, history)
        if _compat.ids.ends_with_any(completion_ids, self.stop_token_ids):
            return ids
        return self._close_for(tool_messages, tools) + ids

    def suffix_ids_batch(
        self,
        list_of_tool_messages: Sequence[Sequence[Message]],
        *,
        completion_ids: Sequence[Sequence[int]],
        tools: Sequence[Any] | None = None,
        histories: Sequence[Sequence[Message] | None] | None = None,
    ) -> list[list[int]]:
        """:meth:`suffix_ids` for many samples at once (one tokenizer call for all of them)."""
        if len(list_of_tool_messages) != len(completion_ids):
            raise ValueError(
                f"{len(list_of_tool_messages)} lists of tool messages but {len(completion_ids)} completions"
            )
        for b, msgs in enumerate(list_of_tool_messages):
            validate_tool_messages(msgs, where=f"list_of_tool_messages[{b}]")
        out = self.engine.suffix_batch(list_of_tool_messages, tools, histories)
        stops = self.stop_token_ids
        for b, completion in enumerate(completion_ids):
            if not _compat.ids.ends_with_any(completion, stops):
                out[b] = self._close_for(list_of_tool_messages[b], tools) + out[b]
        return out

    def _close_for(self, tool_messages: Sequence[Message], tools: Sequence[Any] | None) -> list[int]:
        return list(self.engine.frame(tool_messages, tools).close.ids)

    @property
    def renders(self) -> int:
        """How many times this template has been rendered (probes and per-call paths included)."""
        return self.renderer.count

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r}, fingerprint={self.fingerprint[:12]})"


def _default_name(tokenizer: Any, chat_template: object, template: str) -> str:
    """The tokenizer's name for its own template; for template text from elsewhere, a name of that text
    (``custom-`` and 8 hex digits of its SHA-256), never the host tokenizer's."""
    own = getattr(tokenizer, "chat_template", None)
    owns = template in own.values() if isinstance(own, dict) else template == own
    if chat_template is None or owns:
        return os.path.basename(str(getattr(tokenizer, "name_or_path", "")).rstrip("/")) or "template"
    return "custom-" + hashlib.sha256(template.encode("utf-8")).hexdigest()[:8]


def _generation_config_eos(path_or_id: str | os.PathLike[str]) -> list[int]:
    path = Path(str(path_or_id)) / "generation_config.json"
    if not path.is_file():
        return []
    try:
        eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError):
        return []
    if isinstance(eos, int):
        return [eos]
    if isinstance(eos, list):
        return [int(e) for e in eos if isinstance(e, int)]
    return []
