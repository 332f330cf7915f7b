"""A tiny vision-language model built offline: the Qwen2.5-VL architecture with random weights.

Nothing can be downloaded here, and no VLM is in ``../shared/models``, so the backend tests
(tests/test_vision_backends*.py) build one in a temporary folder: transformers'
``Qwen2_5_VLConfig`` / ``Qwen2_5_VLForConditionalGeneration`` with 2 text layers and 2 vision
blocks of width 128 (heads of 64: vLLM's CPU attention refuses small head sizes), float32 random
weights (seeded, standard deviation 1.0), the real Qwen2.5 tokenizer of ``TMPL_TEST_DATA`` (it holds ``<|image_pad|>``,
``<|vision_start|>``...), an image-only ``Qwen2_5_VLProcessor`` around transformers'
``Qwen2VLImageProcessorPil`` (class defaults; the default image processor and the video processor
need torchvision, which does not load here) and a public VL chat template: llama.cpp's
``Qwen3.5-4B.jinja`` (PyPI ``llama-cpp-python==0.3.36`` sdist, ``vendor/llama.cpp/models/templates``;
in the catalog of ``TMPL_TEST_DATA``), which renders images in user messages and in tool results.

Everything is written with ``save_pretrained``: ``config.json`` + ``model.safetensors``, the
tokenizer files with the chat template, and the image processor's ``preprocessor_config.json``
(``image_processor_type: Qwen2VLImageProcessorPil``). ``processor_config.json`` names
``Qwen2_5_VLProcessor`` (the class engines look up), not tmpl's image-only subclass.

>>> vlm = build_tiny_vlm(tmp_path)  # doctest: +SKIP
>>> vlm.model.generate(**vlm.processor.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt"))  # doctest: +SKIP
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .conftest import DATA

TOKENIZER = "qwen2.5-instruct"
TEMPLATE = "templates/llama.cpp/Qwen3.5-4B.jinja"
TEMPLATE_KWARGS = {"enable_thinking": False}  # the Qwen2.5 tokenizer has <think> only as text
HIDDEN = 128
SEED = 0
#: the weights' standard deviation. At transformers' usual 0.02 the tiny random model repeats one token
#: whatever the image (its logits are nearly flat); at 1.0 its greedy tokens differ from image to image
#: with top-2 margins of ~0.3-5 nats (not flipped by a different, batched summation order)
INIT = 1.0


@dataclass
class TinyVLM:
    """The built fixture: its folder, the model (eval mode, float32), the processor and the template text."""

    path: Path
    model: Any
    processor: Any
    chat_template: str


def missing(tokenizer: str = TOKENIZER) -> str | None:
    """Why the fixture cannot be built here (a skip reason), or None."""
    if not (DATA / tokenizer / "tokenizer.json").is_file():
        return f"tokenizer {tokenizer!r} not in TMPL_TEST_DATA={DATA}"
    if not (DATA / TEMPLATE).is_file():
        return f"template {TEMPLATE!r} not in TMPL_TEST_DATA={DATA}"
    return None


def config(tokenizer: Any) -> Any:
    """The tiny ``Qwen2_5_VLConfig``: the vision tokens are the tokenizer's own IDs."""
    import transformers

    ids = tokenizer.convert_tokens_to_ids(["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"])
    head_dim = 64
    return transformers.Qwen2_5_VLConfig(
        text_config={
            "vocab_size": 151936,  # Qwen2.5's embedding rows (the tokenizer's 151,665 tokens, padded)
            "hidden_size": HIDDEN,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": HIDDEN // head_dim,
            "num_key_value_heads": 1,
            "max_position_embeddings": 4096,
            "max_window_layers": 2,
            "rms_norm_eps": 1e-6,
            # multimodal rotary sections (temporal, height, width) over head_dim / 2 frequencies
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [8, 12, 12]},
            "bos_token_id": 151643,
            "eos_token_id": 151645,
            "tie_word_embeddings": True,
            "initializer_range": INIT,
        },
        vision_config={
            "depth": 2,
            "hidden_size": HIDDEN,
            "intermediate_size": 256,
            "num_heads": HIDDEN // head_dim,
            "out_hidden_size": HIDDEN,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": [1],
            "initializer_range": INIT,
        },
        image_token_id=ids[0],
        video_token_id=ids[1],
        vision_start_token_id=ids[2],
        vision_end_token_id=ids[3],
        tie_word_embeddings=True,
        initializer_range=INIT,
    )


def build_tiny_vlm(folder: Path, tokenizer_folder: str = TOKENIZER) -> TinyVLM:
    """Build the tiny VLM and save it (model, tokenizer, processor) into ``folder``.

    ``tokenizer_folder``: Qwen2.5's by default; ``"qwen3"`` (the same vision tokens) for tool rollouts,
    whose calls tmpl's ``qwen3_xml`` parser reads with this template (not with Qwen2.5's tokenizer).
    """
    import torch
    import transformers

    from tmpl.vision import image_only_processor

    reason = missing(tokenizer_folder)
    if reason is not None:
        raise FileNotFoundError(reason)
    folder.mkdir(parents=True, exist_ok=True)
    chat_template = (DATA / TEMPLATE).read_text(encoding="utf-8")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(DATA / tokenizer_folder))
    tokenizer.chat_template = chat_template
    torch.manual_seed(SEED)
    cfg = config(tokenizer)
    model = transformers.Qwen2_5_VLForConditionalGeneration(cfg).to(torch.float32).eval()
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=151643, eos_token_id=[151645, 151643], pad_token_id=151643, do_sample=False
    )
    model.save_pretrained(str(folder))
    processor = image_only_processor(
        transformers.Qwen2_5_VLProcessor, transformers.Qwen2VLImageProcessorPil(), tokenizer, chat_template
    )
    # ProcessorMixin.save_pretrained saves every attribute, and the video processor here is None: save
    # the parts the way it does (tokenizer files, chat_template.jinja, processor_config.json with the
    # image processor's settings), under the real class's name (engines look the class up by it)
    tokenizer._set_processor_class("Qwen2_5_VLProcessor")
    tokenizer.save_pretrained(str(folder))
    (folder / "chat_template.jinja").write_text(chat_template, encoding="utf-8")
    settings = json.loads(processor.to_json_string())
    settings["processor_class"] = "Qwen2_5_VLProcessor"
    (folder / "processor_config.json").write_text(json.dumps(settings, indent=2), encoding="utf-8")
    return TinyVLM(folder, model, processor, chat_template)


# -- vLLM on this machine -------------------------------------------------------------------------

#: ``sitecustomize.py`` for vLLM processes (a server, its engine core, its model-inspection subprocess)
#: that must load the tiny VLM without torchvision: applied only where torchvision is not importable.
#: vLLM 0.32's ``model_executor/models/qwen2_vl.py`` (imported by ``qwen2_5_vl.py``) imports
#: ``smart_resize`` from ``transformers.models.qwen2_vl.image_processing_qwen2_vl``, which imports
#: torchvision at module level; and ``Qwen2_5_VLProcessor.from_pretrained`` loads a video processor
#: (torchvision again). The hooks: (1) that module is a stand-in holding the PIL module's
#: ``smart_resize`` and ``Qwen2VLImageProcessorPil`` (as ``Qwen2VLImageProcessor``); (2) once
#: ``processing_qwen2_5_vl`` is imported, ``Qwen2_5_VLProcessor.from_pretrained`` builds tmpl's
#: image-only processor from the folder (tokenizer, the saved image-processor settings, the saved
#: template) with a stand-in video processor that declares no video kwargs (vLLM reads
#: ``video_processor.valid_kwargs``). Everything else is vLLM's own code.
SITECUSTOMIZE = """
import importlib.abc
import importlib.machinery
import importlib.util
import sys

_STAND_IN = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
_PROCESSING = "transformers.models.qwen2_5_vl.processing_qwen2_5_vl"


def _image_only_from_folder(path):
    import json
    import os
    import types

    import transformers

    from tmpl.vision import image_only_processor

    with open(os.path.join(path, "processor_config.json"), encoding="utf-8") as fh:
        settings = json.load(fh)["image_processor"]
    settings = {k: v for k, v in settings.items() if k != "image_processor_type"}
    with open(os.path.join(path, "chat_template.jinja"), encoding="utf-8") as fh:
        template = fh.read()
    processor = image_only_processor(
        transformers.Qwen2_5_VLProcessor,
        transformers.Qwen2VLImageProcessorPil(**settings),
        transformers.AutoTokenizer.from_pretrained(path),
        template,
    )
    processor.video_processor = types.SimpleNamespace(valid_kwargs=type("NoVideoKwargs", (), {"__annotations__": {}}))
    return processor


class _StandIn(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil

        module.smart_resize = pil.smart_resize
        module.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil


class _Patched(importlib.abc.Loader):
    def __init__(self, real):
        self.real = real

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module):
        self.real.exec_module(module)
        module.Qwen2_5_VLProcessor.from_pretrained = classmethod(
            lambda cls, path, *args, **kwargs: _image_only_from_folder(str(path))
        )


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == _STAND_IN:
            return importlib.machinery.ModuleSpec(name, _StandIn())
        if name == _PROCESSING:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _Patched(spec.loader)
            return spec
        return None


if __name__ == "sitecustomize" and importlib.util.find_spec("torchvision") is None:
    sys.meta_path.insert(0, _Finder())
"""


def shims(folder: Path) -> Any:
    """:data:`SITECUSTOMIZE` as a module (``_image_only_from_folder``, ``_StandIn``...) loaded from
    ``folder``, for applying the same shims inside this process (loading it installs nothing)."""
    import importlib.util

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tiny_vlm_shims.py"
    path.write_text(SITECUSTOMIZE, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("tiny_vlm_shims", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def vllm_env(folder: Path) -> dict[str, str]:
    """Environment additions for a vLLM process that loads the tiny VLM here: ``PYTHONPATH`` with a
    ``sitecustomize.py`` (:data:`SITECUSTOMIZE`) written into ``folder``, and the repository (tmpl)."""
    import os

    from .conftest import REPO

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    rest = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([str(folder), str(REPO), *([rest] if rest else [])])}
