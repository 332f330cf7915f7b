"""Image content parts: read them, and split messages into what the template renders and the images.

The shapes accepted are those transformers processors take in ``apply_chat_template``
(``{"type": "image", "image" | "url" | "path" | "base64": ...}``), OpenAI's
``{"type": "image_url", "image_url": {"url": ...}}``, and a bare PIL image as a part. A source is a
PIL image, a file path (or ``file://`` URL), a ``data:`` URL, raw bytes or base64 text. Remote
``http(s)`` URLs are refused: a rollout must not depend on the network to read its own inputs.

>>> from PIL import Image
>>> img = Image.new("RGB", (32, 24))
>>> render, images, parts = split_images(
...     [{"role": "tool", "content": [{"type": "text", "text": "shot:"}, {"type": "image", "image": img}]}],
...     where="tool_messages",
... )
>>> render[0]["content"], len(images), parts
([{'type': 'text', 'text': 'shot:'}, {'type': 'image'}], 1, ('tool_messages[0].content[1]',))
"""

from __future__ import annotations

import base64
import binascii
import io
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ImageInputError

#: Part types that carry an image.
IMAGE_PART_TYPES = frozenset({"image", "image_url", "input_image"})
#: Keys of an image part that may hold its source, in the order they are read.
SOURCE_KEYS = ("image", "url", "path", "base64", "image_url")


def pil_image_module() -> Any:
    """``PIL.Image``, imported lazily; a clear error names the extra to install when Pillow is missing."""
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - Pillow is in the test environment
        raise ImportError(
            f"tmpl.vision needs Pillow, which is not installed: pip install 'tmpl[vision]' ({exc})"
        ) from exc
    return Image


def is_image_part(part: object) -> bool:
    """Whether a content part carries an image (a PIL image, or a dict of an image shape)."""
    if isinstance(part, Mapping):
        return part.get("type") in IMAGE_PART_TYPES or (
            "type" not in part and any(k in part for k in ("image", "image_url"))
        )
    return is_pil_image(part)


def is_pil_image(obj: object) -> bool:
    """Whether ``obj`` is a PIL image (without importing PIL)."""
    return type(obj).__module__.startswith("PIL.") and hasattr(obj, "convert") and hasattr(obj, "size")


def load_image(source: object, *, index: int = 0, part: str = "image", where: str = "messages") -> Any:
    """A PIL image from a source: a PIL image (returned as is), a path, a ``file://`` or ``data:`` URL,
    bytes or base64 text. Errors are :class:`~tmpl.errors.ImageInputError` naming ``part``.

    >>> load_image("https://example.com/a.png", part="messages[0].content[0]")
    Traceback (most recent call last):
    ...
    tmpl.errors.ImageInputError: messages[0]: content part messages[0].content[0]: remote URL 'https://example.com/a.png': pass the image, a path or a data: URL (a rollout does not fetch from the network)
    """
    if is_pil_image(source):
        return source

    def fail(reason: str) -> ImageInputError:
        return ImageInputError(index, part, reason, where=where)

    data: bytes | None = None
    if isinstance(source, (bytes, bytearray)):
        data = bytes(source)
    elif isinstance(source, Mapping) and "url" in source:  # OpenAI's {"url": ...}
        return load_image(source["url"], index=index, part=part, where=where)
    elif isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if text.startswith(("http://", "https://")):
            raise fail(
                f"remote URL {text!r}: pass the image, a path or a data: URL (a rollout does not fetch from the network)"
            )
        if text.startswith("data:"):
            head, sep, payload = text.partition(",")
            if not sep or ";base64" not in head:
                raise fail(f"data URL {text[:40]!r}... is not base64 (expected data:image/...;base64,...)")
            data = _b64(payload, fail)
        else:
            path = text[len("file://") :] if text.startswith("file://") else text
            if os.path.isfile(path):
                with open(path, "rb") as fh:
                    data = fh.read()
            elif len(text) > 64 and "/" not in text[:8]:  # base64 text (transformers' "base64" key)
                data = _b64(text, fail)
            else:
                raise fail(f"no such file {path!r}")
    else:
        raise fail(f"an image source must be a PIL image, a path, a data: URL or bytes, not {type(source).__name__}")
    image_mod = pil_image_module()
    try:
        image = image_mod.open(io.BytesIO(data))
        image.load()
    except Exception as exc:  # PIL raises several types for undecodable data
        raise fail(f"not a readable image ({type(exc).__name__}: {exc})") from exc
    return image


def _b64(payload: str, fail: Any) -> bytes:
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise fail(f"invalid base64 ({exc})") from exc


def _source_of(part: object) -> object:
    if not isinstance(part, Mapping):
        return part
    for key in SOURCE_KEYS:
        if part.get(key) is not None:
            return part[key]
    return None


def split_images(
    messages: Sequence[Mapping[str, Any]], *, where: str = "messages", load: bool = True
) -> tuple[list[dict[str, Any]], list[Any], tuple[str, ...]]:
    """``(render_messages, images, parts)``: the messages with each image part replaced by
    ``{"type": "image"}`` (what a chat template renders a placeholder for), the images read as PIL
    images in order, and the name of each image's part (for errors and carriers).

    Messages without image parts are passed through unchanged (the same dict objects). With
    ``load=False`` the images are not read (``images`` is empty): for messages rendered as text only.
    """
    render: list[dict[str, Any]] = []
    images: list[Any] = []
    parts: list[str] = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, (str, bytes)) or not isinstance(content, Sequence):
            render.append(message)  # type: ignore[arg-type]
            continue
        new_content: list[Any] = []
        changed = False
        for j, part in enumerate(content):
            if not is_image_part(part):
                new_content.append(part)
                continue
            name = f"{where}[{i}].content[{j}]"
            source = _source_of(part)
            if source is None:
                raise ImageInputError(
                    i,
                    name,
                    "an image part with no image (expected one of: image, url, path, base64, image_url)",
                    where=where,
                )
            if load:
                images.append(load_image(source, index=i, part=name, where=where))
            parts.append(name)
            new_content.append({"type": "image"})
            changed = True
        render.append({**message, "content": new_content} if changed else message)  # type: ignore[arg-type]
    return render, images, tuple(parts)
