"""Image prompts in TRL: the trainer's processor, the :class:`~tmpl.vision.VisionTemplate` it implies, and the
checks that refuse what TRL would rebuild or drop (images in tool results, a TRL version not checked)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...chat_template import ChatTemplate
from ...errors import TrainerConfigError
from ...rollout.loop import RolloutResult
from ...vision.parts import is_image_part
from ...vision.template import VisionTemplate
from .backends import trainer_name


def vision_processor(trainer: Any) -> Any:
    """The trainer's ``processing_class`` when it is a processor with an image processor, else None."""
    processing_class = getattr(trainer, "processing_class", None)
    if getattr(processing_class, "image_processor", None) is None:
        return None
    if getattr(processing_class, "tokenizer", None) is None:
        return None
    return processing_class


def vision_template_for(trainer: Any, template: ChatTemplate | str | None) -> VisionTemplate:
    """The :class:`VisionTemplate` of the trainer's processor: its chat template (or ``template``'s
    text, or the template tmpl ships under that name) with the trainer's ``chat_template_kwargs``."""
    processor = vision_processor(trainer)
    if processor is None:
        raise TrainerConfigError(
            trainer_name(trainer), "processing_class", "prompts with images need a processor with an image processor"
        )
    kwargs = dict(getattr(trainer, "chat_template_kwargs", None) or {})
    if isinstance(template, ChatTemplate):
        raise TrainerConfigError(
            trainer_name(trainer),
            "processing_class",
            f"template {template.name!r} is a text ChatTemplate: prompts with images render through the processor "
            "(make_rollout_func(template=None) uses the processor's own chat template, as TRL's loss pass does)",
        )
    text = template
    if isinstance(template, str):
        from ... import templates

        if template in {t.name for t in templates.available()}:
            text = templates.load(template)
    return VisionTemplate(processor, text, **kwargs)


def check_vision_trainer(trainer: Any, toolbox: Any, *, forced_backend: bool = False) -> None:
    """Refuse, before any rollout, image prompts whose images TRL's loss pass would not rebuild.

    TRL (1.16) rebuilds a VLM's loss-pass inputs in ``_generate_and_score_completions`` from the dataset's
    ``images``/``image`` column and its own render of the prompts, ``apply_chat_template(prompt,
    processing_class, tools=trainer.tools, **chat_template_kwargs)``; ``trainer.tools`` must be None
    with tmpl's rollout_func (else TRL runs its own tool loop and its tool mask replaces ``env_mask``),
    so tmpl's rollout must render the prompts without tools too.
    """
    if toolbox is not None and len(toolbox):
        names = ", ".join(toolbox.names)
        raise TrainerConfigError(
            trainer_name(trainer),
            "tools",
            f"prompts with images and tools ({names}) cannot go through TRL's rollout_func: TRL "
            f"{_TRL_IMAGES_CHECKED} rebuilds the loss pass's image inputs (pixel_values, image_grid_thw, "
            "mm_token_type_ids) from its own render of the prompts with trainer.tools, which must be None with "
            "tmpl's rollout_func (TRL's own tool loop would run and replace env_mask), so its prompts would "
            "lack the tool schemas tmpl renders; use make_rollout_func() without tools for image prompts",
        )
    generation = getattr(trainer, "vllm_generation", None)
    if not forced_backend and getattr(trainer, "use_vllm", False) and getattr(generation, "mode", None) == "server":
        raise TrainerConfigError(
            trainer_name(trainer),
            "vllm_mode",
            "'server' with prompts holding images is not wired: TRL's VLLMClient takes a prompt's images as "
            "`features` from its image_features() call, which tmpl's client backend does not send (it would "
            "generate from the placeholders alone); use vllm_mode='colocate', or pass backend=VLLMServer(..., "
            "api='generate') to make_rollout_func",
        )
    training = getattr(getattr(trainer, "model", None), "training", True)
    dataset = getattr(trainer, "train_dataset" if training else "eval_dataset", None)
    found = list(dataset.values()) if isinstance(dataset, Mapping) else [dataset]
    for d in found:
        columns = getattr(d, "column_names", None)
        if columns is None or not {"images", "image"} & set(columns):
            raise TrainerConfigError(
                trainer_name(trainer),
                "train_dataset" if training else "eval_dataset",
                f"prompts hold images but the dataset's columns are {columns}: TRL {_TRL_IMAGES_CHECKED}'s loss "
                "pass takes a prompt's images only from an 'images' (or 'image') column; images written into "
                "the prompts alone would reach its forward pass as placeholders without pixel_values",
            )


def check_no_tool_images(
    results: Sequence[RolloutResult], conversations: Sequence[Sequence[Mapping[str, Any]]], trainer: Any
) -> None:
    """Refuse completions in which a tool returned an image: TRL has no channel for them from a rollout_func.

    TRL (1.16) keeps only ``prompt_ids``/``completion_ids``/``logprobs`` from a ``rollout_func``; its loss
    pass gets images returned by tools only from its own tool loop (``tool_images``), so a tool image in
    tmpl's completion would reach the model as placeholders without ``pixel_values``.
    """
    for i, (r, conversation) in enumerate(zip(results, conversations)):
        for j, message in enumerate(r.messages[len(conversation) :], start=len(conversation)):
            content = message.get("content")
            if message.get("role") != "tool" or isinstance(content, str) or not isinstance(content, Sequence):
                continue
            if any(map(is_image_part, content)):
                raise TrainerConfigError(
                    trainer_name(trainer),
                    "rollout_func",
                    f"sample {i}, message {j}: the tool {message.get('name')!r} returned an image. TRL "
                    f"{_TRL_IMAGES_CHECKED} takes no images from a rollout_func (only prompt_ids, completion_ids, "
                    "logprobs); its loss pass gets images returned by tools only from its own tool loop "
                    "(tool_images), so this one would reach the model as placeholders without pixel_values",
                )


def check_trl_rebuild(
    results: Sequence[RolloutResult], conversations: Sequence[Sequence[Mapping[str, Any]]], trainer: Any
) -> None:
    """Check that each prompt_ids equals what TRL's loss pass rebuilds, and that its rows line up.

    TRL renders each prompt with ``trl.data_utils.apply_chat_template(..., tools=trainer.tools,
    **chat_template_kwargs)`` and calls the processor on that text and the prompt's images
    (``padding=True``); its ``mm_token_type_ids`` (and ``pixel_values``/``image_grid_thw``, in order)
    go with tmpl's ``prompt_ids`` left-padded. This does the same per prompt and compares the IDs;
    a processor padding on the right is refused when the batch's prompts differ in length.
    """
    from trl.data_utils import apply_chat_template as trl_render

    processor = vision_processor(trainer)
    kwargs = dict(getattr(trainer, "chat_template_kwargs", None) or {})
    tools = getattr(trainer, "tools", None)
    done: dict[tuple[str, tuple[int, ...]], list[int]] = {}
    for i, (r, conversation) in enumerate(zip(results, conversations)):
        images = [
            part["image"]
            for m in conversation
            if isinstance(m.get("content"), list)
            for part in m["content"]
            if is_image_part(part)
        ]
        text = trl_render({"prompt": list(conversation)}, processor, tools=tools, **kwargs)["prompt"]
        key = (text, tuple(id(im) for im in images))
        if key not in done:
            rebuilt = processor(images=images or None, text=[text])["input_ids"][0]
            done[key] = [int(t) for t in rebuilt]
        ours = r.prompt_ids.tolist()
        if ours != done[key]:
            at = next((k for k, (a, b) in enumerate(zip(ours, done[key])) if a != b), min(len(ours), len(done[key])))
            raise TrainerConfigError(
                trainer_name(trainer),
                "train_dataset",
                f"prompt {i}: tmpl's prompt_ids ({len(ours)} tokens) differ from what TRL {_TRL_IMAGES_CHECKED}'s "
                f"loss pass rebuilds with the processor ({len(done[key])} tokens), first at token {at}: its "
                "pixel_values/mm_token_type_ids would not line up with the IDs",
            )
    side = getattr(processor.tokenizer, "padding_side", "right")
    lengths = {len(r.prompt_ids) for r in results}
    if side != "left" and len(lengths) > 1:
        raise TrainerConfigError(
            trainer_name(trainer),
            "processing_class",
            f"the processor's tokenizer pads on the {side} and the batch's prompts differ in length "
            f"({min(lengths)}-{max(lengths)} tokens): TRL pads prompt_ids on the left but its mm_token_type_ids "
            "with the processor, so they would be shifted; set processing_class.tokenizer.padding_side = 'left'",
        )


#: the TRL version whose GRPOTrainer._generate / _generate_and_score_completions were read for images
_TRL_IMAGES_CHECKED = "1.16"
