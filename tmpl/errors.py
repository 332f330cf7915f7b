"""Typed errors of tmpl. Each one says what went wrong and where.

All derive from :class:`TmplError`; errors about user input also derive from
``ValueError`` so that ``except ValueError`` keeps working.
"""

from __future__ import annotations


class TmplError(Exception):
    """Base class of every error raised by tmpl."""


class TemplateError(TmplError):
    """A chat template misbehaved; ``template`` names it."""

    def __init__(self, template: str, reason: str) -> None:
        self.template = template
        self.reason = reason
        super().__init__(f"chat template {template!r}: {reason}")


class UnsupportedTemplateError(TemplateError):
    """The template cannot render what the operation needs (e.g. a tool conversation).

    >>> raise UnsupportedTemplateError("gemma-2-it", "a 'tool' message raises in the template")
    Traceback (most recent call last):
    ...
    tmpl.errors.UnsupportedTemplateError: chat template 'gemma-2-it': a 'tool' message raises in the template
    """


class HistoryRequiredError(TemplateError):
    """The template's suffix depends on earlier messages; pass ``history=`` to get it exactly."""


class TemplateRenderError(TemplateError):
    """Rendering raised inside the template (a ``raise_exception`` call, a Jinja error)."""


class SpliceError(TemplateError):
    """Token IDs cannot be spliced exactly at a boundary: the tokenizer merges across it.

    ``boundary`` says which boundary (e.g. ``"after the turn close '<|im_end|>'"``).
    """

    def __init__(self, template: str, boundary: str, detail: str = "") -> None:
        self.boundary = boundary
        reason = f"token IDs are not splice-safe {boundary}"
        if detail:
            reason += f" ({detail})"
        super().__init__(template, reason)


class UnknownTemplateError(TmplError, LookupError):
    """No shipped template has this name; ``available`` lists the names that exist.

    >>> raise UnknownTemplateError("qwen4", ["qwen2.5", "qwen3"])
    Traceback (most recent call last):
    ...
    tmpl.errors.UnknownTemplateError: no shipped template named 'qwen4'; available: qwen2.5, qwen3
    """

    def __init__(self, name: str, available: list[str]) -> None:
        self.name = name
        self.available = list(available)
        super().__init__(f"no shipped template named {name!r}; available: {', '.join(self.available) or '(none)'}")


class TemplateMetadataError(TmplError):
    """A shipped template's ``.json`` metadata is missing or malformed; ``path`` names the file."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


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
