"""Cut text at added tokens exactly as ``tokenizers``' added vocabulary does.

The tokenizer finds added tokens leftmost-longest, non-overlapping (Aho-Corasick), before
anything else runs. A token with ``rstrip`` swallows the white space after it (Unicode
``White_Space``, Rust's ``char::is_whitespace``); the search for the next token goes on from the
end of the token itself, as the tokenizer's does. ``lstrip`` and ``single_word`` are not
reproduced (the fast encoder declines them).

>>> cut = AddedCutter([("<|end|>", 7, True), ("<|x|>", 9, False)])
>>> cut.split("a<|end|>  b<|x|>")
['a', 7, 'b', 9]
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

#: Unicode White_Space: what an ``rstrip`` token swallows after it
WHITE_SPACE = frozenset(
    [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
)
_WS_RUN = re.compile("[" + "".join(f"\\U{cp:08x}" for cp in sorted(WHITE_SPACE)) + "]*")

#: from this many tokens on, the pattern is written as a trie (Mistral Nemo has 1,000 added
#: tokens starting with ``<`` or ``[``: a plain alternation tries each at every ``[`` of JSON)
TRIE_FROM = 64


def any_of(words: Iterable[str], trie: bool | None = None) -> re.Pattern[str]:
    """A pattern finding the leftmost-longest of ``words`` (non-empty strings).

    As a trie each node prefers going on to stopping, and only one branch can match the next
    character, so the first match found at a position is the longest; as an alternation, longest first.

    >>> any_of(["ab", "abc"]).match("abcd").group(), any_of(["ab", "abc"], trie=True).match("abcd").group()
    ('abc', 'abc')
    """
    words = sorted(set(words), key=lambda w: (-len(w), w))
    if trie is None:
        trie = len(words) >= TRIE_FROM
    if not trie:
        return re.compile("|".join(map(re.escape, words)))
    root: dict[str, Any] = {}
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        alts = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if "" in node:
            alts.append("")  # a word ends here: tried after every longer one
        if len(alts) == 1:
            return alts[0]
        return "(?:" + "|".join(alts) + ")"

    return re.compile(emit(root))


def _never(_text: str) -> None:
    return None


class AddedCutter:
    """Cut text at a set of added tokens: ``split`` gives the text between them and their IDs."""

    def __init__(self, tokens: Iterable[tuple[str, int, bool]]) -> None:
        """``tokens``: (content, ID, rstrip) of each added token, contents as the text holds them."""
        self.by_content: dict[str, tuple[int, bool]] = {c: (tid, rstrip) for c, tid, rstrip in tokens if c}
        self.pattern = any_of(self.by_content) if self.by_content else None
        #: the first characters of the contents: a text holding none of them holds no token
        self.first = "".join(sorted({c[0] for c in self.by_content}))
        firsts = re.compile("[" + "".join(map(re.escape, self.first)) + "]") if self.first else None
        #: a match when ``text`` may hold a token (None: it certainly holds none); cheap
        self.may_hold: Callable[[str], object] = firsts.search if firsts is not None else _never

    def split(self, text: str) -> list[str | int]:
        """The pieces of ``text``: strings between tokens (non-empty) and the tokens' IDs."""
        if self.pattern is None:
            return [text] if text else []
        out: list[str | int] = []
        start = 0  # where the next text piece starts (after any white space an rstrip token took)
        for m in self.pattern.finditer(text):
            tid, rstrip = self.by_content[m.group()]
            if start < m.start():
                out.append(text[start : m.start()])
            out.append(tid)
            end = m.end()
            if rstrip:
                ws = _WS_RUN.match(text, end)
                end = ws.end() if ws is not None else end
            start = end
        if start < len(text):
            out.append(text[start:])
        return out
