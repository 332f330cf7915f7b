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


class ToolSchemaError(TmplError, ValueError):
    """A tool given to tmpl has no usable JSON schema; ``tool`` names it."""

    def __init__(self, tool: str, reason: str) -> None:
        self.tool = tool
        self.reason = reason
        super().__init__(f"tool {tool!r}: {reason}")


class UnknownParserError(TmplError, ValueError):
    """A tool-call parser was asked for by a name that does not exist."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        super().__init__(f"unknown tool-call parser {name!r}; known parsers: {', '.join(known)}")


class NoToolParserError(TemplateError):
    """No tool-call parser was recognised for a template; force one with ``parser=<name>``."""


class ToolboxError(TmplError, ValueError):
    """The Toolbox was used wrongly (a bad option, a duplicate tool name, a malformed batch)."""
