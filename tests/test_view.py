"""tmpl view without a browser: what the page carries (every array exact), bad input named by line and field,
Parquet read as JSONL, samples picked with a note, memory bounded on a large export, drift re-rendered
against the template's full render, and ``tmpl matrix --html`` linking cells to counterexamples.

The browser tests (what a person sees) are in tests/test_view_browser.py.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest

import tmpl
from tmpl import export
from tmpl.backends import GenerationResult, Scripted
from tmpl.cli import main
from tmpl.episode import Call, Episode
from tmpl.episode.records import to_record
from tmpl.errors import ViewError
from tmpl.view import write_page
from tmpl.view.read import count_items, detect_format, iter_items

#: a tool result that would run script if the page put it into the DOM as HTML
HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"></script><!--'


def lookup(query: str) -> str:
    """Look something up.

    Args:
        query: What to look for.
    """
    return f"{HOSTILE} results for {query}"


def get_weather(city: str) -> str:
    """Current weather.

    Args:
        city: The city.
    """
    return f"{city}: 21 C, sunny"


TOOLS = [lookup, get_weather]
SCHEMAS = tmpl.Toolbox(TOOLS).schemas


def _tpl():
    from .conftest import load_tokenizer

    return tmpl.ChatTemplate(load_tokenizer("qwen2.5-instruct"), name="qwen2.5")


def make_export(folder: Path) -> tuple[Path, list[dict], object]:
    """A JSONL export of Qwen2.5 rollouts (scripted completions, real tokenizer and template):

    row 0: a tool round with the hostile result, then an answer; row 1: a call written without spaces (the
    template re-serializes it: drift); row 2: a direct answer (masked out of the loss as stale); row 3: an aborted generation; row 4: a sample
    with an episode of three calls (a; b, a sub-agent of a; c, a branch from a: a compaction). Returns (path, records, template).
    """
    tpl = _tpl()
    spaced = tpl.codec.encode('<tool_call>\n{"name": "lookup", "arguments": {"query": "rain"}}\n</tool_call><|im_end|>')
    tight = tpl.codec.encode('<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call><|im_end|>')
    final = tpl.codec.encode("It will rain <b>today</b>.<|im_end|>")
    rng = np.random.default_rng(3)

    def policy(req):
        i, _, turn = (int(x) for x in req.request_id.split("-"))
        if i == 3:
            return GenerationResult.failed(req.request_id, "engine went away")
        ids = {0: spaced, 1: tight}.get(i, final) if turn == 0 else final
        return ids, (-rng.random(len(ids)) * 4).astype(np.float32).tolist()

    rollout = tmpl.Rollout(tpl, Scripted(policy), tools=TOOLS, max_turns=3, max_length=2048, measure_drift=True)
    convs = [[{"role": "user", "content": f"Question {k} <i>italic</i>?"}] for k in range(4)]
    results = rollout.run(convs)
    records = export.to_records(results)
    # row 4: an episode whose second sequence branched (the history was compacted)
    base = records[2]
    ids = base["prompt_ids"] + base["completion_ids"]
    ep = Episode(sample_id="ep")
    ep.add_call(Call(base["prompt_ids"], base["completion_ids"][:5], [-0.5] * 5, id="a"))
    ep.add_call(Call(ids[:7], [21, 22], [-0.3, -0.4], id="b", parent="a", agent="helper"))  # a sub-agent of a
    summary = tpl.codec.encode("Summary.")[:1]
    ep.add_call(Call(ids[:10] + summary, [11, 12, 13], [-0.1, -0.2, -0.3], id="c"), edit="compaction")
    records.append({**base, "index": 4, "episode": to_record(ep), "reward": 0.75})
    records[0]["reward"], records[1]["reward"] = 1.0, 0.0
    # row 2 sampled by version 1 and ended under version 3: max_staleness masked it out of the loss
    r2 = records[2]
    r2.update(version=3, staleness=2, stale_action="mask", loss_mask=[0] * len(r2["mask"]))
    r2["versions"] = [1 if m else -1 for m in r2["mask"]]
    path = folder / "rollouts.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path, records, tpl


@functools.lru_cache(maxsize=1)
def shared_export() -> tuple[Path, list[dict], object]:
    """:func:`make_export` once per process (this module and the browser tests read the same file)."""
    return make_export(Path(tempfile.mkdtemp(prefix="tmpl-view-")))


@pytest.fixture(scope="module")
def exported():
    path, records, tpl = shared_export()
    return path, copy.deepcopy(records), tpl


def details(page: Path) -> dict[int, dict]:
    """Each sample's detail as the page carries it (the data elements, parsed as the page parses them)."""
    text = page.read_text(encoding="utf-8")
    found = re.findall(r'<script type="application/json" id="s(\d+)">(.*?)</script>', text)
    return {int(k): json.loads(v) for k, v in found}


def summary_of(page: Path) -> dict:
    text = page.read_text(encoding="utf-8")
    return json.loads(re.search(r'<script type="application/json" id="tmpl-summary">(.*?)</script>', text).group(1))


def unb64(text: str, dtype: str) -> list:
    return np.frombuffer(base64.b64decode(text), dtype).tolist()


def test_page_carries_every_sample_exactly(exported, tmp_path):
    path, records, tpl = exported
    page = tmp_path / "view.html"
    summary = write_page(path, page, tpl=tpl, tools=SCHEMAS)
    assert (summary.shown, summary.total, summary.problem_count) == (len(records), len(records), 0)
    got = details(page)
    assert sorted(got) == list(range(len(records)))
    for k, r in enumerate(records):
        d = got[k]
        assert unb64(d["ids"], "<i4") == r["prompt_ids"] + r["completion_ids"]
        assert d["np"] == len(r["prompt_ids"])
        assert unb64(d["mask"], "<u1") == r["mask"]
        assert d["loss"] is None if r["loss_mask"] == r["mask"] else unb64(d["loss"], "<u1") == r["loss_mask"]
        assert d["ver"] is None if max(r["versions"], default=-1) < 0 else unb64(d["ver"], "<i4") == r["versions"]
        assert unb64(d["lp"], "<f4") == pytest.approx(r["logprobs"], abs=0)  # float32 both sides
        assert d["messages"] == r["messages"]
        assert d["spans"] == [[s["kind"], s["turn"], s["message"], s["start"], s["end"]] for s in r["spans"]]
    cols = summary_of(page)["columns"]
    assert cols["status"] == [r["status"] for r in records]
    assert cols["drift"] == [r["drift"] for r in records]
    assert cols["length"] == [len(r["prompt_ids"]) + len(r["completion_ids"]) for r in records]
    assert cols["reward"][:2] == [1.0, 0.0] and cols["reward"][4] == 0.75
    assert cols["staleness"][2] == 2 and cols["version"][2] == 3
    assert summary_of(page)["version_tokens"] == {"1": sum(records[2]["mask"])} | (
        {"0": sum(sum(r["mask"]) for k, r in enumerate(records) if k != 2 and max(r["versions"], default=-1) == 0)}
    )
    # the hostile tool result is carried (as data) but never as markup the HTML parser would read
    assert any(HOSTILE in str(m.get("content")) for m in got[0]["messages"] if m["role"] == "tool")
    text = page.read_text(encoding="utf-8")
    assert "window.__pwned" in text and "<script>window.__pwned" not in text and "<img src=x" not in text
    assert text.count("<script") == len(records) + 2  # the data elements, the summary, the page's own script


def test_vocab_is_the_tokenizers_text_of_every_id(exported, tmp_path):
    path, records, tpl = exported
    page = tmp_path / "view.html"
    write_page(path, page, tpl=tpl)
    vocab = summary_of(page)["vocab"]
    ids = {t for r in records for t in r["prompt_ids"] + r["completion_ids"]}
    assert set(map(int, vocab)) == ids
    for t in list(ids)[:200]:
        assert vocab[str(t)] == tpl.tokenizer.decode([t])


def test_drift_is_shown_with_the_full_renders_ids(exported, tmp_path):
    """The drifted sample (a call the template re-serializes): the page's re-rendered IDs are the template's
    full render (apply_chat_template) from the drift position, the kept ones the sample's."""
    path, records, tpl = exported
    drifted = [k for k, r in enumerate(records) if r["drift"]]
    assert drifted == [1] and records[1]["drift_cause"] == "json_reserialized"
    page = tmp_path / "view.html"
    write_page(path, page, tpl=tpl, tools=SCHEMAS)
    d = details(page)[1]["drift"]
    r = records[1]
    full = tpl.tokenizer.apply_chat_template(
        r["messages"], tools=SCHEMAS, tokenize=True, add_generation_prompt=False, return_dict=False
    )
    p = r["drift_position"]
    kept = r["prompt_ids"] + r["completion_ids"]
    assert d["position"] == p and full[:p] == kept[:p] and full[p] != kept[p]
    assert d["rendered_ids"] == list(full[p : p + 16])
    assert d["cause"] == "json_reserialized" and d["ours"] == r["drift_ours"]


def test_bad_input_is_named_by_line_and_field_and_the_rest_is_shown(exported, tmp_path, capsys):
    path, records, _ = exported
    good = path.read_text(encoding="utf-8").splitlines()
    short_mask = json.loads(good[1])
    short_mask["mask"] = short_mask["mask"][:3]
    other = {"format": "someone.else.v9", "prompt_ids": [1, 2], "completion_ids": "abc"}
    lines = [good[0], good[2][: len(good[2]) // 2], json.dumps(short_mask), json.dumps(other), "[1, 2]", good[3]]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n" + good[4][:50], encoding="utf-8")  # the last line cut: a truncated file
    page = tmp_path / "bad.html"
    assert main(["view", str(bad), "-o", str(page)]) == 1
    err = capsys.readouterr().err
    assert "bad.jsonl:2: not JSON" in err
    n = len(records[1]["completion_ids"])
    assert f"bad.jsonl:3: mask: has 3 entries but completion_ids has {n}" in err
    assert "bad.jsonl:4: format: 'someone.else.v9'" in err and "bad.jsonl:4: completion_ids: not an array" in err
    assert "bad.jsonl:5: a JSON list, not a record" in err
    assert "bad.jsonl:7: not JSON" in err and "truncated file?" in err
    s = summary_of(page)
    assert s["meta"]["shown"] == 4  # lines 1, 3, 4 and 6: the rest, shown
    assert [p["where"] for p in s["problems"]][:2] == ["bad.jsonl:2", "bad.jsonl:3"]
    shown = details(page)
    assert shown[1]["mask"] is None and unb64(shown[1]["ids"], "<i4")[-1] == records[1]["completion_ids"][-1]


@pytest.mark.parametrize(
    "name, data, says",
    [
        ("rollouts.csv", b"index,sample,status\n0,0,DONE\n", "rollouts.csv:1: text starting 'index,sample,status"),
        ("image.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "image.png:1: binary data, not a JSON record"),
        ("empty.jsonl", b"", "empty.jsonl:1: the file is empty"),
        ("array.json", b'[{"format": "tmpl.rollout.v1"}]', "a JSON array, not JSON lines"),
    ],
)
def test_a_file_of_another_format_is_refused_naming_it(tmp_path, capsys, name, data, says):
    f = tmp_path / name
    f.write_bytes(data)
    assert main(["view", str(f), "-o", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tmpl view: ") and says in err[0], err
    assert not (tmp_path / "x.html").exists()
    assert main(["view", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl: does not exist" in capsys.readouterr().err


def test_parquet_and_gzip_read_as_the_jsonl(exported, tmp_path):
    pytest.importorskip("datasets")
    path, records, _ = exported
    results = export.from_jsonl(path)
    pq = tmp_path / "rollouts.parquet"
    export.to_dataset(results[:4]).to_parquet(str(pq))
    gz = tmp_path / "rollouts.jsonl.gz"
    export.to_jsonl(results[:4], gz)
    assert detect_format(pq) == "parquet" and detect_format(gz) == "jsonl" and count_items(pq) == 4
    pages = {}
    for src in (pq, gz, path):
        pages[src.suffix] = tmp_path / f"{src.name}.html"
        write_page(src, pages[src.suffix])
    want = details(pages[".jsonl"])
    for suffix in (".parquet", ".gz"):
        got = details(pages[suffix])
        assert sorted(got) == [0, 1, 2, 3]
        for k in got:
            a, b = dict(got[k]), dict(want[k])
            assert a.pop("where") != b.pop("where")
            assert a == b, (suffix, k)


def test_max_samples_picks_spread_or_first_and_says_so(exported, tmp_path, capsys):
    path, records, _ = exported
    lines = path.read_text(encoding="utf-8").splitlines()
    many = tmp_path / "many.jsonl"
    with open(many, "w", encoding="utf-8") as f:
        for k in range(20):
            r = json.loads(lines[k % 3])
            r["index"] = k
            f.write(json.dumps(r) + "\n")
    page = tmp_path / "many.html"
    assert main(["view", str(many), "-o", str(page), "--max-samples", "6"]) == 0
    s = summary_of(page)
    assert s["columns"]["index"] == [0, 4, 8, 12, 16]  # every 4th (ceil(20 / 6)) over the whole file
    assert "shows 5 of the 20 samples" in s["meta"]["note"] and "every 4th" in s["meta"]["note"]
    assert "shows 5 of the 20 samples" in capsys.readouterr().err
    assert main(["view", str(many), "-o", str(page), "--max-samples", "6", "--pick", "first"]) == 0
    assert summary_of(page)["columns"]["index"] == [0, 1, 2, 3, 4, 5]
    assert main(["view", str(many), "-o", str(page), "--max-samples", "0"]) == 0
    assert summary_of(page)["meta"]["note"] == "" and len(details(page)) == 20


def _peak_rss() -> int:
    return int(re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def test_a_large_export_is_streamed_in_bounded_memory(tmp_path):
    """A 15 MB export (420 samples of 2,000 tokens): writing its page, all samples kept, raises this process's
    peak memory by a few records' worth, never by the file (peak RSS reset through /proc/self/clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pytest.skip("cannot reset the peak RSS here (/proc/self/clear_refs)")
    rng = np.random.default_rng(0)
    big = tmp_path / "big.jsonl"
    n_tok = 2000
    ids = rng.integers(0, 150000, n_tok).tolist()
    mask = ([1] * 40 + [0] * 10) * (n_tok // 50)
    lps = np.round(-rng.random(n_tok), 4).tolist()
    with open(big, "w", encoding="utf-8") as f:
        for k in range(420):
            rec = {
                "format": "tmpl.rollout.v1",
                "index": k,
                "sample": 0,
                "prompt_ids": ids[:200],
                "completion_ids": ids[200:],
                "mask": mask[200:],
                "logprobs": lps[200:],
                "status": "DONE",
                "reason": "",
                "messages": [{"role": "user", "content": "x" * 100}],
                "spans": [],
                "max_length": 8192,
                "max_completion_length": None,
                "drift": None,
            }
            f.write(json.dumps(rec) + "\n")
    size = big.stat().st_size
    assert size > 14e6
    Path("/proc/self/clear_refs").write_text("5")  # the peak is now what is resident
    base = _peak_rss()
    summary = write_page(big, tmp_path / "big.html", max_samples=None)
    growth = _peak_rss() - base
    assert summary.shown == 420 and (tmp_path / "big.html").stat().st_size > size / 3
    assert growth < min(size / 4, 6e6), (growth, size)


def test_iter_items_streams_problems_and_records_in_order(exported, tmp_path):
    path, records, _ = exported
    items = list(iter_items(path))
    assert [i.where for i in items] == [f"rollouts.jsonl:{k + 1}" for k in range(len(records))]
    assert all(i.problem is None for i in items)
    with pytest.raises(ViewError, match="is a folder"):
        detect_format(tmp_path)


def test_matrix_html_links_each_failed_verdict_to_its_counterexample(tmp_path):
    """``tmpl matrix --html`` on a Qwen2.5 template that forgets earlier assistant content: the tool-loop cell
    links to a section holding that check's counterexample, as ``tmpl check`` prints it."""
    from tmpl.report.matrix import run_matrix, sources_from_paths, to_html
    from tmpl.report.search import counterexample_text

    from .conftest import family_source

    folder = family_source("qwen2.5-instruct")
    if folder is None:
        pytest.skip("the qwen2.5-instruct tokenizer is not under TMPL_TEST_DATA")
    template = json.loads((Path(folder) / "tokenizer_config.json").read_text())["chat_template"]
    old = "{{- '\\n' + message.content }}"
    assert old in template
    forgets = tmp_path / "forgets.jinja"
    forgets.write_text(template.replace(old, "{{- '\\n' + (message.content if loop.last else 'earlier turn') }}"))
    [row] = run_matrix(sources_from_paths([str(forgets)], tokenizer=folder), progress=False)
    from tmpl.cli import gated_level

    assert gated_level(row.report.verdicts["tool_loop"]) == "UNSAFE"  # "SAFE WITH tmpl TEMPLATE qwen2.5"
    page = to_html([row])
    links = re.findall(r'<a href="#(ce-0-[a-z_]+)"', page)
    failed = [u for u in ("tool_loop", "multi_user") if gated_level(row.report.verdicts[u]) == "UNSAFE"]
    assert links == [f"ce-0-{u}" for u in failed] and "ce-0-tool_loop" in links
    section = re.search(r'<section id="ce-0-tool_loop"><h2>(.*?)</h2><pre>(.*?)</pre>', page, re.S)
    name = section.group(1).split("(")[-1].rstrip(")")
    assert section.group(1).startswith("forgets.jinja: tool loop")
    import html

    assert html.unescape(section.group(2)) == counterexample_text(row.report.counterexamples()[name])
    from tmpl.cli import build_parser

    assert build_parser().parse_args(["matrix", "--html"]).format == "html"  # --html is --format html


def test_the_gateways_episode_lines_are_shown_as_samples(tmp_path):
    """``tmpl.export.episodes_to_jsonl`` lines: one sample per episode, every sequence's IDs and mask carried."""
    ep = Episode(sample_id="s1")
    ep.add_call(Call([1, 2, 3], [4, 5], [-0.5, -0.2], id="a"))
    ep.add_call(Call([1, 2, 3, 4, 5, 6], [7], [-0.1], id="b"))
    ep.add_call(Call([1, 9], [8], [-0.1], id="c"), edit="compaction")
    path = export.episodes_to_jsonl([ep], tmp_path / "episodes.jsonl")
    page = tmp_path / "episodes.html"
    assert main(["view", str(path), "-o", str(page)]) == 0
    [d] = details(page).values()
    seqs = d["episode"]["sequences"]
    assert [unb64(s["ids"], "<i4") for s in seqs] == [s.ids.tolist() for s in ep.sequences]
    assert [unb64(s["mask"], "<u1") for s in seqs] == [s.mask.tolist() for s in ep.sequences]
    assert [s["branch"]["edit"] for s in seqs] == [None, "compaction"]
    assert unb64(d["ids"], "<i4") == ep.sequences[-1].ids.tolist()
    assert summary_of(page)["columns"]["sequences"] == [2]
