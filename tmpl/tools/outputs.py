"""Tool output bounded before it is tokenized: cut on characters first, then exactly in tokens.

A tool may return megabytes while its sample has a few thousand tokens left. Tokenizing all of
it to keep the head costs seconds (5 MB: ~625k tokens, ~6 s) and holds up every other sample on
the event loop. So an output is cut in two steps, each cheap:

1. :func:`cut_chars`: at most ``max_chars`` characters (the Toolbox's ``max_output_chars``, in
   the worker for process isolation, before the result even crosses the pipe);
2. :func:`cut_to_tokens`: to the sample's remaining budget in tokens. Only a head of the text is
   tokenized: ``budget * 5`` characters first, doubled while it still gives fewer than ``budget``
   tokens; it never needs more than ``budget * longest`` characters (``longest``: the longest
   token of the vocabulary, so that many characters always make at least ``budget`` tokens).

Each cut ends the text with a marker the model reads (:func:`marker`), and the call's
:class:`~tmpl.tools.metrics.CallOutcome` records the length before the cut (``chars``).

>>> cut_chars("x" * 100, 10)
'xxxxxxxxxx\\n[tool output cut: 10 of 100 characters shown]'
>>> cut_chars("short", 10)
'short'
"""

from __future__ import annotations

from typing import Any

#: how every cut marker starts (a cut text is found again by it)
MARKER_PREFIX = "\n[tool output cut: "
#: characters per token tried first when cutting to a token budget (most text: 3-5)
CHARS_PER_TOKEN = 5


def marker(shown: int, total: int) -> str:
    """The line appended to a cut output: how many of its characters the model sees."""
    return f"{MARKER_PREFIX}{shown} of {total} characters shown]"


def body(content: str, chars: int | None) -> str:
    """``content`` without the marker a previous cut added (``chars``: the length before it, None if uncut)."""
    if chars is None:
        return content
    at = content.rfind(MARKER_PREFIX)
    return content[:at] if at >= 0 else content


def cut_chars(text: str, max_chars: int | None, total: int | None = None) -> str:
    """``text`` cut to ``max_chars`` characters plus a marker (as is when it fits)."""
    total = len(text) if total is None else total
    if max_chars is None or total <= max_chars:
        return text
    return text[:max_chars] + marker(min(max_chars, len(text)), total)


def longest_token(codec: Any) -> int:
    """Characters in the vocabulary's longest token (an upper bound on what one token covers)."""
    n: int | None = codec.memo.get("longest_token")
    if n is None:
        n = max((len(t) for t in codec.backend.get_vocab(with_added_tokens=True)), default=1)
        codec.memo["longest_token"] = n
    return n


def cut_to_tokens(codec: Any, text: str, budget: int, total: int | None = None) -> str | None:
    """``text`` cut to at most ``budget`` tokens, marker included; None when it fits already.

    ``total``: the output's length before any earlier cut (for the marker). Tokenizes at most
    ``budget * longest_token`` characters, usually ``budget * 5``. A budget too small for the
    marker itself gives the marker alone.
    """
    total = len(text) if total is None else total
    uncut = total == len(text)
    if uncut and len(text) * 4 <= budget:
        return None  # a character is at most 4 bytes, so at most 4 byte-level tokens
    room = max(0, budget - len(codec.encode(marker(total, total))))
    bound = max(1, budget) * longest_token(codec)
    window = min(len(text), max(1, budget) * CHARS_PER_TOKEN)
    while True:
        ids = codec.encode_many([text[:window]])[0]
        if len(ids) > budget or window >= min(len(text), bound):
            break
        window = min(len(text), bound, window * 2)
    if window >= len(text) and len(ids) <= (budget if uncut else room):
        return None
    keep = min(room, len(ids))
    head = codec.decode(ids[:keep]) if keep else ""
    if text.startswith(head):
        end = len(head)
    else:  # a normalizer, or a cut inside a character: where the token ends in the text
        end = codec.encode_with_offsets(text[:window])[1][keep - 1][1]
    return text[:end] + marker(end, total)
