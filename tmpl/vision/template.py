"""``VisionTemplate``: a processor with its chat template; prompts and tool-result suffixes with images.

The text of a render comes from :class:`~tmpl.ChatTemplate` (image parts become the template's
own placeholder, e.g. ``<|vision_start|><|image_pad|><|vision_end|>``); the processor itself then
expands each placeholder (``<|image_pad|>`` repeated by the image's grid, Gemma's soft tokens)
and computes the image inputs, so the expansion is the model's own, never re-implemented here.

>>> from transformers import AutoTokenizer, Qwen2_5_VLProcessor, Qwen2VLImageProcessorPil  # doctest: +SKIP
>>> processor = image_only_processor(Qwen2_5_VLProcessor, Qwen2VLImageProcessorPil(),
...                                  AutoTokenizer.from_pretrained("Qwen/Qwen3-4B"), chat_template=qwen35)  # doctest: +SKIP
>>> vt = VisionTemplate(processor)                                                              # doctest: +SKIP
>>> prompt = vt.prompt([{"role": "user", "content": [{"type": "image", "image": "page.png"},
...                                                  {"type": "text", "text": "Read it"}]}], tools=tools)  # doctest: +SKIP
>>> suffix = vt.suffix_ids([{"role": "tool", "content": [{"type": "image", "image": chart}]}],
...                        completion_ids=completion, tools=tools)                            # doctest: +SKIP
>>> ids = prompt.ids + completion + suffix.ids                                                  # doctest: +SKIP
>>> images = ImageInputs.concat([prompt.images, suffix.images.shifted(len(prompt.ids + completion))])  # doctest: +SKIP
>>> model_inputs = images.model_inputs(ids)  # input_ids, pixel_values, image_grid_thw, ...      # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..chat_template import ChatTemplate
from ..errors import ImagePlaceholderError, SpliceError
from ..messages import validate_messages
from .inputs import TOKEN_KEYS, ImageInputs, placeholder_runs
from .parts import split_images

Message = Mapping[str, Any]

_IMAGE_ONLY: dict[type, type] = {}


def image_only_processor(
    processor_class: type, image_processor: Any, tokenizer: Any, chat_template: str | None = None, **kwargs: Any
) -> Any:
    """A processor of ``processor_class`` with only an image processor and a tokenizer.

    Several transformers processors (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma 4) require a video
    processor or an audio feature extractor, whose classes need torchvision or audio libraries. This
    builds a subclass that accepts ``None`` for those and passes ``None``; images and text go
    through the class's own code unchanged. Videos and audio are then unavailable.

    >>> from transformers import AutoTokenizer, Qwen2_5_VLProcessor, Qwen2VLImageProcessorPil  # doctest: +SKIP
    >>> p = image_only_processor(Qwen2_5_VLProcessor, Qwen2VLImageProcessorPil(), tokenizer)  # doctest: +SKIP
    """
    sub = _IMAGE_ONLY.get(processor_class)
    if sub is None:

        def check_argument_for_proper_class(self: Any, argument_name: str, argument: Any) -> Any:
            if argument is None:
                return None
            return processor_class.check_argument_for_proper_class(self, argument_name, argument)  # type: ignore[attr-defined]

        sub = type(
            f"ImageOnly{processor_class.__name__}",
            (processor_class,),
            {"check_argument_for_proper_class": check_argument_for_proper_class, "__module__": __name__},
        )
        _IMAGE_ONLY[processor_class] = sub
    missing = {a: None for a in sub.get_attributes() if a not in ("image_processor", "tokenizer")}  # type: ignore[attr-defined]
    return sub(image_processor=image_processor, tokenizer=tokenizer, chat_template=chat_template, **missing, **kwargs)


@dataclass(frozen=True)
class VisionIds:
    """Token IDs with the image inputs of the images they hold (spans relative to these IDs)."""

    ids: list[int]
    images: ImageInputs


class VisionTemplate:
    """A processor (tokenizer + image processor) with its chat template, for tool loops with images.

    ``chat_template`` is template text or a path (default: the processor's, then the tokenizer's);
    ``template_kwargs`` go to every render as in :class:`~tmpl.ChatTemplate`.

    >>> vt = VisionTemplate(processor)  # doctest: +SKIP
    >>> vt.chat.stop_token_ids          # the text template underneath  # doctest: +SKIP
    frozenset({151645})
    """

    def __init__(
        self,
        processor: Any,
        chat_template: str | os.PathLike[str] | None = None,
        *,
        name: str | None = None,
        **template_kwargs: Any,
    ) -> None:
        self.processor = processor
        tokenizer = processor.tokenizer
        template = chat_template if chat_template is not None else getattr(processor, "chat_template", None)
        #: the text template: rendering, stop tokens, the proven suffix IDs before expansion
        self.chat = ChatTemplate(tokenizer, template, name=name, **template_kwargs)
        # the token the processor expands an image into (Gemma 3's image_token_id is its <start_of_image>,
        # which it expands to <image_soft_token>s: image_token_ids says which)
        ids = [t for t in getattr(processor, "image_token_ids", None) or [] if isinstance(t, int)]
        token_id = ids[0] if len(ids) == 1 else getattr(processor, "image_token_id", None)
        if not isinstance(token_id, int):
            raise ImagePlaceholderError(
                self.chat.name, (), f"{type(processor).__name__} names no single image token: not a supported processor"
            )
        #: the token each image's placeholder run is made of (``<|image_pad|>``, ``<image_soft_token>``...)
        self.image_token_id: int = token_id

    @property
    def name(self) -> str:
        return self.chat.name

    @property
    def stop_token_ids(self) -> frozenset[int]:
        return self.chat.stop_token_ids

    def prompt(self, messages: Sequence[Message], tools: Sequence[Any] | None = None) -> VisionIds:
        """The IDs of ``messages`` with the generation prompt, images expanded, and their image inputs.

        Equal to ``processor.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
        tokenize=True, return_dict=True)`` (``input_ids`` and the image arrays).
        """
        return self.render_ids(messages, tools=tools, add_generation_prompt=True)

    def render_ids(
        self, messages: Sequence[Message], tools: Sequence[Any] | None = None, *, add_generation_prompt: bool = True
    ) -> VisionIds:
        """The IDs of the whole conversation ``messages``, images expanded, and their image inputs:
        ``processor.apply_chat_template(messages, tools=tools, add_generation_prompt=...,
        tokenize=True, return_dict=True)`` (what the rollout's drift and suffix checks compare with).
        """
        render, images, parts = split_images(messages, where="messages")
        validate_messages(render)
        text = self.chat.render(render, tools=tools, add_generation_prompt=add_generation_prompt)
        return self._expand(text, images, parts)

    def suffix_ids(
        self,
        tool_messages: Sequence[Message],
        *,
        completion_ids: Sequence[int],
        tools: Sequence[Any] | None = None,
        history: Sequence[Message] | None = None,
    ) -> VisionIds:
        """IDs to append after ``completion_ids`` (tool results with their images, and the next
        generation prompt), with the image inputs of those images.

        ``prompt + completion_ids + suffix.ids`` equals the processor's full render of
        ``history + [assistant turn] + tool_messages``. The text suffix comes from
        :meth:`tmpl.ChatTemplate.suffix_ids` (image parts as the template's placeholders), then the
        processor expands it. Raises :class:`~tmpl.errors.ImagePlaceholderError` when the template
        does not render one placeholder per image (some drop images in tool results).
        """
        render, images, parts = split_images(tool_messages, where="tool_messages")
        render_history = split_images(history, where="history", load=False)[0] if history is not None else None
        raw = self.chat.suffix_ids(render, completion_ids=completion_ids, tools=tools, history=render_history)
        if not images:
            return VisionIds(raw, ImageInputs.empty(self.image_token_id))
        text = self.chat.tokenizer.decode(raw, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if self.chat.codec.encode(text) != raw:
            raise SpliceError(
                self.name,
                f"around the images of {', '.join(parts)}",
                "the suffix's text does not encode back to its IDs",
            )
        return self._expand(text, images, parts)

    def expand(self, text: str, images: Sequence[Any], parts: tuple[str, ...]) -> VisionIds:
        """The processor's IDs of rendered ``text`` (its image placeholders expanded for ``images``, in
        order) and their image inputs; ``parts`` names each image. What :meth:`render_ids` does after
        rendering, for callers that render (and read the images of) the messages themselves.

        >>> render, images, parts = split_images(messages)                                   # doctest: +SKIP
        >>> vt.expand(vt.chat.render(render, add_generation_prompt=True), images, parts).ids  # doctest: +SKIP
        """
        return self._expand(text, list(images), parts)

    def _expand(self, text: str, images: list[Any], parts: tuple[str, ...]) -> VisionIds:
        try:
            out = self.processor(text=[text], images=images or None, add_special_tokens=False, return_tensors="np")
        except (ValueError, IndexError) as exc:  # the processor's own count check
            raise ImagePlaceholderError(self.name, parts, f"the processor refused the render: {exc}") from exc
        ids = [int(t) for t in np.asarray(out["input_ids"])[0]]
        runs = placeholder_runs(ids, self.image_token_id)
        if len(runs) != len(images):
            raise ImagePlaceholderError(
                self.name,
                parts,
                f"{len(images)} image(s) but {len(runs)} placeholder run(s) in the render: the template "
                "does not render these image parts",
            )
        arrays = {k: np.asarray(v) for k, v in out.items() if k not in TOKEN_KEYS} if images else {}
        type_keys = tuple(k for k in out if k in TOKEN_KEYS - {"input_ids", "attention_mask"})
        return VisionIds(ids, ImageInputs(arrays, tuple(runs), parts, self.image_token_id, type_keys))
