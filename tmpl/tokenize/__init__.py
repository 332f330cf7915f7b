"""The tokenization layer: text to the tokenizer's exact IDs.

- :mod:`.codec`: :class:`Codec` (the only place tmpl tokenizes) and :func:`codec_for`;
- :mod:`.stamp`: what decides a tokenizer's IDs, compared on every encode;
- :mod:`.fast`: the tiktoken encoder, built from the tokenizer's vocabulary and split regex;
- :mod:`.pattern`: which split regexes tiktoken reads as the tokenizer does;
- :mod:`.added`: cutting text at added tokens as the tokenizer does;
- :mod:`.pipeline`: the tokenizer's pipeline steps, GPT-2's byte alphabet.

>>> from tmpl.tokenize import codec_for
>>> codec_for(tokenizer).encode("hi")  # doctest: +SKIP
[6023]
"""

from .codec import AddedTokenInfo, Codec, codec_for

__all__ = ["AddedTokenInfo", "Codec", "codec_for"]
