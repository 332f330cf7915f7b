"""Byte-level runs decoded from a table equal the tokenizer's own decode, and TokenText is unchanged.

The parsers read a completion through :class:`tmpl.toolcalls.tokentext.TokenText`. For byte-level
BPE tokenizers its runs of ordinary tokens now come from :mod:`tmpl.toolcalls.bytedecode`'s table
instead of one ``decode`` call each. Checked here on every real tokenizer of the test data:

- the table exists exactly where the decoder is ``ByteLevel`` over a BPE model;
- every token alone, and seeded random runs (bytes of split characters among them), decode to what
  the tokenizer's ``decode`` gives; a run holding an added token is left to the tokenizer (None);
- the TokenText of random completions (markers, added tokens, multi-byte characters cut across
  tokens) has the same text and spans as the tokenizer-only decoding it replaced (written out
  below as the reference), for byte-level and other tokenizers alike.
"""

from __future__ import annotations

import random

import pytest

from tmpl.toolcalls.api import parser_for
from tmpl.toolcalls.bytedecode import byte_table, decode_run
from tmpl.toolcalls.tokentext import _PRIVATE, TokenText

from .toolcalls_data import FAMILIES, chat_template

BYTE_LEVEL = {
    "qwen2.5-instruct",
    "qwen3",
    "llama-3.2-instruct",
    "mistral-nemo-instruct-2407",
    "phi-4-mini-instruct",
    "deepseek-v3",
    "gpt-oss",
}


def reference_text(view: TokenText) -> tuple[str, list[tuple[int, int, int, bool]]]:
    """TokenText's text and spans as computed before the table: each run decoded by the tokenizer
    after the marker before it, the marker's text cut off."""
    table, ids = view.table, view.ids
    codec = table.codec
    cuts = [i for i, t in enumerate(ids) if t in table.ids]
    pieces, spans, pos, prev, guard = [], [], 0, 0, None
    for p in [*cuts, len(ids)]:
        if p > prev:
            run = ids[prev:p]
            if guard is None:
                text = codec.backend.decode(run, skip_special_tokens=False)
            else:
                head = table.text_of[guard]
                text = codec.backend.decode([guard, *run], skip_special_tokens=False)
                text = text[len(head) :] if text.startswith(head) else codec.decode(run)
            text = _PRIVATE.sub("\ufffd", text)
            spans.append((pos, prev, p, False))
            pieces.append(text)
            pos += len(text)
        if p < len(ids):
            guard = ids[p]
            spans.append((pos, p, p + 1, True))
            pieces.append(table.char[guard])
            pos += 1
        prev = p + 1
    return "".join(pieces), spans


@pytest.mark.parametrize("family", FAMILIES)
def test_the_table_decodes_every_token_and_random_runs_like_the_tokenizer(family):
    codec = chat_template(family).codec
    backend = codec.backend
    table = byte_table(codec)
    decoder, model = type(backend.decoder).__name__, type(backend.model).__name__
    assert (table is not None) == (decoder == "ByteLevel" and model == "BPE")
    assert (table is not None) == (family in BYTE_LEVEL), (decoder, model)
    if table is None:
        return
    n = backend.get_vocab_size(with_added_tokens=False)
    for tid in range(n):
        got = decode_run(table, [tid])
        if tid in codec.added:
            assert got is None
        else:
            assert got == backend.decode([tid], skip_special_tokens=False), tid
    rng = random.Random(family)
    added = sorted(codec.added)
    # tokens of split multi-byte characters: what random runs of ordinary tokens rarely put side by side
    text = "漢字 émoji 🙂🙃 Ωmega ß 한국어 " * 3
    pieces = [t for t in codec.encode(text)]
    for _ in range(3000):
        pool = pieces if rng.random() < 0.5 else range(n)
        run = [rng.choice(pool) for _ in range(rng.randint(1, 30))]
        if rng.random() < 0.1:
            run.insert(rng.randrange(len(run) + 1), rng.choice(added))
        with_added = any(t in codec.added for t in run)  # Mistral's added tokens are IDs 0-999 of its vocabulary
        got = decode_run(table, run)
        if with_added:
            assert got is None
        else:
            assert got == backend.decode(run, skip_special_tokens=False), run


@pytest.mark.parametrize("family", sorted(BYTE_LEVEL)[:1])
def test_a_negative_id_is_left_to_the_tokenizer(family):
    """The table is a list: a negative ID would read an entry from its end. It says nothing (None)
    and the tokenizer, which refuses such an ID, decides."""
    codec = chat_template(family).codec
    table = byte_table(codec)
    assert table is not None
    first = codec.encode("hello")
    assert decode_run(table, first) is not None  # the entries are filled
    assert decode_run(table, [first[0] - len(table)]) is None
    assert decode_run(table, first + [-1]) is None


@pytest.mark.parametrize("family", FAMILIES)
def test_token_text_is_what_the_tokenizer_alone_gave(family):
    tpl = chat_template(family)
    codec = tpl.codec
    try:
        parser = parser_for(tpl)
    except Exception:  # noqa: BLE001 - a family without a tool parser: a parser of another format reads it
        from tmpl.toolcalls.parsers import get_parser

        parser = get_parser("hermes", codec)
    rng = random.Random(family)
    markers = sorted(parser.table.ids)
    added = sorted(codec.added)
    n = codec.backend.get_vocab_size(with_added_tokens=False)
    texts = ["Let me check.\n", '{"name": "f", "arguments": {"city": "Zürich 漢字 🙂"}}', " spaced  out ", "ß\n\n", "x"]
    pieces = [codec.encode(t) for t in texts]
    for _ in range(400):
        ids: list[int] = []
        for _ in range(rng.randint(1, 8)):
            roll = rng.random()
            if roll < 0.3:
                ids.append(rng.choice(markers))
            elif roll < 0.4:
                ids.append(rng.choice(added))
            elif roll < 0.7:
                ids += rng.choice(pieces)
            else:
                ids += [rng.randrange(n) for _ in range(rng.randint(1, 6))]
        view = TokenText(parser.table, ids)
        assert (view.text, view._spans) == reference_text(view), ids
