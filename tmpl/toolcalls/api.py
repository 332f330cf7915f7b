"""Reading a template's completions: its parser (detected by probing) and ``parse_completion``.

>>> tpl = tmpl.ChatTemplate.from_pretrained("Qwen/Qwen3-4B")              # doctest: +SKIP
>>> done = parse_completion(tpl, completion_ids, tools=toolbox)            # doctest: +SKIP
>>> [(c.name, c.arguments) for c in done.tool_calls]                      # doctest: +SKIP
[('get_weather', {'city': 'Paris'})]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import NoToolParserError
from .detect import Detection, detect
from .parsers import ToolParser, get_parser
from .types import ParsedCompletion

if TYPE_CHECKING:
    from ..chat_template import ChatTemplate


def parser_for(tpl: ChatTemplate, name: str | None = None) -> ToolParser:
    """The parser of a template: ``name`` when given, else the detected one.

    Raises :class:`~tmpl.errors.UnknownParserError` for an unknown name and
    :class:`~tmpl.errors.NoToolParserError` when none was detected.
    """
    if name is not None:
        return get_parser(name, tpl.codec)
    found = detect(tpl)
    if found.parser is None:
        raise NoToolParserError(
            tpl.name,
            f"no tool-call parser recognised ({found.detail}); force one with parser=<name> "
            f"(see tmpl.toolcalls.PARSERS)",
        )
    if found.learned is not None:
        learned: ToolParser = found.learned
        return learned
    return get_parser(found.parser, tpl.codec, found.think)


def parse_completion(
    tpl: ChatTemplate, completion_ids: Sequence[int], *, tools: Any = None, parser: str | None = None
) -> ParsedCompletion:
    """Parse one completion's token IDs with the template's parser (see :func:`parser_for`)."""
    return CompletionReader(tpl, parser)(completion_ids, tools=tools)


class CompletionReader:
    """:func:`parse_completion` for one template, its parser and reasoning key looked up once
    (on the first call, so a template without a parser raises there, as parse_completion does).

    The rollout loop's reader: one per Rollout, called once per turn of every sample.

    >>> read = CompletionReader(tpl)                              # doctest: +SKIP
    >>> read(completion_ids, tools=toolbox).tool_calls            # doctest: +SKIP
    """

    __slots__ = ("tpl", "name", "_parser", "_key")

    def __init__(self, tpl: ChatTemplate, name: str | None = None) -> None:
        self.tpl = tpl
        self.name = name  # a parser forced by name (its reasoning key is its own), else the detected one
        self._parser: ToolParser | None = None
        self._key: str | None = None

    def __call__(self, completion_ids: Sequence[int], *, tools: Any = None) -> ParsedCompletion:
        """The parsed completion, as ``parse_completion(tpl, completion_ids, tools=tools)``."""
        if isinstance(completion_ids, (str, bytes)):
            raise TypeError("completion_ids must be a sequence of token IDs, not text (encode it first)")
        parser = self._parser
        if parser is None:
            parser = self._parser = parser_for(self.tpl, self.name)
            self._key = detect(self.tpl).reasoning_key if self.name is None else None
        parsed = parser.parse(completion_ids, tools=tools)
        key = self._key
        if key and key != parsed.reasoning_key:
            parsed = dataclasses.replace(parsed, reasoning_key=key)
        return parsed


__all__ = ["CompletionReader", "Detection", "detect", "parse_completion", "parser_for"]
