"""Hostile tools for tests/test_tool_isolation.py: module-level, stdlib only, so a worker process
imports them quickly (no tests here)."""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time


def get_weather(city: str) -> str:
    """Current weather.

    Args:
        city: The city.
    """
    return f"{city}: 21 C, sunny"


def hang(city: str) -> str:
    """A sync tool that never returns.

    Args:
        city: The city.
    """
    time.sleep(3600)
    return "late"


async def hang_async(city: str) -> str:
    """An async tool that never returns.

    Args:
        city: The city.
    """
    await asyncio.sleep(3600)
    return "late"


def exits(city: str) -> str:
    """Ends its process.

    Args:
        city: The city.
    """
    os._exit(3)


def segfaults(city: str) -> str:
    """Crashes in C.

    Args:
        city: The city.
    """
    return str(ctypes.string_at(0))


def allocates(city: str) -> str:
    """Asks for 4 GB.

    Args:
        city: The city.
    """
    return str(len(bytearray(4 * 2**30)))


def floods(city: str) -> str:
    """Returns 50 MB of text.

    Args:
        city: The city.
    """
    return "sunny and warm, " * (50 * 2**20 // 16)


def chatty(city: str) -> str:
    """Writes to stdout, returns a short result.

    Args:
        city: The city.
    """
    for _ in range(3):
        print("CHATTER " * 10)
    sys.stdout.flush()
    return f"{city}: said it all"


HOSTILE = [hang, hang_async, exits, segfaults, allocates, floods, chatty]
ALL = [get_weather, *HOSTILE]


def make_tools() -> list:
    """A worker_tools factory: the same tools, built in the worker."""
    return list(ALL)


def spins(city: str) -> str:
    """Burns CPU forever.

    Args:
        city: The city.
    """
    while True:
        pass
