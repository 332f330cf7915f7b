"""An MCP server of tmpl's tests, written with the SDK (``MCPServer``, FastMCP in mcp 1.x), for
tests/test_tools_mcp.py: a tool for each thing a server can do to a client.

Run over stdio (``python tests/mcp_server.py``) or streamable HTTP on 127.0.0.1
(``python tests/mcp_server.py http PORT``, uvicorn, as ``MCPServer.run("streamable-http")`` serves it).

- ``add(a, b)``: an int (structured content ``{"result": a + b}`` and its text);
- ``weather(city)``: the fixture model's weather answer, ``Sunny in <city>, 21 C.``;
- ``whoami()``: this process's id and how many calls it has answered (one session, one process);
- ``chart(width, height)``: a caption and a PNG image of that size, red;
- ``fail(reason)``: an ``isError`` result with the reason;
- ``crash()``: the process exits (code 3) in the middle of the call;
- ``hang()``: blocks the server's event loop for an hour (it answers nothing more);
- ``stall()``: waits an hour without blocking (the server answers other calls meanwhile);
- ``nap(seconds)``: answers after ``seconds``.
"""

from __future__ import annotations

import asyncio
import io
import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image

server = MCPServer("tmpl-test-server")
ANSWERED = [0]


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def weather(city: str) -> str:
    """Current weather in a city (what the fixture model's get_weather was trained on)."""
    return f"Sunny in {city}, 21 C."


@server.tool()
def whoami() -> str:
    """This server's process id and the calls it has answered, this one included."""
    ANSWERED[0] += 1
    return f"pid {os.getpid()} call {ANSWERED[0]}"


@server.tool()
def chart(width: int, height: int) -> list:
    """A red chart image of the given size, with a caption."""
    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.new("RGB", (width, height), (220, 20, 20)).save(buf, "PNG")
    return [f"chart {width}x{height}:", Image(data=buf.getvalue(), format="png")]


@server.tool()
def fail(reason: str) -> str:
    """Fail with the reason given."""
    raise ToolError(f"cannot do that: {reason}")


@server.tool()
def crash() -> str:
    """Exit in the middle of the call."""
    os._exit(3)


@server.tool()
async def hang() -> str:
    """Block the server's event loop (a tool stuck in C, or in a sync call made by mistake in async code)."""
    time.sleep(3600)
    return "never"


@server.tool()
async def stall() -> str:
    """Wait an hour without blocking anything."""
    await asyncio.sleep(3600)
    return "never"


@server.tool()
async def nap(seconds: float) -> str:
    """Answer after some seconds."""
    await asyncio.sleep(seconds)
    return f"slept {seconds:g} s"


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
