"""The codec's encode paths give the IDs ``tokenizer(text, add_special_tokens=False)`` gives.

``Codec.encode_many`` (the suffix and prompt hot path) encodes text with tiktoken where the
pipeline allows (``tmpl.tokenize.fast``, tested on its own in test_fast_encode.py) and the rest through
``encode_batch_fast`` (no character offsets) where the installed ``tokenizers`` has it and
``encode_batch`` where it does not; each path must equal the transformers tokenizer's own IDs,
text by text.
"""

from __future__ import annotations

import pytest

from tmpl.tokenize import Codec

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
@pytest.mark.parametrize("path", ["tiktoken", "fast", "batch"])
def test_encode_many_equals_the_tokenizer(family, path, tokenizer_of):
    tok = tokenizer_of(family)
    codec = Codec(tok, fast=path == "tiktoken")  # otherwise every text through the backend
    if path == "tiktoken":
        assert codec.fast is not None or codec.fast_reason  # built now, not after FAST_AFTER_TEXTS texts
    if path == "batch":  # what a tokenizers release without encode_batch_fast runs
        codec._encode_ids = codec.backend.encode_batch
    elif not hasattr(codec.backend, "encode_batch_fast"):
        pytest.skip("this tokenizers release has no encode_batch_fast")
    expected = [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    assert codec.encode_many(TEXTS) == expected
    assert [codec.encode_many([t])[0] for t in TEXTS] == expected
    assert [codec.encode(t) for t in TEXTS] == expected
    assert codec.encode_many([]) == []


SYSTEM = "You are a careful assistant. " * 20  # a long shared system prompt
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
USERS = ["hi", "  spaces first", "\nnewline first", "<|im_end|> written as text", "é ñ 漢字 🙂", "Request 7: 12345"]


@pytest.mark.parametrize("family", FAMILIES)
def test_encode_shared_equals_encoding_each_prompt(family, tokenizer_of):
    """Prompts that share a system prompt and tool schemas (the prefix encoded once where the
    pipeline allows an exact cut) give the IDs of each prompt's own full encoding."""
    tok = tokenizer_of(family)
    codec = Codec(tok)
    texts = []
    for user in USERS:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
        try:
            texts.append(tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False))
        except Exception:  # noqa: BLE001 - a template that takes no system message or tools
            texts.append(tok.apply_chat_template(messages[1:], add_generation_prompt=True, tokenize=False))
    texts.append(texts[0])  # the same prompt twice
    texts.append(texts[0] + "more")  # one prompt a prefix of another
    expected = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert codec.encode_shared(texts) == expected
    assert codec.encode_shared(texts[:1]) == expected[:1]


def test_encode_shared_cuts_only_where_exact(tokenizer_of):
    """Qwen2.5: the shared prefix is cut after its last added token; a prefix ending inside
    an added token ("<|im_" then "end|>" in one text, "start|>" in the other) is not cut there."""
    tok = tokenizer_of("qwen2.5-instruct")
    codec = Codec(tok)
    shared = "<|im_start|>system\n" + SYSTEM + "<|im_end|>\n<|im_start|>user\n"
    texts = [shared + "alpha", shared + "beta"]
    assert codec._shared_cut(texts) == len(shared) - len("user\n")  # right after "<|im_start|>"
    head = "<|im_start|>system\n" + SYSTEM + "<|im_end|>\n"
    inside = [head + "<|im_" + tail for tail in ("end|>x", "start|>y")]  # they part inside a token
    assert codec._shared_cut(inside) == len(head) - 1  # after "<|im_end|>", not in "<|im_"
    expected = [tok(t, add_special_tokens=False)["input_ids"] for t in inside]
    assert codec.encode_shared(inside) == expected
    assert codec._shared_cut(["short<|im_end|>a", "short<|im_end|>b"]) == 0  # not worth a cut
