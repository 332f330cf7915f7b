"""``TmplContinuousTokenBuilder``: verl's Continuous Token builder API, backed by tmpl's suffix engine.

verl (0.9.1) calls a builder's ``build_initial_tokens`` for the first prompt, ``merge_assistant_tokens``
after each generation and ``merge_context_tokens`` for the messages appended after it (tool
results, then the next generation prompt). This builder answers the last with
``ChatTemplate.suffix_ids``: ``runtime + appended`` equals the template's full render of the
conversation, for any template tmpl can prove (the model's own IDs stay as they were generated).
Appends tmpl does not handle (user or system messages, templates it refuses) go to verl's own builder
for the model (``fallback="verl"``, counted in ``fallbacks``) or raise
:class:`tmpl.errors.ContinuousTokenError` (``fallback="error"``).

Given a VLM's processor (one with an image processor), the builder renders through a
:class:`tmpl.vision.VisionTemplate` of it: ``build_initial_tokens`` with ``images`` (put into the
messages' image parts in order) and tool results with image parts get each placeholder expanded as
the processor's full render; ``supports_multimodal()`` is then True, as verl's VL builders say.

>>> builder = TmplContinuousTokenBuilder(tokenizer)                              # doctest: +SKIP
>>> prompt = builder.build_initial_tokens(messages, tools=tools)                  # doctest: +SKIP
>>> merged = builder.merge_context_tokens(before, before + tool_msgs, prompt + completion, tools=tools)  # doctest: +SKIP
>>> merged.token_ids[len(prompt + completion):]  # the full render's tail, token for token  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Literal

from verl.utils.tokenizer.continuous_token import ContinuousTokenBuilder, MergeResult

from ...chat_template import ChatTemplate
from ...errors import ContinuousTokenError, MessageError, TemplateError
from ...vision import VisionTemplate
from ...vision.parts import is_image_part

__all__ = ["TmplContinuousTokenBuilder", "create_tmpl_builder", "use_tmpl_builders"]

logger = logging.getLogger(__name__)

Fallback = Literal["verl", "error"]


class TmplContinuousTokenBuilder(ContinuousTokenBuilder):  # type: ignore[misc]
    """A verl ``ContinuousTokenBuilder`` whose tool-result merges are tmpl's exact suffixes.

    ``template``: a :class:`tmpl.ChatTemplate`, template text or path, or None for the tokenizer's
    own (or ``chat_template_kwargs["chat_template"]``); the other ``chat_template_kwargs`` are
    passed to every render, as verl does. ``hf_model_type`` picks verl's builder used as fallback.
    ``processor``: a VLM's processor (with an image processor): images go through its
    :class:`tmpl.vision.VisionTemplate` (``self.vision``), which renders ``template`` (a ChatTemplate's
    text and settings too) when one is given, else the processor's own.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        allowed_append_roles: Any = None,
        template: ChatTemplate | str | None = None,
        fallback: Fallback = "verl",
        hf_model_type: str | None = None,
        processor: Any = None,
    ) -> None:
        if fallback not in ("verl", "error"):
            raise ValueError(f"fallback must be 'verl' or 'error', not {fallback!r}")
        super().__init__(
            tokenizer, chat_template_kwargs=dict(chat_template_kwargs or {}), allowed_append_roles=allowed_append_roles
        )
        kwargs = dict(chat_template_kwargs or {})
        source = kwargs.pop("chat_template", None)
        self.vision: VisionTemplate | None = None
        if getattr(processor, "image_processor", None) is not None:
            settings: dict[str, Any] = {}
            given: str | None
            if isinstance(template, ChatTemplate):  # its template text and settings, through the processor
                given, settings = template.template, dict(template.template_kwargs)
            else:
                given = template
            self.vision = VisionTemplate(processor, given if given is not None else source, **{**settings, **kwargs})
            self.template = self.vision.chat
        elif isinstance(template, ChatTemplate):
            self.template = template
        else:
            self.template = ChatTemplate(tokenizer, template if template is not None else source, **kwargs)
        self.fallback = fallback
        self.fallbacks = 0  #: merges handed to verl's own builder
        self._verl_builder: Any = None
        if fallback == "verl":
            from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

            extra: dict[str, Any] = {"processor": processor} if self.vision is not None else {}
            self._verl_builder = create_continuous_token_builder(
                tokenizer, hf_model_type=hf_model_type, chat_template_kwargs=dict(chat_template_kwargs or {}), **extra
            )

    def supports_multimodal(self) -> bool:
        """Whether images go through this builder (a VLM processor was given)."""
        return self.vision is not None

    # -- verl's runtime API ----------------------------------------------------------------
    def build_initial_tokens(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        images: list[Any] | None = None,
        videos: list[Any] | None = None,
        audios: list[Any] | None = None,
        mm_inputs_out: dict[str, Any] | None = None,  # noqa: ARG002 - verl's signature
    ) -> list[int]:
        """The first prompt: the template's render of ``messages`` with the generation prompt (with a
        VLM processor, ``images`` in the messages' image parts, in order, expanded by the processor)."""
        if videos or audios or (images and self.vision is None):
            raise ContinuousTokenError(
                self.template.name,
                "videos and audio are not supported" if videos or audios else "images given but no VLM processor",
            )
        if self.vision is not None and (images or _has_images(messages)):
            from .agent_loop import with_images

            msgs = with_images(messages, list(images)) if images else messages
            return self.vision.render_ids(msgs, tools=tools, add_generation_prompt=True).ids
        return self.template.prompt_ids(messages, tools=tools)

    def merge_context_tokens(
        self,
        previous_messages: list[dict[str, Any]],
        updated_messages: list[dict[str, Any]],
        runtime_token_ids: list[int],
        *,
        tools: list[dict[str, Any]] | None = None,
    ) -> MergeResult:
        """Append the messages after ``previous_messages``: tool results get tmpl's exact suffix."""
        self._assert_append_only(previous_messages, updated_messages)
        appended = updated_messages[len(previous_messages) :]
        if not appended:
            return MergeResult(token_ids=list(runtime_token_ids), appended_token_count=0, kind="context")
        why = self._unsupported(previous_messages, appended)
        if why is None:
            try:
                if self.vision is not None:  # images in the tool results (or the history) expanded by the processor
                    ids = self.vision.suffix_ids(
                        appended, completion_ids=runtime_token_ids, tools=tools, history=previous_messages[:-1]
                    ).ids
                else:
                    ids = self.template.suffix_ids(
                        appended, completion_ids=runtime_token_ids, tools=tools, history=previous_messages[:-1]
                    )
            except (TemplateError, MessageError) as exc:
                why = f"{type(exc).__name__}: {exc}"
            else:
                return MergeResult(
                    token_ids=list(runtime_token_ids) + ids, appended_token_count=len(ids), kind="context"
                )
        if self._verl_builder is None:
            raise ContinuousTokenError(self.template.name, why)
        self.fallbacks += 1
        logger.warning("tmpl: %s; using verl's %s for this merge", why, type(self._verl_builder).__name__)
        result: MergeResult = self._verl_builder.merge_context_tokens(
            previous_messages, updated_messages, runtime_token_ids, tools=tools
        )
        return result

    @staticmethod
    def _unsupported(previous: list[dict[str, Any]], appended: list[dict[str, Any]]) -> str | None:
        roles = [m.get("role") for m in appended]
        if any(r != "tool" for r in roles):
            return f"tmpl's suffixes are for tool results after an assistant turn; appended roles {roles}"
        if not previous or previous[-1].get("role") != "assistant":
            return "tool results must follow an assistant turn"
        return None


def create_tmpl_builder(
    tokenizer: Any, *, hf_model_type: str | None = None, **kwargs: Any
) -> TmplContinuousTokenBuilder:
    """A drop-in for verl's ``create_continuous_token_builder``: tmpl's builder for any model type.

    A VLM's processor renders images through a :class:`tmpl.vision.VisionTemplate`; verl's
    ``mm_processor_kwargs`` are refused (tmpl renders with the processor's own settings, verl would
    apply them when it recomputes the model inputs).
    """
    processor = kwargs.pop("processor", None)
    mm_kwargs = kwargs.pop("mm_processor_kwargs", None)
    kwargs.pop("model_family", None)
    if mm_kwargs and getattr(processor, "image_processor", None) is not None:
        raise ContinuousTokenError(
            getattr(tokenizer, "name_or_path", "tokenizer"),
            f"mm_processor_kwargs {sorted(mm_kwargs)}: set them on the processor (tmpl renders with its own settings)",
        )
    return TmplContinuousTokenBuilder(tokenizer, hf_model_type=hf_model_type, processor=processor, **kwargs)


def use_tmpl_builders() -> None:
    """Make every verl agent loop created from now on (in this process) use tmpl's builder.

    verl's ``AgentLoopBase.__init__`` builds its builder with ``create_continuous_token_builder``
    from ``verl.experimental.agent_loop.agent_loop``; this points that name at
    :func:`create_tmpl_builder`. Call it where the agent-loop workers import your code (e.g. the
    module of a custom agent loop or tool, which verl imports in each worker).
    """
    import verl.experimental.agent_loop.agent_loop as agent_loop

    agent_loop.create_continuous_token_builder = create_tmpl_builder


def _has_images(messages: list[dict[str, Any]]) -> bool:
    return any(is_image_part(p) for m in messages if isinstance(m.get("content"), (list, tuple)) for p in m["content"])
