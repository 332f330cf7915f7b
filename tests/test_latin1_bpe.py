"""The Python encoder of Latin-1 text gives the tokenizer's own IDs, or declines.

Every claim is checked against the transformers tokenizer (``tok(text, add_special_tokens=False)``)
on the real tokenizers: generated text (hypothesis) over all of Latin-1 with the characters the
split regexes treat apart made common, generated JSON, and real tool results.
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tmpl
from tmpl import latin1_bpe
from tmpl.codec import Codec, codec_for
from tmpl.latin1_bpe import Latin1Encoder, Unsupported, translate

from .conftest import DATA, FAMILIES

#: what each family's tokenizer (as transformers loads it) runs: regex Splits + ByteLevel over BPE, or
#: ByteLevel's own GPT-2 split (phi-4-mini), is served; otherwise the step that rules it out
SERVED = (
    "qwen2.5-instruct",
    "qwen3",
    "llama-3.2-instruct",
    "mistral-nemo-instruct-2407",
    "gpt-oss",
    "phi-4-mini-instruct",
    "deepseek-v3",  # three Isolated splits in sequence (digit runs, CJK runs, the rest)
)
DECLINED = {
    "gemma-2-it": "normalizer",  # Replace(" ", "▁")
    "gemma-3-it": "normalizer",
    "gemma-4-it": "normalizer",
    "phi-3-mini-4k-instruct": "pre-tokenizer steps ['Metaspace']",
}
assert set(SERVED) | set(DECLINED) == set(FAMILIES)

#: characters the split regexes treat apart: apostrophes and contraction letters in both cases,
#: every kind of white space (NBSP and NEL are Unicode White_Space), line breaks, digits and the
#: Latin-1 numbers (superscripts, fractions), Latin-1 letters of each case, punctuation runs
AWKWARD = " '\"sStTdDmMlLvVrReE\n\r\t\x0b\x0c\xa0\x85 0123456789²³¹½¾µªºßÿÀé.,:;{}[]()<>|/\\-_!?#@&*+=~`$%^\x00\x7f"
LATIN1 = st.text(st.one_of(st.sampled_from(AWKWARD), st.characters(max_codepoint=0xFF)), max_size=60)
JSONS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | LATIN1,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(LATIN1, inner, max_size=4),
    max_leaves=12,
)


def _served(family: str, tokenizer_of):
    tok = tokenizer_of(family)
    codec = codec_for(tok)
    if codec.latin1 is None:
        pytest.fail(f"{family}: the Latin-1 encoder declined ({codec.latin1_reason})")
    return tok, codec.latin1


@pytest.mark.parametrize("family", FAMILIES)
def test_the_encoder_serves_exactly_the_regex_split_byte_level_pipelines(family, tokenizer_of):
    codec = Codec(tokenizer_of(family))
    if family in SERVED:
        assert codec.latin1 is not None, codec.latin1_reason
        assert codec.latin1_reason is None
    else:
        assert codec.latin1 is None
        assert DECLINED[family] in (codec.latin1_reason or "")


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=LATIN1)
def test_latin1_text_encodes_to_the_tokenizers_ids(family, tokenizer_of, text):
    tok = tokenizer_of(family)
    codec = codec_for(tok)
    expected = tok(text, add_special_tokens=False)["input_ids"]
    assert codec.encode(text) == expected
    assert codec.encode_many([text, text + " x"]) == [expected, tok(text + " x", add_special_tokens=False)["input_ids"]]
    if codec.latin1 is not None:
        got = codec.latin1.encode(text)
        assert got is None or got == expected


@pytest.mark.parametrize("family", SERVED)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=JSONS, indent=st.sampled_from([None, 2]), ascii_only=st.booleans())
def test_json_tool_results_encode_to_the_tokenizers_ids(family, tokenizer_of, value, indent, ascii_only):
    tok, enc = _served(family, tokenizer_of)
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    got = enc.encode(text)
    assert got == tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("family", SERVED)
def test_text_the_tokenizer_must_cut_or_that_is_not_latin1_is_declined(family, tokenizer_of):
    tok, enc = _served(family, tokenizer_of)
    special = next(t.content for t in tok.backend_tokenizer.get_added_tokens_decoder().values() if t.special)
    assert enc.encode(f"before {special} after") is None  # the tokenizer cuts at an added token first
    assert enc.encode("Kraków ∑ 漢字 🙂") is None  # beyond U+00FF
    assert enc.encode("<b>no added token here</b>") is not None
    texts = ["plain", f"x{special}y", "Łódź", "Zürich", ""]
    codec = Codec(tok)
    assert codec.encode_many(texts) == [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


@pytest.mark.parametrize("family", SERVED)
def test_real_tool_results_encode_to_the_tokenizers_ids(family, tokenizer_of):
    """Records like the rollout benchmark's tools return (JSON of 50-2,000 characters, cities with accents)."""
    tok, enc = _served(family, tokenizer_of)
    rng = random.Random(3)
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet".split()
    cities = ["Paris", "São Paulo", "Reykjavík", "Montréal", "Zürich"]
    for _ in range(200):
        record = {
            "sku": f"SKU-{rng.randrange(10**6):06d}",
            "title": " ".join(rng.choice(words) for _ in range(rng.randint(1, 6))).title(),
            "price": round(rng.uniform(1, 500), 2),
            "address": {"city": rng.choice(cities), "zip": f"{rng.randrange(10**5):05d}"},
            "lines": "\n".join(" ".join(rng.sample(words, 3)) for _ in range(rng.randint(0, 5))),
        }
        text = json.dumps([record] * rng.randint(1, 4), ensure_ascii=False, indent=rng.choice([None, 2]))
        assert enc.encode(text) == tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize(
    "pattern",
    [
        r"\d+",
        r"^\p{L}+",
        r"\p{L}+$",
        r"(\p{L})+",
        r"[\P{L}]",
        r"[[:alpha:]]",
        r"[a-z&&[^aeiou]]",
        r"\S[\S]",
        r"\p{Han}",
        r"(?m:.)+",  # dot-all in the tokenizer's engine, multi-line in Python's
        r"(?x) a b",
        r"(?<name>a)",
        r"\bword\b",
        r"\h+",
    ],
)
def test_translate_refuses_what_it_does_not_reproduce(pattern):
    with pytest.raises(Unsupported):
        latin1_bpe._compiled(pattern)


@pytest.mark.parametrize("pattern", [r"(?i:'s|'t)|\p{L}+|\s+", r"[\#\&\~]+|(?:ab)+|(?=x)x|(?>a+)b|\p{N}{1,3}"])
def test_translate_keeps_what_both_engines_read_alike(pattern):
    assert latin1_bpe._compiled(pattern).pattern == translate(pattern)


def test_the_build_check_catches_a_wrong_translation(tokenizer_of, monkeypatch):
    """A translation that drops a character from \\p{N} (here ½) is found by the build's own check."""
    tok = tokenizer_of("qwen2.5-instruct")
    wrong = {**latin1_bpe._PROPERTIES, "N": [cp for cp in latin1_bpe._PROPERTIES["N"] if cp != 0xBD]}
    monkeypatch.setattr(latin1_bpe, "_PROPERTIES", wrong)
    with pytest.raises(Unsupported, match="encodes differently"):
        Latin1Encoder.build(tok.backend_tokenizer)
    monkeypatch.undo()
    assert Latin1Encoder.build(tok.backend_tokenizer).encode("½") == tok("½", add_special_tokens=False)["input_ids"]


def test_a_truncating_tokenizer_is_left_to_encode_itself(tokenizer_of):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_of("qwen2.5-instruct").name_or_path)  # its own backend
    codec = Codec(tok)
    text = "one two three four five six seven"
    assert codec.encode(text) == tok(text, add_special_tokens=False)["input_ids"]
    tok.backend_tokenizer.enable_truncation(max_length=3)
    try:
        truncated = tok.backend_tokenizer.encode(text, add_special_tokens=False).ids
        assert len(truncated) == 3
        assert codec.encode_many([text]) == [truncated]
        assert codec.encode(text) == truncated
    finally:
        tok.backend_tokenizer.no_truncation()


def test_the_word_cache_starts_again_when_full(tokenizer_of, monkeypatch):
    tok, _ = _served("qwen2.5-instruct", tokenizer_of)
    monkeypatch.setattr(latin1_bpe, "CACHE_LIMIT", 8)
    enc = Latin1Encoder.build(tok.backend_tokenizer)
    texts = [" ".join(f"w{i}x{j}" for j in range(30)) for i in range(20)]
    for text in texts + texts:
        assert enc.encode(text) == tok(text, add_special_tokens=False)["input_ids"]
        assert len(enc._words) <= 8


def test_tmpl_latin1_0_turns_the_encoder_off(tokenizer_of, monkeypatch):
    tok = tokenizer_of("qwen2.5-instruct")
    monkeypatch.setenv("TMPL_LATIN1", "0")
    off = Codec(tok)
    assert off.latin1 is None and "TMPL_LATIN1=0" in (off.latin1_reason or "")
    assert off.encode_many(["Zürich 21.5"]) == [tok("Zürich 21.5", add_special_tokens=False)["input_ids"]]
    monkeypatch.delenv("TMPL_LATIN1")
    assert Codec(tok).latin1 is not None


@settings(max_examples=400, deadline=None)
@given(
    words=st.lists(st.text("ab<[|", min_size=1, max_size=5), min_size=1, max_size=8),
    texts=st.lists(st.text("ab<[|x", max_size=12), max_size=10),
)
def test_the_added_token_finder_finds_what_a_plain_alternation_finds(words, texts):
    """The trie-shaped pattern (fast where 1,000 added tokens share a first character) finds an
    added token in a text exactly when an alternation of all of them does."""
    import re

    plain = re.compile("|".join(map(re.escape, words)))
    trie = latin1_bpe._any_of(words)
    for text in texts:
        assert (trie.search(text) is None) == (plain.search(text) is None)


def test_a_split_that_can_match_nothing_is_refused(tokenizer_of):
    """A pattern matching the empty string would cut pieces where the tokenizer's split does not."""
    backend = tokenizer_of("qwen2.5-instruct").backend_tokenizer
    with pytest.raises(Unsupported, match="empty string"):
        Latin1Encoder(backend, [r"\p{L}*"])
    with pytest.raises(Unsupported, match="group"):
        Latin1Encoder(backend, [r"(?P<w>\p{L}+)"])


@pytest.mark.parametrize(("vectors", "family"), [("qwen2", "qwen2.5-instruct"), ("llama-bpe", "llama-3.2-instruct")])
def test_llama_cpp_tokenizer_vectors(vectors, family, tokenizer_of):
    """llama.cpp's tokenizer test vectors (inputs and the IDs the original HF tokenizer gave them,
    recorded by llama.cpp): every Latin-1 input is encoded by the Latin-1 encoder, to those IDs."""
    folder = DATA / "vocab-tests"
    inp, out = folder / f"ggml-vocab-{vectors}.gguf.inp", folder / f"ggml-vocab-{vectors}.gguf.out"
    if not inp.is_file() or not out.is_file():
        pytest.skip(f"llama.cpp vectors {vectors!r} not in {folder}")
    texts = inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    expected = [[int(x) for x in line.split()] for line in out.read_text(encoding="utf-8").split("\n")]
    _, enc = _served(family, tokenizer_of)
    latin1 = 0
    for text, ids in zip(texts, expected):
        got = enc.encode(text)
        if got is not None:
            latin1 += 1
            assert got == ids, text
    assert latin1 >= len(texts) // 2, f"only {latin1} of {len(texts)} vectors were Latin-1"


def test_the_checks_compare_against_the_tokenizer_not_the_encoder_they_check(tokenizer_of, monkeypatch):
    """A Latin-1 encoder gone wrong (here: one token of "Paris" swapped for another, in every text it
    is asked for, the suffix's content and a whole render alike) is caught by ``verify_every`` and by
    the drift measure: both compare against the tokenizer's own IDs (``Codec.encode_reference``)."""
    from tmpl.backends import Scripted
    from tmpl.rollout.drift import rerender_drift

    tok = tokenizer_of("qwen2.5-instruct")
    tpl = tmpl.ChatTemplate(tok, name="qwen2.5")
    codec = tpl.codec
    enc = codec.latin1
    assert enc is not None
    paris = tok("Paris", add_special_tokens=False)["input_ids"][-1]
    real = enc.encode

    def wrong(text):
        ids = real(text)
        if ids is None:  # what the encoder declines (a text with atoms): wrong all the same
            ids = tok(text, add_special_tokens=False)["input_ids"]
        return [paris + 1 if i == paris else i for i in ids]

    def get_weather(city: str) -> str:
        """Current weather.

        Args:
            city: The city.
        """
        return f"{city}: 21 C, sunny"

    def policy(request):
        _, _, turn = request.request_id.split("-")
        if turn == "0":
            return tok(
                '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
                add_special_tokens=False,
            )["input_ids"]
        return tok("Done.<|im_end|>", add_special_tokens=False)["input_ids"]

    convo = [[{"role": "user", "content": "Weather?"}]]
    good = tmpl.Rollout(tpl, Scripted(policy), tools=[get_weather], max_turns=3, verify_every=1).run(convo)[0]
    assert good.status.name == "DONE", good.reason
    monkeypatch.setattr(enc, "encode", wrong)
    bad = tmpl.Rollout(tpl, Scripted(policy), tools=[get_weather], max_turns=3, verify_every=1).run(convo)[0]
    assert bad.code.name == "VERIFY_FAILED", (bad.code, bad.reason)
    # the drift measure: the good sample's IDs (the tokenizer's) against a re-render, the encoder wrong
    ids = good.prompt_ids.tolist() + good.completion_ids.tolist()
    schemas = tmpl.Rollout(tpl, Scripted(policy), tools=[get_weather]).tool_schemas
    drift, _ = rerender_drift(tpl, good.messages, ids, tools=schemas)
    assert drift is False
