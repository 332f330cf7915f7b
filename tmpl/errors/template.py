"""Errors of a chat template (:class:`TemplateError`): its render, a splice, a lookup, its metadata, a fix, a budget,
where it comes from, its image placeholders."""

from __future__ import annotations

from typing import Any

from .base import TmplError


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


class HistorySpliceError(TemplateError):
    """A rendered history could not be rebuilt exactly from sampled IDs and encoded text
    (``Rollout(history="template")``): the spliced IDs do not decode to the template's render.
    ``sample`` and ``turn`` name where (``template`` names the template).

    >>> raise HistorySpliceError("qwen3", "0/1", 2, "the spliced IDs decode to 812 characters, the render has 814")
    Traceback (most recent call last):
    ...
    tmpl.errors.HistorySpliceError: chat template 'qwen3': sample 0/1, turn 2: the spliced IDs decode to 812 characters, the render has 814
    """

    def __init__(self, template: str, sample: object, turn: int, detail: str) -> None:
        self.sample = sample
        self.turn = turn
        self.detail = detail
        super().__init__(template, f"sample {sample}, turn {turn}: {detail}")


class UnknownTemplateError(TemplateError, LookupError):
    """No shipped template has this name; ``available`` lists the names that exist.

    >>> raise UnknownTemplateError("qwen4", ["qwen2.5", "qwen3"])
    Traceback (most recent call last):
    ...
    tmpl.errors.UnknownTemplateError: no shipped template named 'qwen4'; available: qwen2.5, qwen3
    """

    def __init__(self, name: str, available: list[str]) -> None:
        self.name = name
        self.template = name
        self.available = list(available)
        self.reason = "no shipped template with this name"
        TmplError.__init__(
            self, f"no shipped template named {name!r}; available: {', '.join(self.available) or '(none)'}"
        )


class TemplateMetadataError(TemplateError):
    """A shipped template's ``.json`` metadata is missing or malformed; ``path`` names the file
    (it is also the ``template`` attribute)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.template = path
        self.reason = reason
        TmplError.__init__(self, f"{path}: {reason}")


class TemplateFixError(TemplateError):
    """:func:`tmpl.report.make_training_safe` could not prove a training-safe rewrite of a template.

    ``reason`` says what could not be proven; ``attempted`` lists the rewrites tried (one line each),
    ``source`` is the rewritten template the proof failed on (None when no rewrite was tried) and
    ``counterexample`` the conversation that breaks it (the search's, JSON-able; None when there is
    none: an unsupported template, a close that is not a token).

    >>> raise TemplateFixError("GLM-4.6.jinja", "the turn close is not a single token of this tokenizer")
    Traceback (most recent call last):
    ...
    tmpl.errors.TemplateFixError: chat template 'GLM-4.6.jinja': cannot make it training-safe: the turn close is not a single token of this tokenizer
    """

    def __init__(self, template: str, reason: str, attempted: tuple[str, ...] = ()) -> None:
        self.attempted = attempted
        self.source: str | None = None
        self.counterexample: dict[str, Any] | None = None
        super().__init__(template, f"cannot make it training-safe: {reason}")
        self.reason = reason


class TemplateEditError(TemplateError):
    """A template's source cannot be edited where the fixer needs to (an expression tmpl cannot print,
    a lexer token not found). :func:`tmpl.report.make_training_safe` turns it into a refusal."""


class BudgetExceededError(TemplateError):
    """Checking a template ran out of its budget (:class:`tmpl.report.budget.Budget`): ``budget`` names
    which (``"seconds"``, ``"memory_mb"`` or ``"output_chars"``), ``limit`` says it in words and
    ``detail`` what hit it. Reports turn it into the verdict ``UNPROVEN (budget exceeded: ...)``.

    >>> raise BudgetExceededError("loops.jinja", "seconds", "3 s of wall time", "the check did not finish in time")
    Traceback (most recent call last):
    ...
    tmpl.errors.BudgetExceededError: chat template 'loops.jinja': budget exceeded: 3 s of wall time (seconds): the check did not finish in time
    """

    def __init__(self, template: str, budget: str, limit: str, detail: str = "") -> None:
        self.budget = budget
        self.limit = limit
        self.detail = detail
        super().__init__(template, f"budget exceeded: {limit} ({budget})" + (f": {detail}" if detail else ""))


class TemplateSourceError(TemplateError, ValueError):
    """Where a template, or the tokenizer it renders with, should come from cannot be used: ``source`` is the
    argument as given (a path, a hub id; it is also the ``template`` attribute), ``reason`` says what is wrong
    there and what was expected.

    >>> raise TemplateSourceError("qwen9", "is neither Jinja template text nor an existing file")
    Traceback (most recent call last):
    ...
    tmpl.errors.TemplateSourceError: qwen9: is neither Jinja template text nor an existing file
    """

    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.template = source
        self.reason = reason
        TmplError.__init__(self, f"{source}: {reason}")


class SourceNotFoundError(TemplateSourceError, FileNotFoundError):
    """A path given as a template file or a tokenizer folder does not exist (and is not a hub id).

    >>> raise SourceNotFoundError("/no/such.jinja", "does not exist; expected a chat template file")
    Traceback (most recent call last):
    ...
    tmpl.errors.SourceNotFoundError: /no/such.jinja: does not exist; expected a chat template file
    """


class NotATemplateError(TemplateSourceError):
    """A path exists but holds no chat template: a binary or non-UTF-8 file, text without Jinja syntax,
    JSON that is not a tokenizer config, a folder without tokenizer files.

    >>> raise NotATemplateError("/etc/hostname", "has no Jinja syntax; expected a chat template file")
    Traceback (most recent call last):
    ...
    tmpl.errors.NotATemplateError: /etc/hostname: has no Jinja syntax; expected a chat template file
    """


class HubUnreachableError(TemplateSourceError, ConnectionError):
    """A hub id was given, it is not in the local hub cache, and the hub did not answer in time (or
    ``HF_HUB_OFFLINE=1`` forbids asking). ``timeout`` is the seconds waited per try (None when offline).

    >>> raise HubUnreachableError("org/model", "the hub did not answer", timeout=5.0)
    Traceback (most recent call last):
    ...
    tmpl.errors.HubUnreachableError: org/model: the hub did not answer
    """

    def __init__(self, source: str, reason: str, *, timeout: float | None = None) -> None:
        self.timeout = timeout
        super().__init__(source, reason)


class ImagePlaceholderError(TemplateError):
    """The images of some messages did not become one placeholder run each in the processor's
    output (e.g. a template that drops images in tool results); ``parts`` names the images.

    >>> raise ImagePlaceholderError("gemma-4", ("tool_messages[0].content[0]",), "1 image, 0 placeholders")
    Traceback (most recent call last):
    ...
    tmpl.errors.ImagePlaceholderError: chat template 'gemma-4': images tool_messages[0].content[0]: 1 image, 0 placeholders
    """

    def __init__(self, template: str, parts: tuple[str, ...], reason: str) -> None:
        super().__init__(template, f"images {', '.join(parts) or '(none)'}: {reason}")
        self.parts = parts
