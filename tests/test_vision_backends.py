"""Backends with images (issue 24, item 3): the Torch backend on a tiny Qwen2.5-VL built offline.

The model is tests/fixture_vlm.py's (random weights, the real Qwen2.5 tokenizer, the image-only
Qwen2.5-VL processor, llama.cpp's Qwen3.5-4B template). Ground truth is ``model.generate`` called
directly on the processor's own full render of the conversation
(``processor.apply_chat_template(..., tokenize=True, return_dict=True, return_tensors="pt")``);
tmpl's side builds the request from ``VisionTemplate`` (prompt, completion, tool-result suffix,
``ImageInputs.concat``) and the backend passes ``ImageInputs.model_inputs`` to ``generate``.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest

from tmpl.backends import GenerationRequest, Sampling, Torch

from .fixture_vlm import TEMPLATE_KWARGS, TinyVLM, build_tiny_vlm, missing

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
PIL = pytest.importorskip("PIL.Image")
if missing():
    pytest.skip(missing(), allow_module_level=True)

from tmpl.vision import ImageInputs, VisionTemplate  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "screenshot",
            "description": "Take a screenshot of a page",
            "parameters": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]},
        },
    }
]
MAX_TOKENS = 10


@pytest.fixture(scope="session")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> TinyVLM:
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"))


@pytest.fixture(scope="session")
def vt(vlm: TinyVLM) -> VisionTemplate:
    return VisionTemplate(vlm.processor, name="tiny-qwen2.5-vl/Qwen3.5-4B", **TEMPLATE_KWARGS)


def image(w: int, h: int, seed: int = 0) -> Any:
    rng = np.random.default_rng(seed + 7919 * w + h)
    arr = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    arr[: h // 2, : w // 3] = (250, 20, 20)
    return PIL.fromarray(arr, "RGB")


def user_turn(img: Any) -> list[dict]:
    return [
        {"role": "system", "content": "You read screenshots."},
        {"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": "Is it the same?"}]},
    ]


def tool_turn(tool_imgs: list[Any]) -> tuple[dict, list[dict]]:
    calls = [
        {"type": "function", "id": f"call{i}", "function": {"name": "screenshot", "arguments": {"url": f"u{i}"}}}
        for i in range(len(tool_imgs))
    ]
    results = [
        {
            "role": "tool",
            "name": "screenshot",
            "tool_call_id": f"call{i}",
            "content": [{"type": "text", "text": f"page u{i}:"}, {"type": "image", "image": img}],
        }
        for i, img in enumerate(tool_imgs)
    ]
    return {"role": "assistant", "content": "", "tool_calls": calls}, results


def full_render(vlm: TinyVLM, messages: list[dict]) -> dict[str, Any]:
    """The processor's own render of the whole conversation, with the generation prompt (the oracle)."""
    return dict(
        vlm.processor.apply_chat_template(
            messages,
            tools=TOOLS,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
            **TEMPLATE_KWARGS,
        )
    )


def direct_generate(vlm: TinyVLM, inputs: dict[str, Any], stops: list[int], sampling: Sampling) -> list[int]:
    """``model.generate`` on the processor's outputs, cut as the backend cuts (at the first stop, kept)."""
    kwargs: dict[str, Any] = dict(max_new_tokens=MAX_TOKENS, eos_token_id=stops, pad_token_id=151643)
    if sampling.greedy:
        kwargs.update(do_sample=False)
    else:
        kwargs.update(do_sample=True, temperature=sampling.temperature, top_k=0, top_p=1.0)
        torch.manual_seed(sampling.seed)
    with torch.no_grad():
        out = vlm.model.generate(**inputs, **kwargs)
    ids = out[0, inputs["input_ids"].shape[1] :].tolist()
    for t, tok in enumerate(ids):
        if tok in stops:
            return ids[: t + 1]
    return ids


def request(rid: str, ids: list[int], images: ImageInputs | None, stops: list[int], sampling: Sampling):
    return GenerationRequest(rid, ids, MAX_TOKENS, frozenset(stops), sampling=sampling, images=images)


def tool_conversation(vt: VisionTemplate, vlm: TinyVLM, user_img: Any, tool_imgs: list[Any]):
    """tmpl's IDs and image inputs for [system, user(image), assistant(calls), tool results(images)] and
    the processor's full render of the same conversation."""
    history = user_turn(user_img)
    assistant, results = tool_turn(tool_imgs)
    truth = full_render(vlm, history + [assistant] + results)
    truth_ids = truth["input_ids"][0].tolist()
    prompt = vt.prompt(history, tools=TOOLS)
    assert truth_ids[: len(prompt.ids)] == prompt.ids  # this template is prefix-stable without thinking
    end = next(i for i in range(len(prompt.ids), len(truth_ids)) if truth_ids[i] in vt.stop_token_ids)
    completion = truth_ids[len(prompt.ids) : end + 1]  # the assistant's tool-call turn, as a model would write it
    suffix = vt.suffix_ids(results, completion_ids=completion, tools=TOOLS, history=history)
    ids = prompt.ids + completion + suffix.ids
    images = ImageInputs.concat([prompt.images, suffix.images.shifted(len(prompt.ids) + len(completion))])
    return ids, images, truth


def forward_logprobs(vlm: TinyVLM, inputs: dict[str, Any], completion: list[int]) -> list[float]:
    """Teacher-forced log-softmax of the completion's tokens (one forward pass over prompt + completion)."""
    n = inputs["input_ids"].shape[1]
    ids = torch.cat([inputs["input_ids"], torch.tensor([completion])], dim=1)
    extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask", "mm_token_type_ids")}
    mm = torch.cat([inputs["mm_token_type_ids"], torch.zeros((1, len(completion)), dtype=torch.long)], dim=1)
    with torch.no_grad():
        logits = vlm.model(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=mm, **extra).logits
    logp = torch.log_softmax(logits[0, n - 1 : -1].float(), dim=-1)
    return logp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1).tolist()


# -- the Torch backend --------------------------------------------------------------------------


@pytest.mark.parametrize("size", [(28, 28), (100, 80), (333, 517)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_torch_prompt_with_image_generates_as_model_generate(vlm: TinyVLM, vt: VisionTemplate, size) -> None:
    history = user_turn(image(*size))
    truth = full_render(vlm, history)
    prompt = vt.prompt(history, tools=TOOLS)
    assert prompt.ids == truth["input_ids"][0].tolist()
    stops = sorted(vt.stop_token_ids)
    greedy = Sampling(temperature=0)
    [result] = Torch(vlm.model).generate_batch([request("r0", prompt.ids, prompt.images, stops, greedy)])
    expected = direct_generate(vlm, truth, stops, greedy)
    assert result.token_ids == expected
    assert result.finish_reason == ("stop" if expected[-1] in stops else "length")
    # logprobs kept: the sampled tokens' raw log-softmax, as a teacher-forced forward pass gives them
    assert result.logprobs is not None and len(result.logprobs) == len(result.token_ids)
    np.testing.assert_allclose(result.logprobs, forward_logprobs(vlm, truth, expected), atol=2e-3)
    # not vacuous: the image reaches the model (another image of the same size, other tokens; the
    # 28x28 image is 4 placeholders among ~200 tokens, which this random model's peaked attention ignores)
    if size != (28, 28):
        other = vt.prompt(user_turn(image(*size, seed=5)), tools=TOOLS)
        assert other.ids == prompt.ids
        [changed] = Torch(vlm.model).generate_batch([request("r1", other.ids, other.images, stops, greedy)])
        assert changed.token_ids != result.token_ids


def test_torch_tool_result_images_generate_as_model_generate(vlm: TinyVLM, vt: VisionTemplate) -> None:
    ids, images, truth = tool_conversation(vt, vlm, image(60, 90), [image(200, 120, 3), image(90, 300, 4)])
    assert ids == truth["input_ids"][0].tolist()
    assert images.count == 3
    stops = sorted(vt.stop_token_ids)
    for sampling in (Sampling(temperature=0), Sampling(temperature=1.0, seed=7)):
        [result] = Torch(vlm.model).generate_batch([request("r0", ids, images, stops, sampling)])
        assert result.token_ids == direct_generate(vlm, truth, stops, sampling), sampling


def test_torch_stop_token_with_images(vlm: TinyVLM, vt: VisionTemplate) -> None:
    """A stop token the model does emit (its third greedy token): generation stops there, kept."""
    history = user_turn(image(100, 80))
    truth = full_render(vlm, history)
    greedy = Sampling(temperature=0)
    free = direct_generate(vlm, truth, [], greedy)
    stop = free[2]
    prompt = vt.prompt(history, tools=TOOLS)
    [result] = Torch(vlm.model).generate_batch([request("r0", prompt.ids, prompt.images, [stop], greedy)])
    assert result.finish_reason == "stop"
    assert result.token_ids == free[: free.index(stop) + 1]


def test_torch_batch_mixes_image_and_text_requests(vlm: TinyVLM, vt: VisionTemplate) -> None:
    """Left-padded batches: each request's tokens are those of its own direct ``model.generate``."""
    greedy = Sampling(temperature=0)
    stops = sorted(vt.stop_token_ids)
    a_hist = user_turn(image(333, 517, 1))
    a = vt.prompt(a_hist, tools=TOOLS)
    b_ids, b_images, b_truth = tool_conversation(vt, vlm, image(56, 56), [image(100, 80, 2)])
    c_hist = [{"role": "user", "content": "Hello!"}]
    c = vt.prompt(c_hist, tools=TOOLS)
    assert c.images.count == 0
    bad = ImageInputs(a.images.arrays, ((0, 1),), a.images.parts, a.images.image_token_id, a.images.token_type_keys)
    requests = [
        request("a", a.ids, a.images, stops, greedy),
        request("bad", a.ids, bad, stops, greedy),  # misaligned with its IDs: fails alone
        request("b", b_ids, b_images, stops, greedy),
        request("c", c.ids, None, stops, greedy),
    ]
    results = Torch(vlm.model).generate_batch(requests)
    assert [r.request_id for r in results] == ["a", "bad", "b", "c"]
    assert results[1].finish_reason == "error" and "do not fit the prompt IDs" in (results[1].error or "")
    assert results[0].token_ids == direct_generate(vlm, full_render(vlm, a_hist), stops, greedy)
    assert results[2].token_ids == direct_generate(vlm, b_truth, stops, greedy)
    assert results[3].token_ids == direct_generate(vlm, full_render(vlm, c_hist), stops, greedy)


def test_sglang_refuses_images(vt: VisionTemplate) -> None:
    """Not wired for images: the request fails before any HTTP call (never the IDs without their pixels)."""
    import asyncio

    from tmpl.backends.sglang import SGLang

    a = vt.prompt(user_turn(image(100, 80)), tools=TOOLS)
    backend = SGLang("http://127.0.0.1:9")
    result = asyncio.run(backend.agenerate(request("a", a.ids, a.images, [], Sampling(temperature=0))))
    assert result.finish_reason == "error" and "images are not supported" in (result.error or "")


def test_vllm_offline_image_request_fails_when_the_engine_hides_its_expansion(vt: VisionTemplate) -> None:
    """The offline engine's expanded prompt must equal the request's IDs; an output without
    ``prompt_token_ids`` cannot be checked, so the request fails (it used to pass unchecked)."""
    from tmpl.backends.vllm import VLLM

    a = vt.prompt(user_turn(image(100, 80)), tools=TOOLS)
    req = request("a", a.ids, a.images, [], Sampling(temperature=0))
    backend = VLLM.__new__(VLLM)  # only the output check: no engine needed
    backend.logprobs_mode = "processed_logprobs"
    completion = types.SimpleNamespace(token_ids=(5, 6), logprobs=None, finish_reason="stop")
    hidden = backend._result(req, types.SimpleNamespace(outputs=[completion]))
    assert hidden.finish_reason == "error" and "no prompt_token_ids" in (hidden.error or "")
    other = backend._result(req, types.SimpleNamespace(outputs=[completion], prompt_token_ids=a.ids[:-1]))
    assert other.finish_reason == "error" and "not the one the IDs came from" in (other.error or "")
    same = backend._result(req, types.SimpleNamespace(outputs=[completion], prompt_token_ids=list(a.ids)))
    assert same.finish_reason == "stop" and same.token_ids == [5, 6]


def test_vllm_server_encodes_each_image_once_off_the_event_loop(vt: VisionTemplate, monkeypatch) -> None:
    """A sample sends every image of its sequence on each turn, and a failed try is sent again: each
    image is PNG-encoded once per client, in a worker thread (a 1024-pixel PNG takes milliseconds,
    which the event loop would spend away from every other sample)."""
    import asyncio
    import threading

    from tmpl.backends import VLLMServer
    from tmpl.backends import server as server_module

    encoded: list[tuple[int, int]] = []  # (image id, thread)
    real = server_module.image_data_url

    def counting(img: Any) -> str:
        encoded.append((id(img), threading.get_ident()))
        return real(img)

    monkeypatch.setattr(server_module, "image_data_url", counting)
    first, second = image(100, 80), image(64, 64, 1)
    one = vt.prompt(user_turn(first), tools=TOOLS)
    both = vt.prompt(
        [{"role": "user", "content": [{"type": "image", "image": first}, {"type": "image", "image": second}]}],
        tools=TOOLS,
    )
    sent: list[list[str]] = []
    statuses = iter([503, 200, 200])
    current: dict[str, Any] = {}

    async def answer(url, payload, timeout=None, headers=None):
        sent.append([p["url"] for p in payload["content_parts"]])
        choice = {
            "token_ids": [5],
            "finish_reason": "stop",
            "logprobs": {"content": [{"token_id": 5, "logprob": -0.1}]},
        }
        body = {"request_id": payload["request_id"], "prompt_token_ids": current["ids"], "choices": [choice]}
        status = next(statuses)
        return status, body if status == 200 else "busy"

    client = VLLMServer("http://127.0.0.1:9", api="generate", retries=1, backoff=0.0)
    client.http.post_json = answer

    async def go() -> tuple[int, list[Any]]:
        outs = []
        for rid, prompt, sources in (("t0", one, [first]), ("t1", both, [first, second])):
            req = request(rid, prompt.ids, prompt.images, [], Sampling(temperature=0))
            req.image_sources = sources
            current["ids"] = list(prompt.ids)
            outs.append(await client.agenerate(req))  # t0: a 503, then answered (two tries)
        return threading.get_ident(), outs

    loop_thread, outs = asyncio.run(go())
    assert [o.finish_reason for o in outs] == ["stop", "stop"], [o.error for o in outs]
    assert [i for i, _ in encoded] == [id(first), id(second)]  # once each: not per try, not per turn
    assert all(thread != loop_thread for _, thread in encoded)
    assert len(sent) == 3 and sent[0] == sent[1] == [real(first)] and sent[2] == [real(first), real(second)]


def test_trl_rollout_func_refuses_prompts_with_images() -> None:
    """A trainer whose processing_class is a text tokenizer (no image processor) cannot carry a prompt's
    images into TRL's loss pass (docs/vision.md, "Backends"): a prompt with an image part is refused
    before any rollout, naming the prompt and message. With a processor, see
    tests/test_integrations_trl_vision.py."""
    from types import SimpleNamespace

    pytest.importorskip("trl")
    from tmpl.errors import TrainerConfigError
    from tmpl.integrations.trl import make_rollout_func

    trainer = SimpleNamespace(
        tools=None,
        environment_factories=None,
        repetition_penalty=1.0,
        min_p=None,
        args=SimpleNamespace(generation_kwargs=None),
    )
    prompts = [
        [{"role": "user", "content": "Hello!"}],
        [{"role": "system", "content": "You read screenshots."}] + user_turn(image(28, 28))[1:],
    ]
    with pytest.raises(
        TrainerConfigError,
        match="prompt 1, message 1 holds an image, and the trainer's processing_class is a text tokenizer",
    ):
        make_rollout_func()(prompts, trainer)


def test_verl_backend_passes_image_data(vt: VisionTemplate) -> None:
    """verl's server manager gets the expanded IDs and ``image_data`` (the PIL images), as verl's own
    agent loops send them; a request whose images are missing fails before any call."""
    import asyncio
    from types import SimpleNamespace

    from tmpl.integrations.verl.backend import VerlServerBackend

    calls: list[dict] = []

    class Manager:
        async def generate(self, request_id, **kwargs):
            calls.append(kwargs)
            return SimpleNamespace(token_ids=[7, 151645], log_probs=[-0.5, -0.1], stop_reason="completed")

    img = image(100, 80)
    a = vt.prompt(user_turn(img), tools=TOOLS)
    backend = VerlServerBackend(Manager(), {"temperature": 1.0})
    stops = frozenset(vt.stop_token_ids)
    req = GenerationRequest("a", a.ids, 8, stops, images=a.images, image_sources=[img])
    result = asyncio.run(backend.agenerate(req))
    assert result.token_ids == [7, 151645] and result.finish_reason == "stop"
    assert calls[0]["prompt_ids"] == a.ids and calls[0]["image_data"] == [img]
    missing_sources = GenerationRequest("b", a.ids, 8, stops, images=a.images)
    failed = asyncio.run(backend.agenerate(missing_sources))
    assert failed.finish_reason == "error" and "image_sources" in (failed.error or "") and len(calls) == 1
    text = asyncio.run(backend.agenerate(GenerationRequest("c", [1, 2], 8, stops)))
    assert text.finish_reason == "stop" and "image_data" not in calls[1]


# -- a rollout with a tool that returns an image, on the real engine ------------------------------


SHOT = image(200, 120, 3)  # what the screenshot tool returns


def screenshot(url: str) -> Any:
    """Take a screenshot of a page.

    Args:
        url: The page.
    """
    return SHOT


def screenshot_rollout(vlm: TinyVLM, engine: Any) -> tuple[Any, list[GenerationRequest], list[int], dict[str, Any]]:
    """Run ``tmpl.Rollout(VisionTemplate, engine, tools=[screenshot])`` on a user turn with an image: the
    random model calls no tools, so the first turn is the full render's tool-call turn (scripted), and
    every later one is ``engine``'s. Returns ``(result, requests seen, first prompt, full render after
    the tool result)``, the renders being the processor's own (``apply_chat_template``)."""
    import tmpl
    from tmpl.backends import Backend, GenerationResult

    vt = VisionTemplate(vlm.processor, name="tiny-qwen2.5-vl/qwen3-tok/Qwen3.5-4B", **TEMPLATE_KWARGS)
    schemas = tmpl.Toolbox([screenshot]).schemas
    history = user_turn(image(60, 90))
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "id": "c0", "function": {"name": "screenshot", "arguments": {"url": "a.io"}}}
        ],
    }
    result_msg = {
        "role": "tool",
        "name": "screenshot",
        "tool_call_id": "c0",
        "content": [{"type": "image", "image": SHOT}],
    }

    def render(messages: list[dict]) -> dict[str, Any]:
        return dict(
            vlm.processor.apply_chat_template(
                messages,
                tools=schemas,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
                return_tensors="pt",
                **TEMPLATE_KWARGS,
            )
        )

    first = render(history)["input_ids"][0].tolist()
    second = render(history + [call, result_msg])
    second_ids = second["input_ids"][0].tolist()
    end = next(i for i in range(len(first), len(second_ids)) if second_ids[i] in vt.stop_token_ids)
    call_ids = second_ids[len(first) : end + 1]  # the tool-call turn as the template renders it
    seen: list[GenerationRequest] = []

    class FirstTurnScripted(Backend):
        threaded = False

        def generate_batch(self, requests):
            seen.extend(requests)
            if len(seen) == 1:  # the first turn: the tool call
                return [GenerationResult(r.request_id, call_ids, [0.0] * len(call_ids), "stop") for r in requests]
            return engine.generate_batch(requests)

    rollout = tmpl.Rollout(
        vt,
        FirstTurnScripted(),
        tools=[screenshot],
        max_turns=2,
        max_tokens_per_turn=MAX_TOKENS,
        sampling=Sampling(temperature=0),
        verify_every=1,
        progress=False,
    )
    [r] = rollout.run([history])
    return r, seen, first, second


def test_rollout_tool_image_reaches_the_torch_engine(tmp_path_factory: pytest.TempPathFactory) -> None:
    """tmpl.Rollout with a VisionTemplate and the Torch backend on the tiny VLM (qwen3 tokenizer, whose
    Qwen3.5-4B tool calls tmpl parses), as :func:`screenshot_rollout` runs it: the second turn is the
    real model's and must equal ``model.generate`` on the processor's full render of the conversation
    with both images, and the request that produced it must be that render."""
    if missing("qwen3"):
        pytest.skip(missing("qwen3"))
    vlm3 = build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm-qwen3"), "qwen3")
    r, seen, first, second = screenshot_rollout(vlm3, Torch(vlm3.model))
    second_ids = second["input_ids"][0].tolist()
    assert len(seen) == 2 and r.tool_calls == 1 and r.tool_failures == 0
    assert seen[0].prompt_ids == first and seen[0].images is not None and seen[0].images.count == 1
    assert seen[1].prompt_ids == second_ids and seen[1].images is not None and seen[1].images.count == 2
    stops = sorted(VisionTemplate(vlm3.processor, **TEMPLATE_KWARGS).stop_token_ids)
    expected = direct_generate(vlm3, second, stops, Sampling(temperature=0))
    assert r.completion_ids.tolist() == second_ids[len(first) :] + expected
