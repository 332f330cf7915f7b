"""Images through the gateway: image blocks of every dialect as canonical image parts, and the prompts
of a :class:`tmpl.vision.VisionTemplate` built from them (docs/vision.md, "The gateway").

Each dialect maps its image blocks to one canonical part, :func:`image_part`: ``{"type": "image",
"image": "data:image/...;base64,...", "block": <the block's name in the client's request>}``. The
gateway never fetches a URL: an image is sent inline (Anthropic's ``base64`` source, a ``data:`` URL in
OpenAI's ``image_url`` and the Responses API's ``input_image``, Gemini's ``inlineData``); any other
source is refused with a 400 naming its block. A request's content stays a string where it holds no
image, so text-only calls take the text path unchanged.

:func:`served_messages` is where a request's images meet the template: a text template refuses the
first image block (a 400 naming it, in the client's dialect), a vision template gets the messages with
the ``block`` names dropped (the parts then equal call after call, whatever the block's place).

On a vision template the session (:mod:`tmpl.gateway.session`) plans prompts through the processor:
a render is :func:`tmpl.rollout.images.render_history` (the processor's own expansion) with the
sampled IDs spliced back; an append is :meth:`VisionTemplate.suffix_ids` of the new tool results, its
images shifted after the head's. Each engine request carries the image inputs of its whole prompt
and the images themselves; each episode sequence keeps the images of its last call's prompt.

>>> image_part("data:image/png;base64,iVBORw0KGgo=", "messages[0].content[1]")["image"][:15]
'data:image/png;'
>>> image_part("https://example.com/cat.png", "messages[0].content[1]")
Traceback (most recent call last):
...
tmpl.errors.GatewayRequestError: messages[0].content[1]: the image's URL 'https://example.com/cat.png' is not read: the gateway fetches no URLs (send the image inline, as base64 or a data: URL)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import GatewayRequestError
from ..vision.parts import is_image_part, load_image

if TYPE_CHECKING:
    from ..trajectory.images import ImageInputs
    from ..vision import VisionTemplate

__all__ = [
    "clashes",
    "data_url",
    "has_images",
    "image_part",
    "loaded",
    "served_messages",
    "sequence_images",
    "shifted_after",
]

#: the key of a canonical image part naming its block in the client's request (dropped before planning)
BLOCK = "block"


def data_url(media_type: Any, data: Any, where: str) -> str:
    """A ``data:`` URL of base64 ``data`` of ``media_type`` (an ``image/...`` type), or a 400 naming ``where``.

    >>> data_url("image/png", "AAAA", "contents[0].parts[1]")
    'data:image/png;base64,AAAA'
    >>> data_url("application/pdf", "AAAA", "contents[0].parts[1]")
    Traceback (most recent call last):
    ...
    tmpl.errors.GatewayRequestError: contents[0].parts[1]: media type 'application/pdf' is not an image (image/png, image/jpeg, image/gif, image/webp...)
    """
    if not isinstance(media_type, str) or not media_type.startswith("image/"):
        raise GatewayRequestError(
            None,
            f"{where}: media type {media_type!r} is not an image (image/png, image/jpeg, image/gif, image/webp...)",
            param=where,
        )
    if not isinstance(data, str) or not data:
        raise GatewayRequestError(None, f"{where}: the image's data must be a non-empty base64 string", param=where)
    return f"data:{media_type};base64,{data}"


def image_part(url: Any, where: str) -> dict[str, Any]:
    """The canonical part of an image sent as ``url`` (a ``data:image/...;base64,`` URL), named ``where``;
    any other URL is a 400 naming ``where`` (the gateway reads no network, no files)."""
    if not isinstance(url, str) or not url:
        raise GatewayRequestError(None, f"{where}: an image needs its URL (a data: URL)", param=where)
    if not url.startswith("data:"):
        shown = url if len(url) <= 80 else url[:77] + "..."
        raise GatewayRequestError(
            None,
            f"{where}: the image's URL {shown!r} is not read: the gateway fetches no URLs (send the image "
            "inline, as base64 or a data: URL)",
            param=where,
        )
    head = url[: url.find(",")] if "," in url else url[:60]
    if not head.startswith("data:image/") or not head.endswith(";base64"):
        raise GatewayRequestError(
            None, f"{where}: the data URL {head[:60]!r} is not a base64 image (data:image/...;base64,...)", param=where
        )
    return {"type": "image", "image": url, BLOCK: where}


def has_images(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a canonical message holds an image part (content a list: only requests with images have one)."""
    return any(isinstance(m.get("content"), list) and any(is_image_part(p) for p in m["content"]) for m in messages)


def served_messages(
    vision: VisionTemplate | None, session: str, messages: Sequence[Mapping[str, Any]]
) -> Sequence[Mapping[str, Any]]:
    """``messages`` as the gateway plans them: unchanged without images; on a text template (``vision``
    None) a 400 naming the first image block; on a vision template, the image parts without their block
    names.

    >>> served_messages(None, "s1", [{"role": "user", "content": [image_part("data:image/png;base64,AA", "m[0]")]}])
    Traceback (most recent call last):
    ...
    tmpl.errors.GatewayRequestError: session 's1': m[0] (an image): this template renders no images: the gateway serves images on a tmpl.vision.VisionTemplate (Gateway(VisionTemplate(processor), backend))
    """
    if not has_images(messages):
        return messages
    out: list[Mapping[str, Any]] = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if not isinstance(content, list) or not any(is_image_part(p) for p in content):
            out.append(m)
            continue
        if vision is None:
            j, part = next((j, p) for j, p in enumerate(content) if is_image_part(p))
            name = part.get(BLOCK) if isinstance(part, Mapping) else None
            name = name or f"messages[{i}].content[{j}]"
            raise GatewayRequestError(
                session,
                f"{name} (an image): this template renders no images: the gateway serves images on a "
                "tmpl.vision.VisionTemplate (Gateway(VisionTemplate(processor), backend))",
                param=name,
            )
        parts = [
            {k: v for k, v in p.items() if k != BLOCK} if isinstance(p, Mapping) and BLOCK in p else p for p in content
        ]
        out.append({**m, "content": parts})
    return out


def loaded(messages: Sequence[Mapping[str, Any]], where: str) -> tuple[list[dict[str, Any]], list[Any]]:
    """``(messages, images)``: the messages with each image part's source read into a PIL image (what
    :meth:`VisionTemplate.suffix_ids` then takes as it is), and those images in order (the engine's
    ``image_sources``). An unreadable image is :class:`~tmpl.errors.ImageInputError` naming its part."""
    out: list[dict[str, Any]] = []
    images: list[Any] = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if not isinstance(content, list) or not any(is_image_part(p) for p in content):
            out.append(dict(m))
            continue
        parts: list[Any] = []
        for j, p in enumerate(content):
            if is_image_part(p) and isinstance(p, Mapping) and p.get("image") is not None:
                image = load_image(p["image"], index=i, part=f"{where}[{i}].content[{j}]", where=where)
                images.append(image)
                parts.append({"type": "image", "image": image})
            else:
                parts.append(p)
        out.append({**m, "content": parts})
    return out, images


def sequence_images(recorded: Mapping[int, ImageInputs], lengths: Sequence[int]) -> list[ImageInputs | None]:
    """The image inputs of each episode sequence (``lengths``: their lengths), from those of the last call
    recorded on it, cut to the sequence; None for a sequence none of whose calls had images."""
    from ..rollout.result import sequence_images as cut

    out: list[ImageInputs | None] = cut(None, recorded, lengths)
    return out


def shifted_after(head: ImageInputs | None, suffix: ImageInputs, offset: int) -> ImageInputs | None:
    """The image inputs of a head's sequence continued by a suffix at ``offset`` (the head's length):
    the head's, then the suffix's shifted there; None where neither has an image."""
    if not suffix.count:
        return head
    moved = suffix.shifted(offset)
    if head is None or not head.count:
        return moved
    from ..trajectory.images import ImageInputs

    return ImageInputs.concat([head, moved])


def clashes(episode: Any, recorded: Mapping[int, ImageInputs], prompt: Sequence[int], images: ImageInputs) -> set[int]:
    """The sequences whose IDs ``prompt`` extends but whose recorded images differ from ``images`` (an
    image of the same size with other pixels: placeholder IDs do not depend on pixels). A sequence has
    one set of model inputs, so a call with this prompt must not continue them (it branches)."""
    from ..rollout.images import same_images

    out: set[int] = set()
    for index, theirs in recorded.items():
        ids = episode.sequence(index).ids
        if len(ids) <= len(prompt) and list(prompt[: len(ids)]) == ids.tolist():
            if same_images(theirs, images, len(ids)) is not None:
                out.add(index)
    return out
