"""Trajectory: budgets, appends, statuses, spans, views, errors; every case on both twins."""

from __future__ import annotations

import doctest
import math
import pickle

import numpy as np
import pytest

import tmpl
from tmpl import Span, Status
from tmpl.errors import (
    BudgetError,
    LogprobError,
    SpanLabelError,
    TmplError,
    TokenIdError,
    TrajectoryClosedError,
    TrajectoryError,
)


def make(twin, prompt=(1, 2, 3), max_length=20, max_completion_length=None, **kw):
    return twin.builder.Trajectory(list(prompt), max_length, max_completion_length, **kw)


def lps(n, value=-0.5):
    return [value] * n


# -- construction and budgets ------------------------------------------------------------------
def test_budget_is_the_smaller_of_both_caps(twin):
    assert make(twin, max_length=20).max_new_tokens() == 17
    assert make(twin, max_length=20, max_completion_length=5).max_new_tokens() == 5
    assert make(twin, max_length=20, max_completion_length=50).max_new_tokens() == 17


def test_max_new_tokens_clamps_the_request(twin):
    traj = make(twin, max_length=10)  # 7 completion tokens fit
    assert traj.max_new_tokens(3) == 3
    assert traj.max_new_tokens(100) == 7
    traj.add_completion([4] * 5, lps(5))
    assert traj.max_new_tokens(100) == 2
    assert traj.max_new_tokens(0) == 0
    assert traj.max_new_tokens(10**30) == 2


def test_max_new_tokens_is_zero_once_final(twin):
    traj = make(twin)
    traj.finish()
    assert traj.max_new_tokens(5) == 0 and traj.max_new_tokens() == 0
    assert traj.remaining == 17  # the budget itself is unchanged


def test_prompt_filling_max_length_leaves_no_room(twin):
    traj = make(twin, prompt=[1] * 8, max_length=8)
    assert traj.max_new_tokens(4) == 0
    assert traj.add_completion([], []) == 0
    assert traj.status is Status.RUNNING


def test_prompt_longer_than_max_length_is_refused(twin):
    with pytest.raises(BudgetError, match=r"prompt of 9 tokens exceeds max_length=8") as info:
        make(twin, prompt=[1] * 9, max_length=8, sample_id="s9")
    assert info.value.sample == "s9"


@pytest.mark.parametrize(
    "max_length, max_completion_length, vocab_size",
    [
        (0, None, None),
        (-1, None, None),
        (10.0, None, None),
        (10, -1, None),
        (10, "5", None),
        (10, None, 0),
        (10, None, 2**31 + 1),
    ],
)
def test_invalid_budgets_raise_budget_error(twin, max_length, max_completion_length, vocab_size):
    with pytest.raises(BudgetError):
        twin.builder.Trajectory([], max_length, max_completion_length, vocab_size=vocab_size)


@pytest.mark.parametrize("requested", [-1, 2.5, "3"])
def test_invalid_request_raises_budget_error(twin, requested):
    with pytest.raises(BudgetError, match="requested"):
        make(twin, sample_id=4).max_new_tokens(requested)


# -- appending -----------------------------------------------------------------------------------
def test_completion_and_suffix_fill_three_arrays_together(twin):
    traj = make(twin, sample_id="a")
    assert traj.add_completion([10, 11], [-0.25, -1.5]) == 2
    assert traj.add_suffix([20, 21, 22]) == 3
    assert traj.add_completion([12], [-2.0]) == 1
    assert traj.completion_ids.tolist() == [10, 11, 20, 21, 22, 12]
    assert traj.mask.tolist() == [1, 1, 0, 0, 0, 1]
    assert traj.logprobs.tolist() == [-0.25, -1.5, 0.0, 0.0, 0.0, -2.0]
    assert traj.prompt_ids.tolist() == [1, 2, 3]
    assert (traj.prompt_length, traj.completion_length, traj.length) == (3, 6, 9)
    assert traj.completion_ids.dtype == np.int32 and traj.mask.dtype == np.uint8 and traj.logprobs.dtype == np.float32
    assert traj.status is Status.RUNNING and traj.reason == "" and traj.tokens_cut == 0


def test_logprobs_are_stored_as_float32(twin):
    traj = make(twin)
    traj.add_completion([1], [-0.1])
    assert traj.logprobs[0] == np.float32(-0.1)


@pytest.mark.parametrize(
    "inputs",
    [
        lambda: ((5, 6), (-0.5, -0.25)),
        lambda: (np.array([5, 6], dtype=np.int64), np.array([-0.5, -0.25], dtype=np.float64)),
        lambda: (np.array([5, 6], dtype=np.uint16), np.array([-0.5, -0.25], dtype=np.float32)),
        lambda: ([np.int64(5), np.int32(6)], [np.float32(-0.5), -0.25]),
        lambda: (iter([5, 6]), iter([-0.5, -0.25])),
        lambda: ([5, 6], [-0.5, -0.25]),
    ],
    ids=["tuple", "ndarray64", "ndarray-small", "numpy-scalars", "iterators", "list"],
)
def test_inputs_of_every_container_give_the_same_arrays(twin, inputs):
    ids, logprobs = inputs()
    traj = make(twin)
    traj.add_completion(ids, logprobs)
    assert traj.completion_ids.tolist() == [5, 6]
    assert traj.logprobs.tolist() == [-0.5, -0.25]


def test_prompt_from_numpy_and_tuple(twin):
    for prompt in (np.array([7, 8], dtype=np.int64), (7, 8)):
        traj = twin.builder.Trajectory(prompt, 10)
        assert traj.prompt_ids.tolist() == [7, 8]


def test_empty_prompt_and_empty_turns(twin):
    traj = twin.builder.Trajectory([], 4)
    assert traj.add_completion([], []) == 0
    assert traj.add_suffix([]) == 0
    assert traj.completion_ids.tolist() == [] and traj.status is Status.RUNNING
    assert [s.size for s in traj.spans] == [0, 0]


def test_completion_past_the_budget_is_cut_with_its_logprobs(twin):
    traj = make(twin, max_length=8, sample_id="q")  # room for 5
    kept = traj.add_completion([4, 5, 6, 7, 8, 9, 10], [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6, -0.7])
    assert kept == 5
    assert traj.completion_ids.tolist() == [4, 5, 6, 7, 8]
    assert traj.logprobs.tolist() == pytest.approx([-0.1, -0.2, -0.3, -0.4, -0.5])
    assert traj.mask.tolist() == [1] * 5
    assert traj.status is Status.TRUNCATED and traj.tokens_cut == 2
    assert "completion of 7 tokens" in traj.reason and "max_length=8" in traj.reason


def test_truncation_reason_names_the_completion_budget_when_it_binds(twin):
    traj = make(twin, max_length=100, max_completion_length=4)
    traj.add_suffix([1] * 6)
    assert traj.tokens_cut == 2 and "max_completion_length=4" in traj.reason


# -- statuses ------------------------------------------------------------------------------------
def test_finish_and_abort_keep_the_first_final_status(twin):
    traj = make(twin)
    assert traj.finish() is Status.DONE
    assert traj.abort("late") is Status.DONE and traj.reason == ""
    other = make(twin)
    assert other.abort("tool crashed") is Status.ABORTED and other.reason == "tool crashed"
    assert other.finish() is Status.ABORTED and not other.running


@pytest.mark.parametrize("final", ["finish", "abort", "truncate", "missing-logprobs"])
def test_nothing_is_appended_after_a_final_status(twin, final):
    traj = make(twin, max_length=6, sample_id=("g", 3))
    if final == "finish":
        traj.finish()
    elif final == "abort":
        traj.abort("env failed")
    elif final == "truncate":
        traj.add_suffix([1, 1, 1, 1])
    else:
        traj.add_completion([1], None)
    before = (traj.completion_ids.tolist(), traj.status, traj.reason, traj.spans)
    with pytest.raises(TrajectoryClosedError) as info:
        traj.add_completion([2], [-1.0])
    with pytest.raises(TrajectoryClosedError):
        traj.add_suffix([2])
    assert info.value.sample == ("g", 3) and info.value.status is traj.status
    assert traj.status.name in str(info.value) and "('g', 3)" in str(info.value)
    assert (traj.completion_ids.tolist(), traj.status, traj.reason, traj.spans) == before


def test_status_members_and_final_flag():
    assert [s.name for s in Status] == ["RUNNING", "DONE", "TRUNCATED", "ABORTED"]
    assert [s.final for s in Status] == [False, True, True, True]


# -- logprobs that cannot be used ---------------------------------------------------------------
def test_missing_logprobs_abort_with_a_reason(twin):
    traj = make(twin)
    assert traj.add_completion([5, 6, 7], None) == 0
    assert traj.status is Status.ABORTED and "3 tokens" in traj.reason and "without logprobs" in traj.reason
    assert traj.completion_length == 0 and traj.spans == []


@pytest.mark.parametrize("logprobs", [[-0.1], [-0.1, -0.2, -0.3], (-0.1,), np.array([-0.1, -0.2, -0.3])])
def test_logprob_count_mismatch_aborts(twin, logprobs):
    traj = make(twin)
    assert traj.add_completion([5, 6], logprobs) == 0
    assert traj.status is Status.ABORTED
    assert f"2 ids but {len(logprobs)} logprobs" in traj.reason
    assert traj.completion_length == 0


@pytest.mark.parametrize(
    "bad, words",
    [
        (math.nan, "NaN"),
        (0.5, "positive"),
        (1e-3, "positive"),
        (-math.inf, "not finite"),
        (math.inf, "not finite"),
        (-1e39, "not finite"),  # finite as a double, -inf as the float32 stored
        (None, "not a number"),
        ("-0.5", "not a number"),
    ],
)
def test_unusable_logprob_values_raise_naming_sample_and_position(twin, bad, words):
    traj = make(twin, sample_id="rollout-7")
    traj.add_completion([1], [-1.0])
    with pytest.raises(LogprobError) as info:
        traj.add_completion([5, 6, 7], [-0.1, bad, -0.3])
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, TrajectoryError) and isinstance(err, TmplError)
    assert err.sample == "rollout-7" and err.position == 1
    assert "'rollout-7'" in str(err) and "logprobs[1]" in str(err) and words in str(err)
    assert traj.completion_ids.tolist() == [1] and traj.status is Status.RUNNING  # unchanged


def test_tiny_positive_logprob_that_rounds_to_zero_is_zero(twin):
    traj = make(twin)
    traj.add_completion([1, 2], [1e-50, -0.0])
    assert traj.logprobs.tolist() == [0.0, 0.0]


def test_logprobs_that_are_not_a_sequence_raise(twin):
    with pytest.raises(LogprobError, match="sequence of floats"):
        make(twin).add_completion([1], 0.5)


# -- token IDs -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad, words",
    [
        (-1, "outside [0, 100)"),
        (100, "outside [0, 100)"),
        (2**70, "outside"),
        (1.5, "not an integer"),
        ("7", "not an integer"),
    ],
)
def test_ids_outside_the_vocabulary_raise_naming_sample_and_position(twin, bad, words):
    traj = make(twin, vocab_size=100, sample_id=17)
    with pytest.raises(TokenIdError) as info:
        traj.add_completion([5, 6, bad], [-1.0, -1.0, -1.0])
    err = info.value
    assert err.sample == 17 and err.position == 2 and err.field == "ids"
    assert "sample 17" in str(err) and "ids[2]" in str(err) and words in str(err)
    assert traj.completion_length == 0 and traj.status is Status.RUNNING
    with pytest.raises(TokenIdError):
        traj.add_suffix([bad])


def test_ids_are_bounded_by_int32_without_a_vocabulary(twin):
    traj = make(twin)
    traj.add_suffix([2**31 - 1])
    with pytest.raises(TokenIdError, match="int32"):
        traj.add_suffix([2**31])
    with pytest.raises(TokenIdError, match="outside"):
        traj.add_suffix(np.array([-3]))


def test_bad_prompt_ids_raise_before_anything_is_built(twin):
    with pytest.raises(TokenIdError) as info:
        twin.builder.Trajectory([1, 2, 999], 10, vocab_size=500, sample_id="p")
    assert info.value.field == "prompt_ids" and info.value.position == 2


@pytest.mark.parametrize("ids", [None, 5, "abc", np.array(3)])
def test_ids_that_are_not_a_sequence_raise(twin, ids):
    with pytest.raises(TokenIdError, match="sequence of token ids"):
        make(twin).add_suffix(ids)


def test_first_bad_id_is_reported_before_logprobs_are_looked_at(twin):
    with pytest.raises(TokenIdError):
        make(twin, vocab_size=10).add_completion([11], [math.nan])


def test_bools_are_integers(twin):
    traj = make(twin)
    traj.add_suffix([True, False])
    assert traj.completion_ids.tolist() == [1, 0]


# -- spans -----------------------------------------------------------------------------------
def test_spans_record_kind_turn_message_and_range(twin):
    traj = make(twin, max_length=40)
    traj.add_completion([1, 2], [-1.0, -1.0], message=2)
    traj.add_suffix([3, 4, 5], message=3)
    traj.add_completion([6], [-1.0], message=4)
    traj.add_suffix([7])
    assert traj.spans == [
        Span("completion", 0, 2, 0, 2),
        Span("suffix", 1, 3, 2, 5),
        Span("completion", 1, 4, 5, 6),
        Span("suffix", 2, None, 6, 7),
    ]
    assert traj.num_turns == 2
    for span in traj.spans:
        expected_mask = 1 if span.kind == "completion" else 0
        assert set(traj.mask[span.start : span.end].tolist()) <= {expected_mask}


def test_a_truncated_span_covers_what_was_kept(twin):
    traj = make(twin, max_length=6)
    traj.add_completion([1], [-1.0])
    traj.add_suffix([2, 3, 4, 5])
    assert traj.spans[-1] == Span("suffix", 1, None, 1, 3)


@pytest.mark.parametrize("message", [-1, 1.0, "2", 2**31])
def test_invalid_message_index_raises(twin, message):
    traj = make(twin, sample_id="m")
    with pytest.raises(SpanLabelError) as info:
        traj.add_suffix([1], message=message)
    assert info.value.sample == "m" and traj.completion_length == 0


# -- views -----------------------------------------------------------------------------------
def test_views_are_read_only_and_share_one_buffer(twin):
    traj = make(twin)
    traj.add_completion([1, 2], [-1.0, -1.0])
    first = traj.completion_ids
    traj.add_suffix([3, 4])
    second = traj.completion_ids
    assert not first.flags.writeable and not traj.mask.flags.writeable and not traj.logprobs.flags.writeable
    assert not traj.prompt_ids.flags.writeable
    assert np.shares_memory(first, second)  # within the first allocation appends reuse the buffer
    assert first.tolist() == [1, 2]  # a view handed out keeps what it showed
    with pytest.raises(ValueError):
        second[0] = 9


def test_storage_grows_with_the_tokens_and_views_keep_what_they_showed(twin):
    from tmpl.trajectory.types import MIN_ALLOC

    traj = make(twin, max_length=1_000_000, sample_id="g")
    handed_out, expected = [], []
    for turn in range(12):  # crosses several doublings of the storage
        ids = [(turn * 7 + i) % 1000 for i in range(MIN_ALLOC // 2 + turn)]
        traj.add_completion(ids, lps(len(ids), -0.25))
        traj.add_suffix([turn + 1] * 5)
        expected += ids + [turn + 1] * 5
        handed_out.append((traj.completion_ids, traj.mask, traj.logprobs, list(expected)))
    for ids, mask, logprobs, shown in handed_out:
        assert ids.tolist() == shown and len(mask) == len(shown) == len(logprobs)
    assert traj.completion_ids.tolist() == expected
    assert traj.mask.tolist().count(1) == sum(MIN_ALLOC // 2 + t for t in range(12))
    assert traj.remaining == 1_000_000 - 3 - len(expected)


def test_storage_never_preallocates_the_budget(twin):
    import tracemalloc

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        trajs = [make(twin, max_length=1_000_000, sample_id=i) for i in range(64)]
        for traj in trajs:
            traj.add_completion(list(range(100)), lps(100))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # A 1M budget preallocated would be 9 MB per sample; 100 tokens need well under 20 kB each.
    assert held < 64 * 20_000, held


def test_budget_stays_exact_when_storage_grows_to_it(twin):
    traj = make(twin, prompt=[1], max_length=1 + 1000, sample_id="b")
    assert traj.add_completion(list(range(600)), lps(600)) == 600
    assert traj.add_suffix([5] * 300) == 300
    assert traj.max_new_tokens() == 100
    assert traj.add_completion(list(range(150)), lps(150)) == 100
    assert traj.status is Status.TRUNCATED and traj.tokens_cut == 50 and traj.length == 1001
    assert traj.completion_ids.tolist() == list(range(600)) + [5] * 300 + list(range(100))


def test_pickle_restores_a_grown_trajectory(twin):
    traj = make(twin, max_length=100_000, sample_id="p")
    traj.add_completion(list(range(700)), lps(700, -0.125))
    back = pickle.loads(pickle.dumps(traj))
    assert back.completion_ids.tolist() == list(range(700)) and back.logprobs.tolist() == [-0.125] * 700
    assert back.add_suffix([1, 2]) == 2 and back.completion_length == 702


def test_reset_keeps_the_prompt_and_nothing_else(twin):
    traj = make(twin, max_length=8, sample_id="r")
    traj.add_completion([4, 5], [-0.5, -0.5])
    traj.add_suffix([6, 7, 8, 9])
    old_ids, old_logprobs = traj.completion_ids, traj.logprobs
    assert traj.status is Status.TRUNCATED
    traj.reset()
    assert traj.status is Status.RUNNING and traj.reason == "" and traj.tokens_cut == 0
    assert traj.completion_length == 0 and traj.spans == [] and traj.num_turns == 0
    assert traj.prompt_ids.tolist() == [1, 2, 3] and traj.max_new_tokens() == 5
    traj.add_completion([11], [-2.0])
    assert traj.completion_ids.tolist() == [11] and traj.logprobs.tolist() == [-2.0]
    assert old_ids.tolist() == [4, 5, 6, 7, 8] and old_logprobs.tolist() == [-0.5, -0.5, 0.0, 0.0, 0.0]
    assert not np.shares_memory(old_ids, traj.completion_ids)


def test_repr_names_sample_and_status(twin):
    traj = make(twin, sample_id="x1")
    traj.add_completion([1], [-1.0])
    assert repr(traj) == "Trajectory(sample_id='x1', prompt=3, completion=1, status=RUNNING)"


# -- pickling --------------------------------------------------------------------------------
def test_pickle_round_trip_keeps_everything(twin):
    traj = make(twin, max_length=9, max_completion_length=5, vocab_size=50, sample_id="pk")
    traj.add_completion([4, 5], [-0.5, -0.75], message=1)
    traj.add_suffix([6, 7, 8, 9], message=2)
    copy = pickle.loads(pickle.dumps(traj))
    assert type(copy) is type(traj)
    for name in ("completion_ids", "mask", "logprobs", "prompt_ids"):
        assert getattr(copy, name).tolist() == getattr(traj, name).tolist()
    for name in ("status", "reason", "tokens_cut", "spans", "num_turns", "sample_id", "vocab_size", "remaining"):
        assert getattr(copy, name) == getattr(traj, name)
    copy.reset()
    copy.add_completion([1, 2, 3, 4, 5, 6], [-1.0] * 6)
    assert copy.tokens_cut == 1  # budgets survived the round trip
    copy.reset()
    with pytest.raises(TokenIdError):
        copy.add_suffix([50])  # and so did the vocabulary


# -- documentation ---------------------------------------------------------------------------
def test_docstring_examples_run(twin):
    import tmpl.trajectory._validate
    import tmpl.trajectory.types

    for module in (twin.builder, tmpl.trajectory._validate, tmpl.trajectory.types, tmpl.errors):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0 and result.attempted > 0, module.__name__


def test_public_trajectory_is_the_selected_twin():
    expected = "tmpl.trajectory._builder_c" if tmpl.NATIVE else "tmpl.trajectory._builder_py"
    assert tmpl.Trajectory.__module__ == expected


def test_truncate_marks_a_running_sample_without_cutting(twin):
    traj = twin.builder.Trajectory([1, 2], max_length=10, sample_id="t")
    traj.add_completion([3, 4], [-0.1, -0.2])
    assert traj.truncate("turn limit").name == "TRUNCATED"
    assert traj.reason == "turn limit" and traj.tokens_cut == 0 and traj.completion_ids.tolist() == [3, 4]
    assert traj.truncate("again").name == "TRUNCATED" and traj.reason == "turn limit"  # final stays
    done = twin.builder.Trajectory([1], max_length=4)
    done.finish()
    assert done.truncate("late").name == "DONE"


def test_truncate_records_what_its_caller_left_out(twin):
    traj = twin.builder.Trajectory([1, 2], max_length=10, sample_id="t")
    with pytest.raises(ValueError, match="cut must be >= 0"):
        traj.truncate("x", cut=-1)
    assert traj.status.name == "RUNNING"
    traj.add_suffix([5, 6])
    assert traj.truncate("an image that does not fit whole", cut=7).name == "TRUNCATED"
    assert traj.tokens_cut == 7 and traj.completion_ids.tolist() == [5, 6]
    assert pickle.loads(pickle.dumps(traj)).tokens_cut == 7
