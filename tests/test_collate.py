"""Collation: equal to a plain lists + pad_sequence reference, TRL's GRPO conventions, no copies."""

from __future__ import annotations

import doctest
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.utils.rnn import pad_sequence

import tmpl
from tmpl import _compat
from tmpl.errors import CollateError
from tmpl.trajectory import _twin
from tmpl.trajectory.batch import BATCH_KEYS

from .trajectory_model import Model, as_float32

PAD = 99


# -- the reference: Python lists and pad_sequence ----------------------------------------------
def reference_batch(samples, pad_id):
    """``samples``: (prompt, ids, mask, logprobs) plain lists per sample; TRL's GRPO padding rules."""
    long = torch.long
    prompts = [torch.tensor(p, dtype=long) for p, _, _, _ in samples]
    completions = [torch.tensor(c, dtype=long) for _, c, _, _ in samples]
    return {
        "prompt_ids": pad_sequence(prompts, batch_first=True, padding_value=pad_id, padding_side="left"),
        "prompt_mask": pad_sequence(
            [torch.ones(len(p), dtype=long) for p in prompts], batch_first=True, padding_value=0, padding_side="left"
        ),
        "completion_ids": pad_sequence(completions, batch_first=True, padding_value=pad_id),
        "completion_mask": pad_sequence(
            [torch.ones(len(c), dtype=long) for c in completions], batch_first=True, padding_value=0
        ),
        "tool_mask": pad_sequence(
            [torch.tensor(m, dtype=long) for _, _, m, _ in samples], batch_first=True, padding_value=1
        ),
        "old_per_token_logps": pad_sequence(
            [torch.tensor(lp, dtype=torch.float32) for _, _, _, lp in samples], batch_first=True, padding_value=0.0
        ),
        "prompt_lengths": torch.tensor([len(p) for p, _, _, _ in samples], dtype=long),
        "completion_lengths": torch.tensor([len(c) for _, c, _, _ in samples], dtype=long),
    }


def assert_batches_equal(got, want):
    assert list(got) == list(want)
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        assert got[key].shape == want[key].shape, key
        assert torch.equal(got[key], want[key]), key


def sample_lists(traj):
    return (traj.prompt_ids.tolist(), traj.completion_ids.tolist(), traj.mask.tolist(), traj.logprobs.tolist())


def small_batch(builder):
    """A tool-calling sample, a truncated one, one with no completion, one with an empty prompt."""
    a = builder.Trajectory([1, 2, 3], 32, sample_id="a")
    a.add_completion([10, 11], [-0.5, -0.25])
    a.add_suffix([20, 21, 22])
    a.add_completion([12], [-1.0])
    a.finish()
    b = builder.Trajectory([4], 5, sample_id="b")
    b.add_completion([13], [-2.0])
    b.add_suffix([23, 24, 25, 26])  # 3 fit
    c = builder.Trajectory([5, 6], 8, sample_id="c")
    d = builder.Trajectory([], 8, sample_id="d")
    d.add_completion([14, 15], [-0.125, -3.0])
    return [a, b, c, d]


def test_small_batch_has_the_expected_values(twin):
    """Written out by hand: the conventions in one picture."""
    batch = tmpl.collate(small_batch(twin.builder), pad_id=PAD)
    assert batch["prompt_ids"].tolist() == [[1, 2, 3], [PAD, PAD, 4], [PAD, 5, 6], [PAD, PAD, PAD]]
    assert batch["prompt_mask"].tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1], [0, 0, 0]]
    assert batch["completion_ids"].tolist() == [
        [10, 11, 20, 21, 22, 12],
        [13, 23, 24, 25, PAD, PAD],
        [PAD] * 6,
        [14, 15, PAD, PAD, PAD, PAD],
    ]
    assert batch["completion_mask"].tolist() == [[1] * 6, [1, 1, 1, 1, 0, 0], [0] * 6, [1, 1, 0, 0, 0, 0]]
    assert batch["tool_mask"].tolist() == [[1, 1, 0, 0, 0, 1], [1, 0, 0, 0, 1, 1], [1] * 6, [1] * 6]
    assert batch["old_per_token_logps"].tolist() == [
        [-0.5, -0.25, 0.0, 0.0, 0.0, -1.0],
        [-2.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [0.0] * 6,
        [-0.125, -3.0, 0.0, 0.0, 0.0, 0.0],
    ]
    assert batch["prompt_lengths"].tolist() == [3, 1, 2, 0]
    assert batch["completion_lengths"].tolist() == [6, 4, 0, 2]


def test_collate_equals_the_pad_sequence_reference(twin):
    trajectories = small_batch(twin.builder)
    want = reference_batch([sample_lists(t) for t in trajectories], PAD)
    assert_batches_equal(tmpl.collate(trajectories, PAD), want)


def test_loss_mask_is_exactly_the_model_tokens(twin):
    trajectories = small_batch(twin.builder)
    batch = tmpl.collate(trajectories, PAD)
    loss_mask = batch["completion_mask"] * batch["tool_mask"]
    for row, traj in enumerate(trajectories):
        n = traj.completion_length
        assert loss_mask[row, :n].tolist() == traj.mask.tolist()
        assert loss_mask[row, n:].sum() == 0
    assert torch.all(batch["old_per_token_logps"][loss_mask == 0] == 0.0)


def test_dtypes_and_keys_follow_trl(twin):
    batch = tmpl.collate(small_batch(twin.builder), PAD)
    assert tuple(batch) == BATCH_KEYS
    for key in BATCH_KEYS:
        assert batch[key].dtype == (torch.float32 if key == "old_per_token_logps" else torch.int64), key
        assert batch[key].is_contiguous()


def test_tensors_share_memory_with_the_filled_arrays(twin, monkeypatch):
    filled = {}
    fill = _twin.builder.collate_arrays

    def capture(*args, **kwargs):
        filled.update(fill(*args, **kwargs))
        return filled

    monkeypatch.setattr(_twin.builder, "collate_arrays", capture)
    batch = tmpl.collate(small_batch(twin.builder), PAD)
    for key in BATCH_KEYS:
        assert np.shares_memory(batch[key].numpy(), filled[key]), key


def test_device_moves_every_tensor(twin):
    batch = tmpl.collate(small_batch(twin.builder), PAD, device="meta")
    assert {t.device.type for t in batch.values()} == {"meta"}


def test_collate_arrays_needs_no_torch(twin):
    arrays = tmpl.collate_arrays(small_batch(twin.builder), PAD)
    assert all(isinstance(a, np.ndarray) for a in arrays.values())
    assert arrays["completion_ids"].dtype == np.int64 and arrays["old_per_token_logps"].dtype == np.float32


def test_pad_to_multiple_of_widens_both_sides(twin):
    batch = tmpl.collate(small_batch(twin.builder), PAD, pad_to_multiple_of=4)
    assert batch["prompt_ids"].shape == (4, 4) and batch["completion_ids"].shape == (4, 8)
    assert batch["prompt_ids"][0].tolist() == [PAD, 1, 2, 3]
    assert batch["tool_mask"][0].tolist() == [1, 1, 0, 0, 0, 1, 1, 1]
    assert batch["completion_mask"][0].tolist() == [1] * 6 + [0, 0]


def test_mask_truncated_zeroes_those_rows_like_trl(twin):
    batch = tmpl.collate(small_batch(twin.builder), PAD, mask_truncated=True)
    assert batch["completion_mask"][1].tolist() == [0] * 6  # sample b was TRUNCATED
    assert batch["tool_mask"][1].tolist() == [0] * 6
    assert batch["completion_ids"][1].tolist() == [13, 23, 24, 25, PAD, PAD]  # ids stay
    assert batch["completion_mask"][0].tolist() == [1] * 6


def test_aborted_samples_are_refused_unless_masked(twin):
    trajectories = small_batch(twin.builder)
    trajectories[2].add_completion([1, 2], None)
    with pytest.raises(CollateError) as info:
        tmpl.collate(trajectories, PAD)
    assert info.value.index == 2 and info.value.sample == "c"
    assert "trajectories[2]" in str(info.value) and "'c'" in str(info.value) and "without logprobs" in str(info.value)
    batch = tmpl.collate(trajectories, PAD, mask_aborted=True)
    assert batch["completion_mask"][2].sum() == 0 and batch["tool_mask"][2].sum() == 0
    assert batch["completion_mask"][0].sum() == 6


@pytest.mark.parametrize(
    "args, words",
    [
        (([], PAD), "no trajectories"),
        ((["not a trajectory"], PAD), "trajectories[0]"),
        ((None, PAD), "sequence of Trajectory"),
        ((["x"], 1.5), "pad_id"),
        ((["x"], True), "pad_id"),
        ((["x"], 2**63), "int64"),
    ],
)
def test_bad_batches_raise_collate_error(twin, args, words):
    with pytest.raises(CollateError, match=re.escape(words)):
        twin.builder.collate_arrays(*args)


def test_bad_pad_to_multiple_of_raises(twin):
    with pytest.raises(CollateError, match="pad_to_multiple_of"):
        tmpl.collate(small_batch(twin.builder), PAD, pad_to_multiple_of=0)


def test_collate_does_not_mix_twins():
    try:
        native = _compat.load("native")["builder"]
    except ImportError:
        pytest.skip("compiled core not built")
    pure = _compat.load("pure")["builder"]
    with pytest.raises(CollateError, match="trajectories\\[1\\]"):
        native.collate_arrays([native.Trajectory([1], 4), pure.Trajectory([1], 4)], PAD)
    with pytest.raises(CollateError, match="trajectories\\[0\\]"):
        pure.collate_arrays([native.Trajectory([1], 4)], PAD)


def test_collate_docstring_example_runs():
    import tmpl.trajectory.batch

    result = doctest.testmod(tmpl.trajectory.batch)
    assert result.failed == 0 and result.attempted > 0


# -- TRL itself as the oracle ------------------------------------------------------------------
def test_matches_trl_grpo_trainer_padding():
    """Pad the same lists the way trl 1.16's GRPOTrainer does (trl.trainer.utils.pad) and compare."""
    pytest.importorskip("trl")
    from trl.trainer.utils import pad

    builder = _twin.builder
    trajectories = small_batch(builder)
    samples = [sample_lists(t) for t in trajectories]
    multiple = 4
    prompt_ids = [torch.tensor(p) for p, _, _, _ in samples]
    completion_ids = [torch.tensor(c, dtype=torch.long) for _, c, _, _ in samples]
    want = {
        "prompt_ids": pad(prompt_ids, padding_value=PAD, padding_side="left", pad_to_multiple_of=multiple),
        "prompt_mask": pad(
            [torch.ones_like(p, dtype=torch.long) for p in prompt_ids],
            padding_value=0,
            padding_side="left",
            pad_to_multiple_of=multiple,
        ),
        "completion_ids": pad(completion_ids, padding_value=PAD, padding_side="right", pad_to_multiple_of=multiple),
        "completion_mask": pad(
            [torch.ones_like(c, dtype=torch.long) for c in completion_ids],
            padding_value=0,
            padding_side="right",
            pad_to_multiple_of=multiple,
        ),
        "tool_mask": pad(
            [torch.tensor(m, dtype=torch.long) for _, _, m, _ in samples],
            padding_value=1,
            padding_side="right",
            pad_to_multiple_of=multiple,
        ),
        "old_per_token_logps": pad(
            [torch.tensor(lp, dtype=torch.float32) for _, _, _, lp in samples],
            padding_value=0.0,
            padding_side="right",
            pad_to_multiple_of=multiple,
        ),
    }
    # trl's mask_truncated_completions: multiply both masks by ~is_truncated
    is_truncated = torch.tensor([t.status is tmpl.Status.TRUNCATED for t in trajectories])
    masked = {
        "completion_mask": want["completion_mask"] * (~is_truncated).unsqueeze(1).int(),
        "tool_mask": want["tool_mask"] * (~is_truncated).unsqueeze(1).int(),
    }
    got = tmpl.collate(trajectories, PAD, pad_to_multiple_of=multiple)
    for key, value in want.items():
        assert torch.equal(got[key], value.to(got[key].dtype)), key
    got = tmpl.collate(trajectories, PAD, pad_to_multiple_of=multiple, mask_truncated=True)
    for key, value in masked.items():
        assert torch.equal(got[key], value.to(got[key].dtype)), key


# -- property: random batches, both twins, the reference ----------------------------------------
turn = st.tuples(
    st.lists(st.integers(0, 500), max_size=12),  # model tokens
    st.lists(st.floats(-20.0, 0.0), min_size=12, max_size=12),  # their logprobs (cut to length)
    st.lists(st.integers(0, 500), max_size=8),  # suffix tokens
)
sample = st.tuples(
    st.lists(st.integers(0, 500), max_size=10),  # prompt
    st.integers(0, 40),  # room left by max_length
    st.one_of(st.none(), st.integers(0, 40)),  # max_completion_length
    st.lists(turn, max_size=4),
    st.booleans(),  # finish
)


@settings(max_examples=500, deadline=None)
@given(st.lists(sample, min_size=1, max_size=6), st.integers(-1, 2**40))
def test_random_batches_equal_the_reference_on_both_twins(samples, pad_id):
    try:
        native = _compat.load("native")["builder"]
    except ImportError:
        pytest.skip("compiled core not built")
    pure = _compat.load("pure")["builder"]
    batches, expected = {}, []
    for builder in (native, pure):
        trajectories = []
        for prompt, room, max_completion, turns, finish in samples:
            max_length = max(len(prompt) + room, 1)
            traj = builder.Trajectory(prompt, max_length, max_completion)
            model = Model(prompt, max_length, max_completion, None)
            for ids, lps, suffix in turns:
                if not traj.running:
                    break
                traj.add_completion(ids, lps[: len(ids)])
                model.add_completion(ids, lps[: len(ids)])
                if traj.running:
                    traj.add_suffix(suffix)
                    model.add_suffix(suffix)
            if finish:
                traj.finish()
            trajectories.append(traj)
            if builder is native:
                expected.append((model.prompt, model.ids, model.mask, [as_float32(x) for x in model.logprobs]))
        batches[builder] = {key: torch.from_numpy(a) for key, a in builder.collate_arrays(trajectories, pad_id).items()}
    want = reference_batch(expected, pad_id)
    assert_batches_equal(batches[native], want)
    assert_batches_equal(batches[pure], want)
