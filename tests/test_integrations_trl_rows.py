"""ToolRLOOTrainer trains one row per training sequence: a real TRL run on CPU whose episodes branch.

A random-weight tiny Qwen2 with the real Qwen2.5 tokenizer, the scripted tool-calling policy of
test_integrations_trl.py, ``Rollout(history="template")`` and an ``edit_history`` hook that compacts
conversation 0 of each batch after its first answer (one user message: a summary and a new question), so
that sample has two training sequences and the others one. The checks use the policy's own record of
what it sampled, the tokenizer's render of each conversation, the reward function's own returns and an
independent forward pass of the policy and reference models, never the trainer's output alone.
"""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from tmpl.backends import Scripted  # noqa: E402 (after the skips)
from tmpl.episode.advantages import sample_advantages  # noqa: E402
from tmpl.errors import RewardError, RolloutContractError, TrainerConfigError  # noqa: E402
from tmpl.integrations.trl import make_rollout_func  # noqa: E402

from .test_integrations_trl import (  # noqa: E402
    TOOLS,
    ToolPolicy,
    dataset,
    model_dir,  # noqa: F401 (a fixture)
    prompts,
    render,
    snapshot,
    standin,
    tok,  # noqa: F401 (a fixture)
    token_logps,
)
from .trl_config import train_args  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

BETA = 0.1


class RecordingPolicy(ToolPolicy):
    """ToolPolicy that keeps every completion it returned (what was sampled, in order)."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.sampled: list[list[int]] = []

    def __call__(self, request):
        ids = super().__call__(request)
        self.sampled.append(list(ids))
        return ids


class Compaction:
    """edit_history hook: after conversation 0's first answer, the history becomes one user message (a
    summary and a new question); the messages it compacted are kept, per call, for the oracle."""

    def __init__(self):
        self.compacted: list[list[dict]] = []

    def __call__(self, messages, ctx):
        if ctx.index != 0 or not ctx.answered or "Summary" in messages[0]["content"]:
            return None
        ctx.label = "compaction"
        self.compacted.append([dict(m) for m in messages])
        return [{"role": "user", "content": f"Summary: {messages[-1]['content']} Now, the weather in Rome?"}]


def mask_runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The maximal runs of tokens with mask 1 (each one completion: completions are split by appended tokens)."""
    runs, current = [], []
    for token, m in zip(ids, mask):
        if m:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


@pytest.fixture(scope="module")
def rows_run(tok, model_dir, tmp_path_factory):  # noqa: F811 (the fixtures imported above)
    from tmpl.integrations.trl import ToolRLOOTrainer

    class Capturing(ToolRLOOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            batch = {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in out.items()}
            self.records.append(
                {"batch": batch, "policy": token_logps(self.model, batch), "ref": token_logps(self.ref_model, batch)}
            )
            return out

        def _compute_loss(self, model, inputs):
            loss = super()._compute_loss(model, inputs)
            inputs_copy = {k: v.clone() for k, v in inputs.items() if torch.is_tensor(v)}
            self.records[-1].setdefault("losses", []).append((loss.detach().clone(), inputs_copy))
            self.records[-1].setdefault("logps", []).append(token_logps(model, inputs))
            return loss

    policy = RecordingPolicy(tok)
    hook = Compaction()
    generations = []

    def on_results(results, metrics):
        generations.append(SimpleNamespace(results=results, sampled=list(policy.sampled), compacted=hook.compacted))
        policy.sampled.clear()
        hook.compacted = []

    func = make_rollout_func(
        tools=TOOLS,
        max_turns=4,
        backend=Scripted(policy),
        history="template",
        edit_history=hook,
        on_results=on_results,
    )
    rewarded = []

    def reward(completions, tool_calls, **kwargs):
        out = [float(c) for c in tool_calls]
        rewarded.append(out)
        return out

    # 2 samples per micro-batch, 2 micro-batches per generation (steps_per_generation = gradient accumulation);
    # one optimizer step: one generation (each costs a minute of CPU in TRL's chunked logprobs over the vocabulary)
    args = train_args(
        trl.RLOOConfig,
        tmp_path_factory.mktemp("rloo-rows"),
        beta=BETA,
        gradient_accumulation_steps=2,
        max_steps=1,
    )
    trainer = Capturing(
        model=model_dir,
        args=args,
        reward_funcs=reward,
        train_dataset=dataset(),
        processing_class=tok,
        rollout_func=func,
    )
    trainer.records = []
    # the reference model moved away from the policy, so the KL is not 0 from the first generation on: a KL
    # taken per row instead of per sample shows there (else it needs a second generation, after a step)
    torch.manual_seed(1)
    with torch.no_grad():
        for param in trainer.ref_model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    before = snapshot(trainer.model)
    trainer.train()
    return SimpleNamespace(
        trainer=trainer, before=before, generations=generations, rewarded=rewarded, records=trainer.records
    )


def loss_rows(record):
    """The rows of the generation that reached the loss (after TRL's shuffle and split), fillers left out."""
    rows, fillers = [], 0
    for _, inputs in record["losses"]:
        for i in range(inputs["completion_ids"].size(0)):
            if int(inputs["sample_index"][i]) < 0:
                fillers += 1
                assert int(inputs["completion_mask"][i].sum()) == 0 and float(inputs["advantages"][i]) == 0.0
                continue
            n = int(inputs["completion_mask"][i].sum())
            prompt = inputs["prompt_ids"][i][inputs["prompt_mask"][i].bool()].tolist()
            rows.append((prompt, inputs["completion_ids"][i][:n].tolist(), inputs["tool_mask"][i][:n].tolist()))
    return rows, fillers


def test_rows_train_with_finite_losses_and_moving_parameters(rows_run):
    trainer = rows_run.trainer
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 1 and all(math.isfinite(x) for x in losses)
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(p, after[n].detach()) for n, p in rows_run.before.items() if "layers.1" in n)
    assert len(rows_run.generations) == len(rows_run.records) == 1


def test_every_sequence_reaches_the_loss_once_with_its_mask(rows_run, tok):  # noqa: F811
    for gen, record in zip(rows_run.generations, rows_run.records):
        results = gen.results
        assert [len(r.sequences) for r in results] == [2, 1, 1, 1]  # conversation 0 was compacted: a branch
        assert "compaction" in str(results[0].sequences[1].branch)
        rows, fillers = loss_rows(record)
        # 5 rows padded to a multiple of steps_per_generation (TRL's split drops a remainder): one filler
        assert len(rows) == 5 and fillers == 1 and len(record["losses"]) == 2
        # oracle 1: each row is the tokenizer's render of its conversation (the compacted one for row 0 of
        # conversation 0), its prompt up to the first sampled token
        [before] = gen.compacted
        conversations = [before, results[0].messages] + [r.messages for r in results[1:]]
        assert len(conversations) == len(rows)
        expected = []
        for messages in conversations:
            full = render(tok, messages, False)
            matches = [row for row in rows if full[: len(row[0]) + len(row[1])] == row[0] + row[1]]
            assert len(matches) >= 1 and all(len(full) - len(m[0]) - len(m[1]) <= 1 for m in matches)
            expected.append(matches[0])
        assert sorted(expected) == sorted(rows)  # every conversation's row, none twice
        # oracle 2: the tokens in the loss are exactly what the policy sampled, each completion once
        runs = [run for _, ids, mask in rows for run in mask_runs(ids, mask)]
        assert sorted(runs) == sorted(gen.sampled)
        assert sum(sum(m) for _, _, m in rows) == sum(len(c) for c in gen.sampled)
        # and they are tmpl's rows (result.rows(): prompt up to the first sampled token, loss mask)
        ours = [
            (row.trajectory.prompt_ids.tolist(), row.trajectory.completion_ids.tolist(), row.loss_mask.tolist())
            for r in results
            for row in r.rows()
        ]
        assert sorted(ours) == sorted(rows)


def test_rows_of_a_sample_share_its_advantage_with_a_baseline_over_samples(rows_run):
    for step, (record, rewards) in enumerate(zip(rows_run.records, rows_run.rewarded)):
        batch = record["batch"]
        index = batch["sample_index"].tolist()
        assert index == [0, 0, 1, 2, 3, -1]  # rows in order, then the filler
        loss_mask = (batch["completion_mask"] * batch["tool_mask"]).double()
        row_kl = ((record["policy"] - record["ref"]).double() * loss_mask).sum(1)
        sample_kl = [float(sum(row_kl[r] for r in range(len(index)) if index[r] == s)) for s in range(4)]
        # by hand: the reward of each sample minus beta times the KL of all its rows; RLOO over the 2 samples
        # of each prompt (num_generations consecutive samples)
        returns = [rewards[s] - BETA * sample_kl[s] for s in range(4)]
        assert rewards == [2.0, 0.0, 1.0, 0.0]  # conversation 0 called a tool in each branch
        hand = [returns[0] - returns[1], returns[1] - returns[0], returns[2] - returns[3], returns[3] - returns[2]]
        got = batch["advantages"].tolist()
        for r, s in enumerate(index):
            assert got[r] == pytest.approx(hand[s] if s >= 0 else 0.0, abs=1e-4)
        assert got[0] == got[1]  # the two rows of sample 0: one advantage
        if step == 0:  # the reference differs: a KL per row instead of per sample would split sample 0's rows
            assert abs(float(row_kl[0] - row_kl[1])) * BETA > 1e-3
            per_row = [rewards[0] - BETA * float(row_kl[k]) - returns[1] for k in (0, 1)]
            assert abs(per_row[0] - per_row[1]) > 1e-3


def test_micro_batch_loss_sums_rows_over_the_samples_it_holds(rows_run):
    trainer = rows_run.trainer
    per = trainer.args.per_device_train_batch_size
    weighed = 0
    for record in rows_run.records:
        for (loss, inputs), token_lp in zip(record["losses"], record["logps"]):
            mask = inputs["completion_mask"] * inputs["tool_mask"]
            # independent: the policy's logprobs from a plain forward (it has not moved since this generation)
            logps = (token_lp * mask).sum(1)
            assert inputs["old_logps"] == pytest.approx(logps, abs=1e-3)
            adv = inputs["advantages"]
            coef = torch.exp(logps - inputs["old_logps"])
            clipped = torch.clamp(coef, 1 - trainer.epsilon_low, 1 + trainer.epsilon_high)
            per_row = -torch.min(coef * adv, clipped * adv)
            rows = adv.size(0)
            assert rows == 3  # 6 rows (one filler) in 2 micro-batches
            assert float(loss) == pytest.approx(float(per_row.sum()) / per, abs=1e-4)
            if abs(float(per_row.sum())) > 1e-3:  # RLOO's mean over rows would weigh samples by their rows
                assert abs(float(loss) - float(per_row.mean())) > 1e-4
                weighed += 1
    assert weighed >= 1  # the negative control ran


def test_plain_grpo_refuses_a_sample_with_several_sequences(tok):  # noqa: F811
    func = make_rollout_func(
        tools=TOOLS, max_turns=4, backend=Scripted(ToolPolicy(tok)), history="template", edit_history=Compaction()
    )
    with pytest.raises(TrainerConfigError, match=r"sample 0 \(conversation 0, sample 0\) has 2 training sequences"):
        func(prompts(2), standin(tok))
    try:
        func(prompts(2), standin(tok))
    except TrainerConfigError as e:
        assert "ToolRLOOTrainer" in str(e) and e.setting == "rollout_func"
    # a trainer that takes rows gets one per sequence, the reward keys one per sample
    out = func(prompts(2), standin(tok, takes_sequence_rows=True))
    assert out["sample_index"] == [0, 0, 1]
    assert len(out["completion_ids"]) == len(out["env_mask"]) == len(out["prompt_ids"]) == 3
    assert len(out["status"]) == len(out["messages"]) == 2
    # append mode: unchanged, and no sample_index for a trainer that does not take rows
    plain = make_rollout_func(tools=TOOLS, max_turns=4, backend=Scripted(ToolPolicy(tok)))(prompts(2), standin(tok))
    assert "sample_index" not in plain and len(plain["completion_ids"]) == 2


def test_sample_index_is_checked():
    from tmpl.integrations.trl.rloo import _check_output

    good = {
        "prompt_ids": [[1], [1], [2]],
        "completion_ids": [[3], [4, 5], [6]],
        "logprobs": [[0.0], [0.0, 0.0], [0.0]],
        "sample_index": [0, 0, 1],
    }
    rows = _check_output(good, 2)
    assert rows.several and rows.sample_index == [0, 0, 1] and rows.env_mask == [[1], [1, 1], [1]]
    for index in ([1, 0, 0], [0, 0, 2], [0, 0, 0]):  # out of order, out of range, a sample without a row
        with pytest.raises(RolloutContractError, match="'sample_index'"):
            _check_output({**good, "sample_index": index}, 2)
    with pytest.raises(RolloutContractError, match="'prompt_ids': 2 rows for 3 rows in sample_index"):
        _check_output({**good, "prompt_ids": [[1], [2]]}, 2)


def test_group_advantages_by_hand():
    from tmpl.integrations.trl.rloo import _group_advantages

    # two groups of 3: leave-one-out means by hand
    rewards = np.array([1.0, 2.0, 6.0, 0.0, 0.0, 3.0])
    hand = [1 - 4.0, 2 - 3.5, 6 - 1.5, 0 - 1.5, 0 - 1.5, 3 - 0.0]
    assert _group_advantages(rewards, 3, normalize=False).tolist() == pytest.approx(hand)
    # an unscored sample is out of the baseline and gets 0; a group with one scored sample gets 0
    nan = float("nan")
    assert _group_advantages(np.array([1.0, nan, 3.0, nan, 5.0, nan]), 3, normalize=False).tolist() == pytest.approx(
        [1 - 3.0, 0.0, 3 - 1.0, 0.0, 0.0, 0.0]
    )
    normalized = _group_advantages(rewards, 3, normalize=True)
    assert normalized.tolist() == pytest.approx(((np.array(hand) - np.mean(hand)) / (np.std(hand, ddof=1) + 1e-4)))
    # the episode helper, GRPO: (R - mean) / (std + eps)
    grpo = sample_advantages([1.0, 2.0, 6.0], estimator="grpo", eps=0.0)
    assert grpo.tolist() == pytest.approx([(1 - 3) / math.sqrt(7), (2 - 3) / math.sqrt(7), (6 - 3) / math.sqrt(7)])
    with pytest.raises(RewardError, match="RLOO needs at least 2 samples"):
        sample_advantages([1.0], estimator="rloo")
    with pytest.raises(RewardError, match="not finite"):
        sample_advantages([1.0, nan], estimator="rloo")
