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

import json
from typing import Any

try:
    import msgspec
except ImportError:  # pragma: no cover - the extra is partly installed: json alone
    msgspec = None  # type: ignore[assignment]

__all__ = ["FAST", "FastJSONResponse", "dumps", "exact_dumps", "loads"]

#: whether msgspec is in use
FAST = msgspec is not None
if msgspec is not None:
    _decoder = msgspec.json.Decoder()
    _encoder = msgspec.json.Encoder(enc_hook=str)  # what json's default=str writes for other types
    _strict = msgspec.json.Encoder()


def loads(data: bytes | str) -> Any:
    """``data`` parsed (msgspec, else ``json``; see the module docstring). Raises ``ValueError`` (or
    ``RecursionError`` for a body nested past ``json``'s reach) as ``json.loads`` does."""
    if msgspec is not None:
        try:
            return _decoder.decode(data)
        except msgspec.DecodeError:
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
    if msgspec is not None:
        try:
            return _encoder.encode(value)
        except (TypeError, ValueError, OverflowError):  # a type str() refuses, nested too deep...
            pass
    return exact_dumps(value)


try:
    from starlette.responses import JSONResponse
except ImportError:  # pragma: no cover - the gateway extra is missing
    pass
else:

    class FastJSONResponse(JSONResponse):
        """A ``JSONResponse`` written by msgspec (``json``'s exact body where msgspec is missing or refuses;
        a float that is not finite is written ``null`` where ``JSONResponse`` fails: the gateway's replies
        hold none, their logprobs are checked finite when recorded).

        >>> FastJSONResponse({"ok": True}).body
        b'{"ok":true}'
        """

        def render(self, content: Any) -> bytes:
            if msgspec is not None:
                try:
                    return bytes(_strict.encode(content))
                except (TypeError, ValueError, OverflowError):
                    pass
            return bytes(super().render(content))
