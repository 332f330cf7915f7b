"""Images in rollouts: what :class:`tmpl.Rollout` does when its template is a :class:`tmpl.vision.VisionTemplate`.

The loop keeps its text-only path as it is; with a vision template (``rollout.vision``) it calls
the hooks here:

- prompts: :func:`prompt_ids` renders each conversation through the processor (images in user
  messages expanded as the model's processor expands them), as :class:`ImageIds`: token IDs that
  carry their :class:`~tmpl.vision.ImageInputs`;
- trajectories: :func:`trajectory` makes an :class:`~tmpl.trajectory.images.ImageTrajectory`
  holding the prompt's images; each :class:`~tmpl.backends.base.GenerationRequest` gets the image
  inputs of its whole ``prompt_ids`` (``images``), so a backend can send them to its engine;
- tool results: a tool that returns an image (a PIL image, an image content part, or a list of
  content parts with images) gets a tool message with those parts (:func:`tool_messages`); its
  suffix is built by :meth:`VisionTemplate.suffix_ids` (:func:`suffixes`), and appended with its
  images (:func:`add_suffix`); text-only results of the same round keep the batched text path;
- checks: ``verify_every`` (:func:`verify`) and ``measure_drift`` (:func:`drift`) re-render the
  whole conversation, images included, through the processor and compare.
- history modes (``history="template"``, ``edit_history``): :func:`render_history` renders the messages
  so far through the processor (the text the sampled IDs are spliced into, placeholders expanded),
  :func:`placed` gives the spliced prompt the render's images, :func:`add_prompt_delta` continues a
  sequence with the images of what it adds, and :func:`image_clashes` names the sequences a prompt's IDs
  extend whose images differ (its call branches from them).

>>> from tmpl.rollout.images import ImageIds
>>> ids = ImageIds([1, 2, 3], None)
>>> ids + [4], ids.images is None
([1, 2, 3, 4], True)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import HistorySpliceError, ImageInputError, TmplError
from ..messages import validate_messages
from ..trajectory.images import ImageInputs, ImageTrajectory, placeholder_runs
from ..vision import VisionTemplate
from ..vision.parts import is_image_part, is_pil_image, split_images
from ..vision.template import VisionIds
from .drift import DriftDetail, explain_drift
from .suffixes import suffixes_of

if TYPE_CHECKING:
    from ..chat_template import ChatTemplate
    from ..tools.metrics import CallOutcome
    from .sample import SampleRun


class ImageIds(list):  # type: ignore[type-arg]
    """Token IDs (a plain ``list`` of ints) with the :class:`ImageInputs` of their placeholders
    (spans relative to these IDs; None: no images)."""

    __slots__ = ("images",)

    def __init__(self, ids: Sequence[int], images: ImageInputs | None) -> None:
        super().__init__(ids)
        self.images = images


def unwrap(template: Any) -> tuple[ChatTemplate, VisionTemplate | None]:
    """``(text template, vision template or None)`` of what a Rollout was given."""
    if isinstance(template, VisionTemplate):
        return template.chat, template
    return template, None


def prompt_ids(vision: VisionTemplate, conversation: Sequence[Mapping[str, Any]], tools: Any) -> list[int]:
    """The prompt of one conversation through the processor (its images expanded), with its images."""
    out = vision.render_ids(conversation, tools=tools, add_generation_prompt=True)
    return ImageIds(out.ids, out.images)


def trajectory(
    vision: VisionTemplate, max_length: int, max_completion_length: int | None, sample_id: str, prompt: Sequence[int]
) -> Any:
    """The sample's :class:`~tmpl.trajectory.images.ImageTrajectory` (its prompt's images, if any),
    within a Rollout's ``max_length`` and ``max_completion_length``."""
    return ImageTrajectory(
        prompt,
        max_length,
        max_completion_length,
        vocab_size=vision.chat.codec.vocab_size,
        sample_id=sample_id,
        images=getattr(prompt, "images", None),
        image_token_id=vision.image_token_id,
    )


def images_of(traj: Any) -> Any:
    """The image inputs of a trajectory made by :func:`trajectory` (its whole sequence's)."""
    return traj.images


def add_suffix(run: SampleRun, suffix: Sequence[int], message: int) -> int:
    """Append a tool suffix and its images (if it carries any) to the sample; tokens appended."""
    traj: Any = run.traj  # an ImageTrajectory (trajectory() made it)
    appended = int(traj.add_suffix(suffix, message=message, images=getattr(suffix, "images", None)))
    run.images = traj.images
    return appended


def sources(run: SampleRun) -> list[Any] | None:
    """The images of the sample's sequence themselves (PIL images, in placeholder order), for engines
    that run the model's processor on them (vLLM, verl's server): ``GenerationRequest.image_sources``.

    Read from the sample's messages (its conversation's images, then its tool results'), cut to the
    images its sequence carries (a budget cut may have stopped before the last); read again only when
    that count grows.
    """
    images = run.images
    if images is None or not images.count:
        return None
    cached = run.image_sources
    if cached is None or len(cached) != images.count:
        cached = run.image_sources = split_images(run.history, where=f"sample {run.index}/{run.sample}")[1][
            : images.count
        ]
    if len(cached) != images.count:
        raise TmplError(
            f"sample {run.index}/{run.sample}: its sequence carries {images.count} image(s) but its messages "
            f"hold {len(cached)}"
        )
    return cached


# -- tool results -------------------------------------------------------------------------------


def image_content(output: Any) -> list[Any] | None:
    """The content parts of a tool's return value when it holds images, else None (text as usual).

    An image (PIL), an image content part (``{"type": "image", ...}``, ``{"type": "image_url", ...}``),
    or a list of content parts with at least one image.

    >>> image_content("text"), image_content({"type": "image", "path": "chart.png"})
    (None, [{'type': 'image', 'path': 'chart.png'}])
    """
    if is_pil_image(output):
        return [{"type": "image", "image": output}]
    if isinstance(output, Mapping) and is_image_part(output):
        return [dict(output)]
    if isinstance(output, (list, tuple)) and any(is_image_part(p) for p in output):
        return [{"type": "image", "image": p} if is_pil_image(p) else p for p in output]
    return None


def tool_messages(outcomes: Sequence[CallOutcome], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` (the outcomes' text messages) with the content of image-returning tools as parts."""
    out = messages
    for k, o in enumerate(outcomes):
        if o.error is None and o.output is not None:
            parts = image_content(o.output)
            if parts is not None:
                if out is messages:
                    out = list(messages)
                out[k] = {**messages[k], "content": parts}
    return out


def refuse_images(conversation: Sequence[Mapping[str, Any]], *, where: str) -> None:
    """Raise :class:`~tmpl.errors.ImageInputError` naming the first image part of ``conversation``: a
    Rollout on a text template would render it as one unexpanded placeholder with no pixels."""
    for i, m in enumerate(conversation):
        content = m.get("content")
        if isinstance(content, (list, tuple)):
            for j, part in enumerate(content):
                if is_image_part(part):
                    raise ImageInputError(
                        i,
                        f"{where}[{i}].content[{j}]",
                        "an image, and this Rollout's template is a text template (its image would be one "
                        "placeholder with no pixels): give tmpl.Rollout a tmpl.vision.VisionTemplate",
                        where=where,
                    )


def has_image_parts(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a message holds an image content part."""
    for m in messages:
        content = m.get("content")
        if isinstance(content, (list, tuple)) and any(is_image_part(p) for p in content):
            return True
    return False


def suffixes(
    vision: VisionTemplate,
    messages: list[list[dict[str, Any]]],
    completions: list[list[int]],
    histories: list[list[dict[str, Any]]],
    schemas: Any,
) -> list[tuple[list[int] | None, Exception | None]]:
    """Each sample's suffix: tool results with images through :meth:`VisionTemplate.suffix_ids`
    (as :class:`ImageIds`), the others in one batch of the text template (each alone if it fails)."""
    out: list[tuple[list[int] | None, Exception | None]] = [(None, None)] * len(messages)
    text = [k for k, msgs in enumerate(messages) if not has_image_parts(msgs)]
    if text:
        pick = [messages[k] for k in text], [completions[k] for k in text], [histories[k] for k in text]
        for k, got in zip(text, suffixes_of(vision.chat, *pick, schemas)):
            out[k] = got
    with_images = set(range(len(messages))) - set(text)
    for k in sorted(with_images):
        try:
            v = vision.suffix_ids(messages[k], completion_ids=completions[k], tools=schemas, history=histories[k])
            out[k] = (ImageIds(v.ids, v.images), None)
        except Exception as exc:  # noqa: BLE001 - handed to the sample, which ends or crashes with it
            out[k] = (None, exc)
    return out


# -- history modes (history="template", edit_history) -------------------------------------------


@dataclass(frozen=True, slots=True)
class RenderedHistory:
    """A history rendered through the processor: ``text``, the render with every image placeholder
    expanded (what the sampled IDs are spliced into), ``full``, the processor's own IDs of it and their
    image inputs, and ``sources``, the images themselves (PIL, in placeholder order)."""

    text: str
    full: VisionIds
    sources: list[Any]


def render_history(vision: VisionTemplate, messages: Sequence[Mapping[str, Any]], tools: Any) -> RenderedHistory:
    """The next prompt's render of ``messages`` (template mode): the template's text, expanded by the
    processor for the messages' images (raises the processor's :class:`~tmpl.errors.TmplError` when the
    template does not render one placeholder per image)."""
    render, images, parts = split_images(messages, where="history")
    validate_messages(render, where="history")
    text = vision.chat.render(render, tools=tools, add_generation_prompt=True)
    full = vision.expand(text, images, parts)
    return RenderedHistory(vision.chat.codec.decode(full.ids), full, images)


def placed(rendered: RenderedHistory, ids: list[int], *, template: str, sample: object, turn: int) -> ImageIds:
    """Spliced prompt ``ids`` (of ``rendered.text``) with the render's images, spans where ``ids`` hold
    their placeholders. Raises :class:`~tmpl.errors.HistorySpliceError` unless ``ids`` hold one run per
    image, each as long as the processor made it."""
    theirs = rendered.full.images
    runs = placeholder_runs(ids, theirs.image_token_id)
    if [b - a for a, b in runs] != [b - a for a, b in theirs.spans]:
        raise HistorySpliceError(
            template,
            sample,
            turn,
            f"the spliced IDs hold placeholder runs of {[b - a for a, b in runs][:6]} tokens, the processor's "
            f"render {[b - a for a, b in theirs.spans][:6]} ({len(runs)} vs {theirs.count} images)",
        )
    return ImageIds(ids, dataclasses.replace(theirs, spans=tuple(runs)))


def same_images(a: ImageInputs, b: ImageInputs, upto: int) -> str | None:
    """None when ``a`` and ``b`` hold the same images (spans, arrays) among those whose placeholders end
    by position ``upto``; else what differs (the first image named)."""
    ka = sum(1 for _, end in a.spans if end <= upto)
    kb = sum(1 for _, end in b.spans if end <= upto)
    if ka != kb:
        return f"{ka} image(s) against {kb} in the first {upto} tokens"
    if not ka:
        return None
    ha, hb = a.split(ka)[0], b.split(kb)[0]
    if ha.spans != hb.spans or set(ha.arrays) != set(hb.arrays):
        return f"image placeholders at {list(ha.spans)[:4]} against {list(hb.spans)[:4]}"
    if all(np.array_equal(ha.arrays[key], hb.arrays[key]) for key in ha.arrays):
        return None
    for k in range(ka):  # which image differs
        one_a, one_b = ha.split(k + 1)[0].split(k)[1], hb.split(k + 1)[0].split(k)[1]
        if any(not np.array_equal(one_a.arrays[key], one_b.arrays[key]) for key in one_a.arrays):
            return f"image {k} ({hb.parts[k]}) has other pixels"
    return "the images' arrays differ"


def image_clashes(run: SampleRun, prompt: list[int]) -> dict[int, str]:
    """The sequences of the sample whose IDs ``prompt`` extends but whose images differ from the prompt's
    (an edit swapped an image for one of the same size: Qwen's and Gemma's placeholder IDs do not depend
    on pixels), each with what differs. A sequence has one set of model inputs, so the call of this
    prompt must not continue them (``Episode.add_call(apart=...)``): it branches."""
    images: ImageInputs | None = getattr(prompt, "images", None)
    assert images is not None and run.episode is not None
    out: dict[int, str] = {}
    for index, theirs in run.seq_images.items():
        ids = run.episode.sequence(index).ids
        if len(ids) <= len(prompt) and prompt[: len(ids)] == ids.tolist():
            why = same_images(theirs, images, len(ids))
            if why is not None:
                out[index] = why
    return out


def add_prompt_delta(run: SampleRun, prompt: list[int]) -> int:
    """Append what ``prompt`` adds to the sample's sequence (mask 0) with the images of its placeholders;
    tokens appended (an image that does not fit whole is not appended: the trajectory says why)."""
    n = len(run.sequence)
    delta = prompt[n:]
    images: ImageInputs | None = getattr(prompt, "images", None)
    tail = None
    if images is not None and images.count:
        tail = images.split(sum(1 for _, end in images.spans if end <= n))[1].shifted(-n)
    traj: Any = run.traj
    appended = int(traj.add_suffix(delta, images=tail)) if delta else 0
    run.images = traj.images
    return appended


# -- checks -------------------------------------------------------------------------------------


def verify(vision: VisionTemplate, messages: list[dict[str, Any]], tools: Any, suffix: Sequence[int]) -> bool:
    """Is ``suffix`` (and its images) the tail of the processor's full render of ``messages``?

    The IDs must be the render's last ones, right after a stop token; the suffix's images must be
    the render's last images: the same placeholder runs there and the same arrays, value for value.
    Raises the processor's TmplError when it cannot render ``messages`` (nothing to compare with:
    the caller counts the suffix as unverified, never as verified).
    """
    full = vision.render_ids(messages, tools=tools, add_generation_prompt=True)
    ids, n = full.ids, len(suffix)
    if not (n < len(ids) and ids[len(ids) - n :] == list(suffix) and ids[len(ids) - n - 1] in vision.stop_token_ids):
        return False
    mine: ImageInputs | None = getattr(suffix, "images", None)
    k = mine.count if mine is not None else 0
    theirs = full.images.split(full.images.count - k)[1]
    if theirs.count != k:
        return False
    if mine is None or not k:
        return True
    if mine.shifted(len(ids) - n).spans != theirs.spans or set(mine.arrays) != set(theirs.arrays):
        return False
    return all(np.array_equal(mine.arrays[key], theirs.arrays[key]) for key in mine.arrays)


def drift(
    vision: VisionTemplate, history: list[dict[str, Any]], ours: list[int], tools: Any
) -> tuple[bool | None, DriftDetail | None]:
    """:func:`tmpl.rollout.drift.rerender_drift` through the processor: would re-rendering the
    conversation (its images expanded by the processor) have changed the sample's IDs?"""
    try:
        gen = history[-1]["role"] != "assistant"
        full = vision.render_ids(history, tools=tools, add_generation_prompt=gen)
    except TmplError:
        return None, None
    detail = explain_drift(vision.chat, ours, full.ids)
    return detail is not None, detail


__all__ = [
    "ImageIds",
    "RenderedHistory",
    "add_prompt_delta",
    "add_suffix",
    "drift",
    "has_image_parts",
    "image_content",
    "image_clashes",
    "images_of",
    "placed",
    "prompt_ids",
    "render_history",
    "same_images",
    "suffixes",
    "tool_messages",
    "trajectory",
    "unwrap",
    "verify",
]
