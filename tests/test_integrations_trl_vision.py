"""TRL's ``rollout_func`` with prompt images (issue 24, item 3): a real ``GRPOTrainer`` on the tiny VLM.

TRL 1.16's ``GRPOTrainer``, given a ``rollout_func``, keeps only ``prompt_ids``/``completion_ids``/
``logprobs`` from it and rebuilds the loss pass's image inputs itself: from the dataset's ``images``
column and ``processing_class(images=..., text=apply_chat_template(prompt, tools=trainer.tools,
**chat_template_kwargs), padding=True)``. tmpl's rollout_func renders image prompts through the
processor's ``VisionTemplate`` without tools and checks its ``prompt_ids`` equal that rebuild. Here the
trainer trains one step on CPU (the tiny Qwen2.5-VL of tests/fixture_vlm.py, processing_class = its
image-only processor, a dataset of two prompts whose images differ in size, so the prompts differ in
length); a forward pre-hook records what the model's loss pass received, and the test checks it
against tmpl's rollouts and against the processor's own render: the prompt part of every row is
tmpl's ``prompt_ids``, each image's ``<|image_pad|>`` run is as long as its ``image_grid_thw`` says,
``mm_token_type_ids`` marks exactly those runs, and the row's ``pixel_values`` are its own image's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from .fixture_vlm import TEMPLATE_KWARGS, TinyVLM, build_tiny_vlm, missing
from .trl_config import train_args

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
PIL = pytest.importorskip("PIL.Image")
if missing():
    pytest.skip(missing(), allow_module_level=True)

from tmpl.errors import TrainerConfigError  # noqa: E402
from tmpl.integrations.trl import make_rollout_func  # noqa: E402

MAX_NEW = 6
#: two prompts whose images differ in size (so their grids and prompt lengths differ) and text
SIZES = [(60, 90), (140, 100)]
QUESTIONS = ["What is on the screen?", "Describe this chart in one word, please."]


def image(w: int, h: int, seed: int = 0) -> Any:
    rng = np.random.default_rng(seed + 7919 * w + h)
    arr = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    arr[: h // 2, : w // 3] = (250, 20, 20)
    return PIL.fromarray(arr, "RGB")


def dataset(with_column: bool = True) -> Any:
    rows = []
    for (w, h), q in zip(SIZES, QUESTIONS):
        if with_column:  # TRL's shape: text prompts, images in their own column
            rows.append({"prompt": [{"role": "user", "content": q}], "images": [image(w, h)]})
        else:  # images written into the prompts only
            content = [{"type": "image", "image": image(w, h)}, {"type": "text", "text": q}]
            rows.append({"prompt": [{"role": "user", "content": content}], "other": 0})
    return datasets.Dataset.from_list(rows)


def args(tmp_path: Any, **overrides: Any) -> Any:
    settings = dict(
        per_device_train_batch_size=4,  # both prompts, two generations each, in one batch
        max_completion_length=MAX_NEW,
        max_steps=1,
        learning_rate=1e-3,
        chat_template_kwargs=dict(TEMPLATE_KWARGS),
    )
    return train_args(trl.GRPOConfig, tmp_path, **{**settings, **overrides})


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> TinyVLM:
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm-trl"))


def trainer_for(vlm: TinyVLM, tmp_path: Any, rollout_func: Any, ds: Any = None, **overrides: Any) -> Any:
    return trl.GRPOTrainer(
        model=vlm.model,
        args=args(tmp_path, **overrides),
        reward_funcs=lambda completions, **kw: [float(i % 2) for i in range(len(completions))],
        train_dataset=dataset() if ds is None else ds,
        processing_class=vlm.processor,
        rollout_func=rollout_func,
    )


@pytest.fixture(scope="module")
def run(vlm: TinyVLM, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One GRPO step; the loss pass's forward inputs and tmpl's rollouts."""
    vlm.processor.tokenizer.padding_side = "left"  # TRL pads prompt_ids on the left; see the refusal below
    phase = {"now": "setup"}
    rollouts: list[Any] = []
    forwards: list[dict[str, Any]] = []
    prompts_seen: list[Any] = []
    tmpl_func = make_rollout_func(max_turns=1, on_results=lambda results, metrics: rollouts.append(list(results)))

    def rollout_func(prompts: Any, trainer: Any) -> dict[str, Any]:
        prompts_seen.append(prompts)
        phase["now"] = "rollout"
        out = tmpl_func(prompts, trainer)
        phase["now"] = "loss"
        return out

    def hook(module: Any, a: Any, kwargs: dict[str, Any]) -> None:
        if phase["now"] == "loss":
            forwards.append({k: v.detach().clone() if torch.is_tensor(v) else v for k, v in kwargs.items()})

    trainer = trainer_for(vlm, tmp_path_factory.mktemp("grpo-vlm"), rollout_func)
    handle = vlm.model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        output = trainer.train()
    finally:
        handle.remove()
        vlm.processor.tokenizer.padding_side = "right"
    return {"rollouts": rollouts, "forwards": forwards, "prompts": prompts_seen, "output": output, "vlm": vlm}


def runs(ids: list[int], token: int) -> list[int]:
    """The lengths of the runs of ``token`` in ``ids``, in order."""
    out, n = [], 0
    for t in [*ids, None]:
        if t == token:
            n += 1
        elif n:
            out.append(n)
            n = 0
    return out


def test_grpo_step_ran_on_tmpl_prompt_ids_with_their_images(run: dict[str, Any]) -> None:
    vlm = run["vlm"]
    processor = vlm.processor
    pad_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    merge = processor.image_processor.merge_size**2
    assert len(run["rollouts"]) == 1 and len(run["rollouts"][0]) == 4
    results = run["rollouts"][0]
    assert np.isfinite(run["output"].training_loss)
    # the processor's own full render of each dataset prompt, as the ground truth of the prompt IDs
    truth = {}
    for (w, h), q in zip(SIZES, QUESTIONS):
        msgs = [{"role": "user", "content": [{"type": "image", "image": image(w, h)}, {"type": "text", "text": q}]}]
        r = processor.apply_chat_template(
            msgs, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt", **TEMPLATE_KWARGS
        )
        truth[q] = {k: v for k, v in r.items()}
    prompt_of = {}
    for r in results:
        q = next(q for q in QUESTIONS if q in processor.tokenizer.decode(r.prompt_ids.tolist()))
        assert r.prompt_ids.tolist() == truth[q]["input_ids"][0].tolist(), q
        prompt_of[tuple(r.prompt_ids.tolist())] = q
    assert len(set(prompt_of.values())) == 2
    assert len({len(r.prompt_ids) for r in results}) == 2, "the prompts should differ in length"

    assert run["forwards"], "the loss pass did not call the model"
    rows_checked = 0
    for f in run["forwards"]:
        ids, mask = f["input_ids"], f["attention_mask"]
        grid, pixels, mm = f["image_grid_thw"], f["pixel_values"], f["mm_token_type_ids"]
        assert grid.shape[0] == ids.shape[0]  # one image per row, in row order
        assert pixels.shape[0] == int(grid.prod(-1).sum())
        starts = np.cumsum([0] + grid.prod(-1).tolist())
        for b in range(ids.shape[0]):
            row = ids[b][mask[b].bool()].tolist()
            match = [r for r in results if row == r.prompt_ids.tolist() + r.completion_ids.tolist()]
            assert match, f"row {b} of the loss pass is no tmpl sequence"
            prompt = match[0].prompt_ids.tolist()
            q = prompt_of[tuple(prompt)]
            # the placeholder run is as long as the row's grid says, and mm_token_type_ids marks exactly it
            assert runs(ids[b].tolist(), pad_id) == [int(grid[b].prod()) // merge]
            assert mm[b].tolist() == (ids[b] == pad_id).long().tolist()
            # the grid and the pixels are the row's own image's, as the processor renders it
            assert grid[b].tolist() == truth[q]["image_grid_thw"][0].tolist()
            torch.testing.assert_close(pixels[starts[b] : starts[b + 1]], truth[q]["pixel_values"].to(pixels.dtype))
            rows_checked += 1
    assert rows_checked >= 4


def test_refuses_right_padding_with_prompts_of_different_lengths(vlm: TinyVLM, tmp_path: Any) -> None:
    """TRL pads prompt_ids on the left and its mm_token_type_ids with the processor: with the tokenizer's
    right padding (this processor's default) they would be shifted. Shown on the processor, then refused."""
    processor = vlm.processor
    assert processor.tokenizer.padding_side == "right"
    texts = [
        trl.data_utils.apply_chat_template(
            {"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}]},
            processor,
            **TEMPLATE_KWARGS,
        )["prompt"]
        for q in QUESTIONS
    ]
    batch = processor(images=[[image(*s)] for s in SIZES], text=texts, padding=True, return_tensors="pt")
    ids = [batch["input_ids"][b][batch["attention_mask"][b].bool()] for b in range(2)]
    width = max(len(x) for x in ids)
    left = torch.stack([torch.cat([x.new_zeros(width - len(x)), x]) for x in ids])
    pad_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert not torch.equal(batch["mm_token_type_ids"], (left == pad_id).long())  # shifted
    trainer = trainer_for(vlm, tmp_path, make_rollout_func(max_turns=1))
    with pytest.raises(TrainerConfigError, match="pads on the right"):
        trainer.train()


def test_refuses_image_prompts_with_tools(vlm: TinyVLM, tmp_path: Any) -> None:
    def lookup(query: str) -> str:
        """Look something up.

        Args:
            query: What to look up.
        """
        return query

    trainer = trainer_for(vlm, tmp_path, make_rollout_func(tools=[lookup], max_turns=2))
    with pytest.raises(TrainerConfigError, match=r"tools \(lookup\)"):
        trainer.train()


def test_refuses_images_outside_the_dataset_column(vlm: TinyVLM, tmp_path: Any) -> None:
    """Images written into the prompts only would reach TRL's loss pass as placeholders without pixels
    (TRL reads the 'images'/'image' column). Through the trainer, the dataset stores such images as
    encoded dicts, not TRL's PIL parts: refused; given PIL parts directly, the missing column is refused."""
    vlm.processor.tokenizer.padding_side = "left"
    try:
        func = make_rollout_func(max_turns=1)
        trainer = trainer_for(vlm, tmp_path, func, ds=dataset(with_column=False))
        with pytest.raises(TrainerConfigError, match=r"prompt 0, message 0 holds an image part that is not TRL's"):
            trainer.train()
        content = [{"type": "image", "image": image(*SIZES[0])}, {"type": "text", "text": QUESTIONS[0]}]
        with pytest.raises(TrainerConfigError, match=r"dataset's columns are \['prompt', 'other'\]"):
            func([[{"role": "user", "content": content}]] * 2, trainer)
    finally:
        vlm.processor.tokenizer.padding_side = "right"


def test_refuses_a_prompt_whose_trl_render_differs(vlm: TinyVLM, tmp_path: Any) -> None:
    """tmpl rendering with another template than the processor's (thinking on) is caught by the rebuild
    check, naming the prompt, before TRL's loss pass pairs its image inputs with the IDs."""
    vlm.processor.tokenizer.padding_side = "left"
    try:
        func = make_rollout_func(max_turns=1, template=vlm.chat_template.replace("enable_thinking", "think_off"))
        trainer = trainer_for(vlm, tmp_path, func)
        with pytest.raises(TrainerConfigError, match=r"prompt 0: tmpl's prompt_ids \(\d+ tokens\) differ"):
            trainer.train()
    finally:
        vlm.processor.tokenizer.padding_side = "right"


SHOT = image(200, 120, 3)  # what the screenshot tool returns


def screenshot(url: str) -> Any:
    """Take a screenshot of a page.

    Args:
        url: The page.
    """
    return SHOT


def test_refuses_a_tool_that_returns_an_image(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Text prompts with tools are TRL's usual rollout_func path; a tool returning an image is refused after
    the rollout, naming the sample and message: TRL takes no images from a rollout_func (its loss pass gets
    tool images only from its own tool loop). The first turn is the template's own tool-call turn
    (scripted: the random model calls no tools), on the fixture with the qwen3 tokenizer."""
    import tmpl
    from tmpl.backends import Backend, GenerationResult

    if missing("qwen3"):
        pytest.skip(missing("qwen3"))
    vlm3 = build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm-trl-qwen3"), "qwen3")
    processor = vlm3.processor
    schemas = tmpl.Toolbox([screenshot]).schemas
    prompt = [{"role": "user", "content": "Look at a.io"}]
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "id": "c0", "function": {"name": "screenshot", "arguments": {"url": "a.io"}}}
        ],
    }

    def render(messages: list[dict], gen: bool) -> list[int]:
        out = processor.apply_chat_template(
            messages, tools=schemas, add_generation_prompt=gen, tokenize=True, return_dict=True, **TEMPLATE_KWARGS
        )
        return list(out["input_ids"][0] if isinstance(out["input_ids"][0], list) else out["input_ids"])

    first, full = render(prompt, True), render(prompt + [call], False)
    end_id = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    call_ids = full[len(first) : full.index(end_id, len(first)) + 1]
    answer = processor.tokenizer.encode("ok", add_special_tokens=False) + [end_id]

    class Scripted(Backend):
        threaded = False

        def generate_batch(self, requests: Any) -> Any:
            return [
                GenerationResult(r.request_id, ids, [0.0] * len(ids), "stop")
                for r in requests
                for ids in [call_ids if len(r.prompt_ids) == len(first) else answer]
            ]

    ds = datasets.Dataset.from_list([{"prompt": prompt}])
    trainer = trl.GRPOTrainer(
        model=vlm3.model,
        args=args(tmp_path_factory.mktemp("grpo-vlm-tools"), per_device_train_batch_size=2, max_completion_length=4096),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        train_dataset=ds,
        processing_class=processor,
    )
    func = make_rollout_func(tools=[screenshot], max_turns=2, backend=Scripted())
    with pytest.raises(TrainerConfigError, match=r"sample 0, message 2: the tool 'screenshot' returned an image"):
        func([prompt, prompt], trainer)


def test_server_mode_with_image_prompts_is_refused(vlm: TinyVLM, tmp_path: Any) -> None:
    """TRL's vLLM server mode: tmpl's client backend does not send images (TRL's client takes them as
    `features`), so image prompts are refused before any rollout, and a request with images given to the
    client backend fails alone without reaching the client."""
    from types import SimpleNamespace

    from tmpl.backends import GenerationRequest
    from tmpl.integrations.trl import VLLMClientBackend
    from tmpl.vision import VisionTemplate

    trainer = trainer_for(vlm, tmp_path, make_rollout_func(max_turns=1))
    trainer.use_vllm, trainer.vllm_generation = True, SimpleNamespace(mode="server")
    content = [{"type": "image", "image": image(*SIZES[0])}, {"type": "text", "text": QUESTIONS[0]}]
    with pytest.raises(TrainerConfigError, match=r"vllm_mode=\.\.\.\): 'server' with prompts holding images"):
        make_rollout_func(max_turns=1)([[{"role": "user", "content": content}]] * 2, trainer)

    calls: list[Any] = []
    client = SimpleNamespace(generate=lambda **kw: calls.append(kw))
    vids = VisionTemplate(vlm.processor, **TEMPLATE_KWARGS).prompt([{"role": "user", "content": content}])
    req = GenerationRequest("r0", vids.ids, 4, frozenset({151645}), images=vids.images)
    [result] = VLLMClientBackend(client).generate_batch([req])
    assert result.finish_reason == "error" and "holds images" in (result.error or "") and not calls
