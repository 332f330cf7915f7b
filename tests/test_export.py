"""Export of rollouts: JSON Lines and datasets (Parquet) written, read back, identical."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

import tmpl
from tmpl import export
from tmpl.backends import GenerationResult, Scripted
from tmpl.errors import ExportError

from .test_rollout import FUNCS


@pytest.fixture(scope="module")
def rolled():
    """Three samples of real Qwen2.5 rollouts: one with two tool rounds, one direct answer, one aborted."""
    from .conftest import load_tokenizer

    tpl = tmpl.ChatTemplate(load_tokenizer("qwen2.5-instruct"), name="qwen2.5")
    call = tpl.codec.encode(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        '<tool_call>\n{"name": "search_web", "arguments": {"query": "rain \\"now\\"", '
        '"max_results": 2}}\n</tool_call><|im_end|>'
    )
    final = tpl.codec.encode("Sunny, 21 °C — no rain.<|im_end|>")
    rng = np.random.default_rng(7)

    def policy(req):
        i, _, turn = (int(x) for x in req.request_id.split("-"))
        if i == 2:
            return GenerationResult.failed(req.request_id, "engine went away")
        ids = call if (i == 0 and turn < 2) else final
        return ids, (-rng.random(len(ids)) * 5).astype(np.float32).tolist()  # logprobs that are not round numbers

    rollout = tmpl.Rollout(tpl, Scripted(policy), tools=FUNCS, max_turns=4, max_length=4096, max_completion_length=1024)
    results = rollout.run([[{"role": "user", "content": f"Weather {k}? ünïcødé"}] for k in range(3)])
    assert [r.status.name for r in results] == ["DONE", "DONE", "ABORTED"]
    assert results[0].tool_calls == 4 and 0 in results[0].mask and results[0].mask.sum() > 0
    return results, rollout.metrics


def _assert_same(a, b):
    for key in ("prompt_ids", "completion_ids", "mask", "logprobs"):
        x, y = getattr(a, key), getattr(b, key)
        assert x.dtype == y.dtype, key
        assert np.array_equal(x, y), key
    assert (
        a.index,
        a.sample,
        a.status,
        a.reason,
        a.turns,
        a.tool_calls,
        a.tool_failures,
        a.finish_reason,
        a.drift,
    ) == (b.index, b.sample, b.status, b.reason, b.turns, b.tool_calls, b.tool_failures, b.finish_reason, b.drift)
    assert a.spans == b.spans
    assert a.messages == b.messages
    assert a.trajectory.tokens_cut == b.trajectory.tokens_cut
    assert a.trajectory.max_new_tokens() == b.trajectory.max_new_tokens()


@pytest.mark.parametrize("name", ["rollouts.jsonl", "rollouts.jsonl.gz"])
def test_jsonl_round_trip_is_identical(rolled, tmp_path, name):
    results, metrics = rolled
    path = export.to_jsonl(results, tmp_path / name, metrics=metrics)
    back = export.from_jsonl(path)
    assert len(back) == len(results)
    for a, b in zip(results, back):
        _assert_same(a, b)
    # what is on disk is plain JSON any trainer can read, one sample per line
    if name.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            raw = f.read()
    else:
        raw = path.read_text(encoding="utf-8")
    lines = raw.splitlines()
    assert len(lines) == 3
    first = json.loads(lines[0])
    assert first["completion_ids"] == results[0].completion_ids.tolist()
    assert first["mask"] == results[0].mask.tolist()
    assert first["status"] == "DONE" and json.loads(lines[2])["status"] == "ABORTED"
    assert "engine went away" in json.loads(lines[2])["reason"]
    assert first["run_metrics"]["rollout/tool_calls"] == metrics.tool_calls == 4
    assert first["messages"][2]["role"] == "tool"


def test_read_back_trajectories_collate_like_the_originals(rolled, tmp_path):
    results, _ = rolled
    back = export.from_jsonl(export.to_jsonl(results[:2], tmp_path / "r.jsonl"))
    before = tmpl.collate_arrays([r.trajectory for r in results[:2]], pad_id=0)
    after = tmpl.collate_arrays([r.trajectory for r in back], pad_id=0)
    for key in before:
        assert np.array_equal(before[key], after[key]), key


def test_dataset_and_parquet_round_trip(rolled, tmp_path):
    datasets = pytest.importorskip("datasets")
    results, metrics = rolled
    ds = export.to_dataset(results, metrics=metrics)
    assert len(ds) == 3
    assert ds.features["completion_ids"].feature.dtype == "int32"
    assert ds.features["logprobs"].feature.dtype == "float32"
    assert ds[0]["status"] == "DONE" and ds[2]["status"] == "ABORTED"
    assert json.loads(ds[0]["messages"]) == results[0].messages
    for a, b in zip(results, export.from_dataset(ds)):
        _assert_same(a, b)
    ds.to_parquet(str(tmp_path / "r.parquet"))
    again = datasets.Dataset.from_parquet(str(tmp_path / "r.parquet"))
    assert again[1]["run_metrics"]["rollout/done"] == 2.0
    for a, b in zip(results, export.from_dataset(again)):
        _assert_same(a, b)


def test_bad_files_name_the_line(rolled, tmp_path):
    results, _ = rolled
    path = export.to_jsonl(results, tmp_path / "r.jsonl")
    lines = path.read_text(encoding="utf-8").splitlines()
    record = json.loads(lines[1])
    record["mask"] = record["mask"][:-1]
    lines[1] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ExportError, match=r"r\.jsonl:2: mask has \d+ entries but completion_ids has \d+"):
        export.from_jsonl(path)
    path.write_text(json.dumps({"format": "other"}) + "\n", encoding="utf-8")
    with pytest.raises(ExportError, match="r.jsonl:1: format 'other'"):
        export.from_jsonl(path)
    with pytest.raises(ExportError, match=r"results\[0\]: expected a tmpl.RolloutResult"):
        export.to_records([results[0].trajectory])
