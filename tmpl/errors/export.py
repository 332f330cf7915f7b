"""Errors of a rollout file or record (:class:`ExportError`): ATIF documents, the viewer's input."""

from __future__ import annotations

from .base import TmplError


class ExportError(TmplError, ValueError):
    """A rollout file or record cannot be written or read back; ``where`` names the file and line or row.

    >>> raise ExportError("rollouts.jsonl:3", "missing field 'mask'")
    Traceback (most recent call last):
    ...
    tmpl.errors.ExportError: rollouts.jsonl:3: missing field 'mask'
    """

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        self.reason = reason
        super().__init__(f"{where}: {reason}")


class AtifError(ExportError):
    """An ATIF trajectory (the Agent Trajectory Interchange Format) tmpl cannot read or write: ``where``
    names the file (and line or document), ``step`` the step at fault (its ``step_id``, or ``"name/step 3"``
    inside an embedded trajectory) and ``field`` the field (``"metrics.logprobs"``) where known.

    >>> raise AtifError("run.json", "steps[1] (step 2): metrics.logprobs has 3 entries but metrics.completion_token_ids has 4")
    Traceback (most recent call last):
    ...
    tmpl.errors.AtifError: run.json: steps[1] (step 2): metrics.logprobs has 3 entries but metrics.completion_token_ids has 4
    """

    def __init__(self, where: str, reason: str, step: int | str | None = None, field: str | None = None) -> None:
        super().__init__(where, reason)
        self.step = step
        self.field = field


class ViewError(ExportError):
    """A file ``tmpl view`` cannot open: ``where`` names the file and line (or row), ``reason`` what is wrong.

    >>> raise ViewError("rollouts.csv:1", "text starting 'index,sample', not a JSON record")
    Traceback (most recent call last):
    ...
    tmpl.errors.ViewError: rollouts.csv:1: text starting 'index,sample', not a JSON record
    """
