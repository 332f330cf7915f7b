"""Regression tests: the four ways slime's retool rollout desynchronized IDs, loss mask and logprobs.

Each failure mode is described in THUDM/slime PR #1861 ("harden retool rollout against
multi-turn / retry desync"): the arrays of a sample must keep the same length through retries,
context-cap clamping, missing logprobs and tool outputs that overflow the context. Each test
replays the scenario against the Trajectory, on both twins.
"""

from __future__ import annotations

import pytest

from tmpl import Status


def aligned(traj) -> bool:
    return len(traj.completion_ids) == len(traj.mask) == len(traj.logprobs) == traj.completion_length


def test_slime_retool_stale_state_on_retry(twin):
    """A retried sample must not append onto the previous attempt's logprobs and mask."""
    traj = twin.builder.Trajectory([1, 2, 3], max_length=64, sample_id="retry")
    traj.add_completion([10, 11, 12], [-0.1, -0.2, -0.3])
    traj.add_suffix([20, 21])
    traj.abort("rollout manager re-enqueued the sample")

    traj.reset()  # the retry
    traj.add_completion([30, 31], [-1.0, -2.0])

    assert traj.status is Status.RUNNING
    assert traj.completion_ids.tolist() == [30, 31]
    assert traj.mask.tolist() == [1, 1]
    assert traj.logprobs.tolist() == [-1.0, -2.0]
    assert traj.spans[0].start == 0 and len(traj.spans) == 1
    assert aligned(traj)


def test_slime_retool_generation_past_the_context_cap(twin):
    """Per-turn max_new_tokens must be clamped to what is left of the context, not the response cap."""
    max_length, max_response = 100, 60
    traj = twin.builder.Trajectory(list(range(50)), max_length, max_response, sample_id="cap")
    traj.add_completion([1] * 30, [-0.5] * 30)
    traj.add_suffix([2] * 15)
    # 50 prompt + 45 completion: 5 tokens of context left, though the response cap alone leaves 15
    assert traj.max_new_tokens(max_response) == 5
    # an engine that ignores the clamp still cannot push the sample past the cap
    traj.add_completion([3] * 12, [-0.5] * 12)
    assert traj.prompt_length + traj.completion_length == max_length
    assert traj.status is Status.TRUNCATED and traj.tokens_cut == 7
    assert aligned(traj) and traj.max_new_tokens(max_response) == 0


@pytest.mark.parametrize("logprobs", [None, [], [-0.5] * 3], ids=["none", "empty", "short"])
def test_slime_retool_missing_logprobs(twin, logprobs):
    """Text without output_token_logprobs aborts the sample; nothing is re-tokenized or padded in."""
    traj = twin.builder.Trajectory([1, 2], max_length=64, sample_id="nolp")
    traj.add_completion([5, 6], [-0.1, -0.2])
    kept = traj.add_completion([7, 8, 9, 10], logprobs)
    assert kept == 0
    assert traj.status is Status.ABORTED and "4" in traj.reason
    assert traj.completion_ids.tolist() == [5, 6] and traj.logprobs.tolist() == pytest.approx([-0.1, -0.2])
    assert aligned(traj)


def test_slime_retool_post_tool_overflow(twin):
    """A tool output that overflows the context is cut with ids, mask and logprobs together."""
    traj = twin.builder.Trajectory([1] * 10, max_length=40, sample_id="overflow")
    traj.add_completion([5] * 20, [-0.3] * 20)
    kept = traj.add_suffix(list(range(100, 125)))  # 25-token interpreter output, 10 tokens of room
    assert kept == 10
    assert traj.completion_ids.tolist()[20:] == list(range(100, 110))
    assert traj.mask.tolist() == [1] * 20 + [0] * 10
    assert traj.logprobs.tolist()[20:] == [0.0] * 10
    assert traj.status is Status.TRUNCATED and traj.tokens_cut == 15 and "suffix of 25 tokens" in traj.reason
    assert traj.prompt_length + traj.completion_length == 40
    assert aligned(traj)
