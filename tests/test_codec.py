"""The codec's encode paths give the IDs ``tokenizer(text, add_special_tokens=False)`` gives.

``Codec.encode_many`` (the suffix and prompt hot path) goes through ``encode_batch_fast``
(no character offsets) where the installed ``tokenizers`` has it and ``encode_batch`` where
it does not; both must equal the transformers tokenizer's own IDs, text by text.
"""

from __future__ import annotations

import pytest

from tmpl.codec import Codec

from .conftest import FAMILIES

TEXTS = [
    "",
    "hi",
    '{"temperature": 21.5, "unit": "celsius"}',
    "unicode: é ñ 漢字 🙂 ∑ ß Ωmega\n\n\tindented\r\nwindows",
    "  leading and trailing spaces  ",
    "<|im_end|>\n<|im_start|>user\nsome text</s>[/INST]<end_of_turn>",  # special tokens of several families
    ("0123456789 abcdefghij " * 200)[:4000],
]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("path", ["fast", "batch"])
def test_encode_many_equals_the_tokenizer(family, path, tokenizer_of):
    tok = tokenizer_of(family)
    codec = Codec(tok)
    if path == "batch":  # what a tokenizers release without encode_batch_fast runs
        codec._encode_ids = codec.backend.encode_batch
    elif not hasattr(codec.backend, "encode_batch_fast"):
        pytest.skip("this tokenizers release has no encode_batch_fast")
    expected = [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    assert codec.encode_many(TEXTS) == expected
    assert [codec.encode_many([t])[0] for t in TEXTS] == expected
    assert [codec.encode(t) for t in TEXTS] == expected
    assert codec.encode_many([]) == []
