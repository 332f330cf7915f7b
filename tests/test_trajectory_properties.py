"""Property tests: random operation sequences on the compiled twin, the pure twin and a list model.

For every step: both twins give the same result (return value, or error type and message) and
the same state; the state matches the plain-list model of the spec; the three arrays have one
length; neither budget is exceeded; a final status never changes until ``reset()``; and every
array handed out earlier still shows what it showed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tmpl import _compat
from tmpl.errors import LogprobError, TmplError, TokenIdError, TrajectoryClosedError

from .trajectory_model import ABORTED, RUNNING, BadId, BadLogprob, Closed, Model, as_float32

try:
    NATIVE = _compat.load("native")["builder"]
except ImportError:  # pragma: no cover - the compiled core is not built
    NATIVE = None
PURE = _compat.load("pure")["builder"]

pytestmark = pytest.mark.skipif(NATIVE is None, reason="compiled core not built: python setup.py build_ext --inplace")

VOCAB = 64
SETTINGS = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- strategies ----------------------------------------------------------------------------------
valid_id = st.integers(0, VOCAB - 1)
odd_but_valid_id = st.one_of(st.builds(np.int64, valid_id), st.builds(np.uint16, valid_id), st.booleans())
invalid_id = st.sampled_from([-1, VOCAB, 2**31, 2**64, 1.5])
token = st.one_of(valid_id, valid_id, valid_id, valid_id, odd_but_valid_id, invalid_id)
clean_token = st.one_of(valid_id, st.integers(VOCAB, 2**31 - 1))  # valid when there is no vocabulary

valid_lp = st.floats(-30.0, 0.0)
odd_but_valid_lp = st.one_of(st.builds(np.float32, valid_lp), st.sampled_from([0, -1, -0.0, 1e-60]))
invalid_lp = st.sampled_from([math.nan, 0.25, math.inf, -math.inf, -1e39, None, "x"])
logprob = st.one_of(valid_lp, valid_lp, valid_lp, valid_lp, odd_but_valid_lp, invalid_lp)
message = st.one_of(st.none(), st.integers(0, 9))
container = st.sampled_from(["list", "list", "tuple", "ndarray"])


def sometimes_bad(draw, good, mixed):
    """Mostly clean inputs; one in five may hold odd or invalid items."""
    return mixed if draw(st.integers(0, 4)) == 0 else good


@st.composite
def completion_op(draw):
    ids = draw(st.lists(sometimes_bad(draw, valid_id, token), max_size=30))
    shape = draw(st.sampled_from(["same", "same", "same", "same", "none", "short", "long"]))
    count = {"same": len(ids), "none": 0, "short": max(len(ids) - 1, 0), "long": len(ids) + 1}[shape]
    lps = draw(st.lists(sometimes_bad(draw, valid_lp, logprob), min_size=count, max_size=count))
    return ("completion", ids, None if shape == "none" else lps, draw(container), draw(message))


@st.composite
def suffix_op(draw):
    ids = draw(st.lists(sometimes_bad(draw, valid_id, token), max_size=30))
    return ("suffix", ids, None, draw(container), draw(message))


# weights by repetition: hypothesis merges repeats of one strategy object, so each is a new one
operation = st.one_of(
    *[completion_op() for _ in range(5)],
    *[suffix_op() for _ in range(4)],
    *[st.tuples(st.just("max_new_tokens"), st.one_of(st.none(), st.integers(0, 80))) for _ in range(2)],
    st.tuples(st.just("finish")),
    st.tuples(st.just("abort")),
    st.tuples(st.just("reset")),
)


@st.composite
def scenario(draw):
    vocab = draw(st.sampled_from([None, VOCAB]))
    prompt = draw(st.lists(valid_id, max_size=12))
    max_length = max(len(prompt) + draw(st.integers(0, 50)), 1)
    max_completion = draw(st.one_of(st.none(), st.integers(0, 50)))
    ops = draw(st.lists(operation, min_size=4, max_size=25))
    return vocab, prompt, max_length, max_completion, ops


# -- running one step on every implementation ----------------------------------------------------
def shaped(values, kind, kinds="iu"):
    """``values`` as a list, tuple or numpy array (of numpy kind in ``kinds``; else left a list)."""
    if values is None or kind == "list":
        return values
    if kind == "tuple":
        return tuple(values)
    if not values:
        return np.array([], dtype=np.int64 if "i" in kinds else np.float64)
    try:
        array = np.array(values)
    except (OverflowError, ValueError, TypeError):
        return values
    return array if array.ndim == 1 and array.dtype.kind in kinds else values


def on_twin(traj, op):
    try:
        name = op[0]
        if name == "completion":
            _, ids, lps, kind, msg = op
            return ("ok", traj.add_completion(shaped(ids, kind), shaped(lps, kind, "f"), message=msg))
        if name == "suffix":
            _, ids, _, kind, msg = op
            return ("ok", traj.add_suffix(shaped(ids, kind), message=msg))
        if name == "max_new_tokens":
            return ("ok", traj.max_new_tokens(op[1]))
        if name == "finish":
            return ("ok", int(traj.finish()))
        if name == "abort":
            return ("ok", int(traj.abort("caller gave up")))
        traj.reset()
        return ("ok", None)
    except TmplError as err:
        return ("error", type(err), str(err), getattr(err, "position", None))


def on_model(model, op):
    try:
        name = op[0]
        if name == "completion":
            return ("ok", model.add_completion(op[1], op[2], op[4]))
        if name == "suffix":
            return ("ok", model.add_suffix(op[1], op[4]))
        if name == "max_new_tokens":
            return ("ok", model.max_new_tokens(op[1]))
        if name == "finish":
            return ("ok", model.finish())
        if name == "abort":
            return ("ok", model.abort())
        model.reset()
        return ("ok", None)
    except Closed:
        return ("error", TrajectoryClosedError, None)
    except BadId as err:
        return ("error", TokenIdError, err.position)
    except BadLogprob as err:
        return ("error", LogprobError, err.position)


def state(traj):
    return (
        traj.completion_ids.tobytes(),
        traj.mask.tobytes(),
        traj.logprobs.tobytes(),
        int(traj.status),
        traj.reason,
        traj.tokens_cut,
        traj.spans,
        traj.num_turns,
        traj.remaining,
        traj.max_new_tokens(),
        traj.length,
    )


def check_against_model(traj, model):
    assert traj.completion_ids.tolist() == model.ids
    assert traj.mask.tolist() == model.mask
    assert traj.logprobs.tolist() == [as_float32(x) for x in model.logprobs]
    assert int(traj.status) == model.status
    assert traj.tokens_cut == model.cut
    assert [tuple(s) for s in traj.spans] == model.spans
    assert traj.num_turns == model.turns
    assert traj.max_new_tokens() == model.max_new_tokens(None)


def check_invariants(traj, max_length, max_completion):
    n = traj.completion_length
    assert len(traj.completion_ids) == len(traj.mask) == len(traj.logprobs) == n
    assert traj.prompt_length + n <= max_length
    assert n <= (max_length if max_completion is None else max_completion)
    assert (traj.reason == "") == (int(traj.status) in (RUNNING, 1))
    if n:
        model_tokens = traj.mask.astype(bool)
        assert np.all(traj.logprobs[~model_tokens] == 0.0)
        assert np.all(traj.logprobs[model_tokens] <= 0.0) and np.all(np.isfinite(traj.logprobs))


@SETTINGS
@given(scenario())
def test_random_operations_agree_across_twins_and_model(case):
    vocab, prompt, max_length, max_completion, ops = case
    native = NATIVE.Trajectory(prompt, max_length, max_completion, vocab_size=vocab, sample_id="prop")
    pure = PURE.Trajectory(prompt, max_length, max_completion, vocab_size=vocab, sample_id="prop")
    model = Model(prompt, max_length, max_completion, vocab)
    handed_out = []
    for op in ops:
        if vocab is None and op[0] in ("completion", "suffix"):
            op = (op[0], [t if t != VOCAB else VOCAB + 1 for t in op[1]], *op[2:])
        before = int(native.status)
        got_native, got_pure, want = on_twin(native, op), on_twin(pure, op), on_model(model, op)
        event(f"{op[0]}: {got_native[1].__name__ if got_native[0] == 'error' else 'ok'}")
        assert got_native == got_pure, op
        if want[0] == "ok":
            assert got_native == want, op
        else:
            assert got_native[0] == "error" and got_native[1] is want[1], (op, got_native, want)
            if want[2] is not None:
                assert got_native[3] == want[2], (op, got_native)
        assert state(native) == state(pure), op
        check_against_model(native, model)
        check_invariants(native, max_length, max_completion)
        if before != RUNNING and op[0] != "reset":
            assert int(native.status) == before, "a final status changed"
        if int(native.status) == ABORTED:
            assert native.reason
        for traj in (native, pure):
            for view in (traj.completion_ids, traj.mask, traj.logprobs):
                handed_out.append((view, view.copy()))
    event(f"ends {native.status.name}")
    for view, copy in handed_out:
        assert np.array_equal(view, copy, equal_nan=True), "an array handed out changed afterwards"


@settings(max_examples=800, deadline=None)
@given(
    st.lists(st.one_of(valid_id, odd_but_valid_id, invalid_id), max_size=40),
    st.lists(logprob, max_size=40),
    st.sampled_from([None, VOCAB]),
)
def test_mixed_item_types_give_the_same_result_on_both_twins(ids, lps, vocab):
    """The compiled core reads exact ints/floats in C and hands anything else to the shared checks."""
    lps = (lps * (len(ids) // max(len(lps), 1) + 1))[: len(ids)] if lps else [-1.0] * len(ids)
    results = []
    for builder in (NATIVE, PURE):
        traj = builder.Trajectory([], 100, vocab_size=vocab, sample_id=("mixed", 1))
        results.append((on_twin(traj, ("completion", ids, lps, "list", None)), state(traj)))
    assert results[0] == results[1]


@settings(max_examples=600, deadline=None)
@given(st.lists(clean_token, max_size=50), st.lists(valid_lp, max_size=50), st.integers(0, 60), container)
def test_prompt_and_completion_round_trip_exactly(ids, lps, room, kind):
    """What fits is stored bit for bit: IDs as given, logprobs as their float32 rounding."""
    n = min(len(ids), len(lps))
    ids, lps = ids[:n], lps[:n]
    max_length = max(len(ids) + room, 1)
    for builder in (NATIVE, PURE):
        traj = builder.Trajectory(shaped(ids, kind), max_length)
        kept = traj.add_completion(shaped(ids, kind), shaped(lps, kind, "f"))
        assert kept == min(n, max_length - len(ids))
        assert traj.prompt_ids.tolist() == ids
        assert traj.completion_ids.tolist() == ids[:kept]
        assert traj.logprobs.tolist() == [as_float32(x) for x in lps[:kept]]
        assert traj.tokens_cut == n - kept
