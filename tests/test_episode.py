"""Episodes (tmpl.episode): calls merged into exact training sequences, on both twins.

The generated tests replay call sequences (append-only histories, edited ones that branch, sub-agents,
untrained calls, budgets) against a reference written here from the rule itself (a call continues the
longest sequence of its lineage whose IDs are a prefix of its prompt, else starts one), and check the
invariants: every sampled token in exactly one loss mask, each call's prompt a prefix of its sequence
where it sits, branch reasons naming the first differing token.
"""

from __future__ import annotations

import contextlib
import doctest
import math
import re
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tmpl
from tmpl.backends import Scripted
from tmpl.episode import (
    APPENDED_VERSION,
    BranchKind,
    Call,
    Episode,
    episode_return,
    first_difference,
    returns_to_go,
    token_advantages,
)
from tmpl.episode import _twin as episode_twin
from tmpl.errors import CallError, EpisodeError, RewardError, TrajectoryError

from .test_rollout import FAMILIES, FUNCS, ScriptedConversation

# -- twins -------------------------------------------------------------------------------------


@contextlib.contextmanager
def on_twin(core) -> Iterator[None]:
    """Run the episode builder on ``core``'s episode twin (the hypothesis-safe form of ``twin``)."""
    before = episode_twin.episode
    episode_twin.episode = core.episode
    try:
        yield
    finally:
        episode_twin.episode = before


def test_the_twin_fixture_swaps_the_episode_twin(twin):
    assert episode_twin.episode is twin.episode
    ep = Episode()
    ep.add_call(Call([1], [2], [-0.5]))
    assert type(ep._seqs[0].buf).__module__ == twin.episode.__name__


def test_doctests_of_the_episode_modules(core):
    import tmpl.episode
    import tmpl.episode.advantages
    import tmpl.episode.builder
    import tmpl.episode.types

    with on_twin(core):
        for module in (
            core.episode,
            tmpl.episode,
            tmpl.episode.types,
            tmpl.episode.builder,
            tmpl.episode.advantages,
        ):
            result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
            assert result.failed == 0 and result.attempted > 0, module.__name__


# -- a reference from the rule -----------------------------------------------------------------


class Reference:
    """The merge rule on plain lists, written from the definition (no budget)."""

    def __init__(self) -> None:
        self.ids: list[list[int]] = []
        self.mask: list[list[int]] = []
        self.lineage: list[tuple] = []
        self.of_call: dict[str, int] = {}

    def add(self, call: Call) -> tuple[int, int | None, int | None]:
        """(sequence, against, token) for the call; against/token None unless it branched from one."""
        prompt = call.prompt_ids.tolist()
        mine = [i for i in range(len(self.ids)) if self.lineage[i] == call.lineage]
        full = [i for i in mine if prompt[: len(self.ids[i])] == self.ids[i]]
        against = token = None
        if full:
            best = max(full, key=lambda i: (len(self.ids[i]), i))
            new = prompt[len(self.ids[best]) :]
        else:
            if mine:

                def common(i: int) -> int:
                    k = 0
                    while k < min(len(prompt), len(self.ids[i])) and prompt[k] == self.ids[i][k]:
                        k += 1
                    return k

                against = max(mine, key=lambda i: (common(i), i))
                token = common(against)
            best = len(self.ids)
            self.ids.append([])
            self.mask.append([])
            self.lineage.append(call.lineage)
            new = prompt
        self.ids[best] += new + call.completion_ids.tolist()
        self.mask[best] += [0] * len(new) + [int(call.trained)] * len(call.completion_ids)
        return best, against, token


# -- generated call sequences ------------------------------------------------------------------

VOCAB = st.integers(min_value=0, max_value=4)  # a small vocabulary: prefixes collide often


@st.composite
def call_scripts(
    draw, *, edits: bool = True, subagents: bool = True, untrained: bool = True, append_only: bool = False
) -> list[dict]:
    """A list of steps, each ``{"call": Call, "edit": label or None}``, as an agent would make them:
    append to a history it holds (the last prompt + completion + new context), or, when ``edits``,
    rewrite one (cut it somewhere and go on: a compaction, dropped reasoning), or start a sub-agent.
    ``append_only``: every call appends to the latest history (a loop that only appends)."""
    histories: list[tuple[list[int], tuple]] = []  # (history, (agent, parent))
    steps: list[dict] = []
    n = draw(st.integers(min_value=1, max_value=10))
    for k in range(n):
        choices = ["append"] if histories else ["fresh"]
        if histories and edits:
            choices.append("edit")
        if histories and subagents:
            choices.append("subagent")
        action = draw(st.sampled_from(choices))
        edit = None
        if action == "fresh":
            prompt, lineage = draw(st.lists(VOCAB, min_size=0, max_size=4)), (None, None)
        else:
            h = len(histories) - 1 if append_only else draw(st.integers(min_value=0, max_value=len(histories) - 1))
            history, lineage = histories[h]
            if action == "append":
                prompt = history + draw(st.lists(VOCAB, max_size=3))
            elif action == "edit":
                cut = draw(st.integers(min_value=0, max_value=len(history)))
                prompt = history[:cut] + draw(st.lists(VOCAB, max_size=3))
                edit = draw(st.sampled_from(["compaction", "template dropped reasoning", None]))
            else:
                parent = f"c{draw(st.integers(min_value=0, max_value=k - 1))}"
                lineage = (draw(st.sampled_from(["researcher", None])), parent)
                prompt = draw(st.lists(VOCAB, max_size=4))
        completion = draw(st.lists(VOCAB, min_size=1, max_size=4))
        trained = draw(st.booleans()) if untrained else True
        version = draw(st.integers(min_value=0, max_value=3))
        logprobs = [-0.125 * (i + 1) for i in range(len(completion))]
        call = Call(
            prompt,
            completion,
            logprobs if trained or draw(st.booleans()) else None,
            versions=[version + i % 2 for i in range(len(completion))],
            trained=trained,
            id=f"c{k}",
            agent=lineage[0],
            parent=lineage[1],
            turn=k,
        )
        histories.append((prompt + completion, lineage))
        steps.append({"call": call, "edit": edit})
    return steps


def check_invariants(ep: Episode, steps: list[dict]) -> None:
    seqs = ep.sequences
    calls = {s["call"].id: s["call"] for s in steps}
    covered = {i: np.zeros(len(s.ids), dtype=np.uint8) for i, s in enumerate(seqs)}
    trained_cover = {i: np.zeros(len(s.ids), dtype=np.uint8) for i, s in enumerate(seqs)}
    placed = 0
    for seq in seqs:
        assert len(seq.ids) == len(seq.mask) == len(seq.logprobs) == len(seq.versions) == len(seq.sampled)
        assert seq.ids.dtype == np.int32 and seq.mask.dtype == np.uint8 and seq.logprobs.dtype == np.float32
        assert seq.sampled_cut == sum(span.cut for span in seq.spans)
        if ep.max_length is not None:
            assert len(seq.ids) <= ep.max_length
        for span in seq.spans:
            call = calls[span.call]
            n = len(call.completion_ids)
            assert span.size + span.cut == n  # every sampled token kept or counted as cut
            kept = call.completion_ids[: span.size]
            assert seq.ids[span.start : span.end].tolist() == kept.tolist()
            if span.cut == 0 and ep.max_length is None:
                # the call's prompt is exactly the sequence before its sampled tokens
                assert span.start == len(call.prompt_ids)
                assert seq.ids[: span.start].tolist() == call.prompt_ids.tolist()
            assert not covered[seq.index][span.start : span.end].any()  # no token sampled twice here
            covered[seq.index][span.start : span.end] = 1
            if call.trained:
                trained_cover[seq.index][span.start : span.end] = 1
                assert seq.logprobs[span.start : span.end].tolist() == call.logprobs[: span.size].tolist()
                assert seq.versions[span.start : span.end].tolist() == call.versions[: span.size].tolist()
            placed += 1
        # mask 1 exactly on trained sampled tokens; sampled marks every sampled token
        assert seq.mask.tolist() == trained_cover[seq.index].tolist()
        assert seq.sampled.tolist() == covered[seq.index].tolist()
        off = seq.mask == 0
        assert (seq.logprobs[off] == 0.0).all() and (seq.versions[off] == APPENDED_VERSION).all()
    # every call in exactly one sequence, and that is the one sequence_of names
    assert placed == len(steps)
    for call_id in calls:
        assert [s.index for s in seqs if call_id in s.calls] == [ep.sequence_of(call_id)]
    kept_trained = sum(
        span.size for seq in seqs for span in seq.spans if calls[span.call].trained
    )  # each trained sampled token in exactly one loss mask
    assert sum(seq.trained_tokens for seq in seqs) == kept_trained


@settings(max_examples=150, deadline=None)
@given(steps=call_scripts())
def test_generated_episodes_follow_the_rule(core, steps):
    with on_twin(core):
        ep = Episode(sample_id="gen")
        ref = Reference()
        for step in steps:
            call = step["call"]
            index = ep.add_call(call, edit=step["edit"])
            want, against, token = ref.add(call)
            assert index == want
            branch = ep.sequence(index).branch
            if against is not None and ep.sequence(index).calls[0] == call.id:
                # a branch names the sequence it left and the first differing token
                assert (branch.against, branch.token) == (against, token)
                other = ep.sequence(against).ids.tolist()
                prompt = call.prompt_ids.tolist()
                assert prompt[:token] == other[:token]
                assert branch.got == (prompt[token] if token < len(prompt) else None)
                assert branch.expected == (other[token] if token < len(other) else None)
                assert branch.got is not None or branch.kind == BranchKind.REWOUND
                assert branch.got != branch.expected
                assert branch.edit == step["edit"]
        check_invariants(ep, steps)
        assert [s.ids.tolist() for s in ep.sequences] == ref.ids
        assert [s.mask.tolist() for s in ep.sequences] == ref.mask


@settings(max_examples=80, deadline=None)
@given(steps=call_scripts(edits=False, subagents=False, append_only=True))
def test_append_only_histories_are_one_sequence(core, steps):
    with on_twin(core):
        ep = Episode()
        first = steps[0]["call"].prompt_ids.tolist()
        for step in steps:
            ep.add_call(step["call"])
        # every prompt extends the sequence so far: one sequence, untrained calls included
        assert ep.num_sequences == 1
        [seq] = ep.sequences
        assert seq.branch.kind == BranchKind.FIRST and seq.prompt_length == len(first)
        check_invariants(ep, steps)


@settings(max_examples=120, deadline=None)
@given(steps=call_scripts(), max_length=st.integers(min_value=1, max_value=14))
def test_budgets_cut_and_count_never_lose(core, steps, max_length):
    with on_twin(core):
        ep = Episode(max_length=max_length)
        for step in steps:
            ep.add_call(step["call"], edit=step["edit"])
        check_invariants(ep, steps)
        for seq in ep.sequences:
            if seq.sampled_cut or seq.tokens_cut:
                assert seq.status is tmpl.Status.TRUNCATED
                assert f"max_length={max_length}" in seq.reason and "call '" in seq.reason


@settings(max_examples=60, deadline=None)
@given(steps=call_scripts())
def test_the_twins_build_the_same_sequences(steps):
    from tmpl import _compat

    try:
        native = _compat.load("native")
    except ImportError as exc:
        pytest.skip(f"compiled core not built: {exc}")
    built = []
    for loaded in (native, _compat.load("pure")):
        with on_twin(_Namespace(loaded)):
            ep = Episode(max_length=12)
            for step in steps:
                ep.add_call(step["call"], edit=step["edit"])
            built.append(
                [
                    (
                        s.ids.tolist(),
                        s.mask.tolist(),
                        s.logprobs.tolist(),
                        s.versions.tolist(),
                        s.sampled.tolist(),
                        s.spans,
                        str(s.branch),
                        s.reason,
                    )
                    for s in ep.sequences
                ]
            )
    assert built[0] == built[1]


class _Namespace:
    def __init__(self, modules: dict) -> None:
        self.episode = modules["episode"]


# -- hand-made cases ---------------------------------------------------------------------------


def test_branches_record_tokens_messages_and_edits(twin):
    ep = Episode(sample_id="q")
    user = {"role": "user", "content": "hi"}
    think = {"role": "assistant", "content": "yo", "reasoning_content": "hmm"}
    ep.add_call(Call([1, 2], [3, 4], [-0.1, -0.2], id="a"), messages=[user])
    ep.add_call(Call([1, 2, 3, 4, 5], [6], [-0.3], id="b"), messages=[user, think, user])
    # the template dropped the reasoning of the earlier turn: [3] is gone from the prompt
    c = ep.add_call(
        Call([1, 2, 4, 5, 6, 7], [8], [-0.4], id="c"),
        messages=[user, {"role": "assistant", "content": "yo"}, user, user],
        edit="template dropped reasoning",
    )
    assert c == 1
    branch = ep.sequence(1).branch
    assert (branch.kind, branch.against, branch.token, branch.got, branch.expected) == ("diverged", 0, 2, 4, 3)
    assert (branch.message, branch.field, branch.edit) == (1, "reasoning_content", "template dropped reasoning")
    # a resample of the first prompt cannot extend sequence 0: rewound
    d = ep.add_call(Call([1, 2], [9], [-0.5], id="d"))
    assert ep.sequence(d).branch.kind == BranchKind.REWOUND and ep.sequence(d).branch.token == 2
    assert "prompt ends" in str(ep.sequence(d).branch)


def test_the_longest_prefix_wins(twin):
    ep = Episode()
    ep.add_call(Call([1], [2], [-0.1], id="a"))  # seq 0: [1, 2]
    ep.add_call(Call([5], [6], [-0.1], id="b"))  # seq 1 (diverged)
    ep.add_call(Call([1, 2, 3], [4], [-0.1], id="c"))  # extends seq 0: [1, 2, 3, 4]
    assert ep.add_call(Call([1, 2, 3, 4, 0], [7], [-0.1], id="d")) == 0


def test_sub_agents_get_their_own_sequences_linked_to_the_parent(twin):
    ep = Episode()
    ep.add_call(Call([1, 2], [3], [-0.1], id="main-0"))
    # the sub-agent's prompt even extends the main sequence: a lineage of its own all the same
    k = ep.add_call(Call([1, 2, 3, 4], [5], [-0.2], id="sub-0", parent="main-0", agent="search"))
    assert k == 1
    sub = ep.sequence(1)
    assert (sub.branch.kind, sub.parent, sub.agent, sub.calls) == ("subagent", "main-0", "search", ("sub-0",))
    assert ep.add_call(Call([1, 2, 3, 4, 5, 6], [7], [-0.3], id="sub-1", parent="main-0", agent="search")) == 1
    assert ep.add_call(Call([1, 2, 3, 9], [8], [-0.4], id="main-1")) == 0  # the main agent goes on
    assert ep.add_call(Call([0], [1], [-0.4], id="other", agent="critic")) == 2
    assert ep.sequence(2).branch.kind == BranchKind.AGENT
    with pytest.raises(CallError, match="parent: 'nope' is no earlier call") as err:
        ep.add_call(Call([1], [2], [-0.1], id="x", parent="nope"))
    assert err.value.call == "x" and err.value.field == "parent"


def test_untrained_calls_are_marked_and_not_in_the_mask(twin):
    ep = Episode()
    ep.add_call(Call([1], [2, 3], [-0.1, -0.2], versions=4, id="policy"))
    ep.add_call(Call([1, 2, 3, 9], [5, 6], None, trained=False, id="user-sim"))
    [seq] = ep.sequences
    assert seq.mask.tolist() == [0, 1, 1, 0, 0, 0]
    assert seq.sampled.tolist() == [0, 1, 1, 0, 1, 1]
    np.testing.assert_allclose(seq.logprobs, [0.0, -0.1, -0.2, 0.0, 0.0, 0.0], rtol=1e-6)
    assert seq.versions.tolist() == [-1, 4, 4, -1, -1, -1]


def test_snapshots_do_not_change_when_calls_are_added(twin):
    ep = Episode()
    ep.add_call(Call([1, 2], [3], [-0.1]))
    before = ep.sequences[0]
    ids = before.ids.tolist()
    for k in range(300):  # past the first allocation: the arrays grow into new ones
        ep.add_call(Call(ep.sequences[0].ids.tolist() + [k % 7], [k % 5], [-0.1]))
    assert before.ids.tolist() == ids and not before.ids.flags.writeable
    assert ep.num_sequences == 1 and ep.sequences[0].length == 3 + 2 * 300


def test_budget_cuts_a_call_like_a_turn_and_names_it(twin):
    ep = Episode(max_length=6, sample_id="b")
    ep.add_call(Call([1, 2], [3, 4], [-0.1, -0.2], id="a"))
    ep.add_call(Call([1, 2, 3, 4, 5], [6, 7, 8], [-0.1] * 3, id="b"))
    [seq] = ep.sequences
    assert seq.ids.tolist() == [1, 2, 3, 4, 5, 6] and seq.status is tmpl.Status.TRUNCATED
    assert seq.reason == "call 'b': completion of 3 tokens cut to 1 (2 cut): max_length=6 reached"
    assert (seq.tokens_cut, seq.sampled_cut, seq.spans[-1].cut) == (2, 2, 2)
    # a call that would continue the full sequence is cut whole, and counted
    ep.add_call(Call([1, 2, 3, 4, 5, 6, 0], [9], [-0.1], id="c"))
    seq = ep.sequence(0)
    assert (seq.tokens_cut, seq.sampled_cut, seq.calls[-1]) == (4, 3, "c")
    # a branch whose context alone is over the budget
    ep.add_call(Call([0] * 9, [1, 2], [-0.1, -0.1], id="d"))
    seq = ep.sequence(1)
    assert seq.ids.tolist() == [0] * 6 and seq.sampled_cut == 2 and seq.trained_tokens == 0
    assert "context of 9 tokens cut to 6" in seq.reason and "its 2 sampled tokens cut" in seq.reason


def test_finish_and_add_context(twin):
    ep = Episode(max_length=8)
    with pytest.raises(EpisodeError, match="add a call first"):
        ep.add_context([1])
    ep.add_call(Call([1], [2], [-0.1]))
    assert ep.add_context([3, 4]) == 2
    ep.finish()
    assert ep.sequence(0).status is tmpl.Status.DONE and ep.sequence(0).ids.tolist() == [1, 2, 3, 4]
    with pytest.raises(EpisodeError, match="finished"):
        ep.add_call(Call([1], [2], [-0.1]))


# -- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        ({"logprobs": [-0.1]}, "logprobs", "1 logprobs for 2 sampled tokens"),
        ({"logprobs": [-0.1, float("nan")]}, "logprobs", "logprobs[1] = nan is NaN"),
        ({"logprobs": None}, "logprobs", "a trained call needs one logprob per sampled token"),
        ({"versions": [1, 2, 3]}, "versions", "3 versions for 2 sampled tokens"),
        ({"versions": -1}, "versions", "version -1 is outside"),
        ({"completion_ids": []}, "completion_ids", "a call samples at least one token"),
        ({"prompt_ids": [1, -5]}, "prompt_ids", "prompt_ids[1] = -5 is outside"),
        ({"turn": "3"}, "turn", "must be an int or None"),
    ],
)
def test_bad_calls_raise_call_errors_naming_the_call(kwargs, field, message):
    args = {"prompt_ids": [1], "completion_ids": [2, 3], "logprobs": [-0.1, -0.2], **kwargs}
    with pytest.raises(CallError, match=re.escape(message)) as err:
        Call(args.pop("prompt_ids"), args.pop("completion_ids"), args.pop("logprobs"), id="c7", **args)
    assert err.value.call == "c7" and err.value.field == field and "call 'c7'" in str(err.value)
    assert isinstance(err.value, (EpisodeError, TrajectoryError, ValueError))


def test_non_finite_rewards_and_duplicate_ids_are_refused(twin):
    with pytest.raises(RewardError, match="call 'c0': reward nan is not a finite number"):
        Call([1], [2], [-0.1], id="c0", reward=float("nan"))
    with pytest.raises(RewardError, match="episode 'e': reward inf"):
        Episode(sample_id="e", reward=float("inf"))
    ep = Episode(sample_id="e")
    ep.add_call(Call([1], [2], [-0.1], id="c0"))
    with pytest.raises(RewardError, match="episode 'e', call 'c0': reward -inf"):
        ep.set_call_reward("c0", -math.inf)
    with pytest.raises(RewardError, match="not a number"):
        ep.reward = "1"  # type: ignore[assignment]
    with pytest.raises(CallError, match="is already a call of this episode"):
        ep.add_call(Call([1], [2], [-0.1], id="c0"))
    with pytest.raises(CallError, match="is no call of this episode"):
        ep.set_call_reward("zz", 1.0)
    with pytest.raises(RewardError, match="has no reward"):
        episode_return(ep)


def test_first_difference_of_messages():
    a = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "tool_calls": [1]}]
    assert first_difference(a, a) is None
    assert first_difference(a, [a[0], {"role": "assistant", "content": "z", "tool_calls": [1]}]) == (1, "content")
    assert first_difference(a, [a[0], {"role": "assistant", "content": "y"}]) == (1, "tool_calls")
    assert first_difference(a, a[:1]) == (1, None)
    assert first_difference([{"role": "user", "content": "x", "extra": 1}], [{"role": "user", "content": "x"}]) == (
        0,
        "extra",
    )


# -- rewards and advantages against a hand computation -------------------------------------------


def _episode(reward: float | None, call_rewards: list[float | None], sample: str) -> Episode:
    ep = Episode(sample_id=sample, reward=reward)
    prompt: list[int] = [1]
    for k, r in enumerate(call_rewards):
        ep.add_call(Call(prompt, [10 + k, 20 + k], [-0.5, -0.5], id=f"t{k}", reward=r))
        prompt = prompt + [10 + k, 20 + k, 99]
    return ep


def test_grpo_and_rloo_advantages_by_hand(twin):
    # three samples of one prompt; returns R = episode reward + call rewards:
    #   s0: 1.0 + (0.5 + 0.0) = 1.5   (two turns)
    #   s1: 0.0 + (0.0)        = 0.0   (one turn)
    #   s2: 2.0 + (0.5 + 0.5 + 0.5) = 3.5  (three turns)
    group = [_episode(1.0, [0.5, 0.0], "s0"), _episode(0.0, [0.0], "s1"), _episode(2.0, [0.5, 0.5, 0.5], "s2")]
    assert [episode_return(ep) for ep in group] == [1.5, 0.0, 3.5]
    # reward to go of s2's calls: t0 2.0+1.5, t1 2.0+1.0, t2 2.0+0.5
    assert returns_to_go(group[2]) == {"t0": 3.5, "t1": 3.0, "t2": 2.5}
    mean = (1.5 + 0.0 + 3.5) / 3  # 5/3
    std = math.sqrt(((1.5 - mean) ** 2 + (0.0 - mean) ** 2 + (3.5 - mean) ** 2) / 2)  # n - 1, as torch.std
    eps = 1e-6
    # one sequence per sample (append-only): 1 prompt token, then per turn 2 sampled + 1 context token
    adv = token_advantages(group, estimator="grpo", eps=eps, reward_to_go=False)
    assert [len(a) for a in adv] == [1, 1, 1]
    want0 = (1.5 - mean) / (std + eps)
    np.testing.assert_allclose(adv[0][0], [0, want0, want0, 0, want0, want0], rtol=1e-6)
    # reward to go: s0's second turn only has 1.0 + 0.0 coming
    adv = token_advantages(group, estimator="grpo", eps=eps)
    # s0 is [1, 10, 20, 99, 11, 21]: turn 0 has 1.0 + 0.5 + 0.0 to go, turn 1 has 1.0 + 0.0
    a0, a1 = (1.5 - mean) / (std + eps), (1.0 - mean) / (std + eps)
    np.testing.assert_allclose(adv[0][0], [0, a0, a0, 0, a1, a1], rtol=1e-6)
    seq2 = group[2].sequences[0]
    expect2 = np.zeros(len(seq2.ids))
    for k, g in enumerate([3.5, 3.0, 2.5]):
        expect2[1 + 3 * k : 3 + 3 * k] = (g - mean) / (std + eps)
    np.testing.assert_allclose(adv[2][0], expect2, rtol=1e-6)
    # Dr. GRPO: no division
    adv = token_advantages(group, scale=False, reward_to_go=False)
    np.testing.assert_allclose(adv[1][0], [0, 0 - mean, 0 - mean], rtol=1e-6)
    # RLOO: each sample's baseline is the mean of the others' returns
    adv = token_advantages(group, estimator="rloo", reward_to_go=False)
    np.testing.assert_allclose(adv[0][0][1], 1.5 - (0.0 + 3.5) / 2)
    np.testing.assert_allclose(adv[1][0][1], 0.0 - (1.5 + 3.5) / 2)
    np.testing.assert_allclose(adv[2][0][1], 3.5 - (1.5 + 0.0) / 2)
    # the baseline is over samples, not turns: s2's three turns count once
    assert all(a.dtype == np.float32 for rows in adv for a in rows)


def test_advantages_only_on_loss_mask_tokens_of_every_sequence(twin):
    ep = Episode(reward=1.0)
    ep.add_call(Call([1], [2], [-0.1], id="a"))
    ep.add_call(Call([7], [3], None, trained=False, id="sim"))  # a branch, untrained
    ep.add_call(Call([7, 3, 4], [5], [-0.1], id="b"))
    other = Episode(reward=0.0)
    other.add_call(Call([1], [2], [-0.1]))
    adv = token_advantages([ep, other], estimator="rloo")
    assert adv[0][0].tolist() == [0.0, 1.0] and adv[0][1].tolist() == [0.0, 0.0, 0.0, 1.0]
    with pytest.raises(RewardError, match="RLOO needs at least 2"):
        token_advantages([ep], estimator="rloo")
    with pytest.raises(RewardError, match="unknown estimator"):
        token_advantages([ep], estimator="ppo")  # type: ignore[arg-type]
    with pytest.raises(RewardError, match="no episodes"):
        token_advantages([])


# -- append mode equals today's Trajectory: a real Rollout, a real tokenizer ---------------------


def _rollout_with_calls(tpl, plan, users, **kwargs):
    scripts = [ScriptedConversation(tpl, u, plan) for u in users]
    calls: dict[int, list[tuple[list[int], list[int]]]] = {i: [] for i in range(len(users))}

    def policy(request):
        i, _, turn = request.request_id.split("-")
        ids = scripts[int(i)].completion(int(turn))
        calls[int(i)].append((list(request.prompt_ids), ids))
        return ids

    rollout = tmpl.Rollout(tpl, Scripted(policy), tools=FUNCS, max_length=8192, **kwargs)
    results = rollout.run([[{"role": "user", "content": u}] for u in users])
    return results, calls


@pytest.mark.parametrize("family", ["qwen2.5-instruct", "llama-3.2-instruct"])
def test_append_only_episode_equals_the_rollout_trajectory(twin, family, tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of(family), name=family)
    plan, _ = FAMILIES[family]
    results, calls = _rollout_with_calls(tpl, plan, ["Weather in Paris?", "Plan my day."], max_turns=5)
    for res in results:
        assert res.status.name == "DONE", res.reason
        ep = Episode()
        for k, (prompt, completion) in enumerate(calls[res.index]):
            ep.add_call(Call(prompt, completion, [-0.25] * len(completion), versions=0, turn=k))
        assert ep.num_sequences == 1  # the loop's history is append-only
        [seq] = ep.sequences
        p = len(res.prompt_ids)
        assert seq.ids.tolist() == res.prompt_ids.tolist() + res.completion_ids.tolist()
        assert seq.mask.tolist() == [0] * p + res.mask.tolist()
        assert seq.logprobs.tolist() == [0.0] * p + res.logprobs.tolist()
        assert seq.versions.tolist() == [-1] * p + res.versions.tolist()
        assert seq.prompt_length == p and seq.turns == (0, 1, 2)
        # and from the result itself
        mine = Episode.from_result(res).sequences[0]
        for name in ("ids", "mask", "logprobs", "versions", "sampled"):
            assert getattr(mine, name).tolist() == getattr(seq, name).tolist(), name
        assert [s.size for s in mine.spans] == [s.size for s in res.spans if s.kind == "completion"]


def test_from_result_and_rows_collate_like_the_result(twin, tokenizer_of):
    tpl = tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"), name="qwen2.5")
    call = tpl.codec.encode(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    )
    # a completion budget the second tool suffix overflows: the trajectory ends with a cut suffix
    rollout = tmpl.Rollout(
        tpl,
        Scripted(lambda r: call),
        tools=FUNCS,
        max_turns=8,
        max_length=10_000,
        max_completion_length=2 * len(call) + 30,
    )
    [res] = rollout.run([[{"role": "user", "content": "q"}]])
    assert res.status.name == "TRUNCATED" and res.spans[-1].kind == "suffix" and res.trajectory.tokens_cut > 0
    ep = Episode.from_result(res)
    [seq] = ep.sequences
    assert seq.ids.tolist() == res.prompt_ids.tolist() + res.completion_ids.tolist()
    assert (seq.status, seq.reason, seq.tokens_cut) == (res.status, res.reason, res.trajectory.tokens_cut)
    assert seq.sampled_cut == 0  # a suffix was cut, no sampled token
    ours = tmpl.trajectory.collate_arrays(ep.rows(), pad_id=0)
    theirs = tmpl.trajectory.collate_arrays([res], pad_id=0)
    assert ours.keys() == theirs.keys()
    for key in theirs:
        np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)
    # the spans too, but for their message labels (an episode keeps none)
    assert [s._replace(message=None) for s in ep.rows()[0].trajectory.spans] == [
        s._replace(message=None) for s in res.spans
    ]


def test_from_trajectory_carries_a_cut_completion(twin):
    t = tmpl.Trajectory([1, 2], max_length=5)
    t.add_completion([3, 4, 5, 6], [-0.1] * 4)
    ep = Episode.from_trajectory(t)
    [seq] = ep.sequences
    assert seq.ids.tolist() == [1, 2, 3, 4, 5] and seq.status is tmpl.Status.TRUNCATED
    assert (seq.tokens_cut, seq.sampled_cut, seq.reason) == (1, 1, t.reason)
    assert Episode.from_trajectory(tmpl.Trajectory([1], max_length=4)).num_sequences == 0
