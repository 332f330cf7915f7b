"""Errors of a message in a conversation (:class:`MessageError`): missing content, an unknown role, tool messages
that do not match the calls, image inputs."""

from __future__ import annotations

from .base import TmplError


class MessageError(TmplError, ValueError):
    """A message is malformed; ``index`` is its position in the list given."""

    def __init__(self, index: int, reason: str, *, where: str = "messages") -> None:
        self.index = index
        self.reason = reason
        super().__init__(f"{where}[{index}]: {reason}")


class MissingContentError(MessageError):
    """A message that needs ``content`` has none."""


class UnknownRoleError(MessageError):
    """A message's ``role`` is not one tmpl knows."""


class ToolMessageCountError(MessageError):
    """The number of tool messages does not match the number of tool calls they answer."""


class ImageInputError(MessageError):
    """An image content part cannot be read; ``part`` names it (e.g. ``"tool_messages[0].content[1]"``).

    >>> raise ImageInputError(0, "tool_messages[0].content[1]", "no such file 'shot.png'", where="tool_messages")
    Traceback (most recent call last):
    ...
    tmpl.errors.ImageInputError: tool_messages[0]: content part tool_messages[0].content[1]: no such file 'shot.png'
    """

    def __init__(self, index: int, part: str, reason: str, *, where: str = "messages") -> None:
        super().__init__(index, f"content part {part}: {reason}", where=where)
        self.part = part
        self.reason = reason
