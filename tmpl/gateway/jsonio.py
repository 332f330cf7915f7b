"""JSON in and out of the gateway's hot path: msgspec where installed (the ``gateway`` extra), else ``json``.

A call's body grows with the agent's history (70 kB at 40 turns and 16k tokens) and is parsed on every
call; the durable store writes a record per call. msgspec parses and writes those several times faster
than ``json`` (1.0 ms against 0.18 ms for that body), with the same values: integers past 64 bits stay
integers (orjson reads them as floats, which is why it is not used). Where msgspec refuses something
``json`` takes (a lone surrogate, ``NaN``), the call falls back to ``json``: what was accepted before
still is, with the same values, and what was refused is refused with ``json``'s own message.

>>> loads(b'{"messages": [{"role": "user", "content": "caf\\u00e9"}], "seed": 123456789012345678901234567890}')
{'messages': [{'role': 'user', 'content': 'café'}], 'seed': 123456789012345678901234567890}
>>> loads(b'{"x": NaN}')["x"] != loads(b'{"x": NaN}')["x"]   # json's reading, where msgspec refuses
True
>>> dumps({"a": [1, 2.5, None], "b": "é"})
b'{"a":[1,2.5,null],"b":"\\xc3\\xa9"}'
"""

from __future__ import annotations

import functools
import json
from typing import Any

__all__ = ["dumps", "exact_dumps", "fast", "loads", "strict_dumps"]


@functools.cache
def _codec() -> tuple[Any, Any, Any, Any] | None:
    """msgspec's ``(DecodeError, decoder, encoder, strict encoder)``, made once; None where msgspec is not
    installed (it comes with the ``gateway`` extra; the in-process gateway and its store work without it)."""
    try:
        import msgspec
    except ImportError:  # pragma: no cover - the gateway extra is missing: json alone
        return None
    return (
        msgspec.DecodeError,
        msgspec.json.Decoder(),
        msgspec.json.Encoder(enc_hook=str),  # what json's default=str writes for other types
        msgspec.json.Encoder(),
    )


def fast() -> bool:
    """Whether msgspec is in use (else ``json`` alone)."""
    return _codec() is not None


def loads(data: bytes | str) -> Any:
    """``data`` parsed (msgspec, else ``json``; see the module docstring). Raises ``ValueError`` (or
    ``RecursionError`` for a body nested past ``json``'s reach) as ``json.loads`` does."""
    codec = _codec()
    if codec is not None:
        try:
            return codec[1].decode(data)
        except codec[0]:
            pass  # json's reading (it takes more) or json's error
    return json.loads(data)


def exact_dumps(value: Any) -> bytes:
    """``json``'s compact UTF-8 JSON of ``value``, ``NaN`` and infinities included (msgspec writes them
    ``null``): for a value that may hold one (a reward), read back as it was.

    >>> exact_dumps({"value": float("nan")})
    b'{"value":NaN}'
    """
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode("utf-8")


def dumps(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON: what ``json.dumps(value, separators=(",", ":"), ensure_ascii=False,
    default=str)`` writes, but for the spelling of some floats (``1e-05`` written ``0.00001``: the same
    value read back) and a float that is not finite, written ``null`` (see :func:`exact_dumps`)."""
    codec = _codec()
    if codec is not None:
        try:
            return bytes(codec[2].encode(value))
        except (TypeError, ValueError, OverflowError):  # a type str() refuses, nested too deep...
            pass
    return exact_dumps(value)


def strict_dumps(value: Any) -> bytes | None:
    """``value`` as compact UTF-8 JSON by msgspec, refusing other types and writing a float that is not
    finite ``null``; None where msgspec is missing or refuses (the caller then writes it its own way).

    >>> strict_dumps({"ok": True}) in (b'{"ok":true}', None)
    True
    """
    codec = _codec()
    if codec is None:
        return None
    try:
        return bytes(codec[3].encode(value))
    except (TypeError, ValueError, OverflowError):
        return None
