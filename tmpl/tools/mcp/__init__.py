"""Tools of MCP servers in a Toolbox: ``Toolbox.from_mcp(...)`` on the ``mcp`` SDK.

    box = tmpl.Toolbox.from_mcp(
        "python -m mcp_server_time --local-timezone UTC",      # stdio: a command line (str or list)
        "http://127.0.0.1:8000/mcp",                           # streamable HTTP: a URL
        tools=[Adapter("get_current_time", schema=get_time, arguments=lambda a: {"timezone": ZONES[a["city"]]})],
        timeout=10.0,
    )
    rollout = tmpl.Rollout(tpl, backend, tools=box)
    box.close()                                                 # the servers' sessions (and processes) end

Each server gets **one long-lived session** (a stdio server: one process), opened when the Toolbox is
built and shared by every call; ``list_tools`` gives the schemas the model sees. The sessions live on one
thread of their own with its event loop (``tmpl-mcp``): the SDK's sessions are bound to the loop and task
that opened them, and the Toolbox calls from its own loop or the caller's; a call crosses with
``run_coroutine_threadsafe``, and its cancellation (the Toolbox's timeout) crosses back.

What a call can become (all tool messages; the failure kinds are the Toolbox's, counted the same way):

- a result: text, structured content, images (content parts for a vision template), see
  :mod:`.mcp_results`; ``isError``: kind ``exception``, ``Error: <tool> failed: <the server's text>``;
- a protocol error (unknown tool, bad parameters): kind ``exception``, the server's message;
- the server exits or drops the connection during the call: kind ``crashed``, ``Error: <tool> crashed:
  the MCP server '<name>' closed the connection during the call; it was restarted``. A stdio server is
  started again at once (a new process; the old one is stopped as the SDK stops it), an HTTP one gets a new
  session;
- the call passes its timeout: the Toolbox's own ``timeout`` message; the call is cancelled, and the server
  is asked for its tool list (``probe_timeout``): a server that does not answer (its loop is stuck) is
  restarted as for a crash, one that answers (only that call hung) is kept;
- the server cannot be started or reached: kind ``crashed``, ``Error: <tool> could not run: ...``; a start
  is tried again at the next call, at most every ``retry_after`` seconds.

Calls of other servers, and other calls of the same server while it answers, go on meanwhile.

**Renaming and reshaping** (:class:`Adapter`): the model may have been trained on tools of another name
and argument shape (the test fixture calls ``get_time(city)``; ``mcp-server-time`` has
``get_current_time(timezone)``). An adapter shows a server's tool under the schema given (a callable's type
hints and docstring, as for any tool, or a schema dict) and maps the model's arguments to the server's with
a function. The mapping is plain Python because it is domain knowledge the server does not have (which
zone a city is in); the result is the server's, untouched.

>>> Server.of("python -m mcp_server_time --local-timezone UTC").label
'mcp_server_time'
>>> Server.of("http://127.0.0.1:8000/mcp").label
'127.0.0.1:8000/mcp'

Its modules: :mod:`.servers` (servers and adapters), :mod:`.link` (one server's session), :mod:`.toolset` (the
Toolbox's side); results are read by :mod:`tmpl.tools.mcp_results`.
"""

from __future__ import annotations

from .servers import OPTIONS, Adapter, Server, sdk, split_options
from .toolset import MCPToolset

__all__ = ["OPTIONS", "Adapter", "MCPToolset", "Server", "sdk", "split_options"]
