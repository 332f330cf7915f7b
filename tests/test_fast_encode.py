"""The tiktoken encoder gives the tokenizer's own IDs, or declines (naming why).

Every claim is checked against the transformers tokenizer (``tok(text, add_special_tokens=False)``)
on the real tokenizers: generated text (hypothesis) over every script, emoji, control characters
and added tokens; every assigned code point in context; generated JSON; llama.cpp's recorded
vectors. The build never raises: anything going wrong in it is a decline.
"""

from __future__ import annotations

import json
import random
import re
import sys
import unicodedata
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tmpl
from tmpl.tokenize import Codec, codec_for, fast
from tmpl.tokenize.added import AddedCutter, any_of
from tmpl.tokenize.fast import MAX_CHARS, Decline, FastEncoder
from tmpl.tokenize.pattern import check
from tmpl.tokenize.pipeline import Unsupported, byte_chars

from .conftest import DATA, FAMILIES

#: regex-split byte-level BPE with one split (or ByteLevel's own, phi-4-mini): served
SERVED = (
    "qwen2.5-instruct",
    "qwen3",
    "llama-3.2-instruct",
    "mistral-nemo-instruct-2407",
    "gpt-oss",
    "phi-4-mini-instruct",
)
DECLINED = {
    "gemma-2-it": "byte fallback",  # and a Replace(" ", "▁") normalizer
    "gemma-3-it": "byte fallback",
    "gemma-4-it": "byte fallback",
    "phi-3-mini-4k-instruct": "byte fallback",  # and Metaspace
    "deepseek-v3": "pre-tokenizer steps ['Split', 'Split', 'Split', 'ByteLevel']",  # three splits in sequence
}
assert set(SERVED) | set(DECLINED) == set(FAMILIES)
#: the families the every-code-point sweep runs on (qwen3 shares Qwen2.5's pipeline)
SWEPT = ("qwen2.5-instruct", "llama-3.2-instruct", "mistral-nemo-instruct-2407", "gpt-oss", "phi-4-mini-instruct")

#: what split regexes treat apart, from every script
AWKWARD = (
    " '\"sStTdDmMlLvVrReE\n\r\t\x0b\x0c\xa0\x85\u2028\u3000\u200b 0123456789²³½٣३௫𝟘ß"
    "ÿÀéſKİıﬀﬁǅ.,:;{}[]()<>|/\\-_!?#@&*+=~`$%^\x00\x7f\x1f"
    "漢字かなカナ한글Ωωжд\u0301\u0308\u093fअ\u0e31ก🙂👍🏽\u200d👩🇫🇷\ufe0f"
)
TEXT = st.text(st.one_of(st.sampled_from(AWKWARD), st.characters(codec="utf-8")), max_size=60)
JSONS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


def ids_of(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _served(family: str, tokenizer_of):
    tok = tokenizer_of(family)
    codec = codec_for(tok)
    if codec.fast is None:
        pytest.fail(f"{family}: the fast encoder declined ({codec.fast_reason})")
    return tok, codec.fast


@pytest.mark.parametrize("family", FAMILIES)
def test_the_encoder_serves_exactly_the_pipelines_it_reproduces(family, tokenizer_of):
    codec = codec_for(tokenizer_of(family))
    if family in SERVED:
        assert codec.fast is not None, codec.fast_reason
        assert codec.fast_reason is None
    else:
        assert codec.fast is None
        assert DECLINED[family] in (codec.fast_reason or "")


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXT, added=st.lists(st.integers(0, 10**6), max_size=3))
def test_generated_text_encodes_to_the_tokenizers_ids(family, tokenizer_of, text, added):
    """Any script, emoji, controls, with the family's added tokens spliced in (rstrip ones too)."""
    tok = tokenizer_of(family)
    codec = codec_for(tok)
    contents = [t.content for t in tok.backend_tokenizer.get_added_tokens_decoder().values()]
    for k in added:
        at = k % (len(text) + 1)
        text = text[:at] + contents[k % len(contents)] + " \n"[: k % 3] + text[at:]
    expected = ids_of(tok, text)
    assert codec.encode(text) == expected
    assert codec.encode_many([text, text + " x"]) == [expected, ids_of(tok, text + " x")]
    if codec.fast is not None:
        got = codec.fast.encode(text)
        assert got is None or got == expected


@pytest.mark.parametrize("family", SERVED)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=JSONS, indent=st.sampled_from([None, 2]), ascii_only=st.booleans())
def test_json_tool_results_encode_to_the_tokenizers_ids(family, tokenizer_of, value, indent, ascii_only):
    tok, enc = _served(family, tokenizer_of)
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    got, expected = enc.encode(text), ids_of(tok, text)
    assert got == expected or (got is None and fast.has_odd_char(text)), text  # unassigned: the tokenizer's


def _assigned(step: int = 1) -> list[str]:
    return [chr(cp) for cp in range(0x20, 0x30000, step) if unicodedata.category(chr(cp)) not in ("Cn", "Cs", "Co")]


def _sweep(family: str, tokenizer_of, chars: list[str]) -> None:
    """Every character in a probe of letters, digits, spaces, breaks and an apostrophe, compared
    in chunks (one batch call of the tokenizer per chunk)."""
    tok, enc = _served(family, tokenizer_of)
    backend = tok.backend_tokenizer
    probes = [f"x{c}x {c}7{c} a{c}\n{c}{c}'s {c}" for c in chars]
    for start in range(0, len(probes), 2048):
        chunk = probes[start : start + 2048]
        expected = [e.ids for e in backend.encode_batch_fast(chunk, add_special_tokens=False)]
        got = [enc.encode(p) for p in chunk]
        wrong = [(f"U+{ord(p[1]):04X}", g, e) for p, g, e in zip(chunk, got, expected) if g != e]
        assert not wrong, wrong[:3]
    assert ids_of(tok, probes[-1]) == enc.encode(probes[-1])  # the transformers call agrees with the backend's


@pytest.mark.parametrize("family", SWEPT)
def test_every_seventh_assigned_code_point_in_context(family, tokenizer_of):
    _sweep(family, tokenizer_of, _assigned(7))


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2.5-instruct"])
def test_every_assigned_code_point_in_context(family, tokenizer_of):
    """U+0020-U+2FFFF, every code point Python's Unicode assigns (145,854; private use left out)."""
    _sweep(family, tokenizer_of, _assigned())


@pytest.mark.parametrize("family", SERVED)
def test_bpe_of_each_piece_is_the_models(family, tokenizer_of):
    """tiktoken's BPE of a piece (no regex) equals the model's own BPE of its byte-level string,
    for the words of a generated multi-script text."""
    tok, enc = _served(family, tokenizer_of)
    chars = byte_chars()
    model = tok.backend_tokenizer.model
    rng = random.Random(5)
    words = re.findall(r"\w+|[^\w\s]+", "".join(rng.choice(AWKWARD) for _ in range(3000)) + " internationalization")
    for word in words:
        raw = word.encode("utf-8")
        ranks = enc.encoding._encode_single_piece(raw)
        got = ranks if enc._id_of is None else [enc._id_of[r] for r in ranks]
        assert got == [t.id for t in model.tokenize("".join(chars[b] for b in raw))], word


@pytest.mark.parametrize("family", SERVED)
def test_real_tool_results_encode_to_the_tokenizers_ids(family, tokenizer_of):
    """Records like the rollout benchmark's tools return (JSON of 50-2,000 characters, cities in several scripts)."""
    tok, enc = _served(family, tokenizer_of)
    rng = random.Random(3)
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet".split()
    cities = ["Paris", "São Paulo", "Reykjavík", "Montréal", "Zürich", "Москва", "東京", "القاهرة", "Αθήνα"]
    for _ in range(150):
        record = {
            "sku": f"SKU-{rng.randrange(10**6):06d}",
            "title": " ".join(rng.choice(words) for _ in range(rng.randint(1, 6))).title(),
            "price": round(rng.uniform(1, 500), 2),
            "address": {"city": rng.choice(cities), "zip": f"{rng.randrange(10**5):05d}"},
            "lines": "\n".join(" ".join(rng.sample(words, 3)) for _ in range(rng.randint(0, 5))),
        }
        text = json.dumps([record] * rng.randint(1, 4), ensure_ascii=rng.random() < 0.3, indent=rng.choice([None, 2]))
        assert enc.encode(text) == ids_of(tok, text)


@pytest.mark.parametrize(("vectors", "family"), [("qwen2", "qwen2.5-instruct"), ("llama-bpe", "llama-3.2-instruct")])
def test_llama_cpp_tokenizer_vectors(vectors, family, tokenizer_of):
    """llama.cpp's tokenizer test vectors (inputs and the IDs the original HF tokenizer gave them,
    recorded by llama.cpp): the fast encoder gives those IDs for every one it serves."""
    folder = DATA / "vocab-tests"
    inp, out = folder / f"ggml-vocab-{vectors}.gguf.inp", folder / f"ggml-vocab-{vectors}.gguf.out"
    if not inp.is_file() or not out.is_file():
        pytest.skip(f"llama.cpp vectors {vectors!r} not in {folder}")
    texts = inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    expected = [[int(x) for x in line.split()] for line in out.read_text(encoding="utf-8").split("\n")]
    _, enc = _served(family, tokenizer_of)
    served = 0
    for text, ids in zip(texts, expected):
        got = enc.encode(text)
        if got is not None:
            served += 1
            assert got == ids, text
    assert served == len(texts), f"{len(texts) - served} vectors left to the tokenizer"


def test_text_the_encoder_leaves_to_the_tokenizer(tokenizer_of):
    """Unassigned code points (Python's Unicode is older than the engines'), surrogates, and texts
    over MAX_CHARS go to the tokenizer; the codec still gives its IDs."""
    tok, enc = _served("qwen2.5-instruct", tokenizer_of)
    unassigned = "a\U000e0080b"  # unassigned in every Unicode so far
    assert enc.encode(unassigned) is None
    assert enc.encode("x\ud800y") is None
    long = "word " * (MAX_CHARS // 5 + 1)
    assert enc.encode(long) is None
    codec = codec_for(tok)
    assert codec.encode(unassigned) == ids_of(tok, unassigned)
    assert codec.encode_many([long[:1000], long]) == [ids_of(tok, long[:1000]), ids_of(tok, long)]


@pytest.mark.slow
def test_a_text_the_tokenizer_refuses_gets_no_ids(tokenizer_of):
    """Twelve million spaces then "x": the tokenizer's regex engine gives up (a Rust panic); tmpl
    gives no IDs either (the text is over MAX_CHARS, the tokenizer encodes it and fails)."""
    codec = codec_for(tokenizer_of("qwen2.5-instruct"))
    assert codec.fast is not None
    text = " " * 12_000_000 + "x"
    with pytest.raises(BaseException) as caught:  # pyo3's PanicException derives from BaseException
        codec.encode(text)
    assert "retry-limit" in str(caught.value)


@pytest.mark.parametrize(
    "pattern",
    [
        r"\d+",
        r"\w+",
        r"\bword\b",
        r"\h+",
        r"^\p{L}+",
        r"\p{L}+$",
        r"(\p{L})+",
        r"(?<name>a)",
        r"(?P<w>\p{L}+)",
        r"[[:alpha:]]",
        r"[a-z&&[^aeiou]]",
        r"[]",
        r"\p{Han}",
        r"(?m:.)+",
        r"(?x) a b",
        r"(?i)'s|x",
        r"(?i:[\p{Lu}])",
        r"(?i:ss)",
        r"(?i:'ST)",
        r"(?i:ﬀ)",
        r"a{1,3}+",
        r"a*+",
        r"a++",
        r"a?+",
        r"a*?",
        r"a+?",
        r"a{99999}",
        r"a|(?=x)",
        r"a|",
        r"\p{L}*",
        r"(?>a+)b",
        r"a\1",
    ],
)
def test_the_pattern_check_refuses_what_the_engines_may_read_apart(pattern):
    with pytest.raises(Unsupported):
        check(pattern)


@pytest.mark.parametrize("pattern", [r"(?i:'s|'t)|\p{L}+|\s+", r"[\#\&\~]+|(?:ab)+|(?=x)x|\p{N}{1,3}|[a-z0-9_]"])
def test_the_pattern_check_keeps_what_both_engines_read_alike(pattern):
    check(pattern)


def test_the_build_check_catches_a_wrong_encoder(tokenizer_of, monkeypatch):
    """A split that lost its ``\\s+(?!\\S)`` alternative (white space before a word would go whole
    to the space run, not leave its last space to the word) is found by the build's own check."""
    backend = tokenizer_of("qwen2.5-instruct").backend_tokenizer
    real = fast._split_regex
    monkeypatch.setattr(fast, "_split_regex", lambda p: (real(p)[0].replace(r"|\s+(?!\S)|", "|"), True))
    built = FastEncoder.build(backend)
    assert isinstance(built, Decline) and "encodes differently" in built.reason
    monkeypatch.undo()
    assert isinstance(FastEncoder.build(backend), FastEncoder)


@pytest.mark.parametrize(
    "error",
    [re.error("bad"), OverflowError("huge repeat"), RuntimeError("anything"), ValueError("tiktoken refused")],
)
def test_the_build_never_raises_only_declines(tokenizer_of, monkeypatch, error):
    backend = tokenizer_of("llama-3.2-instruct").backend_tokenizer

    def boom(*args, **kwargs):
        raise error

    monkeypatch.setattr(fast, "check", boom)
    built = FastEncoder.build(backend)
    assert isinstance(built, Decline) and type(error).__name__ in built.reason


def test_a_warning_turned_into_an_error_declines(tokenizer_of, monkeypatch):
    """Under ``-W error`` a warning in the build is an exception: a decline, not a failing encode."""
    tok = tokenizer_of("llama-3.2-instruct")

    def warn(*args, **kwargs):
        warnings.warn("deprecated", FutureWarning, stacklevel=2)

    monkeypatch.setattr(fast, "check", warn)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        codec = Codec(tok)
        assert codec.fast is None and "FutureWarning" in (codec.fast_reason or "")
        assert codec.encode("Zürich 21.5") == ids_of(tok, "Zürich 21.5")


def test_a_truncating_tokenizer_is_left_to_encode_itself(tokenizer_of):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_of("qwen2.5-instruct").name_or_path)  # its own backend
    codec = Codec(tok)
    text = "one two three four five six seven"
    assert codec.encode(text) == ids_of(tok, text)
    tok.backend_tokenizer.enable_truncation(max_length=3)
    truncated = tok.backend_tokenizer.encode(text, add_special_tokens=False).ids
    assert len(truncated) == 3
    assert codec.encode_many([text]) == [truncated]
    assert codec.encode(text) == truncated
    tok.backend_tokenizer.no_truncation()
    assert codec.encode(text) == ids_of(tok, text)


def test_tmpl_fast_encode_0_turns_the_encoder_off(tokenizer_of, monkeypatch):
    tok = tokenizer_of("qwen2.5-instruct")
    monkeypatch.setenv("TMPL_FAST_ENCODE", "0")
    off = Codec(tok)
    assert off.fast is None and "TMPL_FAST_ENCODE=0" in (off.fast_reason or "")
    assert off.encode_many(["Zürich 21.5"]) == [ids_of(tok, "Zürich 21.5")]
    monkeypatch.delenv("TMPL_FAST_ENCODE")
    assert Codec(tok).fast is not None


@settings(max_examples=300, deadline=None)
@given(
    words=st.lists(st.text("ab<[|", min_size=1, max_size=5), min_size=1, max_size=8),
    texts=st.lists(st.text("ab<[| \n", max_size=14), max_size=8),
    rstrip=st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_the_trie_cuts_where_a_plain_alternation_cuts(words, texts, rstrip):
    """The trie-shaped pattern (fast where 1,000 added tokens share a first character) cuts a text
    exactly where a longest-first alternation of the same tokens does."""
    tokens = [(w, k, rstrip[k % 8]) for k, w in enumerate(dict.fromkeys(words))]
    trie, plain = AddedCutter(tokens), AddedCutter(tokens)
    trie.pattern = any_of([w for w, _, _ in tokens], trie=True)
    plain.pattern = any_of([w for w, _, _ in tokens], trie=False)
    for text in texts:
        assert trie.split(text) == plain.split(text)


@pytest.mark.parametrize("family", ["phi-4-mini-instruct", "mistral-nemo-instruct-2407", "qwen2.5-instruct"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.integers(0, 10**6), max_size=8))
def test_texts_of_added_tokens_and_white_space(family, tokenizer_of, parts):
    """Added tokens (Phi-4's rstrip ones swallow the white space after them), white space of every
    kind, and bits of text, in any order: the tokenizer's IDs."""
    tok, enc = _served(family, tokenizer_of)
    contents = [t.content for t in tok.backend_tokenizer.get_added_tokens_decoder().values()]
    bits = [" ", "\n", "\t", "\u3000", "\xa0", "\x85", "  ", "x", "é", "<|", "[", "'s"]
    text = "".join(contents[k % len(contents)] if k % 2 else bits[k % len(bits)] for k in parts)
    assert enc.encode(text) == ids_of(tok, text)


def test_the_checks_compare_against_the_tokenizer_not_the_encoder_they_check(tokenizer_of, monkeypatch):
    """A fast encoder gone wrong (here: one token of "Paris" swapped for another, in every text it
    is asked for, the suffix's content and a whole render alike) is caught by ``verify_every`` and by
    the drift measure: both compare against the tokenizer's own IDs (``Codec.encode_reference``)."""
    from tmpl.backends import Scripted
    from tmpl.rollout.drift import rerender_drift

    tok = tokenizer_of("qwen2.5-instruct")
    tpl = tmpl.ChatTemplate(tok, name="qwen2.5")
    enc = tpl.codec.fast
    assert enc is not None
    paris = ids_of(tok, "Paris")[-1]
    real = enc.encode

    def wrong(text):
        ids = real(text)
        if ids is None:
            ids = ids_of(tok, text)
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
            return ids_of(
                tok, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
            )
        return ids_of(tok, "Done.<|im_end|>")

    convo = [[{"role": "user", "content": "Weather?"}]]
    good = tmpl.Rollout(tpl, Scripted(policy), tools=[get_weather], max_turns=3, verify_every=1).run(convo)[0]
    assert good.status.name == "DONE", good.reason
    monkeypatch.setattr(enc, "encode", wrong)
    bad = tmpl.Rollout(tpl, Scripted(policy), tools=[get_weather], max_turns=3, verify_every=1).run(convo)[0]
    assert bad.code.name == "VERIFY_FAILED", (bad.code, bad.reason)
    ids = good.prompt_ids.tolist() + good.completion_ids.tolist()
    schemas = tmpl.Rollout(tpl, Scripted(policy), tools=[get_weather]).tool_schemas
    drift, _ = rerender_drift(tpl, good.messages, ids, tools=schemas)
    assert drift is False


def test_python_unicode_is_what_the_guard_assumes():
    """The guard's table comes from this Python's ``unicodedata`` (3.11: Unicode 14)."""
    assert unicodedata.unidata_version >= "14.0.0" and sys.maxunicode == 0x10FFFF
