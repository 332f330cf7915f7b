"""Token counts of a request without a call: Anthropic's ``count_tokens`` and Gemini's ``countTokens``.

A count is the length of the prompt a call of the same request would start from a fresh session: the
request's instructions placed as a call's would be (:func:`~tmpl.gateway.roles.place_roles`), rendered
with the generation prompt, and, on a :class:`tmpl.vision.VisionTemplate`, each image expanded by the
processor (its placeholder run as long as the model sees it). A text template refuses an image with the
same 400 a call gets. No session is touched and nothing is recorded.

>>> prompt_tokens(gateway, None, [{"role": "user", "content": "Hi"}], None, param="messages")  # doctest: +SKIP
9
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import GatewayRequestError
from .roles import place_roles
from .vision import has_images, served_messages

if TYPE_CHECKING:
    from .service import Gateway

__all__ = ["prompt_tokens"]


def prompt_tokens(
    gateway: Gateway,
    session: str | None,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    *,
    param: str,
) -> int:
    """The number of tokens of the prompt ``messages`` and ``tools`` (canonical) render to on ``gateway``'s
    template; a template that cannot render them is the client's 400, naming ``param``."""
    where = session or "count"
    messages = served_messages(gateway.vision, where, messages)  # an image on a text template: the call's 400
    placed = place_roles(gateway.tpl, messages)
    try:
        if gateway.vision is not None and has_images(placed.messages):
            from ..rollout.images import render_history

            return len(render_history(gateway.vision, placed.messages, tools).full.ids)
        text = gateway.tpl.render(placed.messages, tools, add_generation_prompt=True)
    except Exception as exc:  # noqa: BLE001 - the template refuses the conversation: the client's 400
        raise GatewayRequestError(
            session, f"the template cannot render the request: {type(exc).__name__}: {exc}", param=param
        ) from exc
    return len(gateway.tpl.codec.encode(text))
