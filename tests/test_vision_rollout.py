"""Rollouts with images (issue 24, item 6): a prompt with an image, tools that return images.

A scripted backend plays the model: each completion is what the processor's own full render has
for that assistant turn. At every turn the request the engine gets is checked against
``processor.apply_chat_template(conversation so far, add_generation_prompt=True, tokenize=True,
return_dict=True)``: its token IDs, and the model inputs rebuilt from the image inputs it carries
(pixel values, grids, token types), array for array. The tools draw their images with PIL (a bar
chart, a page); the ground truth is given those images directly, never through tmpl's reading.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest

import tmpl
from tmpl.backends.scripted import Scripted
from tmpl.rollout import images as rollout_images
from tmpl.rollout.codes import EndCode
from tmpl.rollout.drift import rerender_drift
from tmpl.trajectory.images import has_images

from . import test_vision as tv
from .test_vision import assert_same_inputs, image

PIL = pytest.importorskip("PIL.Image")
ImageDraw = pytest.importorskip("PIL.ImageDraw")


def render_chart(values: list[int]) -> Any:
    """Render a bar chart of the values.

    Args:
        values: Bar heights, 1 to 5.
    """
    img = PIL.new("RGB", (40 * len(values) + 20, 130), "white")
    draw = ImageDraw.Draw(img)
    for k, v in enumerate(values):
        draw.rectangle([10 + 40 * k, 120 - 20 * v, 40 + 40 * k, 120], fill=(40, 90 + 30 * k, 200))
    return img


def screenshot(url: str) -> Any:
    """Take a screenshot of a page.

    Args:
        url: The page.
    """
    return [{"type": "text", "text": f"{url} as rendered:"}, image(90 + len(url), 64, seed=len(url))]


TOOLS = [render_chart, screenshot]
SCHEMAS = tmpl.Toolbox(TOOLS).schemas
#: Qwen2.5-VL's processor on the qwen3 tokenizer with llama.cpp's Qwen3.5-4B template, thinking off:
#: prefix-stable, and its tool calls parse (with the qwen2.5-instruct tokenizer, tests/test_vision.py's
#: first processor, tmpl's qwen3_xml parser does not read this template's calls: UNPROVEN there)
QWEN = "qwen2.5-vl/qwen3-tok/Qwen3.5-4B/no-thinking"
#: prefix-stable processors whose templates render images in tool results and whose calls parse
NAMES = [QWEN, "gemma-4/ollama-e2b"]


@cache
def setup(name: str) -> tuple[Any, Any, dict[str, Any]]:
    if name != QWEN:
        return tv.setup(name)
    processor = tv._qwen("Qwen2_5_VLProcessor", "qwen3", "templates/llama.cpp/Qwen3.5-4B.jinja")
    return (
        processor,
        tmpl.vision.VisionTemplate(processor, name=name, enable_thinking=False),
        {"enable_thinking": False},
    )


#: turn -> the calls of that assistant turn (none: the final answer)
PLAN: list[list[tuple[str, dict[str, Any]]]] = [
    [("render_chart", {"values": [3, 1, 4]})],
    [("screenshot", {"url": "a.io"}), ("render_chart", {"values": [2, 5]})],
    [],
]


def truth(name: str, messages: list[dict[str, Any]], gen: bool = True) -> dict[str, np.ndarray]:
    processor, _, kwargs = setup(name)
    out = processor.apply_chat_template(
        messages,
        tools=SCHEMAS,
        tokenize=True,
        return_dict=True,
        return_tensors="np",
        add_generation_prompt=gen,
        **kwargs,
    )
    return {k: np.asarray(v) for k, v in out.items()}


class Script:
    """The model of one conversation: turn t makes PLAN[t]'s calls; completions come from full renders."""

    def __init__(self, name: str, user_image: Any) -> None:
        self.name = name
        self.history: list[dict[str, Any]] = [
            {"role": "system", "content": "You read charts."},
            {
                "role": "user",
                "content": [{"type": "image", "image": user_image}, {"type": "text", "text": "Plot these numbers."}],
            },
        ]
        self.checked = 0

    def assistant(self, turn: int) -> dict[str, Any]:
        calls = PLAN[turn]
        if not calls:
            return {"role": "assistant", "content": "The bars are 3, 1, 4 and 2, 5."}
        return {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "id": f"c{turn}{k}", "function": {"name": fn, "arguments": args}}
                for k, (fn, args) in enumerate(calls)
            ],
        }

    def __call__(self, request: Any) -> list[int]:
        turn = int(request.request_id.split("-")[2])
        before = truth(self.name, self.history)
        ids = before["input_ids"][0].tolist()
        # the engine gets the processor's own render and, with it, the images of the whole prompt
        assert list(request.prompt_ids) == ids, f"turn {turn}: the prompt differs from the processor's render"
        assert request.images is not None
        assert_same_inputs(request.images.model_inputs(list(request.prompt_ids)), before, f"turn {turn}")
        self.checked += 1
        assistant = self.assistant(turn)
        alone = truth(self.name, self.history + [assistant], gen=False)["input_ids"][0].tolist()
        assert alone[: len(ids)] == ids
        _, vt, _ = setup(self.name)
        end = next(t for t in range(len(ids), len(alone)) if alone[t] in vt.stop_token_ids)
        self.history.append(assistant)
        for k, (fn, args) in enumerate(PLAN[turn]):  # what the tools return, as the ground truth's parts
            out = {"render_chart": render_chart, "screenshot": screenshot}[fn](**args)
            parts = [out] if fn == "render_chart" else out
            content = [p if isinstance(p, dict) else {"type": "image", "image": p} for p in parts]
            self.history.append({"role": "tool", "tool_call_id": f"c{turn}{k}", "name": fn, "content": content})
        return alone[len(ids) : end + 1]


def run(name: str, **kwargs: Any) -> tuple[list[tmpl.RolloutResult], list[Script], Any]:
    _, vt, _ = setup(name)
    scripts = [Script(name, image(60, 45, seed=1)), Script(name, image(33, 70, seed=2))]

    def policy(request: Any) -> list[int]:
        return scripts[int(request.request_id.split("-")[0])](request)

    rollout = tmpl.Rollout(vt, Scripted(policy), tools=TOOLS, max_turns=4, max_length=20000, progress=False, **kwargs)
    results = rollout.run([s.history[:2] for s in scripts])
    return results, scripts, rollout


@pytest.mark.parametrize("name", NAMES)
def test_rollout_with_tool_images_equals_the_processor_at_every_turn(name: str) -> None:
    results, scripts, rollout = run(name, verify_every=1, measure_drift=True)
    _, vt, _ = setup(name)
    for r, script in zip(results, scripts):
        assert script.checked == 3  # every turn's request checked against the processor
        assert r.code is EndCode.FINISHED and r.status is tmpl.Status.DONE, r.reason
        assert r.tool_calls == 3 and r.tool_failures == 0
        # the sequence and its image inputs: the processor's render of the whole conversation
        final = truth(name, script.history, gen=False)
        seq = r.prompt_ids.tolist() + r.completion_ids.tolist()
        assert seq == final["input_ids"][0].tolist()[: len(seq)]
        assert has_images(r.trajectory) and r.images.count == 1 + 3  # the user's, the chart, the page, the chart
        inputs = r.trajectory.model_inputs()
        for key in final:
            if key in ("input_ids", "attention_mask") or key in r.images.token_type_keys:
                assert np.array_equal(inputs[key][0], final[key][0][: len(seq)]), key
            else:
                assert np.array_equal(inputs[key], final[key]), key
        # tool images are suffix tokens: out of the loss mask (checked on the real mask)
        r.images.check_outside_loss(r.mask, offset=len(r.prompt_ids))
        suffix_spans = [s for s in r.spans if s.kind == "suffix"]
        for a, b in r.images.spans[1:]:
            assert any(len(r.prompt_ids) + s.start <= a and b <= len(r.prompt_ids) + s.end for s in suffix_spans)
        # the drift check re-rendered through the processor: no drift; a text-only re-render would
        # have reported one (the placeholders unexpanded): the images are what it checks
        assert r.drift is False and r.drift_detail is None
        text_drift, _ = rerender_drift(vt.chat, r.messages, seq, SCHEMAS)
        assert text_drift is True
    # and the tool messages kept for rewards carry the images as parts
    tool = [m for m in results[0].messages if m["role"] == "tool"]
    assert [type(p) is dict and p.get("type") for p in tool[0]["content"]] == ["image"]


def test_verify_compares_ids_and_images() -> None:
    name = NAMES[0]
    results, scripts, _ = run(name, verify_every=1)
    assert all(r.code is EndCode.FINISHED for r in results)
    _, vt, _ = setup(name)
    history = scripts[0].history
    before, tool_messages = history[:3], history[3:4]
    completion = truth(name, history[:3], gen=False)["input_ids"][0].tolist()
    start = len(truth(name, history[:2])["input_ids"][0])
    end = next(t for t in range(start, len(completion)) if completion[t] in vt.stop_token_ids)
    good = vt.suffix_ids(tool_messages, completion_ids=completion[start : end + 1], tools=SCHEMAS, history=before[:2])
    ids = rollout_images.ImageIds(good.ids, good.images)
    assert rollout_images.verify(vt, history[:4], SCHEMAS, ids)
    # negative controls: the same IDs with another image's pixels; one token changed
    chart = tool_messages[0]["content"][0]["image"]
    other = chart.copy()
    other.putpixel((5, 5), (0, 0, 0))
    swapped = vt.suffix_ids(
        [{**tool_messages[0], "content": [{"type": "image", "image": other}]}],
        completion_ids=completion[start : end + 1],
        tools=SCHEMAS,
        history=before[:2],
    )
    assert swapped.ids == good.ids
    assert not rollout_images.verify(vt, history[:4], SCHEMAS, rollout_images.ImageIds(swapped.ids, swapped.images))
    assert not rollout_images.verify(
        vt, history[:4], SCHEMAS, rollout_images.ImageIds(good.ids[:-1] + [0], good.images)
    )


def test_rollout_results_export_with_their_images(tmp_path: Any) -> None:
    name = NAMES[0]
    results, _, _ = run(name)
    path = tmpl.export.to_jsonl(results, tmp_path / "r.jsonl", inline_bytes=4096)
    assert any((tmp_path / "r.jsonl.images").iterdir())
    for r, back in zip(results, tmpl.export.from_jsonl(path)):
        assert_same_inputs(back.trajectory.model_inputs(), r.trajectory.model_inputs(), "export")
    batch = tmpl.trajectory.collate_arrays(results, pad_id=0)
    assert batch["num_images"].tolist() == [4, 4]


def test_tool_content_with_images() -> None:
    img = image(30, 30)
    assert rollout_images.image_content(img) == [{"type": "image", "image": img}]
    parts = rollout_images.image_content(["caption", img])
    assert parts == ["caption", {"type": "image", "image": img}]
    assert rollout_images.image_content({"answer": 3}) is None
    assert rollout_images.image_content([1, 2]) is None


def test_text_only_rollouts_send_no_images(tokenizer_of: Any) -> None:
    tpl = tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"))
    backend = Scripted(lambda req: tpl.codec.encode("Hi.") + sorted(tpl.stop_token_ids)[:1])
    rollout = tmpl.Rollout(tpl, backend, progress=False)
    (r,) = rollout.run([[{"role": "user", "content": "Hello"}]])
    assert rollout.vision is None and backend.requests[0].images is None
    assert r.images is None and not has_images(r.trajectory)


def test_stream_takes_the_same_path() -> None:
    name = QWEN
    _, vt, _ = setup(name)
    results, _, _ = run(name)
    scripts = [Script(name, image(60, 45, seed=1)), Script(name, image(33, 70, seed=2))]

    def policy(request: Any) -> list[int]:
        return scripts[int(request.request_id.split("-")[0])](request)

    rollout = tmpl.Rollout(vt, Scripted(policy), tools=TOOLS, max_turns=4, max_length=20000, progress=False)
    streamed = sorted(
        (r for group in rollout.stream_sync([s.history[:2] for s in scripts]) for r in group), key=lambda r: r.index
    )
    for a, b in zip(results, streamed):
        assert b.code is EndCode.FINISHED and scripts[b.index].checked == 3
        assert a.completion_ids.tolist() == b.completion_ids.tolist()
        assert_same_inputs(b.trajectory.model_inputs(), a.trajectory.model_inputs(), "stream")
