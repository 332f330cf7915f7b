"""slime's generate function when a sample's episode has several training sequences (issue 36, item 3).

``make_generate(history="template" | edit_history=... | a SubAgent tool)`` returns a ``list[Sample]``,
one per training sequence. The oracles: the IDs the (Scripted) engine was sent and sampled, recorded
from its requests, and the tokenizer's own ``apply_chat_template`` render of the messages of each turn.
The samples are stand-ins with the fields of slime's ``Sample`` (slime/utils/types.py at THUDM/slime
624b824a); where ``TMPL_SLIME_SRC`` names a slime checkout, the last tests run slime's own list
handling on them (``generate_and_rm_group``, ``validate_rollout_id_annotated``, the flattening and
``_convert_samples_to_train_data``).
"""

from __future__ import annotations

import asyncio
import copy
import doctest
import math
import os
import statistics
import sys
import types
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import tmpl
import tmpl.integrations.slime as slime_module
from tmpl.backends import Scripted
from tmpl.integrations.slime import make_generate, post_process_rewards
from tmpl.rollout import SubAgent

from .conftest import family_source, load_tokenizer
from .test_history_modes import USER, Recorder, _calls_script, _qwen3_script, _render, more_users
from .test_rollout import FUNCS
from .test_subagents import TASK, Engine
from .test_subagents import get_weather as weather_tool

QWEN3_QUESTIONS = ("And in Tokyo?", "Thanks!")


@dataclass
class Sample:
    """Stand-in with the fields of slime's ``Sample`` that a generate function and the reward path use
    (slime/utils/types.py at THUDM/slime 624b824a)."""

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: object = ""
    tokens: list = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: object = None
    loss_mask: list | None = None
    rollout_log_probs: list | None = None
    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    session_id: str | None = None


def _args(**kw):
    return SimpleNamespace(
        hf_checkpoint="unused", rollout_max_response_len=kw.pop("max_response", 1024), rollout_max_context_len=4096
    )


PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 256}


def _qwen3_generate(rec, **kw):
    tpl = tmpl.ChatTemplate(load_tokenizer("qwen3"), name="qwen3")
    generate = make_generate(
        tools=FUNCS,
        template=tpl,
        backend=Scripted(rec),
        max_turns=8,
        history="template",
        edit_history=more_users(*QWEN3_QUESTIONS),
        **kw,
    )
    return tpl, generate


def _turns_of(s) -> list[int]:
    return list(s.metadata["tmpl_turns"])


def _check_samples_against_the_engine(tpl, samples, rec):
    """Each Sample is what the engine was sent and sampled: its tokens start with the prompt of its first
    turn, hold every later turn's prompt as a prefix and its sampled IDs right after; the loss mask is 1
    exactly on those sampled IDs; logprobs are the engine's there and 0.0 elsewhere; every sampled token
    is in exactly one Sample's loss mask."""
    assert sum(sum(s.loss_mask) for s in samples) == sum(len(ids) for ids in rec.sampled)
    trained = sorted(t for s in samples for t in _turns_of(s))
    assert trained == list(range(len(rec.sampled)))  # each turn in exactly one Sample
    for s in samples:
        turns = _turns_of(s)
        prompt = rec.prompts[turns[0]]
        assert len(s.tokens) == len(prompt) + s.response_length and s.response_length > 0
        assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
        assert s.tokens[: len(prompt)] == prompt
        expected = [0] * s.response_length
        for t in turns:
            at = len(rec.prompts[t])
            assert s.tokens[:at] == rec.prompts[t], f"turn {t}: the engine's prompt is a prefix of the Sample"
            assert s.tokens[at : at + len(rec.sampled[t])] == rec.sampled[t], f"turn {t}: sampled IDs"
            expected[at - len(prompt) : at - len(prompt) + len(rec.sampled[t])] = [1] * len(rec.sampled[t])
        assert s.loss_mask == expected
        assert s.tokens[-1] == rec.sampled[turns[-1]][-1]  # a sequence ends with what its last call sampled
        assert all((lp == -0.25) if m else (lp == 0.0) for lp, m in zip(s.rollout_log_probs, s.loss_mask))


def test_template_mode_returns_one_sample_per_sequence_exact_to_the_engine_and_the_template(twin):
    rec = Recorder(_qwen3_script(tmpl.ChatTemplate(load_tokenizer("qwen3"), name="qwen3")))
    tpl, generate = _qwen3_generate(rec)
    parent = Sample(group_index=3, index=7, prompt=[{"role": "user", "content": USER}], label="sunny")
    parent.metadata = {"source": "weather"}
    out = asyncio.run(generate(_args(), parent, dict(PARAMS)))

    # thinking dropped at each new user turn: three sequences, three Samples, the parent object first
    assert isinstance(out, list) and len(out) == 3 and out[0] is parent
    assert [_turns_of(s) for s in out] == [[0, 1], [2, 3], [4]]
    _check_samples_against_the_engine(tpl, out, rec)
    messages = out[0].metadata["messages"]
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for s in out:
        # its prompt is the template's render of the conversation before its first turn (as text: the
        # sampled IDs spliced back may be a tokenization the tokenizer would not produce)
        first = _turns_of(s)[0]
        rendered = _render(tpl, messages[: assistants[first]], tokenize=False)
        assert tpl.codec.decode(s.tokens[: len(s.tokens) - s.response_length]) == rendered
    # the first Sample's prompt is the tokenizer's own render, IDs and all
    assert out[0].tokens[: len(out[0].tokens) - out[0].response_length] == _render(tpl, messages[:1], tokenize=True)
    # the episode: one rollout_id for slime's loss reducer, the parent's index and group, the branch named
    for k, s in enumerate(out):
        assert (s.index, s.group_index, s.rollout_id, s.label) == (7, 3, 7, "sunny")
        assert s.status is Sample.Status.COMPLETED and s.reward is None
        assert s.metadata["source"] == "weather" and s.metadata["tmpl_sequence"] == k
        assert s.metadata["tmpl_sequences"] == 3 and s.metadata["tmpl_episode"] == {
            "index": 7,
            "group_index": 3,
            "rollout_id": 7,
        }
        # every Sample scores as the episode: the same response, the episode's last answer
        assert s.response == tpl.tokenizer.decode(rec.sampled[-1])
    assert out[0].metadata["tmpl_branch"] == "first"
    for s in out[1:]:
        assert s.metadata["tmpl_branch_kind"] == "diverged"
        assert "template dropped reasoning" in s.metadata["tmpl_branch"]
        assert "reasoning_content" in s.metadata["tmpl_branch"]
    # the Samples share no mutable field (slime and its hooks write them one by one)
    assert len({id(s.metadata) for s in out}) == len({id(s.loss_mask) for s in out}) == 3
    assert len({id(s.tokens) for s in out}) == 3 and out[1].prompt is not out[0].prompt


def test_a_retried_sample_is_written_fresh_and_append_mode_still_returns_the_sample(twin):
    tpl = tmpl.ChatTemplate(load_tokenizer("qwen3"), name="qwen3")
    rec = Recorder(_qwen3_script(tpl))
    _, generate = _qwen3_generate(rec)
    stale = Sample(index=1, group_index=0, prompt=[{"role": "user", "content": USER}], tokens=[9] * 20)
    stale.response, stale.response_length, stale.loss_mask, stale.rollout_log_probs = "old", 5, [1] * 5, [-3.0] * 5
    stale.status, stale.rollout_id = Sample.Status.ABORTED, 11
    out = asyncio.run(generate(_args(), stale, dict(PARAMS)))
    _check_samples_against_the_engine(tpl, out, rec)
    assert all(s.rollout_id == 11 and s.response != "old" for s in out)  # a rollout_id given is kept

    # append mode: the one Sample, as before (not a list), the trajectory's IDs
    one = Recorder(_qwen3_script(tpl)[:2])
    generate = make_generate(tools=FUNCS, template=tpl, backend=Scripted(one), max_turns=4)
    sample = Sample(index=2, prompt=[{"role": "user", "content": USER}])
    got = asyncio.run(generate(_args(), sample, dict(PARAMS)))
    assert got is sample and sample.status is Sample.Status.COMPLETED
    assert sample.tokens[: len(one.prompts[1])] == one.prompts[1]
    assert sample.tokens == one.prompts[1] + one.sampled[1]
    assert sum(sample.loss_mask) == sum(len(x) for x in one.sampled)
    assert "tmpl_sequence" not in sample.metadata and sample.rollout_id is None


def test_a_subagent_tool_gives_the_parents_and_the_subagents_samples(twin):
    """Append mode with a SubAgent tool: the parent's sequence and the sub-agent's, each a Sample, with
    the IDs the engine was sent and sampled, every sampled token in one loss mask."""
    tpl = tmpl.ChatTemplate(load_tokenizer("qwen2.5-instruct"), name="qwen2.5-instruct")
    engine = Engine(tpl)
    backend = Scripted(engine)
    sub = tmpl.Rollout(tpl, backend, tools=[weather_tool], max_turns=4)
    research = SubAgent(sub, name="research", description="Look something up and answer in one line.")
    generate = make_generate(tools=[research], template=tpl, backend=backend, max_turns=4)
    parent = Sample(index=0, group_index=0, prompt=[{"role": "user", "content": "Umbrella for Paris?"}])
    out = asyncio.run(generate(_args(), parent, dict(PARAMS)))
    assert isinstance(out, list) and [s.metadata["tmpl_agent"] for s in out] == [None, "research"]
    assert out[1].metadata["tmpl_branch_kind"] == "subagent"
    assert sum(sum(s.loss_mask) for s in out) == sum(len(ids) for ids in engine.sampled.values())
    for s, is_sub in zip(out, (False, True)):
        rids = sorted(rid for rid in engine.sent if ("@" in rid) == is_sub)
        assert len(rids) == 2
        first, last = engine.sent[rids[0]], engine.sent[rids[-1]]
        assert s.tokens[: len(s.tokens) - s.response_length] == first
        assert s.tokens == last + engine.sampled[rids[-1]]
        mask = [0] * s.response_length
        for rid in rids:
            at = len(engine.sent[rid]) - len(first)
            mask[at : at + len(engine.sampled[rid])] = [1] * len(engine.sampled[rid])
        assert s.loss_mask == mask
    assert out[1].tokens[: len(out[1].tokens) - out[1].response_length] == _render(
        tpl, [{"role": "user", "content": TASK}], tokenize=True, tools=tmpl.Toolbox([weather_tool]).schemas
    )
    assert {s.rollout_id for s in out} == {0}


def test_a_rollout_that_may_branch_always_answers_with_a_list(twin):
    """Template mode on one user turn of Qwen3 with tools has one sequence: still a list (slime flattens
    a group only when all its members have one shape)."""
    tpl = tmpl.ChatTemplate(load_tokenizer("qwen3"), name="qwen3")
    rec = Recorder(_qwen3_script(tpl)[:2])
    generate = make_generate(tools=FUNCS, template=tpl, backend=Scripted(rec), max_turns=4, history="template")
    out = asyncio.run(generate(_args(), Sample(index=4, prompt=[{"role": "user", "content": USER}]), dict(PARAMS)))
    assert isinstance(out, list) and len(out) == 1 and out[0].metadata["tmpl_sequences"] == 1
    _check_samples_against_the_engine(tpl, out, rec)
    assert out[0].rollout_id == 4


def test_a_sample_without_index_or_rollout_id_is_refused_when_it_has_several_sequences(twin):
    rec = Recorder(_qwen3_script(tmpl.ChatTemplate(load_tokenizer("qwen3"), name="qwen3")))
    _, generate = _qwen3_generate(rec)
    with pytest.raises(tmpl.errors.TrainerConfigError, match="rollout_id") as err:
        asyncio.run(generate(_args(), Sample(prompt=[{"role": "user", "content": USER}]), dict(PARAMS)))
    assert "3 training sequences" in str(err.value) and USER in str(err.value)


def test_a_truncated_episode_marks_its_last_sequence(twin):
    """A context budget 3 tokens short of the last sequence: its answer is cut, the episode TRUNCATED; the
    Sample of the last sequence says so, the earlier ones are whole; every token the engine returned is
    in one loss mask."""
    tpl = tmpl.ChatTemplate(load_tokenizer("qwen3"), name="qwen3")
    whole = Recorder(_qwen3_script(tpl))
    full = asyncio.run(
        _qwen3_generate(whole)[1](_args(), Sample(index=0, prompt=[{"role": "user", "content": USER}]), dict(PARAMS))
    )
    rec = Recorder(_qwen3_script(tpl))
    _, generate = _qwen3_generate(rec)
    args = _args()
    args.rollout_max_context_len = len(whole.prompts[4]) + len(whole.sampled[4]) - 3
    out = asyncio.run(generate(args, Sample(index=0, prompt=[{"role": "user", "content": USER}]), dict(PARAMS)))
    assert [s.status for s in out] == [Sample.Status.COMPLETED] * 2 + [Sample.Status.TRUNCATED]
    assert "token limit" in out[-1].metadata["tmpl_reason"]
    kept = rec.sampled[4][:-3]  # what the engine returned under its max_tokens
    assert rec.prompts == whole.prompts and out[-1].tokens == rec.prompts[4] + kept
    assert out[-1].loss_mask == [1] * len(kept)
    assert sum(sum(s.loss_mask) for s in out) == sum(len(x) for x in rec.sampled[:4]) + len(kept)
    for a, b in zip(out[:2], full[:2]):  # the earlier sequences are whole: those of the run with room
        assert (a.tokens, a.loss_mask, a.rollout_log_probs) == (b.tokens, b.loss_mask, b.rollout_log_probs)


def test_a_summarizers_untrained_call_gets_no_sample_and_is_named(twin):
    """An edit hook that compacts the history with a summarizer's call (recorded untrained): its sequence
    trains nothing and gets no Sample (named in ``tmpl_left_out``); the policy's two sequences do."""
    tpl = tmpl.ChatTemplate(load_tokenizer("qwen3"), name="qwen3")
    rec = Recorder(_calls_script(tpl, 1))
    summary = tpl.codec.encode("Paris is sunny.<|im_end|>")

    def compact(messages, ctx):
        if ctx.answered:
            return None
        ctx.label = "compaction"
        ctx.record_call(tpl.codec.encode("Summarize: ..."), summary)
        return [messages[0], {"role": "assistant", "content": "Paris is sunny."}, {"role": "user", "content": "Go on."}]

    generate = make_generate(tools=FUNCS, template=tpl, backend=Scripted(rec), max_turns=4, edit_history=compact)
    out = asyncio.run(generate(_args(), Sample(index=5, prompt=[{"role": "user", "content": USER}]), dict(PARAMS)))
    assert [(s.metadata["tmpl_agent"], _turns_of(s)) for s in out] == [(None, [0]), (None, [1])]
    left_out = out[0].metadata["tmpl_left_out"]
    assert len(left_out) == 1 and left_out[0] not in [s.metadata["tmpl_sequence"] for s in out]
    assert "edit_history: compaction" in out[1].metadata["tmpl_branch"]
    _check_samples_against_the_engine(tpl, out, rec)  # the summary's tokens are in no loss mask
    # the second prompt renders the compacted history, which holds the summary as text
    assert out[1].tokens[: len(out[1].tokens) - out[1].response_length] == rec.prompts[1]
    assert tpl.codec.decode(rec.prompts[1]) == _render(
        tpl,
        [
            {"role": "user", "content": USER},
            {"role": "assistant", "content": "Paris is sunny."},
            {"role": "user", "content": "Go on."},
        ],
        tokenize=False,
    )


def test_an_aborted_episode_marks_every_sample_aborted(twin):
    """A hook that raises after the third turn ends the sample EDIT_FAILED: both sequences sampled so far
    come back, every Sample ABORTED (slime then scores none of them), their tokens exact."""
    tpl = tmpl.ChatTemplate(load_tokenizer("qwen3"), name="qwen3")
    rec = Recorder(_qwen3_script(tpl))
    asks = more_users(*QWEN3_QUESTIONS)

    def hook(messages, ctx):
        if ctx.turn == 2:
            raise RuntimeError("the simulated user hung up")
        return asks(messages, ctx)

    generate = make_generate(
        tools=FUNCS, template=tpl, backend=Scripted(rec), max_turns=8, history="template", edit_history=hook
    )
    out = asyncio.run(generate(_args(), Sample(index=0, prompt=[{"role": "user", "content": USER}]), dict(PARAMS)))
    assert [_turns_of(s) for s in out] == [[0, 1], [2]]
    assert all(s.status is Sample.Status.ABORTED for s in out)
    assert "hung up" in out[0].metadata["tmpl_reason"]
    _check_samples_against_the_engine(tpl, out, rec)


def test_post_process_rewards_counts_each_episode_once():
    """Against numpy-free arithmetic written out here: a group (prompt) of three episodes, one of them
    three Samples; GRPO's baseline is over the episodes' returns, with the unbiased std slime uses."""
    S = SimpleNamespace
    samples = [
        S(group_index=0, index=0, rollout_id=0, reward=1.0),
        S(group_index=0, index=0, rollout_id=0, reward=1.0),
        S(group_index=0, index=0, rollout_id=0, reward=1.0),
        S(group_index=0, index=1, rollout_id=1, reward=0.0),
        S(group_index=0, index=2, rollout_id=None, reward=0.5),
        S(group_index=1, index=3, rollout_id=3, reward=2.0),  # a group of one episode: no spread
    ]
    args = S(advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True, reward_key=None)
    raw, adv = post_process_rewards(args, samples)
    assert raw == [1.0, 1.0, 1.0, 0.0, 0.5, 2.0]
    returns = [1.0, 0.0, 0.5]
    mean, std = statistics.mean(returns), statistics.stdev(returns)
    want = [(r - mean) / (std + 1e-6) for r in raw[:5]] + [0.0]
    assert all(math.isclose(a, b, abs_tol=1e-9) for a, b in zip(adv, want)), (adv, want)
    # slime's default would have averaged over the six rows: the episode of three Samples weighed thrice
    assert not math.isclose(adv[3], (0.0 - statistics.mean(raw[:5])) / (statistics.stdev(raw[:5]) + 1e-6))
    # no std: centred only; another estimator or no normalization: the rewards as they are
    args.grpo_std_normalization = False
    assert post_process_rewards(args, samples)[1][:5] == [r - mean for r in raw[:5]]
    assert post_process_rewards(S(advantage_estimator="ppo", rewards_normalization=True), samples)[1] == raw
    keyed = [S(group_index=0, index=i, rollout_id=i, reward={"acc": float(i)}) for i in range(2)]
    args = S(advantage_estimator="reinforce_plus_plus_baseline", rewards_normalization=True, reward_key="acc")
    assert post_process_rewards(args, keyed) == ([0.0, 1.0], [-0.5, 0.5])


def test_the_modules_examples_run():
    assert doctest.testmod(slime_module, optionflags=doctest.ELLIPSIS).failed == 0


# -- slime's own list handling, where a checkout of slime is given ---------------------------------

SLIME_SRC = os.environ.get("TMPL_SLIME_SRC")
needs_slime = pytest.mark.skipif(
    not SLIME_SRC or not (Path(SLIME_SRC) / "slime" / "rollout" / "sglang_rollout.py").exists(),
    reason="set TMPL_SLIME_SRC to a checkout of THUDM/slime (not on the package index) to run its list handling",
)


class _Stub(types.ModuleType):
    """An import-only stand-in for a package slime imports at module level but these paths never call
    (SGLang's server code, wandb, pylatexenc for math grading)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        sub = _Stub(f"{self.__name__}.{name}")
        sub.__path__ = []
        sys.modules[sub.__name__] = sub
        return sub

    def __call__(self, *args, **kwargs):
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else (lambda f: f)


@pytest.fixture(scope="module")
def slime():
    """slime's modules from ``TMPL_SLIME_SRC``: the rollout functions, the validator and RolloutManager's
    class (its methods called on a bare object); missing third-party packages stubbed for import only."""
    import transformers.processing_utils  # noqa: F401 (imported whole before any stub: it looks for wandb)

    sys.path.insert(0, str(SLIME_SRC))
    stubbed: list[str] = []
    try:
        for _ in range(20):
            try:
                import slime.ray.rollout as ray_rollout
                import slime.rollout.sglang_rollout as sglang_rollout
                from slime.observability.rollout_data_utils import validate_rollout_id_annotated
                from slime.utils.types import Sample as SlimeSample

                break
            except ModuleNotFoundError as e:
                if not e.name or e.name.split(".")[0] in ("slime", "torch", "ray", "transformers"):
                    pytest.skip(f"slime's modules need {e.name}")
                stub = _Stub(e.name)
                stub.__path__ = []
                sys.modules[e.name] = stub
                stubbed.append(e.name)
                for name in [n for n in sys.modules if n == "slime" or n.startswith("slime.")]:
                    del sys.modules[name]
        else:
            pytest.skip(f"slime's modules did not import (stubbed {stubbed})")
        manager = ray_rollout.RolloutManager
        manager = getattr(getattr(manager, "__ray_metadata__", None), "modified_class", manager)
        yield SimpleNamespace(
            rollout=sglang_rollout,
            validate=validate_rollout_id_annotated,
            Sample=SlimeSample,
            Manager=manager,
            stubbed=stubbed,
        )
    finally:
        sys.path.remove(str(SLIME_SRC))
        for name in [n for n in sys.modules if n.split(".")[0] in {s.split(".")[0] for s in stubbed}]:
            del sys.modules[name]


GROUP = 2
_SLIME_GENERATE: dict[str, object] = {}


async def slime_generate(args, sample, sampling_params):
    """What ``--custom-generate-function-path`` names in the test below (slime imports it by path)."""
    return await _SLIME_GENERATE["fn"](args, sample, sampling_params)


async def episode_reward(args, samples):
    """``--custom-rm-path`` in batch mode (slime gives it a whole list): 1 when the episode's last answer
    is polite, the same for every Sample of an episode (they share its ``response``)."""
    return [1.0 if "welcome" in s.response else 0.0 for s in samples]


@needs_slime
def test_slimes_own_rollout_and_training_data_take_the_sample_lists(slime, twin):
    tpl = tmpl.ChatTemplate(load_tokenizer("qwen3"), name="qwen3")
    recs = []

    def backend(args):
        recs.append(Recorder(_qwen3_script(tpl)))
        return Scripted(recs[-1])

    _SLIME_GENERATE["fn"] = make_generate(
        tools=FUNCS,
        template=tpl,
        backend=backend,
        max_turns=8,
        history="template",
        edit_history=more_users(*QWEN3_QUESTIONS),
    )
    args = SimpleNamespace(
        hf_checkpoint=str(family_source("qwen3")),
        rollout_max_response_len=1024,
        rollout_max_context_len=4096,
        rollout_temperature=1.0,
        rollout_top_p=1.0,
        rollout_top_k=-1,
        rollout_stop=None,
        rollout_stop_token_ids=None,
        rollout_skip_special_tokens=False,
        sglang_server_concurrency=4,
        rollout_num_engines=1,
        sglang_dp_size=1,
        n_samples_per_prompt=GROUP,
        rollout_batch_size=1,
        custom_generate_function_path=f"{__name__}.slime_generate",
        custom_rm_path=f"{__name__}.episode_reward",
        partial_rollout=False,
        group_rm=False,
        rollout_sample_hook_path=None,
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        reward_key=None,
        sglang_enable_deterministic_inference=False,
        load_debug_rollout_data=None,
    )
    prompt = [{"role": "user", "content": USER}]
    group = [slime.Sample(group_index=0, index=i, prompt=copy.deepcopy(prompt)) for i in range(GROUP)]

    async def run_group():
        return await slime.rollout.generate_and_rm_group(args, group, sampling_params=dict(PARAMS))

    done = asyncio.run(run_group())
    # slime's generate_and_rm took the lists as they are and scored every Sample (batch-mode custom rm)
    assert len(done) == GROUP and all(isinstance(x, list) and len(x) == 3 for x in done)
    assert all(s.reward == 1.0 and s.status is slime.Sample.Status.COMPLETED for x in done for s in x)
    # RolloutManager (its methods on a bare instance): _get_rollout_data runs slime's rollout_id check on
    # what generate_rollout returned (prompts x samples x Samples of one episode) and flattens it
    manager = object.__new__(slime.Manager)
    manager.args, manager.data_source = args, None
    manager.custom_reward_post_process_func = manager.custom_convert_samples_to_train_data_func = None
    manager.generate_rollout = lambda args, rollout_id, data_source, evaluation: [done]
    flat, _ = slime.Manager._get_rollout_data(manager, rollout_id=0)
    unmarked = copy.deepcopy(done)
    unmarked[1][2].rollout_id = None  # the check bites at the depth our lists sit: without one rollout_id
    with pytest.raises(AssertionError, match="rollout_id is unset"):
        slime.validate([unmarked])
    assert [(s.index, s.metadata["tmpl_sequence"]) for s in flat] == [(i, k) for i in range(GROUP) for k in range(3)]
    train = slime.Manager._convert_samples_to_train_data(manager, flat)
    assert train["tokens"] == [s.tokens for s in flat] and train["loss_masks"] == [s.loss_mask for s in flat]
    assert train["rollout_ids"] == [0, 0, 0, 1, 1, 1]
    for k, s in enumerate(flat):  # each rollout's loss is divided by its whole loss-mask total
        rec = recs[s.index]
        assert train["rollout_mask_sums"][k] == sum(len(x) for x in rec.sampled)
    for i, x in enumerate(done):
        _check_samples_against_the_engine(tpl, x, recs[i])
    # slime's default normalization and ours: equal rewards, all 0 in both; one Sample per episode and a
    # full group (slime's default then groups by n_samples_per_prompt), the same numbers
    _, default = slime.Manager._post_process_rewards(manager, flat)
    assert post_process_rewards(args, flat)[1] == pytest.approx(default)
    plain = [slime.Sample(group_index=0, index=i, rollout_id=i, reward=float(i % 2)) for i in range(GROUP)]
    _, default = slime.Manager._post_process_rewards(manager, plain)
    assert post_process_rewards(args, plain)[1] == pytest.approx(default, abs=1e-6)


# -- routing replay (issue 40): routes in slime's own field ------------------------------------------


def _replay_args(**kw):
    args = _args(**kw)
    args.use_rollout_routing_replay, args.num_layers, args.moe_router_topk = True, 2, 2
    return args


def test_routing_replay_over_sglang_fills_rollout_routed_experts(twin):
    """``--use-rollout-routing-replay``: the default engine is tmpl's SGLang client asking for routes
    (``return_routed_experts``, ``routed_experts_start_len`` of each turn's new positions); the Sample's
    ``rollout_routed_experts`` is slime's shape, ``[len(tokens) - 1, num_layers, moe_router_topk]`` int32,
    every row the engine's route of that prefix (stitched over the turns, equal to one pass)."""
    from .test_routes_server import SGLangRoutes
    from .vllm_standin import SyntheticRoutes, synthetic_routes

    tpl = tmpl.ChatTemplate(load_tokenizer("qwen3"), name="qwen3")
    rec = Recorder(_qwen3_script(tpl)[:2])  # a tool call, then the answer
    with SGLangRoutes(SyntheticRoutes(Scripted(rec))) as server:
        args = _replay_args()
        host, port = server.url.rsplit(":", 1)
        args.sglang_router_ip, args.sglang_router_port = host[len("http://") :], int(port)
        generate = make_generate(tools=FUNCS, template=tpl, max_turns=8)
        sample = asyncio.run(generate(args, Sample(index=0, prompt=[{"role": "user", "content": USER}]), dict(PARAMS)))
    assert sample.status is Sample.Status.COMPLETED and len(rec.sampled) == 2
    routes = sample.rollout_routed_experts
    assert routes.dtype == np.int32 and routes.shape == (len(sample.tokens) - 1, 2, 2)
    assert np.array_equal(routes, synthetic_routes(sample.tokens)[:-1])
    first, second = server.bodies
    assert first["return_routed_experts"] and first["routed_experts_start_len"] == 0
    # the second turn asks from the first turn's last sampled token (its route comes with this prefill)
    assert second["routed_experts_start_len"] == len(rec.prompts[0]) + len(rec.sampled[0]) - 1


def test_routing_replay_gives_each_sample_of_an_episode_its_sequences_routes(twin):
    from .vllm_standin import SyntheticRoutes, synthetic_routes

    tpl = tmpl.ChatTemplate(load_tokenizer("qwen3"), name="qwen3")
    rec = Recorder(_qwen3_script(tpl))
    generate = make_generate(
        tools=FUNCS,
        template=tpl,
        backend=SyntheticRoutes(Scripted(rec)),
        max_turns=8,
        history="template",
        edit_history=more_users(*QWEN3_QUESTIONS),
    )
    out = asyncio.run(
        generate(_replay_args(), Sample(index=7, prompt=[{"role": "user", "content": USER}]), dict(PARAMS))
    )
    assert len(out) == 3
    for s in out:
        assert s.rollout_routed_experts.shape == (len(s.tokens) - 1, 2, 2)
        assert np.array_equal(s.rollout_routed_experts, synthetic_routes(s.tokens)[:-1])
    # without routing replay the field is None (a retried sample keeps nothing of an earlier attempt)
    plain = asyncio.run(generate(_args(), out[0], dict(PARAMS)))
    assert all(s.rollout_routed_experts is None for s in plain)


def test_routing_replay_refuses_a_backend_without_routes():
    tpl = tmpl.ChatTemplate(load_tokenizer("qwen3"), name="qwen3")
    generate = make_generate(tools=FUNCS, template=tpl, backend=Scripted(lambda req: [1]))
    with pytest.raises(tmpl.errors.RoutesUnavailableError, match="Scripted"):
        asyncio.run(generate(_replay_args(), Sample(index=0, prompt=[{"role": "user", "content": USER}]), PARAMS))


@needs_slime
def test_slimes_replay_validator_takes_the_routes(slime, twin):
    """slime's own check before R3 consumes the routes (``validate_rollout_routed_experts_for_replay``)."""
    import torch
    from slime.observability.rollout_data_utils import validate_rollout_routed_experts_for_replay

    from .vllm_standin import SyntheticRoutes

    tpl = tmpl.ChatTemplate(load_tokenizer("qwen3"), name="qwen3")
    generate = make_generate(
        tools=FUNCS, template=tpl, backend=SyntheticRoutes(Scripted(Recorder(_qwen3_script(tpl)[:2])))
    )
    sample = asyncio.run(generate(_replay_args(), Sample(index=0, prompt=[{"role": "user", "content": USER}]), PARAMS))
    validate_rollout_routed_experts_for_replay([torch.as_tensor(sample.rollout_routed_experts)], _replay_args())
