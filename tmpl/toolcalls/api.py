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

    __slots__ = ("tpl", "name", "plain", "_parser", "_key", "_none")

    def __init__(self, tpl: ChatTemplate, name: str | None = None, *, plain: bool = False) -> None:
        self.tpl = tpl
        self.name = name  # a parser forced by name (its reasoning key is its own), else the detected one
        #: a template with no tool-call format (Gemma 3's) reads a completion as its text, no calls (a
        #: rollout without tools needs no parser); False: NoToolParserError, as parse_completion
        self.plain = plain
        self._parser: ToolParser | None = None
        self._key: str | None = None
        self._none = False  # looked up, and the template has no parser

    def __call__(self, completion_ids: Sequence[int], *, tools: Any = None) -> ParsedCompletion:
        """The parsed completion, as ``parse_completion(tpl, completion_ids, tools=tools)``."""
        if isinstance(completion_ids, (str, bytes)):
            raise TypeError("completion_ids must be a sequence of token IDs, not text (encode it first)")
        parser = self._parser
        if parser is None:
            if self._none:
                return self._text(completion_ids)
            try:
                parser = self._parser = parser_for(self.tpl, self.name)
            except NoToolParserError:
                if not self.plain or self.name is not None:
                    raise
                self._none = True
                return self._text(completion_ids)
            self._key = detect(self.tpl).reasoning_key if self.name is None else None
        parsed = parser.parse(completion_ids, tools=tools)
        key = self._key
        if key and key != parsed.reasoning_key:
            parsed = dataclasses.replace(parsed, reasoning_key=key)
        return parsed

    def _text(self, completion_ids: Sequence[int]) -> ParsedCompletion:
        """The completion as content only (its stop token left out), for a template with no tool calls."""
        ids = list(completion_ids)
        if ids and ids[-1] in self.tpl.stop_token_ids:
            ids.pop()
        return ParsedCompletion(self.tpl.codec.decode(ids).strip(), None, (), (), parser="none")


__all__ = ["CompletionReader", "Detection", "detect", "parse_completion", "parser_for"]
