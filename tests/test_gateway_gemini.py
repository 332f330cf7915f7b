"""The Gemini API (``generateContent``, ``streamGenerateContent``, ``countTokens``, the model GET) through
the gateway: the real ``google-genai`` SDK (streamed and not, function calling by hand, thought parts
sent back) and Gemini CLI 0.61.0's own request body (tests/data/gemini_cli_request.json, recorded from
``gemini -p`` against a recording server), on the Qwen2.5, Llama 3.2 and Qwen3 tokenizers over a
Scripted backend.

Every prompt is checked against the engine's IDs and ``apply_chat_template`` of the raw request body
converted by the documented mapping (tests/mapping_gemini.py, written apart from tmpl's code); an
episode whose client sends its contents back is one sequence with every sampled ID kept. Errors come in
Gemini's shape.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

import tmpl
from tmpl.backends import Scripted
from tmpl.gateway import Gateway, create_app
from tmpl.gateway.dialects import gemini

from .conftest import load_tokenizer
from .gateway_util import full_render_ids, served
from .mapping_gemini import gemini_messages
from .scripted_calls import CALLS, Policy

genai = pytest.importorskip("google.genai", reason="google-genai is not installed (pip install -e '.[test]')")
httpx = pytest.importorskip("httpx", reason="httpx is not installed (pip install -e '.[test]')")
pytest.importorskip("fastapi", reason="FastAPI is not installed (pip install -e '.[gateway]')")
types = genai.types

GEMINI_CLI = Path(__file__).parent / "data" / "gemini_cli_request.json"

SCRIPT = [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Lima"})]


@pytest.fixture
def setup(monkeypatch):
    """A gateway per family, and every raw Gemini body as it arrived."""
    bodies: list[dict] = []
    real = gemini.parse

    def keep(body, **kwargs):
        if not kwargs.get("count"):
            bodies.append(copy.deepcopy(body))
        return real(body, **kwargs)

    monkeypatch.setattr(gemini, "parse", keep)

    def make(family: str, script=SCRIPT):
        tok = load_tokenizer(family)
        tpl = tmpl.ChatTemplate(tok, enable_thinking=True) if family == "qwen3" else tmpl.ChatTemplate(tok)
        policy = Policy(tok, family, script)
        backend = Scripted(policy)
        return Gateway(tpl, backend, max_context=65_536), backend, policy

    return make, bodies


def check_calls(gateway, backend, policy, key: str, bodies: list[dict]) -> None:
    episode = gateway.episode(key)
    calls = episode.calls
    assert len(calls) == len(bodies) >= 2
    engine = {r.request_id: list(r.prompt_ids) for r in backend.requests}
    for k, (call, body) in enumerate(zip(calls, bodies)):
        prompt = call.prompt_ids.tolist()
        assert prompt == engine[call.id]
        assert call.completion_ids.tolist() == policy.sampled[call.id]
        messages, tools = gemini_messages(body)
        assert prompt == full_render_ids(gateway.tpl.tokenizer, messages, tools), f"call {k}: not the full render"
    assert episode.num_sequences == 1, [str(s.branch) for s in episode.sequences]
    for before, after in zip(calls, calls[1:]):
        kept = before.prompt_ids.tolist() + before.completion_ids.tolist()
        assert after.prompt_ids.tolist()[: len(kept)] == kept
    assert int(episode.sequences[0].mask.sum()) == sum(len(c.completion_ids) for c in calls)


WEATHER = types.FunctionDeclaration(
    name="get_weather",
    description="The weather in a city.",
    parameters=types.Schema(
        type=types.Type.OBJECT, properties={"city": types.Schema(type=types.Type.STRING)}, required=["city"]
    ),
)


@pytest.mark.parametrize("family", list(CALLS))
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_google_genai_sdk_function_calling(setup, family, stream):
    make, bodies = setup
    gateway, backend, policy = make(family)
    config = types.GenerateContentConfig(
        system_instruction="Be brief.",
        tools=[types.Tool(function_declarations=[WEATHER]), types.Tool(google_search=types.GoogleSearch())],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        temperature=0.7,
        top_p=0.9,
        max_output_tokens=200,
        thinking_config=types.ThinkingConfig(include_thoughts=True),
    )
    with served(create_app(gateway)) as url:
        client = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=f"{url}/s/gm"))
        contents: list = [types.Content(role="user", parts=[types.Part(text="Weather in Paris and Lima?")])]
        thoughts: list[str] = []
        for _ in range(5):
            if stream:
                chunks = list(client.models.generate_content_stream(model="gemini-x", contents=contents, config=config))
                parts = [p for c in chunks for p in c.candidates[0].content.parts]
                finish = chunks[-1].candidates[0].finish_reason
                content = types.Content(role="model", parts=parts)
            else:
                reply = client.models.generate_content(model="gemini-x", contents=contents, config=config)
                content, finish = reply.candidates[0].content, reply.candidates[0].finish_reason
            assert finish == types.FinishReason.STOP
            thoughts += [p.text for p in content.parts if p.thought]
            if stream:  # sent back as Gemini CLI does: thought parts dropped, signatures kept
                content = types.Content(role="model", parts=[p for p in content.parts if not p.thought])
            contents.append(content)
            calls = [p.function_call for p in content.parts if p.function_call]
            if not calls:
                break
            results = [
                types.Part(function_response=types.FunctionResponse(id=c.id, name=c.name, response={"output": f"RESULT-{c.args['city']}"}))
                for c in calls
            ]  # fmt: skip
            contents.append(types.Content(role="user", parts=results))
        counted = client.models.count_tokens(model="gemini-x", contents=contents)
        record = httpx.get(f"{url}/s/gm/episode").json()
        beta = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=f"{url}/s/gm", api_version="v1beta"))
        described = beta.models.get(model="gemini-x")  # Gemini's model resource (v1's route is OpenAI's)
    assert "".join(p.text for p in contents[-1].parts if p.text and not p.thought) == "All done."
    if family == "qwen3":  # thought parts went out and came back, or only their signatures did
        assert thoughts == ["Step 0.", "Step 1.", "Step 2."]
        assert all(any(p.thought_signature for p in c.parts) for c in contents[1::2])
    else:
        assert thoughts == []
    k = next(k for k, t in enumerate(bodies[0]["tools"]) if "googleSearch" in t)
    assert record["notes"] == [
        f"tools[{k}].googleSearch: a hosted tool, left out of the prompt (the gateway runs no hosted tools)"
    ]
    assert described.name == "models/gemini-x" and "generateContent" in described.supported_actions
    assert bodies[0]["generationConfig"]["temperature"] == 0.7
    assert [r.sampling.temperature for r in backend.requests] == [0.7] * len(bodies)
    # countTokens: the template's render of the contents (with the generation prompt), counted apart
    messages, tools = gemini_messages(
        {"contents": [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in contents]}
    )  # the SDK's countTokens sends no system instruction or tools
    assert counted.total_tokens == len(full_render_ids(gateway.tpl.tokenizer, messages, tools))
    check_calls(gateway, backend, policy, "gm", bodies)


def _sse(text: str) -> list[dict]:
    return [json.loads(block[6:]) for block in text.replace("\r\n", "\n").split("\n\n") if block.startswith("data: ")]


@pytest.mark.parametrize("family", list(CALLS))
def test_gemini_cli_request_body(setup, family):
    """Gemini CLI 0.61.0's first request as it sent it (``:streamGenerateContent?alt=sse``, a system
    instruction, 16 function declarations in ``parametersJsonSchema``, thinkingConfig): served; then its
    next request (the model content and a functionResponse appended) as the JSON-array stream, continuing
    the sampled IDs; then the non-streamed route."""
    make, bodies = setup
    gateway, backend, policy = make(family, script=[("list_directory", {"dir_path": "."})])
    body = json.loads(GEMINI_CLI.read_text())
    path = "/s/gcli/v1beta/models/gemini-2.5-flash"
    with served(create_app(gateway)) as url:
        first = httpx.post(f"{url}{path}:streamGenerateContent", params={"alt": "sse"}, json=body, timeout=60)
        assert first.status_code == 200, first.text
        assert first.headers["content-type"].startswith("text/event-stream")
        chunks = _sse(first.text)
        parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]]
        call = next(p["functionCall"] for p in parts if "functionCall" in p)
        assert call["name"] == "list_directory" and call["args"] == {"dir_path": "."}
        assert chunks[-1]["usageMetadata"]["promptTokenCount"] == len(backend.requests[0].prompt_ids)
        nxt = copy.deepcopy(body)
        nxt["contents"] += [
            {"role": "model", "parts": [p for p in parts if not p.get("thought")]},  # as Gemini CLI keeps it
            {"role": "user", "parts": [{"functionResponse": {"id": call["id"], "name": call["name"],
                                                             "response": {"output": "RESULT-a.txt"}}}]},
        ]  # fmt: skip
        second = httpx.post(f"{url}{path}:streamGenerateContent", json=nxt, timeout=60)
        assert second.status_code == 200 and second.headers["content-type"].startswith("application/json")
        array = second.json()  # the JSON-array stream, read whole
        assert array[-1]["candidates"][0]["finishReason"] == "STOP"
        assert array[-1]["tmpl"]["prompt"] == "append"
        text = "".join(
            p.get("text", "") for c in array for p in c["candidates"][0]["content"]["parts"] if not p.get("thought")
        )
        assert text == "All done."
        third = httpx.post(f"{url}/s/gcli-2/v1beta/models/g:generateContent", json=nxt, timeout=60).json()
        assert third["candidates"][0]["content"]["role"] == "model"
    assert third["tmpl"]["prompt"] == "render"  # a new session: its history rendered, tokens counted
    check_calls(gateway, backend, policy, "gcli", bodies[:2])
    messages, tools = gemini_messages(body)
    assert len(tools) == 16 and messages[0]["role"] == "system"


def test_errors_in_gemini_shape(setup):
    make, _ = setup
    gateway, backend, _ = make("qwen2.5-instruct")
    path = "/s/gerr/v1beta/models/g"
    with served(create_app(gateway)) as url:
        client = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=f"{url}/s/gerr"))
        with pytest.raises(genai.errors.ClientError) as err:
            client.models.generate_content(
                model="g", contents="Hi", config=types.GenerateContentConfig(response_mime_type="application/json")
            )
        assert err.value.code == 400 and err.value.status == "INVALID_ARGUMENT"
        assert "responseMimeType" in err.value.message
        missing = httpx.post(f"{url}{path}:generateContent", json={"contents": []})
        unknown = httpx.post(f"{url}{path}:embedContent", json={"contents": [{"parts": [{"text": "x"}]}]})
        image = httpx.post(
            f"{url}{path}:generateContent",
            json={"contents": [{"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": ""}}]}]},
        )
        broken = httpx.post(f"{url}{path}:generateContent", content=b"{", headers={"content-type": "application/json"})
    assert missing.status_code == 400 and missing.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert set(missing.json()["error"]) == {"code", "message", "status"}
    assert unknown.status_code == 404 and unknown.json()["error"]["status"] == "NOT_FOUND"
    assert image.status_code == 400 and "inlineData" in image.json()["error"]["message"]
    assert broken.status_code == 400 and broken.json()["error"]["code"] == 400
    assert backend.requests == []


def test_candidates_and_stop_sequences(setup):
    """candidateCount is n (each candidate a recorded call of the prompt), stopSequences cut the text
    (the string left out), toolConfig ANY is taken as AUTO, the parameters as the engine got them."""
    make, bodies = setup
    gateway, backend, policy = make("qwen2.5-instruct", script=[])
    body = {
        "contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY"}},
        "generationConfig": {"candidateCount": 2, "stopSequences": [" done"], "seed": 7, "maxOutputTokens": 9},
    }
    with served(create_app(gateway)) as url:
        reply = httpx.post(f"{url}/s/gn/v1beta/models/g:generateContent", json=body, timeout=60).json()
    assert [(c["index"], c["content"]["parts"], c["finishReason"]) for c in reply["candidates"]] == [
        (0, [{"text": "All"}], "STOP"),
        (1, [{"text": "All"}], "STOP"),
    ]
    assert [(r.sampling.seed, r.max_tokens) for r in backend.requests] == [(7, 9), (8, 9)]  # a seed per candidate
    calls = gateway.episode("gn").calls
    assert len(calls) == 2 and calls[0].prompt_ids.tolist() == calls[1].prompt_ids.tolist()
    messages, tools = gemini_messages(bodies[0])
    assert calls[0].prompt_ids.tolist() == full_render_ids(gateway.tpl.tokenizer, messages, tools)
