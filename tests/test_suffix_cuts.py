"""Boundary cuts (tmpl/suffix/cuts.py): a tool content encoded without its frame text.

Every suffix here is checked against a full ``apply_chat_template`` render (``check_turn``), on
both twins, for contents whose edge characters take a cut and for contents whose edges must
not (the whole run is encoded then). Which path a content takes is read off the tokenizers'
own split rules (``[^\\r\\n\\p{L}\\p{N}]?\\p{L}+`` joins one leading non-letter to a word;
``[^\\s\\p{L}\\p{N}]+[\\r\\n]*`` joins punctuation to the newlines after it), not from tmpl.
"""

from __future__ import annotations

import random

import pytest

import tmpl
from tmpl.suffix import clear_caches

from .contract import HISTORIES, assistant_turn, check_turn, tool_results

FAST = ["qwen2.5-instruct", "llama-3.2-instruct", "mistral-nemo-instruct-2407"]


@pytest.fixture
def fresh():
    """Each test probes (and verifies cuts) from scratch, under the current twin."""
    clear_caches()
    yield
    clear_caches()


def _run_plan(tpl: tmpl.ChatTemplate, results: list[dict]):
    """The one dynamic run of a one-result suffix and what a call encodes for it."""
    engine = tpl.engine
    frame = engine.frame(results, None)
    layout, fns = engine.plan(frame, results)
    assert len(layout.runs) == 1
    run = layout.runs[0]
    return run, run.plan(results, fns)


def _check(tpl: tmpl.ChatTemplate, content: str):
    """Check the suffix of one result against the full render; return (head cut?, tail cut?)."""
    assistant = assistant_turn(1)
    results = tool_results(assistant, [content])
    check_turn(tpl, HISTORIES["user"], assistant, results)
    run, (text, pre, drop, post) = _run_plan(tpl, results)
    head = drop == 0 and not text.startswith(run.anchor)
    return head, bool(post), text


def test_pipelines_that_can_be_cut(tokenizer_of):
    """Regex-split byte-level BPE can be cut; SentencePiece-style pipelines (BPE across spaces)
    cannot, nor Phi-4's, whose <|end|> strips the whitespace after it."""
    for family in FAST + ["qwen3", "deepseek-v3", "gpt-oss"]:
        assert tmpl.ChatTemplate(tokenizer_of(family), name=family).codec.regex_byte_level, family
    for family in ["gemma-2-it", "gemma-3-it", "phi-3-mini-4k-instruct", "phi-4-mini-instruct"]:
        assert not tmpl.ChatTemplate(tokenizer_of(family), name=family).codec.regex_byte_level, family


def test_no_cut_where_an_added_token_could_straddle(tokenizer_of):
    codec = tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct")).codec
    assert not codec.straddle_free("result: <|im_", at_end=True)  # "<|im_" + "end|>" would be one token
    assert not codec.straddle_free("end|>\n", at_end=False)
    assert codec.straddle_free("<tool_response>\n", at_end=True)


# (content, head cut taken, tail cut taken) on Qwen2.5: "user\n<tool_response>\n" CONTENT "\n</tool_response>"
QWEN = [
    ("21.5 C sun", True, True),
    ('{"city": "Paris"}', True, True),  # "}" joins the "\n" after it: cut after that "\n" instead
    ("Zürich 雨", True, True),
    ("\u0301accent first", False, True),  # a combining mark: never cut next to
    ("ends with a zero-width space\u200b", True, False),  # a format character (Cf): never cut next to
    ("  padded both sides \n", True, True),  # spaces after ">\n" and "\n" before "\n</": still split there
    ("\u0301 both edges \u200b", False, False),
]


def test_qwen_edges(twin, fresh, tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"), name="qwen2.5-instruct")
    for content, head, tail in QWEN:
        assert _check(tpl, content)[:2] == (head, tail), content


def test_llama_cuts_before_the_json_string(twin, fresh, tokenizer_of):
    """Llama 3.2 writes the content as a JSON string after "\\n\\n": its first character is always '"'."""
    tpl = tmpl.ChatTemplate(tokenizer_of("llama-3.2-instruct"), name="llama-3.2-instruct")
    for content in ["21.5 C sun", "\u0301accent first", "'s 're", "12345 digits", "漢字"]:
        head, tail, text = _check(tpl, content)
        assert head and text.startswith('"'), content


def test_mistral_cuts_before_or_after_the_space(twin, fresh, tokenizer_of):
    """Mistral Nemo: '{"content": ' CONTENT. The space joins a following word or punctuation
    (the cut goes before it) but not a digit (the cut goes after it)."""
    tpl = tmpl.ChatTemplate(tokenizer_of("mistral-nemo-instruct-2407"), name="mistral-nemo-instruct-2407")
    for content, encoded_from in [("21.5 C sun", "21.5"), ("sunny", " sunny"), ('{"a": 1}', ' {"a"'), ("«x»", " «")]:
        head, _, text = _check(tpl, content)
        assert head and text.startswith(encoded_from), (content, text)
    head, _, _ = _check(tpl, "\u0301accent first")
    assert not head


PIECES = [
    "a", "Z", "word", "é", "漢字", "🙂", "1", "12345", " ", "  ", "\n", "\t", "\r\n", "'s", "'re", "'", "{", "}",
    '"', "\\", ".", "!!", "\u0301", "\u200b", "ǅ", "²", "—", "«", "»", "€", "˜", "ʰ", "٣", "<b>", "</tool_response>",
]  # fmt: skip


@pytest.mark.parametrize("family", FAST)
def test_random_contents_match_full_renders(twin, fresh, family, tokenizer_of):
    """Random contents built from edge-sensitive pieces (contractions, digit runs, combining marks,
    whitespace, punctuation, non-ASCII categories): every suffix equals the full render's."""
    tpl = tmpl.ChatTemplate(tokenizer_of(family), name=family)
    rng = random.Random(13)
    cut = 0
    for _ in range(60):
        content = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 6)))
        head, tail, _ = _check(tpl, content)
        cut += head or tail
    assert cut > 20  # the cuts are exercised, not only the whole-run path


def test_batch_takes_the_same_cuts(twin, fresh, tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"), name="qwen2.5-instruct")
    assistant = assistant_turn(1)
    batch = [tool_results(assistant, [content]) for content, _, _ in QWEN]
    stop = [next(iter(tpl.stop_token_ids))]
    singles = [tpl.suffix_ids(results, completion_ids=stop) for results in batch]
    assert tpl.suffix_ids_batch(batch, completion_ids=[stop] * len(batch)) == singles
