"""OpenAI Responses through the gateway as Codex CLI speaks it: ``namespace`` tools flattened and their
calls mapped back, ``custom`` (freeform) tools and ``custom_tool_call`` items, hosted tools left out
and noted, reasoning items whose ``encrypted_content`` brings the exact reasoning back, ``developer``
messages; the real ``openai`` SDK (streamed and not) and Codex CLI 0.171.0's own request body
(tests/data/codex_request.json, recorded from ``codex exec`` against a recording server), on the
Qwen2.5, Llama 3.2 and Qwen3 tokenizers over a Scripted backend.

Every prompt is checked against the engine's IDs and ``apply_chat_template`` of the raw request body
converted by the documented mapping (tests/mapping_responses.py, written apart from tmpl's code); an
episode whose client sends its items back (reasoning text dropped, as Codex does) is one sequence with
every sampled ID kept.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

import tmpl
from tmpl.backends import Scripted
from tmpl.gateway import Gateway, create_app
from tmpl.gateway.dialects import responses

from .conftest import load_tokenizer
from .gateway_util import full_render_ids, served
from .mapping_responses import responses_messages
from .scripted_calls import CALLS, Policy

openai = pytest.importorskip("openai", reason="the openai SDK is not installed (pip install -e '.[test]')")
httpx = pytest.importorskip("httpx", reason="httpx is not installed (pip install -e '.[test]')")
pytest.importorskip("fastapi", reason="FastAPI is not installed (pip install -e '.[gateway]')")

CODEX = Path(__file__).parent / "data" / "codex_request.json"

#: how each family's model writes a call, and an answer (Qwen3 thinks first)
PATCH = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"
#: the calls an episode makes, one per turn (rendered names), then the answer
SCRIPT = [
    ("get_weather", {"city": "Paris"}),
    ("weather__forecast", {"city": "Lima", "days": 2}),
    ("apply_patch", {"input": PATCH}),
]
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
    {
        "type": "namespace",
        "name": "weather",
        "description": "Forecasts.",
        "tools": [
            {
                "type": "function",
                "name": "forecast",
                "description": "The forecast for a city.",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                    "required": ["city"],
                },
            }
        ],
    },
    {
        "type": "custom",
        "name": "apply_patch",
        "description": "Apply a patch to files.",
        "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" /(.|\\n)+/'},
    },
    {"type": "web_search"},
]


@pytest.fixture
def setup(monkeypatch):
    """A gateway per family, and every raw Responses body as it arrived."""
    bodies: list[dict] = []
    real = responses.parse

    def keep(body):
        bodies.append(copy.deepcopy(body))
        return real(body)

    monkeypatch.setattr(responses, "parse", keep)

    def make(family: str, script=SCRIPT):
        tok = load_tokenizer(family)
        tpl = tmpl.ChatTemplate(tok, enable_thinking=True) if family == "qwen3" else tmpl.ChatTemplate(tok)
        policy = Policy(tok, family, script)
        backend = Scripted(policy)
        return Gateway(tpl, backend, max_context=65_536), backend, policy

    return make, bodies


def check_calls(gateway, backend, policy, key: str, bodies: list[dict]) -> None:
    """Each call: the engine's prompt, the full render of the raw body by the mapping; one sequence."""
    episode = gateway.episode(key)
    calls = episode.calls
    assert len(calls) == len(bodies)
    engine = {r.request_id: list(r.prompt_ids) for r in backend.requests}
    tok = gateway.tpl.tokenizer
    for k, (call, body) in enumerate(zip(calls, bodies)):
        prompt = call.prompt_ids.tolist()
        assert prompt == engine[call.id]
        assert call.completion_ids.tolist() == policy.sampled[call.id]
        messages, tools = responses_messages(body)
        assert prompt == full_render_ids(tok, messages, tools), f"call {k}: not the full render of the request"
    assert episode.num_sequences == 1, [str(s.branch) for s in episode.sequences]
    for before, after in zip(calls, calls[1:]):
        kept = before.prompt_ids.tolist() + before.completion_ids.tolist()
        assert after.prompt_ids.tolist()[: len(kept)] == kept
    assert int(episode.sequences[0].mask.sum()) == sum(len(c.completion_ids) for c in calls)


def codex_style(item: dict) -> dict:
    """An output item as Codex keeps it for its next request: reasoning without its text (the opaque
    ``encrypted_content`` and the summary only), no item ids, no status."""
    out = {k: v for k, v in item.items() if k not in ("id", "status")}
    if out["type"] == "reasoning":
        out.pop("content", None)
    return out


@pytest.mark.parametrize("family", list(CALLS))
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_openai_sdk_namespace_custom_and_hosted_tools(setup, family, stream):
    make, bodies = setup
    gateway, backend, policy = make(family)
    with served(create_app(gateway)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/cx/v1", api_key="unused", max_retries=0)
        items: list = [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You code."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather, then a patch."}]},
        ]
        seen = []
        for _ in range(6):
            kwargs = dict(
                model="m", input=items, tools=TOOLS, include=["reasoning.encrypted_content"], store=False,
                reasoning={"summary": "auto"}, parallel_tool_calls=True, prompt_cache_key="k1",
            )  # fmt: skip
            if stream:
                with client.responses.stream(**kwargs) as events:
                    kinds = [e.type for e in events]
                    reply = events.get_final_response()
                assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
            else:
                reply = client.responses.create(**kwargs)
            out = [o.model_dump(exclude_none=True, by_alias=True) for o in reply.output]
            seen += out
            items += [codex_style(o) for o in out]
            calls = [o for o in out if o["type"] in ("function_call", "custom_tool_call")]
            if not calls:
                break
            for c in calls:
                kind = "function_call_output" if c["type"] == "function_call" else "custom_tool_call_output"
                items.append({"type": kind, "call_id": c["call_id"], "output": f"RESULT-{len(bodies)}"})
        record = httpx.get(f"{url}/s/cx/episode").json()
    assert reply.output_text == "All done."
    made = [o for o in seen if o["type"] in ("function_call", "custom_tool_call")]
    assert [(o["type"], o.get("namespace"), o["name"]) for o in made] == [
        ("function_call", None, "get_weather"),
        ("function_call", "weather", "forecast"),
        ("custom_tool_call", None, "apply_patch"),
    ]
    assert json.loads(made[1]["arguments"]) == {"city": "Lima", "days": 2}
    assert made[2]["input"] == PATCH
    if family == "qwen3":  # reasoning went out with the gateway's reference and came back without its text
        reasoning = [o for o in seen if o["type"] == "reasoning"]
        assert len(reasoning) == 4 and all(o["encrypted_content"].startswith("tmpl1.") for o in reasoning)
        assert all(o["summary"][0]["text"] == f"Step {k}." for k, o in enumerate(reasoning))
    assert record["notes"] == [
        "tools[3]: the hosted tool 'web_search' is left out of the prompt (the gateway runs no hosted tools)"
    ]
    prompt = gateway.tpl.tokenizer.decode(gateway.episode("cx").calls[0].prompt_ids.tolist())
    assert "weather__forecast" in prompt and "web_search" not in prompt
    check_calls(gateway, backend, policy, "cx", bodies)


def _sse(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in text.split("\n\n"):
        lines = [ln for ln in block.splitlines() if not ln.startswith(":")]
        event = next((ln[7:] for ln in lines if ln.startswith("event: ")), None)
        data = next((ln[6:] for ln in lines if ln.startswith("data: ")), None)
        if event and data:
            out.append((event, json.loads(data)))
    return out


@pytest.mark.parametrize("family", list(CALLS))
def test_codex_cli_request_body(setup, family):
    """Codex CLI 0.171.0's first request as it sent it (streamed; developer messages; 8 function tools, a
    namespace, web_search): served, then its next request (the call and its output appended, the
    reasoning sent back without its text) continues the sampled IDs."""
    make, bodies = setup
    gateway, backend, policy = make(family, script=[("exec_command", {"cmd": "ls"})])
    body = json.loads(CODEX.read_text())
    with served(create_app(gateway)) as url:
        first = httpx.post(f"{url}/s/codex/v1/responses", json=body, timeout=60)
        assert first.status_code == 200, first.text
        events = _sse(first.text)
        assert events[0][0] == "response.created" and events[-1][0] == "response.completed"
        done = [d["item"] for e, d in events if e == "response.output_item.done"]
        assert [(i["type"], i.get("name")) for i in done if i["type"] != "reasoning"] == [
            ("function_call", "exec_command")
        ]
        nxt = copy.deepcopy(body)
        nxt["input"] += [codex_style(i) for i in done]
        nxt["input"].append({"type": "function_call_output", "call_id": done[-1]["call_id"], "output": "RESULT-a.txt"})
        second = httpx.post(f"{url}/s/codex/v1/responses", json=nxt, timeout=60)
        assert second.status_code == 200, second.text
        final = _sse(second.text)[-1][1]["response"]
        record = httpx.get(f"{url}/s/codex/episode").json()
    assert final["output"][-1]["content"][0]["text"] == "All done."
    assert final["tmpl"]["prompt"] == "append"  # the suffix after the reply's own IDs
    assert record["notes"] == [
        "tools[8]: the hosted tool 'web_search' is left out of the prompt (the gateway runs no hosted tools)"
    ]
    prompt = gateway.tpl.tokenizer.decode(gateway.episode("codex").calls[0].prompt_ids.tolist())
    assert "multi_agent_v1__spawn_agent" in prompt and "You are a coding agent running in the Codex CLI" in prompt
    # the developer messages are the system turn: no default system prompt before them (Qwen2.5's "You are Qwen")
    assert "You are Qwen" not in prompt and "developer" not in prompt.split("You are a coding agent")[0]
    check_calls(gateway, backend, policy, "codex", bodies)


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"tool_choice": {"type": "function", "name": "get_weather"}}, "tool_choice"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "text"),
        ({"tools": [{"type": "namespace", "tools": []}]}, "tools"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
        ({"input": [{"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": 3}]}, "input"),
    ],
)
def test_refusals_in_openai_shape(setup, change, param):
    make, _ = setup
    gateway, backend, _ = make("qwen2.5-instruct")
    with served(create_app(gateway)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/bad/v1", api_key="unused", max_retries=0)
        kwargs = {"model": "m", "input": "Hi", **change}
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(**kwargs)
    assert err.value.status_code == 400
    assert err.value.body["param"] == param and err.value.body["type"] == "invalid_request_error"
    assert backend.requests == []


def test_every_request_field_is_in_the_table():
    """Each field of the SDK's ResponseCreateParams (and Codex's client_metadata) has a row in FIELDS and in
    docs/gateway.md's table: a field the API adds fails here until it is read, ignored or refused."""
    from openai.types.responses.response_create_params import ResponseCreateParamsBase

    fields = set(ResponseCreateParamsBase.__annotations__) | {"stream", "client_metadata"}
    assert fields <= set(responses.FIELDS), sorted(fields - set(responses.FIELDS))
    docs = (Path(__file__).parent.parent / "docs" / "gateway.md").read_text()
    table = docs[
        docs.index("### OpenAI Responses request fields") : docs.index("Input items (tests/mapping_responses.py")
    ]
    assert [f for f in sorted(fields) if f"`{f}`" not in table] == []
