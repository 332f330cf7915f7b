"""The images check of a report: for a template that renders image parts, are its image placeholders
expanded as the model's processor expands them (in prompts), and is the suffix of a tool result
with an image exact (issue 24, item 7)?

A template is a vision-language template here when a user message with an image content part
renders differently from the same message without it; the difference is its placeholder (e.g.
``<|vision_start|><|image_pad|><|vision_end|>``). A processor is then built around the template's
own tokenizer from transformers' classes with their ``*ImageProcessorPil`` image processors and
class defaults (docs/vision.md, "Processors"), chosen by the placeholder:

- ``<|image_pad|>``: ``Qwen2_5_VLProcessor`` (``Qwen2VLImageProcessorPil``);
- ``<start_of_image>``: ``Gemma3Processor`` (``Gemma3ImageProcessorPil``);
- ``<|image|>``: ``Gemma4Processor`` (``Gemma4ImageProcessorPil``).

Any other placeholder, a tokenizer without the placeholder's tokens, or transformers/Pillow missing
leaves the check ``UNPROVEN`` with the reason. The ground truth is always the processor's own full
render (``processor.apply_chat_template(..., tokenize=True, return_dict=True)``), at two image
sizes each:

- ``placeholders``: :meth:`tmpl.vision.VisionTemplate.prompt` of a conversation with an image
  equals the render, token IDs and every image array; ``SAFE`` (stable), else ``UNSAFE`` with the
  first difference;
- ``suffix``: :meth:`~tmpl.vision.VisionTemplate.suffix_ids` of a tool result with an image equals the
  tail of the render of the whole conversation (IDs and the image's arrays); ``UNSUPPORTED`` when
  the template drops images in tool results or refuses tool messages.

>>> image_placeholder(tpl)     # doctest: +SKIP
'<|vision_start|><|image_pad|><|vision_end|>'
>>> check_images(tpl).label    # doctest: +SKIP
'placeholders stable, suffix exact (Qwen2_5_VLProcessor)'
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ImagePlaceholderError, TmplError
from .verdict import SAFE, UNPROVEN, UNSAFE, UNSUPPORTED, Verdict

#: image sizes (width, height) of the prompt check and of the tool-result check
PROMPT_SIZES = ((64, 48), (333, 517))
TOOL_SIZES = ((100, 80), (517, 333))
_TEXT = "Describe the picture."
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "screenshot",
            "description": "Take a screenshot of a page",
            "parameters": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]},
        },
    }
]


@dataclass
class ImagesCheck:
    """What the images check found (``placeholder``: the template's text for one image part;
    ``processor``: the processor the expansion was checked with, None when none could be built)."""

    placeholder: str
    processor: str | None
    placeholders: Verdict
    suffix: Verdict
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """One cell of ``tmpl matrix``: ``placeholders stable, suffix exact (Qwen2_5_VLProcessor)``."""
        if self.processor is None:
            return f"{UNPROVEN} ({self.placeholders.reason})"
        p = "placeholders stable" if self.placeholders.level == SAFE else f"placeholders {self.placeholders.label}"
        s = "suffix exact" if self.suffix.level == SAFE else f"suffix {self.suffix.label}"
        return f"{p}, {s} ({self.processor.split(' ')[0]})"


def image_placeholder(tpl: Any) -> str | None:
    """The text ``tpl`` renders for one image part of a user message, or None (it renders none)."""
    part = [{"type": "image"}, {"type": "text", "text": _TEXT}]
    try:
        with_image = tpl.renderer.text([{"role": "user", "content": part}], add_generation_prompt=True)
        without = tpl.renderer.text([{"role": "user", "content": part[1:]}], add_generation_prompt=True)
    except TmplError:
        return None
    if with_image == without or _TEXT not in with_image:
        return None
    a = 0
    while a < min(len(with_image), len(without)) and with_image[a] == without[a]:
        a += 1
    b = 0
    while b < min(len(with_image), len(without)) - a and with_image[-1 - b] == without[-1 - b]:
        b += 1
    inserted: str = with_image[a : len(with_image) - b]
    if not inserted.strip() or "type" in inserted:  # nothing, or the parts printed as data
        return None
    return inserted


def _image(w: int, h: int, seed: int) -> Any:
    from ..vision.parts import pil_image_module

    rng = np.random.default_rng(seed + 7919 * w + h)
    arr = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    arr[: h // 2, : w // 3] = (250, 20, 20)
    return pil_image_module().fromarray(arr, "RGB")


def _processor(tpl: Any, placeholder: str) -> tuple[Any, str] | str:
    """A processor for ``tpl`` (and its description), or why none can be built here."""
    from ..vision.parts import pil_image_module

    try:
        pil_image_module()
        import transformers
    except ImportError as exc:
        return f"the images check needs transformers and Pillow ({exc})"
    vocab = tpl.tokenizer.get_vocab()
    kinds = [
        ("<|image_pad|>", ("<|image_pad|>",), "Qwen2_5_VLProcessor", "Qwen2VLImageProcessorPil"),
        ("<start_of_image>", ("<start_of_image>", "<image_soft_token>"), "Gemma3Processor", "Gemma3ImageProcessorPil"),
        ("<|image|>", ("<|image|>",), "Gemma4Processor", "Gemma4ImageProcessorPil"),
    ]
    for marker, tokens, processor_class, image_class in kinds:
        if marker not in placeholder:
            continue
        missing = [t for t in tokens if t not in vocab]
        if missing:
            return f"the tokenizer has no {', '.join(missing)}: no {processor_class} can be built on it here"
        from ..vision import image_only_processor

        tok = copy.deepcopy(tpl.tokenizer)  # processors may add tokens to theirs: never to the template's
        try:
            cls, image_processor = getattr(transformers, processor_class), getattr(transformers, image_class)()
            if processor_class == "Gemma3Processor":
                processor = cls(image_processor, tok, chat_template=tpl.template)
            else:
                processor = image_only_processor(cls, image_processor, tok, tpl.template)
        except Exception as exc:  # noqa: BLE001 - any failure to build is the reason it is unproven
            return f"{processor_class} cannot be built here: {type(exc).__name__}: {exc}"
        return processor, f"{processor_class} ({image_class}, class defaults)"
    shown = placeholder if len(placeholder) <= 48 else placeholder[:48] + "..."
    return f"no processor buildable here for the placeholder {shown!r}"  # (the three kinds above: docs/vision.md)


def _truth(processor: Any, messages: list[dict[str, Any]], kwargs: dict[str, Any], gen: bool = True) -> dict[str, Any]:
    out = processor.apply_chat_template(
        messages,
        tools=_TOOLS,
        tokenize=True,
        return_dict=True,
        return_tensors="np",
        add_generation_prompt=gen,
        **kwargs,
    )
    return {k: np.asarray(v) for k, v in out.items()}


def _same_arrays(mine: Any, truth: dict[str, Any], skip: set[str]) -> str | None:
    for key, value in truth.items():
        if key in skip:
            continue
        if key not in mine.arrays:
            return f"{key!r} is missing"
        if not np.array_equal(mine.arrays[key], value):
            return f"{key!r} differs"
    return None


def _user(img: Any) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You read screenshots."},
        {"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": _TEXT}]},
    ]


def _placeholders(vt: Any, processor: Any, kwargs: dict[str, Any]) -> Verdict:
    for k, (w, h) in enumerate(PROMPT_SIZES):
        messages = _user(_image(w, h, k))
        try:
            truth = _truth(processor, messages, kwargs)
        except Exception as exc:  # noqa: BLE001 - the processor's own render failed: nothing to compare with
            return Verdict(UNPROVEN, f"the processor's render failed: {type(exc).__name__}: {exc}")
        try:
            mine = vt.prompt(messages, tools=_TOOLS)
        except TmplError as exc:
            return Verdict(UNSAFE, f"{w}x{h}: {exc}")
        ids = truth["input_ids"][0].tolist()
        if mine.ids != ids:
            at = next((i for i, (a, b) in enumerate(zip(mine.ids, ids)) if a != b), min(len(ids), len(mine.ids)))
            return Verdict(UNSAFE, f"{w}x{h}: token IDs differ from the processor's at {at}")
        wrong = _same_arrays(mine.images, truth, {"input_ids", "attention_mask", *mine.images.token_type_keys})
        if wrong:
            return Verdict(UNSAFE, f"{w}x{h}: image inputs: {wrong}")
    return Verdict(SAFE, cases=len(PROMPT_SIZES))


def _drops_tool_images(vt: Any, messages: list[dict[str, Any]], placeholder: str) -> bool:
    """Whether the template's text render of ``messages`` (a user image, a tool result with one) holds
    fewer placeholders than images: checked, not read from the processor's error."""
    from ..vision.parts import split_images

    render, _, parts = split_images(messages, load=False)
    try:
        text = vt.chat.renderer.text(render, tools=_TOOLS, add_generation_prompt=True)
    except TmplError:
        return False
    return text.count(placeholder) < len(parts)


def _suffix(vt: Any, processor: Any, kwargs: dict[str, Any], notes: list[str], placeholder: str) -> Verdict:
    history = _user(_image(40, 40, 9))
    assistant = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "id": "call0", "function": {"name": "screenshot", "arguments": {"url": "u"}}}
        ],
    }
    for k, (w, h) in enumerate(TOOL_SIZES):
        img = _image(w, h, 20 + k)
        results = [
            {
                "role": "tool",
                "name": "screenshot",
                "tool_call_id": "call0",
                "content": [{"type": "text", "text": "page u:"}, {"type": "image", "image": img}],
            }
        ]
        try:
            prompt = vt.prompt(history, tools=_TOOLS)
        except TmplError as exc:
            return Verdict(UNPROVEN, f"the prompt does not render: {exc}")
        try:
            truth = _truth(processor, history + [assistant] + results, kwargs)
        except MemoryError:  # a budget's memory limit: the report says budget exceeded, not a verdict
            raise
        except ValueError as exc:
            if _drops_tool_images(vt, history + [assistant] + results, placeholder):
                return Verdict(UNSUPPORTED, "the template drops images in tool results (the processor's render fails)")
            return Verdict(UNPROVEN, f"the processor's render failed: {type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - e.g. a template that raises on tool messages
            return Verdict(UNSUPPORTED, f"the processor's render of a tool result fails: {type(exc).__name__}: {exc}")
        ids = truth["input_ids"][0].tolist()
        start = next((i for i, (a, b) in enumerate(zip(prompt.ids, ids)) if a != b), len(prompt.ids))
        end = next((i for i in range(start, len(ids)) if ids[i] in vt.stop_token_ids), None)
        if end is None:
            return Verdict(UNPROVEN, "no stop token closes the assistant turn in the processor's render")
        try:
            suffix = vt.suffix_ids(results, completion_ids=ids[start : end + 1], tools=_TOOLS, history=history)
        except ImagePlaceholderError:
            return Verdict(UNSUPPORTED, "the template drops images in tool results")
        except TmplError as exc:
            return Verdict(UNSUPPORTED, f"{type(exc).__name__}: {exc}")
        if suffix.ids != ids[end + 1 :]:
            return Verdict(UNSAFE, f"{w}x{h}: the suffix differs from the processor's full render")
        images = truth.get("image_grid_thw", truth.get("pixel_values"))
        tail = {key: v for key, v in truth.items() if key not in ("input_ids", "attention_mask")}
        tail = {key: v for key, v in tail.items() if key not in suffix.images.token_type_keys}
        if images is not None and len(images) >= 2:  # the last image is the tool's: compare its rows
            rows = {key: n[-1] for key, n in _rows(tail, len(images)).items()}
            tail = {key: v[len(v) - rows[key] :] for key, v in tail.items()}
        wrong = _same_arrays(suffix.images, tail, set())
        if wrong:
            return Verdict(UNSAFE, f"{w}x{h}: the tool image's inputs: {wrong}")
        if start != len(prompt.ids) and not notes:
            notes.append("not prefix-stable with images: the template re-renders the assistant turn")
    return Verdict(SAFE, cases=len(TOOL_SIZES))


def _rows(arrays: dict[str, Any], count: int) -> dict[str, list[int]]:
    from ..trajectory.images import ImageInputs

    spans = tuple((i, i + 1) for i in range(count))
    return ImageInputs(arrays, spans, ("",) * count, 0).rows()


def check_images(tpl: Any) -> ImagesCheck | None:
    """The images check of ``tpl`` (a :class:`tmpl.ChatTemplate`), None for a template without images."""
    placeholder = image_placeholder(tpl)
    if placeholder is None:
        return None
    built = _processor(tpl, placeholder)
    if isinstance(built, str):
        unproven = Verdict(UNPROVEN, built)
        return ImagesCheck(placeholder, None, unproven, Verdict(UNPROVEN, built))
    processor, described = built
    from ..vision import VisionTemplate

    kwargs = dict(tpl.template_kwargs)
    try:
        vt = VisionTemplate(processor, tpl.template, name=tpl.name, **kwargs)
    except TmplError as exc:
        reason = f"{described}: {exc}"
        return ImagesCheck(placeholder, None, Verdict(UNPROVEN, reason), Verdict(UNPROVEN, reason))
    notes: list[str] = []
    return ImagesCheck(
        placeholder,
        described,
        _placeholders(vt, processor, kwargs),
        _suffix(vt, processor, kwargs, notes, placeholder),
        notes,
    )
