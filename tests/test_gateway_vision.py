"""Images through the gateway (issue 50): a :class:`tmpl.vision.VisionTemplate` served to real SDK clients.

The processor is Qwen2.5-VL's (transformers' own class, its PIL image processor) on the qwen3 tokenizer
with llama.cpp's Qwen3.5-4B template (tests/test_vision_rollout.py's ``QWEN``): it renders images in user
turns and in tool results, and tmpl reads its calls. A scripted backend plays the model; each completion
is the tail of the processor's own render of the conversation with that assistant turn.

Ground truth is ``processor.apply_chat_template(..., tokenize=True, return_dict=True)`` of the raw
request's messages, written here from each API's documented shape, the images given to it as PIL images
decoded by Pillow from the bytes the client sent (never through tmpl's reading): its ``input_ids`` must be
the engine request's prompt, its ``pixel_values`` and ``image_grid_thw`` what the request's image inputs
rebuild. A text template answers every dialect's image with a 400 in that API's error shape.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
import pytest

from tmpl.backends import Scripted
from tmpl.episode.records import from_record as episode_from_record
from tmpl.gateway import Gateway, create_app
from tmpl.trajectory.images import from_record

from .gateway_util import served
from .test_vision import assert_same_inputs, image
from .test_vision_rollout import QWEN, setup

anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is not installed (pip install -e '.[test]')")
openai = pytest.importorskip("openai", reason="the openai SDK is not installed (pip install -e '.[test]')")
httpx = pytest.importorskip("httpx", reason="httpx is not installed (pip install -e '.[test]')")
PIL = pytest.importorskip("PIL.Image")
pytest.importorskip("fastapi", reason="FastAPI is not installed (pip install -e '.[gateway]')")

SCHEMA = {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}
#: the tool as the template renders it (OpenAI's function shape: what every dialect's tools map to)
TOOLS = [{"type": "function", "function": {"name": "screenshot", "description": "Shoot a page", "parameters": SCHEMA}}]
SYSTEM = "You read pages."
ASK = "What is on this page?"


def png(img: Any) -> str:
    """An image as base64 PNG text (what a client sends)."""
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def decoded(b64: str) -> Any:
    """The image a client's base64 holds, read by Pillow directly."""
    out = PIL.open(io.BytesIO(base64.b64decode(b64)))
    out.load()
    return out


def truth(messages: list[dict[str, Any]], gen: bool = True) -> dict[str, np.ndarray]:
    processor, _, kwargs = setup(QWEN)
    out = processor.apply_chat_template(
        messages, tools=TOOLS, tokenize=True, return_dict=True, return_tensors="np", add_generation_prompt=gen, **kwargs
    )
    return {k: np.asarray(v) for k, v in out.items()}


class Model:
    """Scripted: answers with ``self.next`` (an assistant message), its IDs read off the processor's render of
    ``self.history`` plus it; keeps every engine request."""

    def __init__(self) -> None:
        self.history: list[dict[str, Any]] = []
        self.next: dict[str, Any] = {"role": "assistant", "content": "A red page."}
        self.requests: list[Any] = []
        self.sampled: list[list[int]] = []

    def __call__(self, request: Any) -> list[int]:
        self.requests.append(request)
        _, vt, _ = setup(QWEN)
        ids = truth(self.history)["input_ids"][0].tolist()
        alone = truth(self.history + [self.next], gen=False)["input_ids"][0].tolist()
        assert alone[: len(ids)] == ids
        end = next(t for t in range(len(ids), len(alone)) if alone[t] in vt.stop_token_ids)
        self.sampled.append(alone[len(ids) : end + 1])
        return self.sampled[-1]


def vision_gateway(model: Model) -> Gateway:
    _, vt, _ = setup(QWEN)
    return Gateway(vt, Scripted(model), max_tokens=256, temperature=0.0)


def check_request(request: Any, expected: dict[str, np.ndarray], where: str) -> None:
    """The engine request is the processor's render, with the images of its whole prompt."""
    assert list(request.prompt_ids) == expected["input_ids"][0].tolist(), f"{where}: prompt"
    assert request.images is not None and request.image_sources is not None
    assert len(request.image_sources) == request.images.count
    rebuilt = request.images.model_inputs(list(request.prompt_ids))
    assert_same_inputs(rebuilt, expected, where)


def test_anthropic_sdk_images_in_a_user_turn_and_a_tool_result() -> None:
    """Claude Code's shape: an image in the first user turn, then a tool_result holding text and an image.
    The second call continues the first's prompt and sampled IDs (an append), and the drained episode is
    one sequence whose images rebuild the processor's full render, sampled tokens its only loss tokens."""
    page, shot = png(image(60, 45, seed=1)), png(image(90, 64, seed=2))
    model = Model()
    gateway = vision_gateway(model)
    user = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": page}},
        {"type": "text", "text": ASK},
    ]
    tools = [{"name": "screenshot", "description": "Shoot a page", "input_schema": SCHEMA}]
    raw_user = {"role": "user", "content": [{"type": "image", "image": decoded(page)}, {"type": "text", "text": ASK}]}
    model.history = [{"role": "system", "content": SYSTEM}, raw_user]
    call = {"id": "toolu_1", "type": "function", "function": {"name": "screenshot", "arguments": {"url": "a.io"}}}
    model.next = {"role": "assistant", "content": "", "tool_calls": [call]}
    with served(create_app(gateway)) as base:
        client = anthropic.Anthropic(base_url=f"{base}/s/ep1", api_key="none", max_retries=0)
        first = client.messages.create(
            model="m", max_tokens=64, system=SYSTEM, tools=tools, messages=[{"role": "user", "content": user}]
        )
        check_request(model.requests[0], truth(model.history), "call 1")
        # count_tokens: the processor's own count of the same request (each image's placeholder run expanded)
        counted = client.messages.count_tokens(
            model="m", system=SYSTEM, tools=tools, messages=[{"role": "user", "content": user}]
        )
        assert counted.input_tokens == truth(model.history)["input_ids"].shape[1]
        assert len(model.requests) == 1  # a count calls no engine
        use = next(b for b in first.content if b.type == "tool_use")
        assert (use.name, use.input) == ("screenshot", {"url": "a.io"})
        result = [
            {"type": "text", "text": "a.io as rendered:"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": shot}},
        ]
        model.history += [
            {**model.next, "tool_calls": [{**call, "id": use.id}]},
            {
                "role": "tool",
                "tool_call_id": use.id,
                "content": [{"type": "text", "text": "a.io as rendered:"}, {"type": "image", "image": decoded(shot)}],
            },
        ]
        model.next = {"role": "assistant", "content": "A red page."}
        second = client.messages.create(
            model="m",
            max_tokens=64,
            system=SYSTEM,
            tools=tools,
            messages=[
                {"role": "user", "content": user},
                {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": result}]},
            ],
        )
        assert second.content[0].text == "A red page."
        expected = truth(model.history)
        check_request(model.requests[1], expected, "call 2")
        assert second.model_extra["tmpl"]["prompt"] == "append"
        one, two = model.requests
        head = list(one.prompt_ids) + model.sampled[0]
        assert list(two.prompt_ids[: len(head)]) == head  # the first call's prompt and sampled IDs, unchanged
        assert httpx.post(f"{base}/s/ep1/finish", timeout=30).status_code == 200
        (drained,) = httpx.get(f"{base}/episodes/drain", timeout=30).json()["episodes"]
    (seq,) = episode_from_record(drained["record"]).sequences  # what a trainer in another process reads
    assert len(drained["images"]) == 1
    ids = seq.ids.tolist()
    assert ids[: len(two.prompt_ids)] == list(two.prompt_ids)
    mask = seq.mask.tolist()
    first_sampled = len(one.prompt_ids)
    n1 = len(head) - first_sampled
    ones = [k for k, m in enumerate(mask) if m]
    assert ones == list(range(first_sampled, first_sampled + n1)) + list(range(len(two.prompt_ids), len(ids)))
    images = from_record(drained["images"][0])
    assert images.count == 2
    images.check_outside_loss(mask)
    assert_same_inputs(images.model_inputs(ids[: len(two.prompt_ids)]), expected, "drained episode")


def test_openai_chat_responses_and_gemini_images_equal_the_processor() -> None:
    """An image in a user turn in the three other dialects: OpenAI Chat Completions' ``image_url`` (the
    openai SDK), the Responses API's ``input_image`` (the openai SDK), Gemini's ``inlineData`` (its REST
    body): each engine request is the processor's render of the same conversation, images included."""
    b64 = png(image(48, 40, seed=3))
    url = f"data:image/png;base64,{b64}"
    model = Model()
    model.history = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [{"type": "image", "image": decoded(b64)}, {"type": "text", "text": ASK}]},
    ]
    expected = truth(model.history)
    fn = TOOLS[0]["function"]
    with served(create_app(vision_gateway(model))) as base:
        chat = openai.OpenAI(base_url=f"{base}/s/chat/v1", api_key="none", max_retries=0)
        reply = chat.chat.completions.create(
            model="m",
            max_tokens=64,
            tools=TOOLS,
            messages=[
                {"role": "system", "content": SYSTEM},
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": ASK}],
                },
            ],
        )
        assert reply.choices[0].message.content == "A red page."
        check_request(model.requests[-1], expected, "chat completions")
        responses = openai.OpenAI(base_url=f"{base}/s/responses/v1", api_key="none", max_retries=0)
        out = responses.responses.create(
            model="m",
            instructions=SYSTEM,
            tools=[{"type": "function", **fn}],
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "image_url": url, "detail": "auto"},
                        {"type": "input_text", "text": ASK},
                    ],
                }
            ],
        )
        assert out.output_text == "A red page."
        check_request(model.requests[-1], expected, "responses")
        body = {
            "systemInstruction": {"parts": [{"text": SYSTEM}]},
            "contents": [
                {"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": b64}}, {"text": ASK}]}
            ],
            "tools": [
                {
                    "functionDeclarations": [
                        {**{k: fn[k] for k in ("name", "description")}, "parametersJsonSchema": SCHEMA}
                    ]
                }
            ],
        }
        got = httpx.post(f"{base}/s/gemini/v1beta/models/m:generateContent", json=body, timeout=60)
        assert got.status_code == 200, got.text
        assert got.json()["candidates"][0]["content"]["parts"][-1]["text"] == "A red page."
        check_request(model.requests[-1], expected, "gemini")
        got = httpx.post(f"{base}/v1beta/models/m:countTokens", json=body, timeout=60)
        assert got.status_code == 200, got.text
        assert got.json() == {"totalTokens": expected["input_ids"].shape[1]}  # the processor's count, images expanded
    assert len(model.requests) == 3


def test_a_text_template_answers_each_dialects_image_with_a_400_naming_it() -> None:
    """The same images to a gateway on a text template (the VL template's own text side): a 400 in each
    API's error shape, naming the image's block as the client wrote it; the engine never called."""
    _, vt, _ = setup(QWEN)
    model = Model()
    b64 = png(image(20, 20, seed=4))
    url = f"data:image/png;base64,{b64}"
    with served(create_app(Gateway(vt.chat, Scripted(model)))) as base:
        client = anthropic.Anthropic(base_url=f"{base}/s/a", api_key="none", max_retries=0)
        result = [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}]
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(
                model="m",
                max_tokens=8,
                messages=[
                    {"role": "user", "content": "Shoot a.io"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": result}]},
                ],
            )
        error = caught.value.body["error"]
        assert error["type"] == "invalid_request_error"
        assert "messages[2].content[0].content[0] (an image)" in error["message"]
        assert "renders no images" in error["message"]
        chat = openai.OpenAI(base_url=f"{base}/s/c/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.BadRequestError) as bad:
            chat.chat.completions.create(
                model="m",
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": ASK}, {"type": "image_url", "image_url": {"url": url}}],
                    }
                ],
            )
        assert "messages[0].content[1] (an image)" in bad.value.body["message"]
        assert "renders no images" in bad.value.body["message"]
        with pytest.raises(openai.BadRequestError) as bad:
            chat.responses.create(
                model="m", input=[{"role": "user", "content": [{"type": "input_image", "image_url": url}]}]
            )
        assert "input[0].content[0] (an image)" in bad.value.body["message"]
        body = {
            "contents": [
                {"role": "user", "parts": [{"text": ASK}, {"inlineData": {"mimeType": "image/png", "data": b64}}]}
            ]
        }
        got = httpx.post(f"{base}/s/g/v1beta/models/m:generateContent", json=body, timeout=30)
        assert got.status_code == 400
        assert got.json()["error"]["status"] == "INVALID_ARGUMENT"
        assert "contents[0].parts[1] (an image)" in got.json()["error"]["message"]
        got = httpx.post(f"{base}/v1beta/models/m:countTokens", json=body, timeout=30)  # a count: the same 400
        assert got.status_code == 400 and "contents[0].parts[1] (an image)" in got.json()["error"]["message"]
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.count_tokens(model="m", messages=[{"role": "user", "content": result}])
        assert "messages[0].content[0] (an image)" in caught.value.body["error"]["message"]
    assert model.requests == []


def test_images_the_gateway_does_not_read() -> None:
    """A URL image (the gateway fetches none) is a 400 naming its block, on a vision template too; a vision
    template with the durable store is refused when the gateway is made (the store keeps no images)."""
    model = Model()
    with served(create_app(vision_gateway(model))) as base:
        client = anthropic.Anthropic(base_url=f"{base}/s/u", api_key="none", max_retries=0)
        source = {"type": "url", "url": "https://example.com/cat.png"}
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(
                model="m", max_tokens=8, messages=[{"role": "user", "content": [{"type": "image", "source": source}]}]
            )
        assert "messages[0].content[0]: the image's URL 'https://example.com/cat.png' is not read" in str(
            caught.value.body["error"]["message"]
        )
    assert model.requests == []
    _, vt, _ = setup(QWEN)
    with pytest.raises(ValueError, match="the durable store keeps no images"):
        Gateway(vt, Scripted(model), store=":memory:")
