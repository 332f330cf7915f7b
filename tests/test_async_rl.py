"""Async RL on scripted engines: policy versions per token, weight updates under requests in flight
(keep, abort + resume, drain), the staleness policies, and streaming finished groups.

The engines here answer with fixed token IDs, so every expected version, mask and ID is known
from the script, never read back from the code under test.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

import tmpl
from tmpl.backends import Backend, GenerationResult, Scripted
from tmpl.rollout.codes import EndCode


def get_weather(city: str) -> str:
    """Current weather.

    Args:
        city: The city.
    """
    return f"{city}: 21 C, sunny"


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
FINAL = "It is sunny in Paris today.<|im_end|>"


@pytest.fixture
def tpl(tokenizer_of):
    return tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"), name="qwen2.5")


def ask(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Weather in Paris, question {i}?"}]


class Engine(Backend):
    """An engine that answers each request as soon as it arrives, except requests the test holds:
    those wait until released. Turn ``t`` of prompt ``i`` calls the tool while ``t < calls[i]``.
    ``spans`` (request id -> versions per token) makes it report versions as vLLM does."""

    batching = False

    def __init__(self, tpl, calls: dict[int, int] | None = None) -> None:
        self.call = tpl.codec.encode(CALL)
        self.final = tpl.codec.encode(FINAL)
        self.calls = calls or {}
        self.seen: list[tuple[str, int, list[int], int]] = []  # id, version at submission, prompt, max_tokens
        self.held: dict[str, asyncio.Event] = {}
        self.arrived: dict[str, asyncio.Event] = {}
        self.spans: dict[str, list[int]] = {}
        self.partial: dict[str, int] = {}  # request id -> tokens it returns before an abort
        self.labels: list[int] = []

    def ids_for(self, request_id: str) -> list[int]:
        i, _, turn = request_id.split("-")[:3]
        return self.call if int(turn) < self.calls.get(int(i), 0) else self.final

    def hold(self, request_id: str) -> None:
        self.held[request_id] = asyncio.Event()
        self.arrived[request_id] = asyncio.Event()

    async def agenerate(self, req):
        self.seen.append((req.request_id, req.version, list(req.prompt_ids), req.max_tokens))
        if req.request_id in self.arrived:
            self.arrived[req.request_id].set()
            await self.held[req.request_id].wait()
        base = req.request_id.split("-p")[0]
        ids = self.ids_for(base)
        done = sum(len(p) for r, _, p, _ in self.seen if r == base) if "-p" in req.request_id else 0
        if "-p" in req.request_id:  # a continuation: the rest of the same completion
            first = next(p for r, _, p, _ in self.seen if r == base)
            done = len(req.prompt_ids) - len(first)
            ids = ids[done:]
        if req.request_id in self.partial:
            k = self.partial[req.request_id]
            return GenerationResult(req.request_id, ids[:k], [-0.5] * k, "abort")
        return GenerationResult(req.request_id, ids, [-0.1] * len(ids), "stop", versions=self.spans.get(req.request_id))

    async def update_weights(self, version, apply=None, *, mode="keep", reset_prefix_cache=True):
        self.labels.append(version)
        await super().update_weights(version, apply, mode=mode, reset_prefix_cache=reset_prefix_cache)


def expected_versions(result, per_turn: list[int]) -> list[int]:
    """-1 on appended tokens; on the model's tokens of turn t, ``per_turn[t]`` (from the trajectory's
    completion spans, which the trajectory tests check on their own)."""
    out = [-1] * len(result.mask)
    for turn, span in enumerate(s for s in result.spans if s.kind == "completion"):
        out[span.start : span.end] = [per_turn[turn]] * span.size
    return out


async def when(event: asyncio.Event, task: asyncio.Task) -> None:
    waiter = asyncio.ensure_future(event.wait())
    await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
    if not waiter.done():
        waiter.cancel()
        raise AssertionError(f"the rollout ended first: {task.result() if not task.exception() else task.exception()}")


def test_each_token_has_the_version_in_effect_when_its_turn_was_submitted(tpl):
    engine = Engine(tpl, calls={0: 2})
    rollout = tmpl.Rollout(tpl, engine, tools=[get_weather], max_turns=4, version=3)
    engine.hold("0-0-1")

    async def go():
        task = asyncio.ensure_future(rollout.run_async([ask(0)]))
        await when(engine.arrived["0-0-1"], task)
        await rollout.update_weights_async(4)  # turn 1 is in flight: its tokens stay version 3
        engine.held["0-0-1"].set()
        return await task

    [r] = asyncio.run(go())
    assert r.status.name == "DONE" and r.turns == 3
    assert [v for _, v, _, _ in engine.seen] == [3, 3, 4]
    assert r.versions.tolist() == expected_versions(r, [3, 3, 4])
    assert len(r.versions) == len(r.completion_ids) == len(r.mask) == len(r.logprobs)
    assert r.version == 4 and r.staleness == 1 and r.oldest_version == 3
    assert engine.labels == [4] and engine.weight_version == 4
    assert rollout.metrics.tokens_by_version == {3: 2 * len(engine.call), 4: len(engine.final)}


def test_versions_the_engine_reports_split_a_turn(tpl):
    engine = Engine(tpl)
    n = len(engine.final)
    engine.spans["0-0-0"] = [5] * 4 + [6] * (n - 4)
    [r] = tmpl.Rollout(tpl, engine, version=6).run([ask(0)])
    assert r.versions.tolist() == [5] * 4 + [6] * (n - 4)
    assert r.staleness == 1
    engine.spans["0-0-0"] = [5] * (n - 1)  # not one per token: not believed, the submission version is used
    [r] = tmpl.Rollout(tpl, engine, version=6).run([ask(0)])
    assert r.versions.tolist() == [6] * n


def test_abort_mode_resumes_the_sample_from_its_own_ids(tpl):
    """A request stopped by an abort-mode update keeps the tokens it sampled (once); the sample goes on
    from prompt + those tokens under the new version, and ends as the uninterrupted run would."""
    plain = Engine(tpl, calls={0: 1})
    [ref] = tmpl.Rollout(tpl, plain, tools=[get_weather], max_turns=3, verify_every=1).run([ask(0)])

    engine = Engine(tpl, calls={0: 1})
    rollout = tmpl.Rollout(tpl, engine, tools=[get_weather], max_turns=3, verify_every=1, measure_drift=True)
    engine.hold("0-0-0")
    engine.partial["0-0-0"] = 7

    async def go():
        task = asyncio.ensure_future(rollout.run_async([ask(0)]))
        await when(engine.arrived["0-0-0"], task)
        update = asyncio.ensure_future(rollout.update_weights_async(1, mode="abort"))
        await asyncio.sleep(0)
        engine.held["0-0-0"].set()  # the engine answers the paused request: 7 tokens, finish "abort"
        await update
        return await task

    [r] = asyncio.run(go())
    assert r.status.name == "DONE", r.reason
    assert r.completion_ids.tolist() == ref.completion_ids.tolist()  # nothing duplicated, nothing lost
    assert r.mask.tolist() == ref.mask.tolist()
    first, cont = engine.seen[0], engine.seen[1]
    assert cont[0] == "0-0-0-p1" and cont[1] == 1
    assert cont[2] == first[2] + engine.call[:7]  # the continuation's prompt: its own IDs, no re-render
    assert cont[3] == first[3] - 7
    call_versions = [0] * 7 + [1] * (len(engine.call) - 7)
    turn0 = next(s for s in r.spans if s.kind == "completion")
    assert r.versions[turn0.start : turn0.end].tolist() == call_versions
    assert r.logprobs[turn0.start : turn0.start + 7].tolist() == [-0.5] * 7
    assert r.resumed == 1 and rollout.metrics.resumed == 1
    assert r.drift is False and r.code is EndCode.FINISHED


def test_an_abort_that_no_update_caused_still_aborts_the_sample(tpl):
    engine = Engine(tpl)
    engine.partial["0-0-0"] = 3
    [r] = tmpl.Rollout(tpl, engine).run([ask(0)])
    assert r.code is EndCode.BACKEND_ABORTED and len(r.completion_ids) == 0


def _stale_run(tpl, stale: str):
    """Sample 0 calls the tool twice; while its turn 2 is in flight the weights move 0 -> 1 -> 2.
    Then a second run of the same rollout: one sample answering at once, at version 2."""
    engine = Engine(tpl, calls={0: 2})
    rollout = tmpl.Rollout(tpl, engine, tools=[get_weather], max_turns=4, max_staleness=1, stale=stale)
    engine.hold("0-0-2")

    async def go():
        task = asyncio.ensure_future(rollout.run_async([ask(0)]))
        await when(engine.arrived["0-0-2"], task)
        await rollout.update_weights_async(1)
        await rollout.update_weights_async(2)
        engine.held["0-0-2"].set()
        first = await task
        metrics, seen = rollout.metrics, [rid for rid, *_ in engine.seen]
        engine.calls = {}
        return first, metrics, seen, await rollout.run_async([ask(1)])

    [r], metrics, seen, [fresh] = asyncio.run(go())
    return engine, r, metrics, seen, fresh


def test_withhold_keeps_the_sample_and_takes_its_tokens_out_of_the_loss(tpl):
    engine, r, metrics, _, fresh = _stale_run(tpl, "withhold")
    assert r.status.name == "DONE" and r.withheld and r.stale_action == "withhold"
    assert r.staleness == 2 and r.versions.tolist() == expected_versions(r, [0, 0, 0])
    assert r.mask.sum() > 0 and r.loss_mask.tolist() == [0] * len(r.mask)
    assert fresh.stale_action is None and fresh.loss_mask.tolist() == fresh.mask.tolist()
    # the training sequences carry the same loss mask; the episode keeps what was sampled
    [seq] = r.sequences
    assert seq.mask.sum() == 0 and r.episode.sequences[0].mask.sum() == r.mask.sum() > 0
    assert [s.mask.tolist() for s in fresh.sequences] == [fresh.episode.sequences[0].mask.tolist()]
    batch = tmpl.collate_arrays([r, fresh], pad_id=0)
    assert batch["tool_mask"][0, : len(r.mask)].tolist() == [0] * len(r.mask)
    assert batch["tool_mask"][1, : len(fresh.mask)].tolist() == fresh.mask.tolist()
    assert batch["versions"][0, : len(r.mask)].tolist() == expected_versions(r, [0, 0, 0])
    assert batch["versions"][1].tolist()[: len(fresh.mask)] == [2] * len(fresh.mask)
    assert metrics.stale == {"withhold": 1} and metrics.stale_tokens_off == int(r.mask.sum())
    assert metrics.to_dict()["rollout/stale/withhold"] == 1.0


def test_mask_takes_out_only_the_tokens_sampled_too_long_ago(tpl):
    engine = Engine(tpl, calls={0: 2})
    rollout = tmpl.Rollout(tpl, engine, tools=[get_weather], max_turns=4, max_staleness=1, stale="mask")
    engine.hold("0-0-1")
    engine.hold("0-0-2")

    async def go():
        task = asyncio.ensure_future(rollout.run_async([ask(0)]))
        await when(engine.arrived["0-0-1"], task)
        await rollout.update_weights_async(1)
        engine.held["0-0-1"].set()
        await when(engine.arrived["0-0-2"], task)
        await rollout.update_weights_async(2)
        engine.held["0-0-2"].set()
        return await task

    [r] = asyncio.run(go())
    versions = expected_versions(r, [0, 0, 1])  # turns 0 and 1 submitted at 0, turn 2 at 1; ends at 2
    assert r.versions.tolist() == versions
    assert r.stale_action == "mask" and r.status.name == "DONE"
    assert r.loss_mask.tolist() == [int(v >= 1) for v in versions]  # version 0 is 2 behind 2: off
    assert 0 < r.loss_mask.sum() < r.mask.sum()
    # the sequence's loss mask is the result's: the prompt's tokens, then loss_mask over the completion
    [seq] = r.sequences
    p = len(r.prompt_ids)
    assert seq.mask[:p].sum() == 0 and seq.mask[p:].tolist() == r.loss_mask.tolist()
    assert r.episode.sequences[0].mask[p:].tolist() == r.mask.tolist()


def test_drop_cancels_a_sample_as_soon_as_an_update_makes_it_too_stale(tpl):
    engine, r, metrics, seen, fresh = _stale_run(tpl, "drop")
    assert r.code is EndCode.STALE_DROPPED and r.status.name == "ABORTED" and r.stale_action == "drop"
    assert len(r.completion_ids) == 0 and len(r.versions) == 0  # nothing appended
    assert "max_staleness=1" in r.reason
    assert seen == ["0-0-0", "0-0-1", "0-0-2"]  # no turn after the drop
    assert fresh.status.name == "DONE" and fresh.stale_action is None
    assert metrics.stale == {"drop": 1} and metrics.end_codes == {"stale_dropped": 1}


def test_drain_and_keep_on_a_batching_engine_wait_for_the_running_batch(tpl):
    """A batching engine's weights never change under a batch: the update waits for it."""
    final = tpl.codec.encode(FINAL)
    order: list[str] = []

    class Slow(Scripted):
        threaded = True

        def generate_batch(self, requests):
            order.append("batch start")
            import time

            time.sleep(0.3)
            order.append("batch end")
            return super().generate_batch(requests)

    backend = Slow(lambda r: final)

    async def apply():
        order.append("apply")

    rollout = tmpl.Rollout(tpl, backend)

    async def go():
        task = asyncio.ensure_future(rollout.run_async([ask(0), ask(1)]))
        while "batch start" not in order:
            await asyncio.sleep(0.01)
        await rollout.update_weights_async(1, apply=apply, mode="keep")
        return await task

    results = asyncio.run(go())
    assert order == ["batch start", "batch end", "apply"]
    assert [r.versions.tolist() for r in results] == [[0] * len(final)] * 2
    assert backend.weight_version == 1 and rollout.version == 1


def test_update_errors(tpl):
    rollout = tmpl.Rollout(tpl, Scripted(lambda r: []))
    with pytest.raises(tmpl.errors.WeightUpdateError, match="Scripted failed at apply: cannot reload"):
        rollout.update_weights(1, apply="/some/folder")
    assert rollout.version == 0  # a failed update leaves the version as it was
    with pytest.raises(ValueError, match="mode"):
        rollout.update_weights(1, mode="later")
    with pytest.raises(ValueError, match="stale"):
        tmpl.Rollout(tpl, Scripted(lambda r: []), stale="ignore")


# -- streaming --------------------------------------------------------------------------------


def test_stream_yields_whole_groups_in_the_order_they_finish(tpl):
    # prompt 0 calls the tool three times, prompt 1 answers at once: its group is ready first
    engine = Engine(tpl, calls={0: 3})
    rollout = tmpl.Rollout(tpl, engine, tools=[get_weather], max_turns=5, sampling=tmpl.Sampling(n=3))

    async def go():
        return [group async for group in rollout.stream([ask(0), ask(1)])]

    groups = asyncio.run(go())
    assert [[(r.index, r.sample) for r in g] for g in groups] == [[(1, 0), (1, 1), (1, 2)], [(0, 0), (0, 1), (0, 2)]]
    assert [r.turns for r in groups[1]] == [4, 4, 4]
    assert rollout.metrics.samples == 6


def test_stream_bounds_samples_in_flight_and_takes_prompts_from_a_queue(tpl):
    engine = Engine(tpl, calls={0: 1, 1: 1, 2: 1})
    rollout = tmpl.Rollout(tpl, engine, tools=[get_weather], max_turns=3, sampling=tmpl.Sampling(n=2))

    async def go():
        prompts: asyncio.Queue = asyncio.Queue()
        got = []
        await prompts.put(ask(0))
        stream = rollout.stream(prompts, max_in_flight=2)
        got.append(await stream.__anext__())
        await rollout.update_weights_async(1)  # between groups: the next prompt samples with version 1
        await prompts.put(ask(1))
        await prompts.put(ask(2))
        await prompts.put(None)
        got += [g async for g in stream]
        return got

    groups = asyncio.run(go())
    assert [g[0].index for g in groups] == [0, 1, 2]
    # max_in_flight=2 is one group of n=2: a prompt's requests all come before the next prompt's
    prompt_of = [int(rid.split("-")[0]) for rid, *_ in engine.seen]
    assert prompt_of == sorted(prompt_of)
    assert {int(v) for v in groups[0][0].versions if v >= 0} == {0}
    assert all({int(v) for v in r.versions if v >= 0} == {1} for g in groups[1:] for r in g)
    with pytest.raises(ValueError, match="max_in_flight=1 cannot hold one group of n=2"):
        asyncio.run(rollout.stream([ask(0)], max_in_flight=1).__anext__())


def test_stream_sync_runs_on_while_the_caller_trains_and_takes_updates_from_its_thread(tpl):
    engine = Engine(tpl, calls={i: 1 for i in range(4)})
    rollout = tmpl.Rollout(tpl, engine, tools=[get_weather], max_turns=3, sampling=tmpl.Sampling(n=2))
    seen = []
    for step, group in enumerate(rollout.stream_sync([ask(i) for i in range(4)], max_in_flight=2)):
        assert len(group) == 2 and len({r.index for r in group}) == 1
        seen.append(group[0].index)
        for r in group:  # no token is newer than the version when its group was handed over
            assert r.versions.max() <= rollout.version
        rollout.update_weights(step + 1)
    assert sorted(seen) == [0, 1, 2, 3]
    assert engine.labels == [1, 2, 3, 4] and rollout.version == 4
    assert rollout.metrics.samples == 8


def test_export_and_replay_carry_versions(tpl, tmp_path, capsys):
    engine, r, _, _, fresh = _stale_run(tpl, "mask")
    path = tmpl.export.to_jsonl([r, fresh], tmp_path / "rollouts.jsonl")
    back = tmpl.export.from_jsonl(path)
    for a, b in zip([r, fresh], back):
        assert b.versions.tolist() == a.versions.tolist() and b.versions.dtype == np.int32
        assert b.loss_mask.tolist() == a.loss_mask.tolist() and b.stale_action == a.stale_action
        assert (b.version, b.staleness) == (a.version, a.staleness)
    from tmpl.cli import main

    main(["replay", str(path)])
    out = capsys.readouterr().out
    n_call = len(engine.call)
    assert f"| v0 x{n_call}, - x" in out  # the first row: its first turn's tokens, then a suffix
    assert f"| v2 x{len(engine.final)} | 0 |" in out  # the fresh sample: one turn, version 2, not stale


# -- sticky routing -----------------------------------------------------------------------------


def _two_servers_run(tpl, *, sticky: bool, down_after_first_turn: bool = False):
    from tmpl.backends import VLLMServer

    from .vllm_standin import StandinServer

    call, final = tpl.codec.encode(CALL), tpl.codec.encode(FINAL)
    holder: dict = {}

    def policy_of(name: str):
        def policy(req):
            i, s, turn = req.request_id.split("-")[:3]
            if down_after_first_turn and (i, s, turn) == ("0", "0", "0"):
                url = holder[name]  # the server this turn went to is down from now on
                home = next(x for x in holder["backend"].servers if x.url == url)
                home.down_until = time.monotonic() + 60
                holder["down"] = url
            return call if int(turn) < 2 else final

        return policy

    with StandinServer(Scripted(policy_of("a"))) as a, StandinServer(Scripted(policy_of("b"))) as b:
        holder["a"], holder["b"] = a.url, b.url
        backend = VLLMServer([a.url, b.url], sticky=sticky, timeout=30)
        holder["backend"] = backend
        rollout = tmpl.Rollout(
            tpl, backend, tools=[get_weather], max_turns=4, sampling=tmpl.Sampling(n=3), max_concurrency=64
        )
        results = rollout.run([ask(i) for i in range(4)])
        served = {a.url: list(a.request_ids), b.url: list(b.request_ids)}
    return results, backend, served, holder.get("down")


def server_of_each_turn(served) -> dict[str, list[str]]:
    """sample ("i-s") -> the server of each of its turns, in turn order."""
    turns: dict[str, dict[int, str]] = {}
    for url, ids in served.items():
        for rid in ids:
            i, s, turn = rid.split("-")[:3]
            turns.setdefault(f"{i}-{s}", {})[int(turn)] = url
    return {sample: [by_turn[t] for t in sorted(by_turn)] for sample, by_turn in turns.items()}


def test_sticky_routing_keeps_the_turns_of_a_sample_on_one_server(tpl):
    results, backend, served, _ = _two_servers_run(tpl, sticky=True)
    assert all(r.status.name == "DONE" and r.turns == 3 for r in results)
    routes = server_of_each_turn(served)
    assert len(routes) == 12 and all(len(set(urls)) == 1 and len(urls) == 3 for urls in routes.values()), routes
    assert backend.sticky_hits == 24 and backend.sticky_moves == 0  # turns 1 and 2 of each of 12 samples
    assert all(served.values())  # both servers got samples (least loaded for first turns)


def test_without_sticky_turns_go_to_the_least_loaded_server(tpl):
    results, backend, served, _ = _two_servers_run(tpl, sticky=False)
    assert all(r.status.name == "DONE" for r in results)
    assert backend.sticky_hits == 0 and backend.sticky_moves == 0


def test_sticky_routing_leaves_a_server_that_is_down(tpl):
    results, backend, served, down = _two_servers_run(tpl, sticky=True, down_after_first_turn=True)
    assert all(r.status.name == "DONE" for r in results)
    route = server_of_each_turn(served)["0-0"]
    assert route[0] == down and route[1] != down and route[2] == route[1], route
    assert backend.sticky_moves >= 1


def test_torch_backend_update_runs_the_callers_transfer_between_batches(tiny_qwen2):
    """The torch backend's update is the caller's callable; the next turn samples from the new weights
    (its logprobs are the new model's) and carries the new version."""
    import torch

    model, tok = tiny_qwen2
    tpl = tmpl.ChatTemplate(tok, name="qwen2.5")
    rollout = tmpl.Rollout(
        tpl,
        tmpl.backends.Torch(model),
        max_turns=1,
        max_length=256,
        max_tokens_per_turn=6,
        sampling=tmpl.Sampling(temperature=0.0),
        version=1,
    )
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        [before] = rollout.run([ask(0)])

        def transfer():
            with torch.no_grad():
                model.model.norm.weight.mul_(3.0)

        rollout.update_weights(2, apply=transfer)
        [after] = rollout.run([ask(0)])
        assert before.versions.tolist() == [1] * len(before.mask) and after.versions.tolist() == [2] * len(after.mask)
        seq = torch.tensor([after.prompt_ids.tolist() + after.completion_ids.tolist()])
        with torch.no_grad():
            lp = torch.log_softmax(model(seq).logits[0].float(), -1)
        p = after.prompt_ids.size
        for t, token in enumerate(after.completion_ids.tolist()):
            assert lp[p + t - 1, token].item() == pytest.approx(float(after.logprobs[t]), abs=1e-4)
        assert after.logprobs.tolist() != before.logprobs.tolist()
    finally:
        model.load_state_dict(saved)


# -- server weight updates over a fake transport ----------------------------------------------------


class FakeHTTP:
    """Answers vLLM's RL endpoints: ``down`` servers refuse connections, ``fail`` maps a path to an HTTP error."""

    def __init__(self, down=(), fail=None, slow=()):
        self.down, self.fail, self.slow, self.calls = set(down), dict(fail or {}), tuple(slow), []

    async def post_json(self, url, payload, *, timeout=None, headers=None):
        from tmpl.errors import HTTPConnectionError

        base, path = url[: url.index("/", 8)], url[url.index("/", 8) :]
        if base in self.down:
            raise HTTPConnectionError(url, "cannot connect: refused")
        self.calls.append((base, path, payload))
        if path.startswith(self.slow):
            raise asyncio.TimeoutError()
        for prefix, status in self.fail.items():
            if path.startswith(prefix):
                return status, {"detail": "boom"}
        return 200, {}


def test_server_update_pauses_applies_resets_labels_resumes_and_retires_a_dead_server():
    from tmpl.backends import VLLMServer

    backend = VLLMServer(["http://a:1", "http://b:1"])
    backend.http = FakeHTTP(down={"http://a:1"})
    asyncio.run(backend.update_weights(3, "/ckpt/3", mode="abort"))
    assert [(base, path) for base, path, _ in backend.http.calls] == [
        ("http://b:1", "/pause?mode=abort&clear_cache=true"),
        ("http://b:1", "/collective_rpc"),
        ("http://b:1", "/reset_prefix_cache"),
        ("http://b:1", "/update_weight_version"),
        ("http://b:1", "/resume"),
    ]
    assert backend.http.calls[1][2] == {"method": "reload_weights", "kwargs": {"weights_path": "/ckpt/3"}}
    assert backend.http.calls[3][2] == {"new_version": "3"}
    a, b = backend.stats
    assert a["retired"] and "unreachable" in a["retired"] and not a["healthy"] and b["retired"] is None
    assert backend.weight_version == 3
    # the retired server gets no request any more, even when the other one is busy
    assert backend._pick(set()).url == "http://b:1"


def test_server_update_that_fails_names_the_server_and_step_and_still_resumes():
    from tmpl.backends import VLLMServer
    from tmpl.errors import WeightUpdateError

    backend = VLLMServer(["http://a:1", "http://b:1"])
    backend.http = FakeHTTP(fail={"/collective_rpc": 500})
    with pytest.raises(WeightUpdateError, match=r"weight update on http://a:1 failed at apply: HTTP 500") as info:
        asyncio.run(backend.update_weights(3, "/ckpt/3", mode="keep", reset_prefix_cache=False))
    assert (info.value.engine, info.value.step) == ("http://a:1", "apply")
    resumed = sorted(base for base, path, _ in backend.http.calls if path == "/resume")
    assert resumed == ["http://a:1", "http://b:1"]  # both were paused: both resume
    assert ("http://a:1", "/pause?mode=keep&clear_cache=false") in [(b, p) for b, p, _ in backend.http.calls]
    assert backend.weight_version == 0
    backend.http = FakeHTTP(fail={"/pause": 404})
    with pytest.raises(WeightUpdateError, match="VLLM_SERVER_DEV_MODE=1"):
        asyncio.run(backend.update_weights(4, mode="drain"))


def test_server_update_slower_than_the_timeout_fails_and_resumes_every_server():
    """A reload that outlasts the client's timeout is a failed update of live servers: they are all
    resumed and none is retired (a timeout used to retire every server for good)."""
    from tmpl.backends import VLLMServer
    from tmpl.errors import WeightUpdateError

    backend = VLLMServer(["http://a:1", "http://b:1"])
    backend.http = FakeHTTP(slow=("/collective_rpc",))
    with pytest.raises(WeightUpdateError, match="failed at apply: no answer within"):
        asyncio.run(backend.update_weights(3, "/ckpt/3", mode="keep"))
    resumed = sorted(base for base, path, _ in backend.http.calls if path == "/resume")
    assert resumed == ["http://a:1", "http://b:1"]
    assert all(s["retired"] is None for s in backend.stats) and backend.weight_version == 0
    assert backend._pick(set()).url in ("http://a:1", "http://b:1")


def test_an_engine_label_newer_than_the_rollout_is_kept_and_warned_about(caplog):
    """An engine left at label "2" by earlier work, a Rollout at version 0: the tokens keep the
    engine's 2 (the truth about its weights) and a warning says how to line the two up."""
    from tmpl.rollout.versions import token_versions

    result = GenerationResult("7-0-0", [11, 12, 13], None, "stop", versions=[2, 2, 2])
    with caplog.at_level("WARNING", logger="tmpl.rollout"):
        assert token_versions(result, submitted=0, current=0).tolist() == [2, 2, 2]
    assert "version 2, newer than this Rollout's version 0" in caplog.text and "7-0-0" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="tmpl.rollout"):
        assert token_versions(result, submitted=2, current=3).tolist() == [2, 2, 2]  # older than the rollout: ordinary
        assert token_versions(GenerationResult("r", [1, 2], None, "stop"), submitted=3, current=3).tolist() == [3, 3]
    assert caplog.text == ""


def test_a_newer_engine_label_is_warned_about_once_per_rollout(tpl, caplog):
    """Every request of every sample labelled "2" by an engine a Rollout at 0 did not update: one
    warning, not one per turn; the tokens keep the engine's label."""

    class Labelled(Engine):
        async def agenerate(self, req):
            out = await super().agenerate(req)
            out.versions = [2] * len(out.token_ids)
            return out

    rollout = tmpl.Rollout(tpl, Labelled(tpl, calls={0: 1, 1: 1, 2: 1}), tools=[get_weather], progress=False)
    with caplog.at_level("WARNING", logger="tmpl.rollout"):
        results = rollout.run([ask(i) for i in range(3)])
    assert sum(r.turns for r in results) == 6
    assert caplog.text.count("newer than this Rollout's version 0") == 1
    assert all(int(v) in (2, -1) for r in results for v in r.versions)


class SlowUpdate(Engine):
    """Its weight update waits for the test (``release``) after it started (``started``)."""

    def __init__(self, tpl) -> None:
        super().__init__(tpl)
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def update_weights(self, version, apply=None, *, mode="keep", reset_prefix_cache=True):
        self.started.set()
        await self.release.wait()
        await super().update_weights(version, apply, mode=mode, reset_prefix_cache=reset_prefix_cache)


@pytest.mark.parametrize("max_staleness", [None, 0])
def test_a_sample_ending_during_an_update_ended_under_the_version_being_set(tpl, max_staleness):
    """Keep mode: a request that comes back while the update is under way carries the new label on
    its tokens. The sample ended under that version (staleness 0, never -1), and with
    max_staleness=0 nothing of it is stale (it was -1 behind before)."""
    engine = SlowUpdate(tpl)
    engine.hold("0-0-0")
    engine.spans["0-0-0"] = [1] * len(engine.final)
    rollout = tmpl.Rollout(tpl, engine, max_staleness=max_staleness, stale="mask")

    async def go():
        task = asyncio.ensure_future(rollout.run_async([ask(0)]))
        await when(engine.arrived["0-0-0"], task)
        update = asyncio.ensure_future(rollout.update_weights_async(1, mode="keep"))
        await engine.started.wait()
        engine.held["0-0-0"].set()  # answered while the update holds the engine
        [r] = await task
        assert not update.done()
        engine.release.set()
        await update
        return r

    r = asyncio.run(go())
    assert r.status.name == "DONE" and r.versions.tolist() == [1] * len(engine.final)
    assert r.version == 1 and r.staleness == 0 and r.stale_action is None
    assert r.loss_mask.tolist() == r.mask.tolist() == [1] * len(engine.final)
    assert rollout.version == 1
