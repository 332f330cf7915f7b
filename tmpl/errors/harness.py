"""Errors of an agent harness run (:class:`HarnessError`): its spec, its task, its verifier."""

from __future__ import annotations

from .base import TmplError


class HarnessError(TmplError):
    """An agent harness (:mod:`tmpl.harness`): its spec, its run, its verifier. ``harness`` names it.

    >>> raise HarnessError("claude-code", "the executable 'claude' is not on PATH")
    Traceback (most recent call last):
    ...
    tmpl.errors.HarnessError: harness 'claude-code': the executable 'claude' is not on PATH
    """

    def __init__(self, harness: str, reason: str) -> None:
        self.harness = harness
        self.reason = reason
        super().__init__(f"harness {harness!r}: {reason}")


class HarnessSpecError(HarnessError, ValueError):
    """A :class:`tmpl.harness.Harness` that cannot run: an unknown dialect or placeholder, an empty argv.

    >>> HarnessSpecError("x", "argv must be a non-empty sequence of strings").harness
    'x'
    """


class HarnessTaskError(HarnessError, ValueError):
    """A :class:`tmpl.harness.HarnessTask` that cannot be laid out: its files directory missing, a path
    leaving the working directory, a content that is not text or bytes. ``task`` names it.

    >>> raise HarnessTaskError("bug-1", "files: '/data/bug-1' is not a directory")
    Traceback (most recent call last):
    ...
    tmpl.errors.HarnessTaskError: task 'bug-1': files: '/data/bug-1' is not a directory
    """

    def __init__(self, task: str, reason: str) -> None:
        self.harness = ""
        self.task = task
        self.reason = reason
        TmplError.__init__(self, f"task {task!r}: {reason}")


class HarnessVerifierError(HarnessError):
    """A verifier that gave no reward: it hung past its timeout, crashed, or returned something that is
    not a finite number. ``verifier`` names it (its argv or function).

    >>> raise HarnessVerifierError("pytest -q", "did not finish within 60 s (its process tree was killed)")
    Traceback (most recent call last):
    ...
    tmpl.errors.HarnessVerifierError: verifier 'pytest -q': did not finish within 60 s (its process tree was killed)
    """

    def __init__(self, verifier: str, reason: str) -> None:
        self.harness = ""
        self.verifier = verifier
        self.reason = reason
        TmplError.__init__(self, f"verifier {verifier!r}: {reason}")
