"""MCP servers as the Toolbox names them (:class:`Server`: a command line or a URL), tools shown under another
name and schema (:class:`Adapter`), and the ``mcp`` SDK imported on first use."""

from __future__ import annotations

import inspect
import keyword
import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import ToolboxError
from ...toolcalls.schema import tool_name, tool_schema

#: options of ``Toolbox.from_mcp`` that are the servers' (the rest are the Toolbox's)
OPTIONS = ("connect_timeout", "probe_timeout", "retry_after", "structured")


def sdk() -> Any:
    """The ``mcp`` package, imported lazily; a clear error names the extra to install when it is missing."""
    try:
        import mcp
    except ImportError as exc:
        raise ImportError(
            f"Toolbox.from_mcp needs the MCP SDK, which is not installed: pip install 'tmpl[mcp]' ({exc})"
        ) from exc
    return mcp


@dataclass(frozen=True)
class Server:
    """One MCP server: a ``command`` run over stdio, or a streamable HTTP ``url``.

    ``name`` labels it in messages and in :attr:`Adapter.server` (default: the command's module or
    script, or the URL without its scheme). ``env`` is added to the SDK's safe default environment;
    ``cwd`` is the command's working directory; ``headers`` go with every HTTP request.
    """

    command: tuple[str, ...] | None = None
    url: str | None = None
    name: str | None = None
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    headers: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ToolboxError("an MCP Server takes a command (stdio) or a url (streamable HTTP), one of the two")
        if self.command is not None and not (self.command and all(isinstance(a, str) for a in self.command)):
            raise ToolboxError(f"an MCP server's command must be a non-empty list of strings, not {self.command!r}")

    @classmethod
    def of(cls, spec: Any) -> Server:
        """A Server from what ``from_mcp`` takes: a Server, a URL (``http(s)://...``), a command line (a
        string, split as a shell would, or a list), or the SDK's ``StdioServerParameters``."""
        if isinstance(spec, Server):
            return spec
        if isinstance(spec, str):
            if spec.startswith(("http://", "https://")):
                return cls(url=spec)
            return cls(command=tuple(shlex.split(spec)))
        if isinstance(spec, (list, tuple)):
            return cls(command=tuple(spec))
        command = getattr(spec, "command", None)
        if isinstance(command, str):  # the SDK's StdioServerParameters
            cwd = getattr(spec, "cwd", None)
            return cls(command=(command, *spec.args), env=spec.env, cwd=None if cwd is None else str(cwd))
        raise ToolboxError(f"an MCP server is a URL, a command line or a tmpl.tools.mcp.Server, not {spec!r}")

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        if self.url is not None:
            return self.url.split("://", 1)[-1]
        assert self.command is not None
        args = list(self.command)
        if os.path.basename(args[0]).startswith("python"):
            if "-m" in args[:-1]:
                return args[args.index("-m") + 1]
            rest = [a for a in args[1:] if not a.startswith("-")]
            if rest:
                return os.path.basename(rest[0])
        return os.path.basename(args[0])


@dataclass(frozen=True)
class Adapter:
    """A server's ``tool`` shown to the model under another name and argument shape.

    ``schema``: what the model sees, a callable (schema from its type hints and docstring; it is never
    called) or a schema dict; default: the server's schema under ``name``. ``name``: the name the model
    calls (default: the schema's, else ``tool``). ``arguments``: the model's arguments to the server's
    (default: as they are). ``server``: which server's tool, when several have one of that name.

    >>> def get_time(city: str) -> str:
    ...     '''Current local time in a city.
    ...
    ...     Args:
    ...         city: City name
    ...     '''
    >>> a = Adapter("get_current_time", schema=get_time, arguments=lambda args: {"timezone": "UTC"})
    >>> a.shown
    'get_time'
    """

    tool: str
    schema: Any = None
    name: str | None = None
    arguments: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    server: str | None = None

    @property
    def shown(self) -> str:
        if self.schema is not None:
            return tool_name(tool_schema(self.schema))
        return self.name or self.tool


def split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``from_mcp``'s options as (the toolset's, the Toolbox's); MCP tools run in their servers'
    processes, so the Toolbox runs them on its event loop (``isolation="thread"``)."""
    ours = {k: v for k, v in options.items() if k in OPTIONS}
    theirs = {k: v for k, v in options.items() if k not in OPTIONS}
    if theirs.get("isolation", "thread") != "thread":
        raise ToolboxError(
            "Toolbox.from_mcp runs its tools in the MCP servers' own processes: isolation must be 'thread' "
            f"(a server is restarted when it crashes or hangs), not {theirs['isolation']!r}"
        )
    for name in ("worker_tools", "workers", "memory_mb", "cpu_seconds"):
        if theirs.get(name) is not None and name in theirs:
            raise ToolboxError(
                f"Toolbox.from_mcp: {name} is an option of isolation='process', which MCP tools do not use"
            )
    return ours, theirs


def _signature(params: Any) -> inspect.Signature | None:
    """Keyword-only parameters for a JSON schema's properties (required ones without a default), so the
    Toolbox answers a call with missing or unknown arguments as ``bad_arguments`` before the server sees it;
    None when the schema allows more (``additionalProperties``) or a name is not a Python identifier."""
    if not isinstance(params, Mapping):
        return None
    props = params.get("properties") or {}
    if not isinstance(props, Mapping) or params.get("additionalProperties") not in (None, False):
        return None
    required = set(params.get("required") or ())
    if any(not (isinstance(n, str) and n.isidentifier() and not keyword.iskeyword(n)) for n in props):
        return None
    kind = inspect.Parameter.KEYWORD_ONLY
    return inspect.Signature(
        [inspect.Parameter(n, kind, **({} if n in required else {"default": None})) for n in props]
    )
