"""An MCP ``CallToolResult`` as a :class:`~tmpl.tools.reply.ToolReply`: the tool message a model reads.

- text blocks: their text, one block per line;
- ``structuredContent``: the raw value kept as the call's ``output``; shown as compact JSON when the
  result has no text (a server SHOULD also send it as text, and most do), or always with
  ``structured=True``;
- images: decoded (PIL) into content parts ``{"type": "image", "image": ...}`` beside the text parts,
  in the server's order, for a :class:`tmpl.vision.VisionTemplate` rollout (``CallOutcome.output``
  holds the parts: :mod:`tmpl.rollout.images` reads them there); a text template reads a line
  ``[image: image/png, 64x48]`` instead;
- audio, embedded resources and resource links: a line saying what they are (a resource's text
  is shown);
- ``isError``: a failure of kind ``exception`` whose content is ``Error: <tool> failed: <text>``.

>>> from types import SimpleNamespace as NS
>>> ok = NS(content=[NS(type="text", text="3")], structured_content={"result": 3}, is_error=False)
>>> reply = reply_of(ok, "add")
>>> reply.content, reply.value, reply.failure
('3', {'result': 3}, None)
>>> bad = NS(content=[NS(type="text", text="Invalid timezone 'Mars'")], structured_content=None, is_error=True)
>>> reply_of(bad, "get_time").content
"Error: get_time failed: Invalid timezone 'Mars'"
"""

from __future__ import annotations

import base64
import binascii
import io
import json
from typing import Any

from .reply import ToolReply


def reply_of(result: Any, name: str, *, structured: bool = False) -> ToolReply:
    """The tool message of ``result`` (an MCP ``CallToolResult``) for the tool the model called ``name``."""
    shown: list[tuple[bool, dict[str, Any]]] = []  # (a text block?, its content part), in the server's order
    for block in result.content or ():
        kind = getattr(block, "type", None)
        if kind == "text":
            shown.append((True, {"type": "text", "text": block.text}))
        elif kind == "image":
            image, note = _image(block)
            part = (
                {"type": "image", "image": image, "note": note} if image is not None else {"type": "text", "text": note}
            )
            shown.append((False, part))
        else:
            shown.append((False, {"type": "text", "text": _other(block)}))
    value = result.structured_content
    if value is not None and (structured or not any(is_text for is_text, _ in shown)):
        as_json = json.dumps(value, ensure_ascii=False)
        shown = [(True, {"type": "text", "text": as_json})] + [s for s in shown if not (structured and s[0])]
    parts = [part for _, part in shown]
    text = "\n".join(p["text"] if p["type"] == "text" else p.pop("note") for p in parts)
    if result.is_error:
        return ToolReply(f"Error: {name} failed: {text or 'the server gave no reason'}", failure="exception")
    has_images = any(p["type"] == "image" for p in parts)
    return ToolReply(text, parts if has_images else None, text if value is None else value)


def _image(block: Any) -> tuple[Any, str]:
    """The block's image (PIL) and the line a text template shows for it; (None, why) when unreadable."""
    mime = getattr(block, "mime_type", None) or "image"
    try:
        data = base64.b64decode(block.data, validate=True)
    except (binascii.Error, ValueError, TypeError):
        return None, f"[image: {mime}, not valid base64]"
    from ..vision.parts import pil_image_module

    try:
        image = pil_image_module().open(io.BytesIO(data))
        image.load()
    except Exception as exc:  # noqa: BLE001 - Pillow raises several kinds for bytes that are no image
        return None, f"[image: {mime}, {len(data)} bytes that do not read as an image ({type(exc).__name__})]"
    return image, f"[image: {mime}, {image.size[0]}x{image.size[1]}]"


def _other(block: Any) -> str:
    """A line for a block that is neither text nor an image."""
    kind = getattr(block, "type", None)
    if kind == "audio":
        return f"[audio: {getattr(block, 'mime_type', None) or 'audio'}, not shown]"
    if kind == "resource":
        res = block.resource
        text = getattr(res, "text", None)
        if isinstance(text, str):
            return f"[resource {res.uri}]\n{text}"
        return f"[resource {res.uri}: {getattr(res, 'mime_type', None) or 'binary'}, not shown]"
    if kind == "resource_link":
        return f"[resource link {block.uri}: {getattr(block, 'name', '')}]"
    return f"[{kind or type(block).__name__} content, not shown]"
