"""A tool as the Toolbox holds it (:class:`_Tool`: its function, schema and limits), and each way one of its calls
ends as a :class:`~tmpl.tools.metrics.CallOutcome`: answered, raised, timed out, refused, answered by a worker."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..toolcalls.types import ToolCall
from .metrics import CallOutcome
from .outputs import cut_chars
from .procpool import Answer
from .procworker import content_of
from .reply import ToolReply


@dataclass(frozen=True)
class _Tool:
    name: str
    fn: Any
    schema: dict[str, Any]
    is_async: bool
    signature: inspect.Signature | None
    timeout: float
    #: (names keyword arguments may take, names that must be given) when the signature is that
    #: simple (no positional-only, *args or **kwargs): arguments are checked without ``bind``
    keywords: tuple[frozenset[str], frozenset[str]] | None = None

    def check(self, args: Mapping[str, Any]) -> None:
        """Raise TypeError when ``args`` do not fit the signature (as ``signature.bind`` would)."""
        if self.keywords is not None:
            allowed, required = self.keywords
            names = args.keys()
            if names <= allowed and required <= names:
                return
        if self.signature is not None:
            self.signature.bind(**args)


def _short(text: str, n: int = 300) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _keywords(sig: inspect.Signature | None) -> tuple[frozenset[str], frozenset[str]] | None:
    """Names a call may pass by keyword and the ones it must, when only those rules apply."""
    if sig is None:
        return None
    allowed, required = set(), set()
    for p in sig.parameters.values():
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            return None
        allowed.add(p.name)
        if p.default is p.empty:
            required.add(p.name)
    return frozenset(allowed), frozenset(required)


def _timed_out(call: ToolCall, tool: _Tool) -> CallOutcome:
    return CallOutcome(
        call.id, call.name, "timeout", f"Error: {call.name} timed out after {tool.timeout:g} s", tool.timeout
    )


def _raised(call: ToolCall, exc: BaseException, latency: float | None) -> CallOutcome:
    """The outcome of a call that raised: the exception in words (its traceback is dropped: the
    frames it holds, the awaiting task's among them, would keep a reference cycle alive)."""
    text = _short(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    exc.__traceback__ = None
    return CallOutcome(call.id, call.name, "exception", f"Error: {call.name} raised {text}", latency)


def _ok(call: ToolCall, value: Any, latency: float | None, max_chars: int | None) -> CallOutcome:
    """The outcome of a call that returned ``value``: its content, cut to ``max_chars`` with a marker."""
    if type(value) is ToolReply:  # a tool that says more than a value (an MCP server's result)
        return value.outcome(call.id, call.name, latency, max_chars)
    content = content_of(value)
    if max_chars is None or len(content) <= max_chars:
        return CallOutcome(call.id, call.name, None, content, latency, value)
    return CallOutcome(call.id, call.name, None, cut_chars(content, max_chars), latency, value, chars=len(content))


def _refused(call: ToolCall, max_hung: int) -> CallOutcome:
    return CallOutcome(
        call.id,
        call.name,
        "refused",
        f"Error: {call.name} was not run: {max_hung} earlier calls of it still hang past their timeout",
        None,
    )


def _from_worker(call: ToolCall, tool: _Tool, answer: Answer) -> CallOutcome:
    """A worker process's answer as the call's outcome."""
    if answer.kind == "ok":
        if answer.chars > len(answer.content):
            content = cut_chars(answer.content, len(answer.content), answer.chars)
            return CallOutcome(call.id, call.name, None, content, answer.latency, None, chars=answer.chars)
        return CallOutcome(call.id, call.name, None, answer.content, answer.latency, answer.value)
    if answer.kind == "timeout":
        return _timed_out(call, tool)
    if answer.kind == "raised":
        return CallOutcome(
            call.id, call.name, "exception", f"Error: {call.name} raised {_short(answer.content)}", answer.latency
        )
    return CallOutcome(call.id, call.name, "crashed", f"Error: {call.name} crashed: {answer.content}", answer.latency)
