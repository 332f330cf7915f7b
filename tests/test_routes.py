"""Routing replay (issue 40): mixture-of-experts routes carried with every token, exact across turns.

The proof runs on a tiny Qwen3-MoE trained to call ``get_time`` (tests/fixture_moe.py) with the Torch
backend: the routes a multi-turn tool rollout stitched together, turn by turn, equal the routes of ONE
transformers forward pass over each final sequence, position by position (100% in fp32; bf16 measured and
printed). Then the paths routes travel: both trajectory twins (budgets, pickles, reset), ``collate``,
``tmpl.export``, template mode's sequences, interrupted generations stitched from pieces, and bad input,
which ends a sample ``EndCode.BAD_ROUTES`` and keeps nothing misaligned.
"""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

import tmpl
from tmpl.backends.base import Backend
from tmpl.errors import RoutesError, RoutesUnavailableError
from tmpl.rollout.codes import EndCode
from tmpl.rollout.routes import RoutePiece, stitch

from .fixture_moe import EXPERTS, LAYERS, TOP_K, get_time, questions, tokenizer_folder

torch = pytest.importorskip("torch")

QUESTIONS = [questions()[0], questions()[6]]  # one city (two turns), a pair of cities (three turns)


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """The tiny MoE fixture (built once for the module), its tokenizer and the Qwen3 template."""
    if not (tokenizer_folder() / "tokenizer.json").is_file():
        pytest.skip(f"the Qwen3 tokenizer is not at {tokenizer_folder()} (set TMPL_TEST_DATA)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .fixture_moe import build_tiny_moe

    path = build_tiny_moe(tmp_path_factory.mktemp("tiny-moe"))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(path))
    return model, tok, tmpl.ChatTemplate(tok, name="qwen3")


def forward_routes(model, ids) -> np.ndarray:
    """The experts of every position of ``ids`` in one forward pass: top-k of the softmax of the router
    logits, as the router takes them ([positions, layers, top_k])."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([list(ids)]), output_router_logits=True)
    layers = [
        torch.topk(torch.softmax(lg, dim=-1, dtype=torch.float), TOP_K, dim=-1).indices for lg in out.router_logits
    ]
    return torch.stack(layers, dim=1).numpy()


def rollout(model, tpl, **kw):
    kw.setdefault("sampling", tmpl.Sampling(temperature=1.0, n=2, seed=7))
    kw.setdefault("max_length", 1024)
    return tmpl.Rollout(
        tpl, tmpl.backends.Torch(model), tools=[get_time], max_turns=4, measure_drift=False, routes=True, **kw
    )


def agreement(model, results, *, exact_sets: bool = False) -> tuple[int, int]:
    """(positions whose stitched route equals the one-pass route, positions with a known route);
    ``exact_sets``: compare each layer's experts as a set (the order of two near-equal experts aside)."""
    same = total = 0
    for r in results:
        ids = r.prompt_ids.tolist() + r.completion_ids.tolist()
        known = r.routes_known.astype(bool)
        ref = forward_routes(model, ids)
        if exact_sets:
            ours, theirs = np.sort(r.routes[known], axis=-1), np.sort(ref[known], axis=-1)
            same += int((ours == theirs).all(axis=(1, 2)).sum())
            total += int(known.sum())
            continue
        same += int((r.routes[known] == ref[known]).all(axis=(1, 2)).sum())
        total += int(known.sum())
    return same, total


def test_the_router_logits_give_the_experts_the_model_used(moe):
    """On Qwen3-MoE, top-k of the softmax of ``output_router_logits`` is the experts its router chose."""
    model, tok, _ = moe
    used = []
    routers = [m for m in model.modules() if type(m).__name__ == "Qwen3MoeTopKRouter"]
    assert len(routers) == LAYERS
    hooks = [m.register_forward_hook(lambda mod, a, out: used.append(out[2])) for m in routers]
    try:
        ids = tok.encode("What time is it in Paris and in Rome?")
        ours = forward_routes(model, ids)
    finally:
        for h in hooks:
            h.remove()
    assert np.array_equal(ours, torch.stack(used, dim=1).numpy())


def test_stitched_routes_equal_one_forward_pass_fp32(moe):
    """Several samples of a multi-turn tool rollout: every known route equals the one-pass route (fp32)."""
    model, _, tpl = moe
    results = rollout(model, tpl).run(QUESTIONS)
    assert len(results) == 4 and max(r.turns for r in results) >= 3 and sum(r.tool_calls for r in results) >= 6, [
        (r.turns, r.code) for r in results
    ]
    for r in results:
        assert r.code is EndCode.FINISHED, (r.code, r.reason)
        assert r.routes.shape == (r.trajectory.length, LAYERS, TOP_K) and r.routes.dtype == np.uint8
        assert int(r.routes.max()) < EXPERTS
        # every position routed but the last sampled token, which no forward pass ran
        assert r.routes_known[:-1].all() and not r.routes_known[-1]
    same, total = agreement(model, results)
    print(f"\nrouting replay fp32: {same}/{total} positions agree ({100 * same / total:.2f}%)")
    assert same == total


def test_bf16_agreement_is_measured(moe):
    """A bf16 rollout against one bf16 forward pass, and against an fp32 one (a trainer in fp32): the
    agreement is printed, not asserted."""
    model, _, tpl = moe
    half = type(model)(model.config).to(torch.bfloat16).eval()
    half.load_state_dict(model.state_dict())
    results = rollout(half, tpl, sampling=tmpl.Sampling(temperature=1.0, n=1, seed=7)).run(QUESTIONS[:1])
    for name, ref in (("bf16", half), ("fp32", model)):
        same, total = agreement(ref, results)
        sets, _ = agreement(ref, results, exact_sets=True)
        print(
            f"\nrouting replay, bf16 rollout vs one {name} forward pass: {same}/{total} positions agree "
            f"({100 * same / total:.2f}%; as sets of experts: {100 * sets / total:.2f}%)"
        )
    assert total > 0


def test_collate_export_and_pickles_carry_the_routes(moe, tmp_path):
    model, _, tpl = moe
    results = rollout(model, tpl, sampling=tmpl.Sampling(temperature=1.0, n=1, seed=3)).run(QUESTIONS[:2])
    batch = tmpl.collate_arrays(results, pad_id=0)
    width_p = batch["prompt_ids"].shape[1]
    assert batch["routes"].shape == (2, width_p + batch["completion_ids"].shape[1], LAYERS, TOP_K)
    for row, r in enumerate(results):
        at = width_p - len(r.prompt_ids)
        n = r.trajectory.length
        assert np.array_equal(batch["routes"][row, at : at + n], r.routes)
        assert batch["routes_mask"][row, at : at + n].tolist() == r.routes_known.tolist()
        assert not batch["routes_mask"][row, :at].any() and not batch["routes_mask"][row, at + n :].any()
    tensors = tmpl.collate(results, pad_id=0)
    assert tensors["routes"].dtype == torch.uint8 and tuple(tensors["routes"].shape) == batch["routes"].shape
    path = tmpl.export.to_jsonl(results, tmp_path / "r.jsonl")
    again = tmpl.export.from_jsonl(path)
    for a, b in zip(results, again):
        assert np.array_equal(a.routes, b.routes) and a.routes.dtype == b.routes.dtype
        assert np.array_equal(a.routes_known, b.routes_known)
        c = pickle.loads(pickle.dumps(a.trajectory))
        assert np.array_equal(c.routes, a.routes) and np.array_equal(c.routes_known, a.routes_known)
    record = tmpl.export.to_records(results)[0]["routes"]
    assert record["dtype"] == "uint8" and isinstance(record["data"], str)  # base64 of the bytes


def test_template_mode_sequences_carry_their_own_routes(moe):
    """An edit between turns starts a new sequence: each sequence's routes equal a forward pass over it."""
    model, _, tpl = moe

    def rewrite_first_question(messages, ctx):
        if ctx.turn == 0 and not ctx.answered:
            ctx.label = "reworded"
            return [dict(messages[0], content=messages[0]["content"] + " Thanks."), *messages[1:]]
        return None

    results = rollout(
        model, tpl, sampling=tmpl.Sampling(n=1, temperature=1.0, seed=5), edit_history=rewrite_first_question
    ).run(QUESTIONS[1:2])
    (r,) = results
    assert len(r.sequences) == 2, [str(s.branch) for s in r.sequences]
    rows = r.rows()
    for seq, held, row in zip(r.sequences, r.sequence_routes, rows):
        assert held is not None
        routes, known = held
        assert len(routes) == len(seq.ids) and known.sum() >= len(seq.ids) - 1
        ref = forward_routes(model, seq.ids.tolist())
        k = known.astype(bool)
        assert np.array_equal(routes[k], ref[k])
        assert np.array_equal(row.trajectory.routes, routes)
    batch = tmpl.collate_arrays(rows, pad_id=0)
    assert batch["routes_mask"].sum() == sum(int(k.sum()) for _, k in r.sequence_routes)


def test_interrupted_generation_pieces_stitch_to_the_whole(moe):
    """A generation an abort-mode weight update interrupted comes back in pieces, each asked from where
    the previous one's routes ended: stitched, they equal the uninterrupted turn's routes."""
    model, tok, _ = moe
    backend = tmpl.backends.Torch(model)
    prompt = tok.encode("<|im_start|>user\nWhat time is it in Rome?<|im_end|>\n<|im_start|>assistant\n")
    greedy = tmpl.Sampling(temperature=0.0)
    req = tmpl.backends.base.GenerationRequest("a", prompt, 12, frozenset(), greedy, routes_from=3)
    (whole,) = backend.generate_batch([req])
    k = 5  # the first piece sampled 5 tokens, then the update stopped it
    first = dataclasses.replace(req, max_tokens=k)
    (a,) = backend.generate_batch([first])
    asked = a.routes_start + len(a.routes)
    second = dataclasses.replace(
        req, request_id="a-p1", prompt_ids=prompt + a.token_ids, max_tokens=12 - k, routes_from=asked
    )
    (b,) = backend.generate_batch([second])
    assert a.token_ids + b.token_ids == whole.token_ids
    pieces = [
        RoutePiece(3, len(prompt), k, a.routes, a.routes_start),
        RoutePiece(asked, len(prompt) + k, len(b.token_ids), b.routes, b.routes_start),
    ]
    routes, start = stitch(pieces, sample="a")
    assert start == 3 and np.array_equal(routes, whole.routes)
    with pytest.raises(RoutesError, match="asked from"):
        stitch([pieces[0], dataclasses.replace(pieces[1], asked=asked + 1, start=asked + 1)], sample="a")


def test_a_suffix_cut_at_the_budget_leaves_its_positions_unrouted(moe):
    """A tool suffix cut at max_length ends the sample: the cut suffix's positions and the last sampled token
    have no route (no prefill ran them), every other position has the one-pass route."""
    model, tok, tpl = moe
    schemas = tmpl.Toolbox([get_time]).schemas
    prompt = tok.apply_chat_template(QUESTIONS[0], tools=schemas, add_generation_prompt=True, tokenize=True)
    if isinstance(prompt, dict) or hasattr(prompt, "keys"):
        prompt = prompt["input_ids"]
    ro = rollout(model, tpl, sampling=tmpl.Sampling(temperature=0.0), max_length=len(prompt) + 40)
    (r,) = ro.run([QUESTIONS[0]])
    assert r.code is EndCode.BUDGET_CUT and r.tool_calls == 1, (r.code, r.reason)
    (completion,) = [s for s in r.spans if s.kind == "completion"]
    last_sampled = len(prompt) + completion.end - 1
    known = r.routes_known.astype(bool)
    assert known[:last_sampled].all() and not known[last_sampled:].any() and r.trajectory.length == len(prompt) + 40
    same, total = agreement(model, [r])
    assert same == total == last_sampled


class Interrupting(Backend):
    """The Torch backend whose first generation is stopped after ``k`` tokens as an abort-mode weight update
    stops it (finish "abort", the rollout's abort epoch moved on), so the loop continues it in a new request."""

    gives_routes = True

    def __init__(self, inner, k):
        self.inner, self.k, self.rollout, self.asked = inner, k, None, []

    def generate_batch(self, requests):
        self.asked += [r.routes_from for r in requests]
        if self.rollout is None or self.k is None:
            return self.inner.generate_batch(requests)
        cut = [dataclasses.replace(r, max_tokens=min(r.max_tokens, self.k)) for r in requests]
        self.k = None
        self.rollout._abort_epoch += 1
        return [dataclasses.replace(res, finish_reason="abort") for res in self.inner.generate_batch(cut)]


def test_a_generation_resumed_after_an_abort_keeps_exact_routes(moe):
    """Partial rollouts end to end: the first turn is stopped after 4 tokens and continued; the pieces'
    routes stitch into the sample's, equal to one forward pass over the final sequence."""
    model, _, tpl = moe
    backend = Interrupting(tmpl.backends.Torch(model), k=4)
    ro = tmpl.Rollout(
        tpl,
        backend,
        tools=[get_time],
        max_turns=4,
        max_length=1024,
        measure_drift=False,
        routes=True,
        sampling=tmpl.Sampling(temperature=0.0),
    )
    backend.rollout = ro
    (r,) = ro.run([QUESTIONS[0]])
    assert r.code is EndCode.FINISHED and r.resumed == 1 and r.turns == 2, (r.code, r.reason)
    p = len(r.prompt_ids)
    assert backend.asked[:2] == [0, p + 4 - 1]  # the continuation asks from the piece's last sampled token
    same, total = agreement(model, [r])
    assert same == total == r.trajectory.length - 1


class Corrupting(Backend):
    """The Torch backend with one turn's routes corrupted by ``bend(result, turn)``."""

    gives_routes = True

    def __init__(self, inner, bend):
        self.inner, self.bend, self.turn = inner, bend, 0

    def generate_batch(self, requests):
        out = []
        for result in self.inner.generate_batch(requests):
            out.append(self.bend(result, self.turn))
        self.turn += 1
        return out


@pytest.mark.parametrize(
    "bend, words",
    [
        (lambda r, t: dataclasses.replace(r, routes=r.routes[:-1]) if t == 1 else r, "positions"),
        (lambda r, t: dataclasses.replace(r, routes=r.routes.astype(np.float32)) if t == 1 else r, "dtype float32"),
        (lambda r, t: dataclasses.replace(r, routes=r.routes[:, :1]) if t == 1 else r, "1 layers x top-2 after 2"),
        (lambda r, t: dataclasses.replace(r, routes=None) if t == 1 else r, "no routes"),
        (lambda r, t: dataclasses.replace(r, routes_start=r.routes_start + 1) if t == 1 else r, "start at position"),
    ],
    ids=["short", "dtype", "layers", "missing", "shifted"],
)
def test_bad_routes_end_the_sample_and_keep_nothing_misaligned(moe, bend, words):
    model, _, tpl = moe
    backend = Corrupting(tmpl.backends.Torch(model), bend)
    r = tmpl.Rollout(
        tpl,
        backend,
        tools=[get_time],
        max_turns=4,
        max_length=1024,
        measure_drift=False,
        routes=True,
        sampling=tmpl.Sampling(temperature=0.0),
    ).run([QUESTIONS[0]])[0]
    assert r.code is EndCode.BAD_ROUTES and r.status is tmpl.Status.ABORTED, (r.code, r.reason)
    assert words in r.reason
    # what was kept is the first turn's routes, still aligned with the first turn's positions
    ids = r.prompt_ids.tolist() + r.completion_ids.tolist()
    known = r.routes_known.astype(bool)
    assert known.sum() and np.array_equal(r.routes[known], forward_routes(model, ids)[known])
    assert not known[len(ids) - 1]


def test_a_backend_without_routes_says_so_once(moe, tiny_qwen2):
    _, _, tpl = moe
    with pytest.raises(RoutesUnavailableError, match="Scripted gives no mixture-of-experts routes"):
        tmpl.Rollout(tpl, tmpl.backends.Scripted(lambda req: [1]), routes=True)
    dense, _ = tiny_qwen2
    assert not tmpl.backends.Torch(dense).gives_routes
    with pytest.raises(RoutesUnavailableError):
        tmpl.Rollout(tpl, tmpl.backends.Torch(dense), routes=True)


# -- the trajectory twins --------------------------------------------------------------------------


def test_trajectory_routes_on_both_twins(twin):
    t = twin.builder.Trajectory([1, 2, 3], max_length=7, sample_id="q")
    assert t.routes is None and t.routes_known.tolist() == [0, 0, 0]
    t.add_completion([4, 5], [-0.1, -0.2])
    t.add_routes(0, np.array([[[1, 2]], [[3, 4]], [[5, 6]], [[7, 0]]], dtype=np.int32))
    assert t.routes.dtype == np.uint8 and t.routes_known.tolist() == [1, 1, 1, 1, 0]
    before = t.routes
    t.add_suffix([6, 7, 8])  # cut at the budget: 2 of 3 kept
    assert t.status is tmpl.Status.TRUNCATED and t.routes.shape == (7, 1, 2)
    assert t.routes_known.tolist() == [1, 1, 1, 1, 0, 0, 0] and before.shape == (5, 1, 2)  # views keep
    t.add_routes(4, np.array([[[300, 1]]], dtype=np.uint16))  # widens the storage, keeps what it had
    assert t.routes.dtype == np.uint16 and t.routes[:5, 0].tolist() == [[1, 2], [3, 4], [5, 6], [7, 0], [300, 1]]
    for bad, words in [
        (np.zeros((1, 2, 2), dtype=np.uint8), "2 layers x top-2 after 1 layers"),
        (np.zeros((4, 1, 2), dtype=np.uint8), "do not fit"),
        (np.zeros((1, 1, 2), dtype=np.int64), "dtype int64"),
        (np.full((1, 1, 2), -1, dtype=np.int32), "negative"),
    ]:
        with pytest.raises(RoutesError, match=words):
            t.add_routes(5, bad)
    assert t.routes_known.tolist() == [1, 1, 1, 1, 1, 0, 0]  # unchanged by the refusals
    c = pickle.loads(pickle.dumps(t))
    assert np.array_equal(c.routes, t.routes) and c.routes.dtype == np.uint16
    t.reset()
    assert t.routes is None and t.routes_known.tolist() == [0, 0, 0]


def test_collate_marks_rows_without_routes_and_refuses_other_shapes(twin):
    a = twin.builder.Trajectory([1, 2], max_length=8, sample_id="a")
    a.add_completion([3, 4], [-0.1, -0.2])
    a.add_routes(0, np.array([[[1, 2]], [[3, 4]], [[5, 6]]], dtype=np.uint8))
    b = twin.builder.Trajectory([7], max_length=8, sample_id="b")
    b.add_completion([8], [-0.3])
    batch = tmpl.collate_arrays([a, b], pad_id=0)
    # positions of cat(prompt_ids, completion_ids): a's prompt fills the 2 prompt columns, b's is left-padded
    assert batch["routes"][0, :, 0].tolist() == [[1, 2], [3, 4], [5, 6], [0, 0]]
    assert batch["routes_mask"].tolist() == [[1, 1, 1, 0], [0, 0, 0, 0]]
    b.add_routes(0, np.zeros((1, 2, 2), dtype=np.uint8))
    with pytest.raises(tmpl.errors.CollateError, match="trajectories\\[1\\]"):
        tmpl.collate_arrays([a, b], pad_id=0)
