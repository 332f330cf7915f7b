"""Errors of a tool, a tool-call parser or the Toolbox (:class:`ToolError`): schemas, parsers, isolation, the
sandbox, MCP servers, tools files."""

from __future__ import annotations

from .base import TmplError
from .template import TemplateError


class ToolError(TmplError):
    """A tool, a tool-call parser or the Toolbox cannot do what was asked.

    ``tool`` names the tool or parser at fault when there is one (else None), ``reason`` says why.
    Errors a tool raises while it runs are not ToolErrors: the Toolbox turns them into tool results.

    >>> raise ToolError("no parser for this format", tool="hermes")
    Traceback (most recent call last):
    ...
    tmpl.errors.ToolError: no parser for this format
    """

    def __init__(self, reason: str = "", *, tool: str | None = None) -> None:
        self.tool = tool
        self.reason = reason
        super().__init__(reason)


class ToolSchemaError(ToolError, ValueError):
    """A tool given to tmpl has no usable JSON schema; ``tool`` names it."""

    def __init__(self, tool: str, reason: str) -> None:
        self.tool = tool
        self.reason = reason
        TmplError.__init__(self, f"tool {tool!r}: {reason}")


class UnknownParserError(ToolError, ValueError):
    """A tool-call parser was asked for by a name that does not exist; ``tool`` is that name."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.tool = name
        self.known = known
        self.reason = "unknown tool-call parser"
        TmplError.__init__(self, f"unknown tool-call parser {name!r}; known parsers: {', '.join(known)}")


class NoToolParserError(TemplateError, ToolError):
    """No tool-call parser was recognised for a template; force one with ``parser=<name>``.

    Both a TemplateError (``template`` names it) and a ToolError (``tool`` is None).
    """

    def __init__(self, template: str, reason: str) -> None:
        self.template = template
        self.tool = None
        self.reason = reason
        TmplError.__init__(self, f"chat template {template!r}: {reason}")


class ToolboxError(ToolError, ValueError):
    """The Toolbox was used wrongly (a bad option, a duplicate tool name, a malformed batch)."""

    def __init__(self, reason: str = "", *, tool: str | None = None) -> None:
        ToolError.__init__(self, reason, tool=tool)


class ToolIsolationError(ToolboxError):
    """A tool cannot run in a worker process (``Toolbox(isolation="process")``); ``tool`` names it.

    Workers start clean (not forked from the caller), so each tool reaches them by pickle: a
    function or class defined at module level (pickled by its importable name), or built there
    by the ``worker_tools`` factory. A lambda, a nested function or a closure cannot be sent.

    >>> raise ToolIsolationError("lambda", "a lambda cannot be pickled")
    Traceback (most recent call last):
    ...
    tmpl.errors.ToolIsolationError: tool 'lambda' cannot run in a worker process: a lambda cannot be pickled
    """

    def __init__(self, tool: str, reason: str) -> None:
        ToolError.__init__(self, f"tool {tool!r} cannot run in a worker process: {reason}", tool=tool)
        self.reason = reason


class SandboxError(ToolboxError):
    """``Toolbox(isolation="sandbox")`` cannot sandbox its workers: bubblewrap is missing, or an
    option of :class:`tmpl.tools.sandbox.Sandbox` is wrong. (A sandbox that fails to start a
    worker is a :class:`ToolIsolationError` naming the tools, with bwrap's reason.)

    >>> raise SandboxError("bubblewrap ('bwrap') is not installed")
    Traceback (most recent call last):
    ...
    tmpl.errors.SandboxError: isolation='sandbox': bubblewrap ('bwrap') is not installed
    """

    def __init__(self, reason: str) -> None:
        ToolError.__init__(self, f"isolation='sandbox': {reason}")
        self.reason = reason


class MCPServerError(ToolboxError):
    """An MCP server cannot give a Toolbox its tools (``Toolbox.from_mcp``): it did not start or answer,
    two servers list a tool of the same name, or an adapter names a tool no server has. ``server``
    names the server (its command or URL when it has no name), ``tool`` the tool at fault, if one.

    Calls of a server that crashes or hangs later are not errors: they are answered as tool messages.

    >>> raise MCPServerError("time", "did not start within 30 s")
    Traceback (most recent call last):
    ...
    tmpl.errors.MCPServerError: MCP server 'time': did not start within 30 s
    """

    def __init__(self, server: str, reason: str, *, tool: str | None = None) -> None:
        ToolError.__init__(self, f"MCP server {server!r}: {reason}", tool=tool)
        self.server = server
        self.reason = reason


class ToolsFileError(ToolError, ValueError):
    """A file of tool schemas (``tmpl replay --tools``) does not exist or is not a JSON list; ``path`` names it.

    >>> raise ToolsFileError("tools.json", "holds a JSON dict; expected a JSON file with a list of tool schemas")
    Traceback (most recent call last):
    ...
    tmpl.errors.ToolsFileError: tools.json: holds a JSON dict; expected a JSON file with a list of tool schemas
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        ToolError.__init__(self, f"{path}: {reason}")
        self.reason = reason
