"""Drift explained: each cause constructed on a real template, found at the right token, decoded."""

from __future__ import annotations

import pytest

import tmpl
from tmpl import export
from tmpl.backends import Scripted
from tmpl.rollout.drift import DriftCause, chosen, explain_drift, first_difference

from .conftest import load_tokenizer
from .test_rollout import FUNCS, SCHEMAS

USER = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'


def _tpl(family: str) -> tmpl.ChatTemplate:
    return tmpl.ChatTemplate(load_tokenizer(family), name=family)


def _render(tpl, messages, gen: bool, **kwargs) -> list[int]:
    """The template's full render, tokenized by the tokenizer itself (not by tmpl)."""
    out = tpl.tokenizer.apply_chat_template(
        messages, chat_template=tpl.template, tokenize=True, add_generation_prompt=gen, **kwargs
    )
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


def _rollout(tpl, turns: list[list[int]], status: str = "DONE", **kwargs):
    """One sample whose k-th generation is ``turns[k]`` (IDs), drift measured on it."""

    def policy(req):
        return turns[min(int(req.request_id.split("-")[-1]), len(turns) - 1)]

    rollout = tmpl.Rollout(tpl, Scripted(policy), tools=FUNCS, max_turns=4, measure_drift=True, **kwargs)
    [r] = rollout.run([USER])
    assert r.status.name == status, r.reason
    return r, rollout


def test_json_key_order_is_json_reserialized():
    tpl = _tpl("qwen2.5-instruct")
    enc = tpl.codec.encode
    r, rollout = _rollout(
        tpl,
        [
            enc('<tool_call>\n{"arguments": {"city": "Paris"}, "name": "get_weather"}\n</tool_call><|im_end|>'),
            enc("Sunny.<|im_end|>"),
        ],
    )
    d = r.drift_detail
    assert r.drift is True and d.cause is DriftCause.JSON_RESERIALIZED
    assert d.ours == '{"arguments": {"city": "Paris"}, "name": "get_weather"}'
    assert d.rendered == '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    ours = r.prompt_ids.tolist() + r.completion_ids.tolist()
    rendered = _render(tpl, r.messages, False, tools=SCHEMAS)  # what a trainer re-rendering the text gets
    assert ours[: d.position] == rendered[: d.position] and ours[d.position] != rendered[d.position]
    assert rollout.metrics.drift_causes == {"json_reserialized": 1}
    assert rollout.metrics.to_dict()["rollout/drift/rate/json_reserialized"] == 1.0


def test_json_spacing_is_json_reserialized():
    tpl = _tpl("qwen2.5-instruct")
    enc = tpl.codec.encode
    r, _ = _rollout(
        tpl,
        [
            enc('<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call><|im_end|>'),
            enc("Sunny.<|im_end|>"),
        ],
    )
    assert r.drift_detail.cause is DriftCause.JSON_RESERIALIZED
    assert r.drift_detail.ours == '{"name": "get_weather", "arguments": {"city":"Paris"}}'


def test_stripped_answer_is_whitespace():
    tpl = _tpl("qwen2.5-instruct")
    r, _ = _rollout(tpl, [tpl.codec.encode("  Sunny.  \n<|im_end|>")])
    d = r.drift_detail
    assert d.cause is DriftCause.WHITESPACE
    assert d.ours.startswith("  Sunny.  \n") and d.rendered.startswith("Sunny.<|im_end|>")


def test_same_text_other_tokens_is_bpe_merge():
    tpl = _tpl("qwen2.5-instruct")
    enc = tpl.codec.encode
    split = enc("Sun") + enc("ny and warm.") + enc("<|im_end|>")
    assert enc("Sunny and warm.<|im_end|>") != split  # the tokenizer merges across the split
    r, _ = _rollout(tpl, [split])
    d = r.drift_detail
    assert d.cause is DriftCause.BPE_MERGE and d.ours == d.rendered and "Sun" in d.ours


def test_dropped_think_block_is_reasoning_stripped():
    """Qwen3 drops the reasoning of assistant turns before the last user message."""
    tpl = _tpl("qwen3")
    first = USER + [{"role": "assistant", "content": "Sunny.", "reasoning_content": "Look it up."}]
    ours = _render(tpl, first, False)  # the turn as generated (rendered as the last turn)
    later = _render(tpl, first + [{"role": "user", "content": "And tomorrow?"}], True)
    d = explain_drift(tpl, ours, later)
    assert d.cause is DriftCause.REASONING_STRIPPED
    assert "<think>" in d.ours and "Look it up." in d.ours and "Look it up." not in d.rendered
    assert ours[: d.position] == later[: d.position] and ours[d.position] != later[d.position]


def test_other_stop_token_is_turn_close():
    """Llama 3.2: a turn the model closed with <|eom_id|> (no stop token here) is re-rendered with <|eot_id|>."""
    tpl = _tpl("llama-3.2-instruct")
    enc = tpl.codec.encode
    r, _ = _rollout(tpl, [enc("Sunny.<|eom_id|>")], status="TRUNCATED")
    d = r.drift_detail
    assert d.cause is DriftCause.TURN_CLOSE and "<|eom_id|>" in d.ours and "<|eot_id|>" in d.rendered


def test_date_is_render_time_value():
    """Llama 3.2 writes today's date into the system block unless ``date_string`` pins it."""
    tpl = _tpl("llama-3.2-instruct")
    ours = _render(tpl, USER, True, date_string="26 Jul 2024")
    rendered = _render(tpl, USER, True)
    if ours == rendered:  # pragma: no cover - only on 26 July 2024
        pytest.skip("today is the pinned date")
    d = explain_drift(tpl, ours, rendered)
    assert d.cause is DriftCause.RENDER_TIME_VALUE and "2024" in d.ours


@pytest.mark.parametrize("other", ["26 Nov 2026", "3 Mar 2025", "26 Jul 2025"])
def test_a_date_is_a_render_time_value_whatever_it_shares_with_the_other(other):
    """Two renders of dates that share their day (or day and month) differ only after it: still a date."""
    tpl = _tpl("llama-3.2-instruct")
    d = explain_drift(
        tpl, _render(tpl, USER, True, date_string="26 Jul 2024"), _render(tpl, USER, True, date_string=other)
    )
    assert d is not None and d.cause is DriftCause.RENDER_TIME_VALUE, d


def test_other_text_is_other():
    tpl = _tpl("qwen2.5-instruct")
    said = USER + [{"role": "assistant", "content": "Sunny."}]
    ours = _render(tpl, said, False)
    d = explain_drift(tpl, ours, _render(tpl, USER + [{"role": "assistant", "content": "Rainy."}], False))
    assert d.cause is DriftCause.OTHER and d.ours.startswith("Sun") and d.rendered.startswith("Rain")


def test_no_drift_no_detail():
    tpl = _tpl("qwen2.5-instruct")
    enc = tpl.codec.encode
    r, rollout = _rollout(tpl, [enc(CALL), enc("Sunny.<|im_end|>")])
    assert r.drift is False and r.drift_detail is None and rollout.metrics.drift_causes == {}
    ids = _render(tpl, USER, True)
    assert explain_drift(tpl, ids, ids + [1, 2]) is None and first_difference(ids, ids[:-1]) == len(ids) - 1


def test_measure_drift_fraction_chooses_the_same_samples():
    assert [chosen(0.5, i, 0) for i in range(64)] == [chosen(0.5, i, 0) for i in range(64)]
    share = sum(chosen(0.125, i, s) for i in range(2000) for s in range(4)) / 8000
    assert 0.1 < share < 0.15
    assert not any(chosen(0, i, 0) or chosen(False, i, 0) for i in range(100))
    tpl = _tpl("qwen2.5-instruct")
    final = tpl.codec.encode("  Sunny.<|im_end|>")
    rollout = tmpl.Rollout(tpl, Scripted(lambda r: final), tools=FUNCS, measure_drift=0.5, sampling=tmpl.Sampling(n=4))
    results = rollout.run([USER] * 8)
    measured = [r.drift is not None for r in results]
    assert measured == [chosen(0.5, r.index, r.sample) for r in results] and 0 < sum(measured) < 32
    assert rollout.metrics.drift_measured == sum(measured) == rollout.metrics.drift_causes["whitespace"]
    with pytest.raises(ValueError, match="measure_drift"):
        tmpl.Rollout(tpl, Scripted(lambda r: final), tools=FUNCS, measure_drift=1.5)


def test_drift_detail_round_trips_through_jsonl_and_parquet(tmp_path):
    tpl = _tpl("qwen2.5-instruct")
    enc = tpl.codec.encode
    r, rollout = _rollout(
        tpl,
        [
            enc('<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call><|im_end|>'),
            enc("Sunny.<|im_end|>"),
        ],
    )
    path = export.to_jsonl([r], tmp_path / "r.jsonl", metrics=rollout.metrics)
    [back] = export.from_jsonl(path)
    assert back.drift_detail == r.drift_detail and back.drift is True
    pytest.importorskip("datasets")
    export.to_dataset([r]).to_parquet(str(tmp_path / "r.parquet"))
    import datasets

    [again] = export.from_dataset(datasets.Dataset.from_parquet(str(tmp_path / "r.parquet")))
    assert again.drift_detail == r.drift_detail
    assert again.tool_failure_kinds == r.tool_failure_kinds == {}


def test_replay_prints_the_causes_stored_and_found_again(tmp_path, capsys):
    """``tmpl replay``: the stored causes, and the same causes from a fresh re-render with the model's template."""
    import json

    from tmpl.cli import main

    from .conftest import DATA

    tpl = _tpl("qwen2.5-instruct")
    enc = tpl.codec.encode
    reordered = enc('<tool_call>\n{"arguments": {"city": "Paris"}, "name": "get_weather"}\n</tool_call><|im_end|>')
    final, padded = enc("Sunny.<|im_end|>"), enc(" Sunny. <|im_end|>")

    def policy(req):
        i, _, turn = (int(x) for x in req.request_id.split("-"))
        return [reordered if turn == 0 else final, final, padded][i]

    rollout = tmpl.Rollout(tpl, Scripted(policy), tools=FUNCS, max_turns=3, measure_drift=True)
    results = rollout.run([USER] * 3)
    assert [r.drift_detail.cause.value if r.drift else None for r in results] == [
        "json_reserialized",
        None,
        "whitespace",
    ]
    path = export.to_jsonl(results, tmp_path / "r.jsonl")
    assert main(["replay", str(path)]) == 1  # two of the three samples drifted
    stored = capsys.readouterr().out
    (tmp_path / "tools.json").write_text(json.dumps(SCHEMAS))
    assert (
        main(["replay", str(path), "--model", str(DATA / "qwen2.5-instruct"), "--tools", str(tmp_path / "tools.json")])
        == 1
    )
    again = capsys.readouterr().out
    for out in (stored, again):
        rows = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
        cause = next(line for line in out.splitlines() if line.startswith("| index")).split(" | ").index("cause")
        assert [row.split(" | ")[cause] for row in rows] == ["json_reserialized", "", "whitespace"]
        assert all(row.split(" | ")[3] == "1" for row in rows)  # append mode: one sequence each
        assert "3 samples, 3 measured, 2 drifted: json_reserialized 1, whitespace 1" in out
    assert stored == again


def test_to_dict_keys_are_stable_and_count_what_happened():
    """Telemetry of two real batches: same keys; tool failures by kind, truncations by code, drift by cause."""
    tpl = _tpl("qwen2.5-instruct")
    enc = tpl.codec.encode
    unknown = enc('<tool_call>\n{"name": "no_such_tool", "arguments": {}}\n</tool_call><|im_end|>')

    def policy(req):
        i, _, turn = (int(x) for x in req.request_id.split("-"))
        return [unknown, enc(CALL), enc(" Sunny.<|im_end|>")][i] if turn == 0 else enc(CALL)

    rollout = tmpl.Rollout(tpl, Scripted(policy), tools=FUNCS, max_turns=2, measure_drift=True)
    results = rollout.run([USER] * 3)
    first = rollout.metrics.to_dict()
    assert [r.code.value for r in results] == ["max_turns", "max_turns", "finished"]
    assert first["rollout/tool_failures/unknown_tool"] == 1.0 == results[0].tool_failure_kinds["unknown_tool"]
    assert first["rollout/tool_failures/exception"] == 0.0
    assert first["rollout/truncated/max_turns"] == 2.0 and first["rollout/aborted/crashed"] == 0.0
    assert first["rollout/drift/measured"] == 3.0
    assert first["rollout/drift/rate/whitespace"] == pytest.approx(1 / 3)
    assert first["rollout/time/tools"] > 0.0 and first["rollout/time/engine"] >= 0.0
    rollout.run([USER])
    assert set(rollout.metrics.to_dict()) == set(first)  # a batch with nothing failing logs the same keys


def test_telemetry_example_in_the_docs_logs_a_real_batch(capsys):
    """docs/integrations.md, block 'telemetry': called as TRL calls a reward function, and as on_results."""
    from .test_integrations_docs import doc_block

    namespace: dict = {}
    exec(doc_block("telemetry"), namespace)  # noqa: S102 - the documented block, run as written
    tpl = _tpl("qwen2.5-instruct")
    rollout = tmpl.Rollout(
        tpl, Scripted(lambda r: tpl.codec.encode(" Sunny.<|im_end|>")), tools=FUNCS, measure_drift=True
    )
    results = rollout.run([USER] * 2)
    metrics = rollout.metrics.to_dict()
    rewards = namespace["reward_with_telemetry"](
        completions=["x", "y"],
        messages=[r.messages for r in results],
        status=[r.status.name for r in results],
        rollout_metrics=[metrics] * 2,
        turns=[1, 1],
    )
    assert rewards == [1.0, 1.0]
    printed = capsys.readouterr().out
    assert "'rollout/drift/rate/whitespace': 1.0" in printed and "'rollout/done': 2.0" in printed
    namespace["on_results"](results, rollout.metrics)
    assert capsys.readouterr().out == printed
