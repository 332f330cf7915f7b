"""Images in prompts and tool results (tmpl.vision), against the processors' own full renders.

Ground truth is always ``processor.apply_chat_template(..., tokenize=True, return_dict=True)`` of
the whole conversation, with the images passed to it as PIL images (never through tmpl's reading).
Processors are transformers' own classes with their PIL image processors (torchvision does not load
here) and real tokenizers from TMPL_TEST_DATA; the chat templates are the real VL templates of the
catalog (../shared/tokenizers/templates/catalog.json). What cannot be checked here is listed in
docs/vision.md as UNPROVEN, and the tests below assert the reason (the template refuses or drops it).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tmpl
from tmpl.errors import ImageInputError, ImagePlaceholderError, TemplateError, TrajectoryError

from .conftest import DATA

PIL = pytest.importorskip("PIL.Image")
transformers = pytest.importorskip("transformers")

from tmpl.vision import ImageInputs, VisionTemplate, image_only_processor, placeholder_runs  # noqa: E402

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


@cache
def _tokenizer(folder: str) -> Any:
    path = DATA / folder
    if not path.is_dir():
        pytest.skip(f"tokenizer {folder!r} not in TMPL_TEST_DATA={DATA}")
    # not conftest's shared one: Gemma4Processor adds <|video|> to its tokenizer (the same for all of them)
    return transformers.AutoTokenizer.from_pretrained(str(path))


def _template(rel: str) -> str:
    path = DATA / rel
    if not path.is_file():
        pytest.skip(f"template {rel!r} not in TMPL_TEST_DATA={DATA}")
    return path.read_text(encoding="utf-8")


def _qwen(processor_class: str, folder: str, template: str, **image_kwargs: Any) -> Any:
    return image_only_processor(
        getattr(transformers, processor_class),
        transformers.Qwen2VLImageProcessorPil(**image_kwargs),
        _tokenizer(folder),
        _template(template),
    )


def _gemma4(template: str) -> Any:
    return image_only_processor(
        transformers.Gemma4Processor,
        transformers.Gemma4ImageProcessorPil(),
        _tokenizer("gemma-4-it"),
        _template(template),
    )


def _gemma3() -> Any:
    tok = _tokenizer("gemma-3-it")
    return transformers.Gemma3Processor(transformers.Gemma3ImageProcessorPil(), tok, chat_template=tok.chat_template)


#: name -> (processor builder, template kwargs). Qwen3-VL's image processor: patch 16, merge 2.
PROCESSORS: dict[str, tuple[Callable[[], Any], dict[str, Any]]] = {
    "qwen2.5-vl/qwen2.5-tok/Qwen3.5-4B": (
        lambda: _qwen("Qwen2_5_VLProcessor", "qwen2.5-instruct", "templates/llama.cpp/Qwen3.5-4B.jinja"),
        {"enable_thinking": False},
    ),
    "qwen2.5-vl/qwen3-tok/Qwen3.5-4B/thinking": (
        lambda: _qwen("Qwen2_5_VLProcessor", "qwen3", "templates/llama.cpp/Qwen3.5-4B.jinja"),
        {},
    ),
    "qwen3-vl/qwen3-tok/ollama-qwen38": (
        lambda: _qwen("Qwen3VLProcessor", "qwen3", "templates/ollama/qwen38_chat_template.jinja", patch_size=16),
        {},
    ),
    "gemma-4/gemma-4-it": (lambda: _gemma4("gemma-4-it/chat_template.jinja"), {}),
    "gemma-4/llama.cpp-31B-it": (lambda: _gemma4("templates/llama.cpp/google-gemma-4-31B-it.jinja"), {}),
    "gemma-4/ollama-31b": (lambda: _gemma4("templates/ollama/gemma4_31b_chat_template.jinja"), {}),
    "gemma-4/ollama-e2b": (lambda: _gemma4("templates/ollama/gemma4_e2b_chat_template.jinja"), {}),
    "gemma-4/onnxruntime": (lambda: _gemma4("templates/onnxruntime-extensions/google-gemma-4.jinja"), {}),
    "gemma-3/gemma-3-it": (_gemma3, {}),
}
#: Those whose templates render images in tool results (read off the templates: the Qwen ones and
#: ollama's Gemma 4 ones render the image parts of a tool message; Google's Gemma 4 template and its
#: copies keep only its text parts; Gemma 3's raises on the 'tool' role).
DROPS_TOOL_IMAGES = ["gemma-4/gemma-4-it", "gemma-4/llama.cpp-31B-it", "gemma-4/onnxruntime"]
TOOL_IMAGES = [k for k in PROCESSORS if k.startswith("qwen") or k in ("gemma-4/ollama-31b", "gemma-4/ollama-e2b")]

SIZES = [(28, 28), (100, 80), (333, 517), (1024, 96), (1100, 960)]  # the last is downscaled (Qwen: over 1003520 px)


@cache
def setup(name: str) -> tuple[Any, VisionTemplate, dict[str, Any]]:
    build, kwargs = PROCESSORS[name]
    processor = build()
    return processor, VisionTemplate(processor, name=name, **kwargs), kwargs


def image(w: int, h: int, seed: int = 0) -> Any:
    """A deterministic image with structure (so resizing and patches are not trivial)."""
    rng = np.random.default_rng(seed + 7919 * w + h)
    arr = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    arr[: h // 2, : w // 3] = (250, 20, 20)
    return PIL.fromarray(arr, "RGB")


def processor_render(processor: Any, messages: list[dict], kwargs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    out = processor.apply_chat_template(
        messages, tools=TOOLS, tokenize=True, return_dict=True, return_tensors="np", **kwargs, **extra
    )
    return {k: np.asarray(v) for k, v in out.items()}


def conversation(user_img: Any, tool_imgs: list[Any]) -> tuple[list[dict], dict, list[dict]]:
    history = [
        {"role": "system", "content": "You read screenshots."},
        {
            "role": "user",
            "content": [{"type": "image", "image": user_img}, {"type": "text", "text": "Is it the same?"}],
        },
    ]
    calls = [
        {"type": "function", "id": f"call{i}", "function": {"name": "screenshot", "arguments": {"url": f"u{i}"}}}
        for i in range(len(tool_imgs))
    ]
    assistant = {"role": "assistant", "content": "", "tool_calls": calls}
    results = [
        {
            "role": "tool",
            "name": "screenshot",
            "tool_call_id": f"call{i}",
            "content": [{"type": "text", "text": f"page u{i}:"}, {"type": "image", "image": img}],
        }
        for i, img in enumerate(tool_imgs)
    ]
    return history, assistant, results


def assert_same_inputs(rebuilt: dict[str, np.ndarray], truth: dict[str, np.ndarray], where: str) -> None:
    assert set(rebuilt) == set(truth), (where, sorted(rebuilt), sorted(truth))
    for k in truth:
        assert rebuilt[k].shape == truth[k].shape, (where, k, rebuilt[k].shape, truth[k].shape)
        assert np.array_equal(rebuilt[k], truth[k]), (where, k)


def check_tool_turn(
    name: str,
    user_img: Any,
    tool_imgs: list[Any],
    tool_results: list[dict] | None = None,
    contents: list[list[Any]] | None = None,
) -> None:
    """prompt + completion + suffix == the processor's full render, and the carriers rebuild its outputs.

    ``tool_results``: what tmpl is given instead (other image shapes of the same pixels);
    ``contents``: other contents of the tool messages, for the full render and tmpl alike.
    """
    processor, vt, kwargs = setup(name)
    history, assistant, results = conversation(user_img, tool_imgs)
    for message, content in zip(results, contents or []):
        message["content"] = content
    full = processor_render(processor, history + [assistant] + results, kwargs, add_generation_prompt=True)
    full_ids = full["input_ids"][0].tolist()
    prompt = vt.prompt(history, tools=TOOLS)
    start = next((i for i, (a, b) in enumerate(zip(prompt.ids, full_ids)) if a != b), len(prompt.ids))
    stops = vt.stop_token_ids
    end = next(i for i in range(start, len(full_ids)) if full_ids[i] in stops)
    completion = full_ids[start : end + 1]
    suffix = vt.suffix_ids(
        tool_results if tool_results is not None else results, completion_ids=completion, tools=TOOLS, history=history
    )
    assert suffix.ids == full_ids[end + 1 :], f"{name}: suffix differs from the processor's full render"
    assert suffix.images.count == sum(1 for m in results for part in m["content"] if part.get("type") == "image")
    # a truncated completion (no stop token): the template's close first, then the same suffix
    cut = vt.suffix_ids(results, completion_ids=completion[:-1], tools=TOOLS, history=history)
    extra = len(cut.ids) - len(suffix.ids)
    assert extra > 0 and cut.ids[extra:] == suffix.ids
    assert cut.images.spans == suffix.images.shifted(extra).spans
    if start == len(prompt.ids):  # prefix-stable: the whole sequence, and the carriers, rebuild the render
        assert prompt.ids + completion + suffix.ids == full_ids
        carrier = ImageInputs.concat([prompt.images, suffix.images.shifted(end + 1)])
        assert_same_inputs(carrier.model_inputs(full_ids), full, name)
        traj = tmpl.Trajectory(prompt.ids, max_length=len(full_ids) + 8)
        traj.add_completion(completion, [0.0] * len(completion))
        traj.add_suffix(suffix.ids)
        assert traj.prompt_ids.tolist() + traj.completion_ids.tolist() == full_ids
        carrier.check_outside_loss(traj.mask, offset=traj.prompt_length)
        # negative control: a placeholder put in the loss is caught
        bad = traj.mask.copy()
        bad[carrier.spans[-1][0] - traj.prompt_length] = 1
        with pytest.raises(TrajectoryError, match="in the loss mask"):
            carrier.check_outside_loss(bad, offset=traj.prompt_length)
    else:  # the template re-renders the assistant turn (thinking): the suffix is the render's tail,
        # and the carriers still hold exactly the full render's image arrays
        carrier = ImageInputs.concat([prompt.images, suffix.images.shifted(end + 1)])
        arrays = {k: v for k, v in full.items() if k not in ("input_ids", "attention_mask", *carrier.token_type_keys)}
        assert_same_inputs(dict(carrier.arrays), arrays, name)
        assert len(placeholder_runs(full_ids, vt.image_token_id)) == carrier.count == 1 + suffix.images.count


# -- prompts (images in user messages) --------------------------------------------------------


@pytest.mark.parametrize("size", SIZES[:3], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", list(PROCESSORS))
def test_prompt_with_images_equals_processor_render(name: str, size: tuple[int, int]) -> None:
    processor, vt, kwargs = setup(name)
    history, _, _ = conversation(image(*size), [])
    history.append({"role": "assistant", "content": "Let me look."})
    history.append(
        {
            "role": "user",
            "content": [{"type": "image", "image": image(64, 40, 1)}, {"type": "text", "text": "and this"}],
        }
    )
    truth = processor_render(processor, history, kwargs, add_generation_prompt=True)
    prompt = vt.prompt(history, tools=TOOLS)
    assert prompt.ids == truth["input_ids"][0].tolist()
    assert prompt.images.count == 2
    assert_same_inputs(prompt.images.model_inputs(prompt.ids), truth, name)


# -- tool results with images -----------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", TOOL_IMAGES)
def test_tool_image_suffix_equals_processor_render(name: str, size: tuple[int, int]) -> None:
    check_tool_turn(name, image(60, 90), [image(*size, seed=2)])


@pytest.mark.parametrize("name", TOOL_IMAGES)
def test_parallel_tool_results_with_images(name: str) -> None:
    check_tool_turn(name, image(56, 56), [image(200, 120, 3), image(90, 300, 4)])


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    w=st.integers(min_value=1, max_value=900),
    h=st.integers(min_value=1, max_value=900),
    name=st.sampled_from(TOOL_IMAGES),
)
def test_tool_image_sizes_hypothesis(w: int, h: int, name: str) -> None:
    # at least 28 px a side (below, Qwen2-VL's smart_resize refuses the image); aspect ratios stay
    # under its limit of 200
    check_tool_turn(name, image(40, 40), [image(max(w, 28), max(h, 28), seed=5)])


@pytest.mark.parametrize("name", TOOL_IMAGES)
def test_adjacent_images_in_one_tool_result(name: str) -> None:
    """Two images back to back (no text between) stay two placeholder runs, as the processor renders them."""
    a, b = image(120, 64, 6), image(64, 120, 7)
    content = [{"type": "image", "image": a}, {"type": "image", "image": b}, {"type": "text", "text": "two"}]
    check_tool_turn(name, image(40, 40), [a, b][:1], contents=[content])


def _png(img: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def test_every_image_source_shape_gives_the_render(tmp_path: Any) -> None:
    """Paths, file:// and data: URLs, OpenAI image_url parts, bare PIL parts, bytes: all read to the
    same pixels as the PIL image given to the processor's full render."""
    name = TOOL_IMAGES[0]
    img = image(150, 110, 9)
    path = tmp_path / "shot.png"
    path.write_bytes(_png(img))
    data_url = "data:image/png;base64," + base64.b64encode(_png(img)).decode()
    shapes = [
        {"type": "image", "image": str(path)},
        {"type": "image", "path": str(path)},
        {"type": "image", "url": f"file://{path}"},
        {"type": "image", "image": data_url},
        {"type": "image", "base64": base64.b64encode(_png(img)).decode()},
        {"type": "image_url", "image_url": {"url": data_url}},
        {"type": "image", "image": _png(img)},
        img,
    ]
    for shape in shapes:
        results = [
            {
                "role": "tool",
                "name": "screenshot",
                "tool_call_id": "call0",
                "content": [{"type": "text", "text": "page u0:"}, shape],
            }
        ]
        check_tool_turn(name, image(40, 40), [img], tool_results=results)


# -- what the templates refuse: said, never passed silently ------------------------------------


@pytest.mark.parametrize("name", DROPS_TOOL_IMAGES)
def test_template_that_drops_tool_images_is_refused(name: str) -> None:
    processor, vt, kwargs = setup(name)
    history, assistant, results = conversation(image(50, 50), [image(70, 70, 1)])
    # the template itself drops the image: the processor's own full render refuses the images
    with pytest.raises(ValueError, match="number of"):
        processor_render(processor, history + [assistant] + results, kwargs, add_generation_prompt=True)
    prompt = vt.prompt(history, tools=TOOLS)
    with pytest.raises(ImagePlaceholderError, match=r"tool_messages\[0\]\.content\[1\]") as caught:
        vt.suffix_ids(
            results, completion_ids=prompt.ids[-1:] + [next(iter(vt.stop_token_ids))], tools=TOOLS, history=history
        )
    assert caught.value.parts == ("tool_messages[0].content[1]",)


def test_gemma3_tool_messages_are_refused_by_its_template() -> None:
    processor, vt, kwargs = setup("gemma-3/gemma-3-it")
    history, assistant, results = conversation(image(50, 50), [image(70, 70, 1)])
    with pytest.raises(Exception, match="alternate"):
        processor_render(processor, history + [assistant] + results, kwargs, add_generation_prompt=True)
    with pytest.raises(TemplateError):
        vt.suffix_ids(results, completion_ids=[1], tools=TOOLS, history=history)


# -- inputs that cannot be read, named -----------------------------------------------------------


@pytest.mark.parametrize(
    ("part", "match"),
    [
        ({"type": "image", "image": "/nonexistent/shot.png"}, "no such file"),
        ({"type": "image", "url": "https://example.com/x.png"}, "remote URL"),
        ({"type": "image", "image": "data:image/png;base64,@@@"}, "invalid base64"),
        ({"type": "image", "image": b"not an image"}, "not a readable image"),
        ({"type": "image"}, "no image"),
        ({"type": "image", "image": 3}, "not int"),
    ],
)
def test_unreadable_image_parts_are_named(part: dict, match: str) -> None:
    _, vt, _ = setup(TOOL_IMAGES[0])
    results = [
        {"role": "tool", "name": "screenshot", "content": "ok"},
        {"role": "tool", "name": "screenshot", "content": [{"type": "text", "text": "x"}, part]},
    ]
    with pytest.raises(ImageInputError, match=match) as caught:
        vt.suffix_ids(results, completion_ids=[1], tools=TOOLS)
    assert caught.value.index == 1 and caught.value.part == "tool_messages[1].content[1]"


def test_carrier_rejects_misaligned_ids() -> None:
    name = TOOL_IMAGES[0]
    _, vt, _ = setup(name)
    history, _, _ = conversation(image(60, 60), [])
    prompt = vt.prompt(history, tools=TOOLS)
    ((a, b),) = prompt.images.spans
    assert placeholder_runs(prompt.ids, vt.image_token_id) == [(a, b)]
    with pytest.raises(TrajectoryError, match="image placeholders"):
        prompt.images.model_inputs(prompt.ids[: a + 1] + prompt.ids[b:])  # one placeholder instead of b - a


def test_doctests() -> None:
    import doctest

    import tmpl.vision
    import tmpl.vision.inputs
    import tmpl.vision.parts

    for mod in (tmpl.vision, tmpl.vision.inputs, tmpl.vision.parts):
        result = doctest.testmod(mod)
        assert result.attempted > 0 and result.failed == 0, mod.__name__
