"""An asyncio event loop running forever on a daemon thread of its own, for code called from any thread
or loop: the Toolbox's calls, the MCP sessions (which must close in the task and loop that opened them).

>>> loop = start_loop_thread("tmpl-example")
>>> import asyncio
>>> async def answer(): return 42
>>> asyncio.run_coroutine_threadsafe(answer(), loop).result(timeout=5)
42
>>> _ = loop.call_soon_threadsafe(loop.stop)
"""

from __future__ import annotations

import asyncio
import threading

__all__ = ["start_loop_thread"]


def start_loop_thread(name: str, *, close: bool = True) -> asyncio.AbstractEventLoop:
    """A new event loop, running on a daemon thread named ``name`` once this returns; stop it with
    ``loop.call_soon_threadsafe(loop.stop)``. ``close``: close the loop once it stops (False leaves what
    it held, e.g. calls still running, to be collected with it)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        loop.run_forever()
        if close:
            loop.close()

    threading.Thread(target=serve, name=name, daemon=True).start()
    ready.wait()
    return loop
