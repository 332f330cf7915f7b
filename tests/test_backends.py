"""Backends: torch on a random-weight model with the real Qwen2.5 tokenizer; the vLLM adapter
against a stand-in module; the server client against a local server speaking vLLM's JSON."""

from __future__ import annotations

import asyncio
import sys

import pytest
import torch

from tmpl.backends import (
    VLLM,
    BackendError,
    GenerationRequest,
    GenerationResult,
    Sampling,
    Scripted,
    Torch,
    VLLMServer,
)

from .vllm_standin import FakeLLM, StandinServer, fake_vllm_module

#: logprobs agree with a separate float32 forward pass to within this (batched, left-padded
#: generation and an unpadded forward differ only by float rounding)
ATOL = 1e-4


def _prompts(tok):
    return [
        tok.encode("Hello there, how are you?"),
        tok.encode("Short"),
        tok.encode("A third prompt with more words in it, ok"),
    ]


def _forward_logprobs(model, prompt, completion, temperature=None):
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(completion)])).logits[0].float()
    if temperature:
        logits = logits / temperature
    steps = torch.arange(len(prompt) - 1, len(prompt) + len(completion) - 1)
    return torch.log_softmax(logits, -1)[steps, torch.tensor(completion)]


@pytest.mark.parametrize("mode, temperature", [("raw", 1.0), ("raw", 0.0), ("processed", 0.7)])
def test_torch_logprobs_equal_a_separate_forward_pass(tiny_qwen2, mode, temperature):
    model, tok = tiny_qwen2
    stops = frozenset({tok.convert_tokens_to_ids("<|im_end|>")})
    backend = Torch(model)
    sampling = Sampling(temperature=temperature, logprobs=mode, seed=7)
    requests = [GenerationRequest(f"r{i}", p, 12 + 3 * i, stops, sampling) for i, p in enumerate(_prompts(tok))]
    results = backend.generate_batch(requests)
    for req, res in zip(requests, results):
        assert res.request_id == req.request_id and res.logprobs_mode == mode
        assert len(res.token_ids) == len(res.logprobs) <= req.max_tokens
        assert res.finish_reason == ("stop" if res.token_ids[-1] in stops else "length")
        if res.finish_reason == "length":
            assert len(res.token_ids) == req.max_tokens
        ref = _forward_logprobs(model, req.prompt_ids, res.token_ids, temperature if mode == "processed" else None)
        assert torch.allclose(torch.tensor(res.logprobs), ref, atol=ATOL), (
            (ref - torch.tensor(res.logprobs)).abs().max()
        )


def _generate_keeping_every_row(model, requests, sampling, stops, pad):
    """The approach the backend replaced: ``generate(output_logits / output_scores)`` keeps a
    vocabulary row per step; log-softmax of the stacked rows, gathered at the sampled tokens.
    Returns ``(ids, logprobs)`` per request, cut like the backend cuts (first stop kept, else max_tokens)."""
    width = max(len(r.prompt_ids) for r in requests)
    ids = torch.full((len(requests), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(requests):
        ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
        mask[i, width - len(r.prompt_ids) :] = 1
    kwargs = dict(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=max(r.max_tokens for r in requests),
        pad_token_id=pad,
        eos_token_id=sorted(stops),
        return_dict_in_generate=True,
        output_logits=sampling.logprobs == "raw",
        output_scores=sampling.logprobs == "processed",
    )
    if sampling.greedy:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    else:
        kwargs.update(
            do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or None
        )
    torch.manual_seed(sampling.seed)
    with torch.no_grad():
        gen = model.generate(**kwargs)
    rows = torch.stack(list(gen.logits if sampling.logprobs == "raw" else gen.scores), dim=1).float()
    new = gen.sequences[:, width:]
    lps = torch.log_softmax(rows, -1).gather(-1, new[:, : rows.shape[1], None]).squeeze(-1)
    out = []
    for i, r in enumerate(requests):
        toks = new[i, : r.max_tokens].tolist()
        end = next((t + 1 for t, tok in enumerate(toks) if tok in stops), len(toks))
        out.append((toks[:end], lps[i, :end].tolist()))
    return out


@pytest.mark.parametrize("mode", ["raw", "processed"])
@pytest.mark.parametrize("temperature, top_k, top_p", [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.7, 50, 0.9)])
def test_torch_step_logprobs_equal_keeping_every_row(tiny_qwen2, mode, temperature, top_k, top_p):
    """Same seed -> same token IDs and the same logprobs (1e-5) as generate(output_logits/output_scores)."""
    model, tok = tiny_qwen2
    stops = frozenset({tok.convert_tokens_to_ids("<|im_end|>")})
    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, logprobs=mode, seed=11)
    requests = [GenerationRequest(f"r{i}", p, 10 + 4 * i, stops, sampling) for i, p in enumerate(_prompts(tok))]
    backend = Torch(model)
    got = backend.generate_batch(requests)
    expected = _generate_keeping_every_row(model, requests, sampling, stops, backend.pad_token_id)
    for res, (ids, lps) in zip(got, expected):
        assert res.token_ids == ids
        assert res.logprobs == pytest.approx(lps, abs=1e-5)


def test_torch_raw_logprobs_come_before_the_generation_config_processors(tiny_qwen2):
    """Tokens suppressed by the model's generation_config shape what is sampled (and the
    processed logprobs) but not the raw ones: raw is the model's own log-softmax."""
    model, tok = tiny_qwen2
    stops = frozenset({tok.convert_tokens_to_ids("<|im_end|>")})
    backend = Torch(model)
    suppressed = range(1000, 100_000)  # two thirds of the vocabulary: log(3) nats off every processed logprob
    model.generation_config.suppress_tokens = list(suppressed)
    try:
        for mode in ("raw", "processed"):
            sampling = Sampling(temperature=1.0, logprobs=mode, seed=3)
            requests = [GenerationRequest(f"r{i}", p, 12, stops, sampling) for i, p in enumerate(_prompts(tok))]
            got = backend.generate_batch(requests)
            expected = _generate_keeping_every_row(model, requests, sampling, stops, backend.pad_token_id)
            for req, res, (ids, lps) in zip(requests, got, expected):
                assert res.token_ids == ids and res.logprobs == pytest.approx(lps, abs=1e-5)
                assert not set(res.token_ids) & set(suppressed)
                forward = _forward_logprobs(model, req.prompt_ids, res.token_ids)
                raw_matches = torch.allclose(torch.tensor(res.logprobs), forward, atol=ATOL)
                assert raw_matches == (mode == "raw")
    finally:
        model.generation_config.suppress_tokens = None


def test_torch_pads_with_any_token_when_the_config_names_none(tiny_qwen2):
    model, tok = tiny_qwen2
    configured = Torch(model)
    saved = (model.config.pad_token_id, model.config.eos_token_id)
    prompts = [tok.encode("hello there"), tok.encode("a much longer prompt, so the first one is left-padded")]
    stops = frozenset({tok.convert_tokens_to_ids("<|im_end|>")})
    reqs = [GenerationRequest(f"r{i}", ids, 6, stops, Sampling(temperature=0)) for i, ids in enumerate(prompts)]
    expected = configured.generate_batch(reqs)
    try:
        model.config.pad_token_id = model.config.eos_token_id = None
        bare = Torch(model)
        assert bare.pad_token_id == 0
        got = bare.generate_batch(reqs)
        assert Torch(model, tokenizer=tok).pad_token_id == tok.pad_token_id
    finally:
        model.config.pad_token_id, model.config.eos_token_id = saved
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    for a, b in zip(got, expected):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_torch_out_of_memory_halves_the_batch_and_retries(tiny_qwen2, monkeypatch):
    model, tok = tiny_qwen2
    backend = Torch(model, max_batch_size=8)
    stops = frozenset({tok.convert_tokens_to_ids("<|im_end|>")})
    reqs = [
        GenerationRequest(f"r{i}", tok.encode(f"prompt number {i}"), 4, stops, Sampling(temperature=0))
        for i in range(6)
    ]
    expected = backend.generate_batch(reqs)
    real, sizes = backend._generate, []

    def limited(chunk, sampling, stops):  # a device that fits 2 sequences at a time
        sizes.append(len(chunk))
        if len(chunk) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 79.00 GiB")
        return real(chunk, sampling, stops)

    monkeypatch.setattr(backend, "_generate", limited)
    got = backend.generate_batch(reqs)
    assert sizes[0] == 6 and max(sizes[1:]) <= 3 and all(r.finish_reason != "error" for r in got)
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    for a, b in zip(got, expected):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_torch_stops_at_the_first_stop_token_and_keeps_it(tiny_qwen2):
    model, tok = tiny_qwen2
    backend = Torch(model)
    prompt = tok.encode("count")
    [free] = backend.generate_batch([GenerationRequest("a", prompt, 20, frozenset(), Sampling(temperature=0))])
    stop = free.token_ids[5]  # greedy: the 6th token will be generated again; make it a stop token
    [cut] = backend.generate_batch([GenerationRequest("b", prompt, 20, frozenset({stop}), Sampling(temperature=0))])
    first = free.token_ids.index(stop)
    assert cut.token_ids == free.token_ids[: first + 1] and cut.finish_reason == "stop"
    [none] = backend.generate_batch([GenerationRequest("c", prompt, 0, frozenset(), Sampling())])
    assert none.token_ids == [] and none.finish_reason == "length"
    [empty] = backend.generate_batch([GenerationRequest("d", [], 5, frozenset(), Sampling())])
    assert empty.finish_reason == "error" and "empty prompt" in empty.error


def test_torch_batching_does_not_change_greedy_outputs(tiny_qwen2):
    model, tok = tiny_qwen2
    backend = Torch(model)
    greedy = Sampling(temperature=0)
    reqs = [GenerationRequest(f"r{i}", p, 8, frozenset(), greedy) for i, p in enumerate(_prompts(tok))]
    together = backend.generate_batch(reqs)
    alone = [backend.generate_batch([r])[0] for r in reqs]
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]


def test_scripted_backend_cuts_like_an_engine():
    backend = Scripted(lambda req: [5, 6, 7, 8, 9])
    [a, b, c] = backend.generate_batch(
        [
            GenerationRequest("a", [1], 10, frozenset({7})),
            GenerationRequest("b", [1], 3, frozenset()),
            GenerationRequest("c", [1], 10, frozenset({9})),
        ]
    )
    assert (a.token_ids, a.finish_reason) == ([5, 6, 7], "stop")
    assert (b.token_ids, b.finish_reason) == ([5, 6, 7], "length")
    assert (c.token_ids, c.finish_reason, len(c.logprobs)) == ([5, 6, 7, 8, 9], "stop", 5)


# -- vLLM offline engine: the adapter against a stand-in with the same interface ---------------


def test_vllm_adapter_uses_token_prompts_and_sampled_logprobs(tiny_qwen2, monkeypatch):
    model, tok = tiny_qwen2
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm_module())
    monkeypatch.setitem(sys.modules, "vllm.inputs", sys.modules["vllm"].inputs)
    llm = FakeLLM(Torch(model))
    backend = VLLM(llm)
    stops = frozenset({tok.convert_tokens_to_ids("<|im_end|>"), 198})
    reqs = [
        GenerationRequest(f"r{i}", p, 6, stops, Sampling(temperature=0.5, top_k=20, seed=3))
        for i, p in enumerate(_prompts(tok))
    ]
    results = backend.generate_batch(reqs)
    [(prompts, params, use_tqdm)] = llm.calls
    assert [p["prompt_token_ids"] for p in prompts] == [list(r.prompt_ids) for r in reqs]
    assert use_tqdm is False
    kw = params[0].kwargs
    assert kw["max_tokens"] == 6 and kw["stop_token_ids"] == sorted(stops) and kw["logprobs"] == 0
    assert kw["detokenize"] is False and kw["top_k"] == 20 and kw["seed"] == 3 and kw["n"] == 1
    for res in results:
        assert len(res.logprobs) == len(res.token_ids) and res.finish_reason in ("stop", "length")
        assert all(lp <= 0 for lp in res.logprobs)


def test_vllm_adapter_without_enqueue_isolates_a_refused_request(tiny_qwen2, monkeypatch):
    # an LLM without enqueue (older vLLM, stand-ins): one generate call; when it raises, one call per
    # request, so only the refused request fails (the real engine's path, enqueue, is in test_vllm_real.py)
    model, tok = tiny_qwen2
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm_module())
    monkeypatch.setitem(sys.modules, "vllm.inputs", sys.modules["vllm"].inputs)

    class Refusing(FakeLLM):
        def generate(self, prompts, sampling_params=None, use_tqdm=True):
            if any(len(p["prompt_token_ids"]) > 40 for p in prompts):
                raise ValueError("prompt longer than max_model_len=40")
            return super().generate(prompts, sampling_params, use_tqdm)

    llm = Refusing(Torch(model))
    stops = frozenset({tok.convert_tokens_to_ids("<|im_end|>")})
    short = _prompts(tok)[0]
    assert len(short) <= 40
    reqs = [
        GenerationRequest("a", short, 4, stops, Sampling(temperature=0.0)),
        GenerationRequest("b", short + [198] * 50, 4, stops, Sampling(temperature=0.0)),
        GenerationRequest("c", short, 4, stops, Sampling(temperature=0.0)),
    ]
    a, b, c = VLLM(llm).generate_batch(reqs)
    assert b.finish_reason == "error" and b.error == "vLLM: ValueError: prompt longer than max_model_len=40"
    assert a.finish_reason != "error" and a.token_ids == c.token_ids and len(a.token_ids) > 0
    assert [len(prompts) for prompts, _, _ in llm.calls] == [1, 1]  # the batch failed, then a and c alone


def test_vllm_missing_gives_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(BackendError, match=r"pip install 'tmpl\[vllm\]'"):
        VLLM(object()).generate_batch([GenerationRequest("a", [1], 2, frozenset())])


# -- vLLM servers: the client against a local server speaking the same JSON -------------------


def _run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("api", ["generate", "completions"])
def test_server_client_token_in_token_out(tiny_qwen2, api):
    model, tok = tiny_qwen2
    local = Torch(model)
    stops = frozenset({tok.convert_tokens_to_ids("<|im_end|>")})
    prompt = _prompts(tok)[0]
    with StandinServer(local) as server:
        client = VLLMServer(server.url, api=api, timeout=60)
        res = _run(client.agenerate(GenerationRequest("x1", prompt, 7, stops, Sampling(temperature=0))))
    direct = local.generate_batch([GenerationRequest("x1", prompt, 7, stops, Sampling(temperature=0))])[0]
    assert res.finish_reason in ("stop", "length") and res.error is None
    assert res.token_ids == direct.token_ids
    assert res.logprobs == pytest.approx(direct.logprobs, abs=ATOL)


def test_server_client_spreads_load_and_survives_a_dropping_server(tiny_qwen2):
    model, tok = tiny_qwen2
    local = Scripted(lambda req: [11, 12, 13])
    with StandinServer(local, drop_first=10**6) as bad, StandinServer(local) as good:
        client = VLLMServer([bad.url, good.url], timeout=10, retries=2, backoff=0.01)

        async def many():
            return await asyncio.gather(
                *(client.agenerate(GenerationRequest(f"q{i}", [1, 2], 5, frozenset())) for i in range(12))
            )

        results = _run(many())
    assert all(r.token_ids == [11, 12, 13] and r.error is None for r in results)
    stats = {s["url"]: s for s in client.stats}
    assert stats[good.url]["completed"] == 12 and stats[bad.url]["failures"] >= 1 and stats[bad.url]["completed"] == 0


def test_server_client_gives_up_with_a_reason():
    client = VLLMServer(["http://127.0.0.1:9", "http://127.0.0.1:7"], timeout=5, retries=1, backoff=0.0)
    res = _run(client.agenerate(GenerationRequest("z", [1], 3, frozenset())))
    assert isinstance(res, GenerationResult) and res.finish_reason == "error"
    assert "gave up after 2 attempt(s)" in res.error and "cannot connect" in res.error


def cancelled_on(status: int) -> tuple[StandinServer, VLLMServer]:
    """A request cancelled while a stand-in server (answering abort notices with ``status``) holds it."""
    with StandinServer(Scripted(lambda req: [1]), delay=1.0, abort_status=status) as server:
        client = VLLMServer(server.url, timeout=30)

        async def go():
            task = asyncio.create_task(client.agenerate(GenerationRequest("slow-1", [1, 2], 3, frozenset())))
            await asyncio.sleep(0.2)
            await client.cancel("slow-1")
            with pytest.raises(asyncio.CancelledError):
                await task

        _run(go())
    return server, client


def test_server_client_cancel_aborts_on_the_server():
    server, client = cancelled_on(200)
    assert server.aborted[0] == "slow-1"  # then vLLM 0.32's engine name for it, generate-tokens-slow-1
    assert client.stats[0]["aborts"] == 1 and client.stats[0]["abort_errors"] == 0


@pytest.mark.parametrize("status", [500, 404])
def test_an_abort_notice_the_server_refuses_is_counted(status):
    """A server that answers the abort notice with an error (or has no abort route: 404 on both paths)
    did not acknowledge it: ``stats`` says so, next to the notices sent."""
    server, client = cancelled_on(status)
    assert server.aborted[0] == "slow-1" and len(server.aborted) == (4 if status == 404 else 2)
    assert client.stats[0]["aborts"] == 1 and client.stats[0]["abort_errors"] == 1


# vLLM's tokens endpoint answers in two shapes: 0.30 (chat-style logprob entries whose token is the
# string "token_id:N") and 0.33 (entries with token_id). Recorded-form answers for both:
TOKENS_030 = {
    "choices": [
        {
            "index": 0,
            "finish_reason": "stop",
            "logprobs": {
                "content": [
                    {"token": "token_id:151657", "logprob": -0.01, "bytes": None, "top_logprobs": []},
                    {"token": "token_id:151645", "logprob": -0.25, "bytes": None, "top_logprobs": []},
                ]
            },
        }
    ]
}
TOKENS_033 = {
    "choices": [
        {
            "index": 0,
            "finish_reason": "stop",
            "token_ids": [151657, 151645],
            "logprobs": {"content": [{"token_id": 151657, "logprob": -0.01}, {"token_id": 151645, "logprob": -0.25}]},
        }
    ]
}


@pytest.mark.parametrize("body", [TOKENS_030, TOKENS_033], ids=["vllm-0.30", "vllm-0.33"])
def test_server_client_parses_both_tokens_endpoint_shapes(body):
    client = VLLMServer("http://127.0.0.1:9", api="generate")
    out = client._parse(GenerationRequest("a", [1], 4, frozenset()), body, "http://127.0.0.1:9")
    assert (out.token_ids, out.logprobs, out.finish_reason) == ([151657, 151645], [-0.01, -0.25], "stop")


def test_server_client_explains_a_disabled_tokens_endpoint():
    from tmpl.backends.server import scale_out_hint

    text = scale_out_hint("http://h:1", {"error": "Scale-out endpoints are disabled"})
    assert "--enable-scale-out" in text and "api='completions'" in text


def test_server_client_retries_under_a_new_id_and_skips_a_dead_server():
    """A lost connection marks the server down (no new requests for ``down_for`` s); the retry goes
    elsewhere under a new id, so aborting the lost try, or a late answer to it, cannot touch it."""
    local = Scripted(lambda req: [11, 12, 13])
    with StandinServer(local, drop_first=10**6) as bad, StandinServer(local) as good:
        client = VLLMServer([bad.url, good.url], timeout=10, retries=2, backoff=0.0, down_for=60)
        first = _run(client.agenerate(GenerationRequest("q0", [1, 2], 5, frozenset())))
        later = _run(client.agenerate(GenerationRequest("q1", [1, 2], 5, frozenset())))
    assert first.token_ids == later.token_ids == [11, 12, 13]
    stats = {s["url"]: s for s in client.stats}
    assert stats[bad.url]["lost"] == 1 and not stats[bad.url]["healthy"] and stats[good.url]["healthy"]
    assert bad.requests == 1  # q1 never went to the server that was down
    assert good.request_ids == ["q0~a1", "q1"]


def test_server_client_refuses_an_answer_for_another_request():
    client = VLLMServer("http://127.0.0.1:9", api="generate")

    async def answer(url, payload, timeout=None, headers=None):
        return 200, {"request_id": "generate-tokens-someone-else", **TOKENS_033}

    client.http.post_json = answer
    out = _run(client.agenerate(GenerationRequest("mine", [1], 4, frozenset())))
    assert out.finish_reason == "error" and "'generate-tokens-someone-else', not 'mine'" in out.error


def test_http_connection_error_is_a_backend_error_naming_the_server():
    from tmpl.backends.http import HTTPConnectionError as OldPath
    from tmpl.errors import BackendError, HTTPConnectionError

    assert OldPath is HTTPConnectionError and issubclass(HTTPConnectionError, BackendError)
    client = VLLMServer("http://127.0.0.1:9", timeout=5)
    with pytest.raises(HTTPConnectionError, match=r"^http://127\.0\.0\.1:9/v1/completions: cannot connect") as info:
        _run(client.http.post_json("http://127.0.0.1:9/v1/completions", {}))
    assert info.value.url == "http://127.0.0.1:9/v1/completions"
