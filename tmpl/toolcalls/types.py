"""Records of a parsed completion: tool calls, parse errors, and the completion itself.

Parsing never raises on what the model wrote: a call that cannot be read becomes a
:class:`CallProblem` in :attr:`ParsedCompletion.errors`, with the raw text, so that the
tool loop can answer it with an error message the model can learn from.

>>> call = ToolCall(id="a1B2c3D4e", name="get_weather", arguments={"city": "Paris"}, raw="...")
>>> call.to_dict()["function"]
{'name': 'get_weather', 'arguments': {'city': 'Paris'}}
>>> done = ParsedCompletion(content="Let me look.", reasoning=None, tool_calls=(call,), errors=())
>>> done.to_message()["tool_calls"][0]["id"]
'a1B2c3D4e'
"""

from __future__ import annotations

import os
import random
import string
from dataclasses import dataclass, field
from typing import Any

#: Alphabet of generated call ids: 9 of these are valid for every template (Mistral included).
ID_ALPHABET = string.ascii_letters + string.digits
ID_LENGTH = 9


_ids = random.Random()  # seeded from the OS; ids must differ, not be secret (no system call per id)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ids.seed)  # a forked worker does not repeat its parent's ids


def new_call_id() -> str:
    """A random call id of 9 alphanumerics (what Mistral requires; every other template accepts it).

    >>> len(new_call_id()), new_call_id().isalnum()
    (9, True)
    """
    n = _ids.getrandbits(64)  # 64 random bits; 62**9 > 2**53
    n, a = divmod(n, 3844)  # two base-62 digits at a time (the same id as one digit at a time)
    n, b = divmod(n, 3844)
    n, c = divmod(n, 3844)
    n, d = divmod(n, 3844)
    return _PAIRS[a] + _PAIRS[b] + _PAIRS[c] + _PAIRS[d] + ID_ALPHABET[n % 62]


#: every pair of alphabet characters, indexed by ``low + 62 * high`` (low written first)
_PAIRS = [ID_ALPHABET[k % 62] + ID_ALPHABET[k // 62] for k in range(62 * 62)]


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model made (outside its reasoning), ready to execute.

    ``id`` is the model's own call id when it wrote one, else a generated one
    (``id_generated`` says which). ``raw`` is the call's text as the model wrote it, delimiters
    included; ``token_span`` is its ``[start, end)`` in the completion's token IDs.
    ``repairs`` lists what the parser had to forgive (``"missing close"``, ``"python literal"``,
    ``"trailing text"``, ``"coerced 'days' to integer"``...), empty for a clean call.
    """

    id: str
    name: str
    arguments: dict[str, Any]
    raw: str
    token_span: tuple[int, int] | None = None
    repairs: tuple[str, ...] = ()
    id_generated: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The call as an OpenAI-style ``tool_calls`` entry (arguments as a dict, as templates expect)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": dict(self.arguments)}}


@dataclass(frozen=True)
class CallProblem:
    """A call the model attempted that could not be read, or a structural problem (not an exception).

    >>> CallProblem("bad_json", "expected ':' at char 9", name="get_weather").is_call
    True


    ``kind`` is one of :data:`PARSE_ERROR_KINDS`; ``name`` is the tool name when it could be read.
    A CallProblem with ``kind`` in :data:`CALL_ERROR_KINDS` stands for one attempted call: the tool
    loop answers it with an error message in the call's place.
    """

    kind: str
    message: str
    raw: str = ""
    name: str | None = None
    token_span: tuple[int, int] | None = None
    id: str = field(default_factory=new_call_id)

    @property
    def is_call(self) -> bool:
        """True when this problem stands for one attempted call (it gets its own tool message)."""
        return self.kind in CALL_ERROR_KINDS


#: The name of :class:`CallProblem` before 0.2.0 (it is a finding in a completion, not an exception).
ParseError = CallProblem


#: What can go wrong while reading a call.
PARSE_ERROR_KINDS = (
    "malformed",  # the call's text does not have the format's shape
    "bad_json",  # the arguments are not a JSON object / Python literal dict
    "missing_name",  # no tool name could be read
    "truncated",  # the completion ends inside the call
)
CALL_ERROR_KINDS = frozenset(PARSE_ERROR_KINDS)


@dataclass(frozen=True)
class ParsedCompletion:
    """What one completion says: visible content, reasoning, tool calls, and what could not be read.

    ``content`` is the text outside reasoning and calls, special tokens removed, stripped.
    ``reasoning`` is the text of ``<think>`` blocks / the analysis channel (None when there is none);
    calls written inside it are part of it and are never executed.
    ``items`` holds the calls and the call-level errors in the order the model wrote them (what
    :class:`~tmpl.Toolbox` answers, one tool message each).
    """

    content: str
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...]
    errors: tuple[CallProblem, ...]
    parser: str = ""
    reasoning_key: str = "reasoning_content"
    items: tuple[ToolCall | CallProblem, ...] = ()

    def __post_init__(self) -> None:
        if not self.items and (self.tool_calls or self.errors):
            ordered = list(self.tool_calls) + [e for e in self.errors if e.is_call]
            ordered.sort(key=lambda x: x.token_span[0] if x.token_span else 0)
            object.__setattr__(self, "items", tuple(ordered))

    @property
    def has_calls(self) -> bool:
        """True when the model attempted at least one call (readable or not)."""
        return bool(self.items)

    def to_message(self, *, reasoning_key: str | None = None) -> dict[str, Any]:
        """The assistant message dict (for logging, rewards, or re-rendering).

        >>> ParsedCompletion("hi", "think", (), ()).to_message()
        {'role': 'assistant', 'content': 'hi', 'reasoning_content': 'think'}
        """
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            message[reasoning_key or self.reasoning_key] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        return message
