"""The Anthropic Messages dialect as Claude Code and the ``anthropic`` SDK send it (issue: Claude Code
2.1.197 stopped on ``messages[1].role must be 'user' or 'assistant'``), and instruction turns a template
has no place for (``developer``, a ``system`` turn mid-conversation).

Every prompt is checked against the template's own render (``apply_chat_template``) of the raw request,
converted by the documented mapping (tests/mapping_anthropic.py, written from docs/gateway.md). The
Claude Code body is a real one (tests/data/claude_code_request.json: recorded from
``@anthropic-ai/claude-code@2.1.197 -p "create hello.txt"`` against a recording server; its second
call, after a Bash tool call).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tmpl
from tmpl.backends import Scripted
from tmpl.gateway import Gateway, create_app

from .conftest import load_tokenizer
from .gateway_util import full_render_ids, served
from .mapping_anthropic import anthropic_messages

anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is not installed (pip install -e '.[test]')")
httpx = pytest.importorskip("httpx", reason="httpx is not installed (pip install -e '.[test]')")
pytest.importorskip("fastapi", reason="FastAPI is not installed (pip install -e '.[gateway]')")

CLAUDE_CODE = json.loads((Path(__file__).parent / "data" / "claude_code_request.json").read_text())
#: each family's text answer, then a call to Bash as its model writes one
FAMILIES = {
    "qwen2.5-instruct": ("Done.<|im_end|>", '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>'),
    "qwen3": ("<think>\nok\n</think>\n\nDone.<|im_end|>", '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>'),
    "llama-3.2-instruct": ("Done.<|eot_id|>", '{"name": "Bash", "parameters": {"command": "ls"}}<|eot_id|>'),
    "gemma-2-it": ("Done.<end_of_turn>", None),
    "mistral-nemo-instruct-2407": ("Done.</s>", None),
    "gpt-oss": ("<|channel|>final<|message|>Done.<|return|>", None),  # one call only: a reply re-renders otherwise
}  # fmt: skip


class Policy:
    """Scripted: a Bash call when the user asked for one ("call a tool") and no result ("a.txt") is in
    the prompt yet, else the answer."""

    def __init__(self, tok, family: str) -> None:
        self.tok = tok
        self.answer, self.call = FAMILIES[family]

    def __call__(self, req):
        text = self.tok.decode(list(req.prompt_ids))
        out = self.call if self.call and "call a tool" in text and "a.txt" not in text else self.answer
        return self.tok.encode(out, add_special_tokens=False)


def setup(family: str):
    tok = load_tokenizer(family)
    tpl = tmpl.ChatTemplate(tok, enable_thinking=True) if family == "qwen3" else tmpl.ChatTemplate(tok)
    backend = Scripted(Policy(tok, family))
    return Gateway(tpl, backend, max_tokens=64, max_context=200_000), backend, tok


def prompts(backend) -> list[list[int]]:
    return [list(r.prompt_ids) for r in backend.requests]


def sse(text: str) -> list[tuple[str, dict]]:
    out = []
    for chunk in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines() if ": " in line)
        if "event" in lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


# -- Claude Code's request, raw -------------------------------------------------------------------
@pytest.mark.parametrize("family", ["qwen2.5-instruct", "llama-3.2-instruct", "qwen3"])
def test_claude_codes_request_is_the_templates_full_render(family):
    """The recorded body (system blocks, a system turn at messages[1], 24 tools, metadata, adaptive
    thinking, context_management, output_config) at Claude Code's URL with ``?beta=true``: answered,
    streamed and not, its prompt the template's render of the mapping, the system turn in place."""
    gateway, backend, tok = setup(family)
    body = json.loads(json.dumps(CLAUDE_CODE))
    assert body["messages"][1]["role"] == "system" and len(body["tools"]) == 24
    with served(create_app(gateway)) as url, httpx.Client(base_url=url, timeout=60) as http:
        plain = http.post("/s/cc/v1/messages?beta=true", json={**body, "stream": False})
        streamed = http.post("/s/cc2/v1/messages?beta=true", json=body)
    assert plain.status_code == 200, plain.text
    assert streamed.status_code == 200, streamed.text
    reply = plain.json()
    assert reply["content"][-1]["text"].strip() == "Done." and reply["stop_reason"] == "end_turn"
    assert reply["tmpl"]["roles"] == {"leading_system": "system", "system_turns": "rendered"}
    events = sse(streamed.text)
    assert [e for e, _ in events][0] == "message_start" and events[-1][0] == "message_stop"
    expected = full_render_ids(tok, *anthropic_messages(body))
    assert prompts(backend) == [expected, expected]
    agents = body["messages"][1]["content"]
    text = tok.decode(expected)
    assert text.index("create hello.txt") < text.index(agents) < text.index("echo hello > hello.txt")


# -- the SDK: an episode with a mid-conversation system turn, thinking blocks sent back, server tools
SERVER_TOOLS = [
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
    {"type": "bash_20250124", "name": "bash"},
    {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
]
BASH = {
    "name": "Bash",
    "description": "Run a shell command.",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    "cache_control": {"type": "ephemeral"},
}


@pytest.mark.parametrize("family", ["qwen2.5-instruct", "llama-3.2-instruct", "qwen3"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_sdk_episode_with_system_turns_thinking_and_server_tools(family, stream):
    gateway, backend, tok = setup(family)
    system = [{"type": "text", "text": "You code.", "cache_control": {"type": "ephemeral"}}]
    messages: list[dict] = [
        {"role": "user", "content": [{"type": "text", "text": "Please "}, {"type": "text", "text": "call a tool"}]},
        {"role": "system", "content": "Skills: none."},
    ]
    extra = {
        "metadata": {"user_id": "u1"},
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "top_k": 40,
        "service_tier": "auto",
    }
    bodies = []
    with served(create_app(gateway)) as url:
        client = anthropic.Anthropic(base_url=f"{url}/s/sdk", api_key="unused", max_retries=0)
        for turn in range(2):
            kwargs = dict(model="claude-x", max_tokens=64, system=system, messages=messages,
                          tools=[BASH, *SERVER_TOOLS], extra_body=extra)  # fmt: skip
            bodies.append(json.loads(json.dumps({k: v for k, v in kwargs.items() if k != "extra_body"})))
            if stream:
                with client.beta.messages.stream(**kwargs, betas=["mid-conversation-system-2026-04-07"]) as events:
                    reply = events.get_final_message()
            else:
                reply = client.messages.with_raw_response.create(**kwargs)
                raw = json.loads(reply.http_response.text)
                assert {n.split(":")[0] for n in raw["tmpl"]["left_out"]} == {"tools[1]", "tools[2]", "tools[3]"}
                reply = reply.parse()
            blocks = [b.model_dump(exclude_none=True) for b in reply.content]
            if turn == 1:
                assert reply.stop_reason == "end_turn" and blocks[-1]["text"].strip() == "Done."
                break
            assert reply.stop_reason == "tool_use", blocks
            use = next(b for b in blocks if b["type"] == "tool_use")
            # sent back as Claude Code does: a redacted thinking block, cache_control on the last block
            sent_back = [{"type": "redacted_thinking", "data": "c2VjcmV0"}, *blocks]
            messages += [
                {"role": "assistant", "content": sent_back},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": use["id"],
                            "content": "a.txt",
                            "cache_control": {"type": "ephemeral"},
                        }
                    ],
                },  # fmt: skip
            ]
    engine = prompts(backend)
    assert len(engine) == 2
    for k, body in enumerate(bodies):
        assert engine[k] == full_render_ids(tok, *anthropic_messages(body)), f"call {k}: not the full render"
    episode = gateway.episode("sdk")
    assert episode.num_sequences == 1, [str(s.branch) for s in episode.sequences]
    assert "Skills: none." in tok.decode(engine[1]) and "web_search" not in tok.decode(engine[1])


# -- the fallback: templates without a system turn mid-conversation ----------------------------------
@pytest.mark.parametrize(("family", "leading"), [("gemma-2-it", "folded"), ("mistral-nemo-instruct-2407", "system")])
def test_system_turns_are_folded_where_the_template_refuses_them(family, leading):
    """Claude Code's first call (user blocks, then the system turn; its tools left out: these templates
    take none here) and a later system turn after an answer: folded as documented, said in ``tmpl.roles``."""
    gateway, backend, tok = setup(family)
    first = {k: v for k, v in CLAUDE_CODE.items() if k != "tools"}
    first["messages"] = CLAUDE_CODE["messages"][:2]
    first["stream"] = False
    with served(create_app(gateway)) as url, httpx.Client(base_url=url, timeout=60) as http:
        one = http.post("/s/fold/v1/messages?beta=true", json=first)
        assert one.status_code == 200, one.text
        assert one.json()["tmpl"]["roles"] == {"leading_system": leading, "system_turns": "folded"}
        second = json.loads(json.dumps(first))
        second["messages"] += [
            {"role": "assistant", "content": one.json()["content"]},
            {"role": "system", "content": "The user is away."},
            {"role": "user", "content": "Go on."},
        ]
        two = http.post("/s/fold/v1/messages", json=second)
        assert two.status_code == 200, two.text
    engine = prompts(backend)
    for k, body in enumerate((first, second)):
        assert engine[k] == full_render_ids(tok, *anthropic_messages(body, fold=True, fold_leading=leading == "folded"))
    assert "The user is away.\n\nGo on." in tok.decode(engine[1])
    assert CLAUDE_CODE["messages"][1]["content"] in tok.decode(engine[0])


# -- developer turns (Chat Completions) -----------------------------------------------------------------
@pytest.mark.parametrize(("family", "rendered_as"), [("qwen2.5-instruct", "system"), ("gpt-oss", "developer")])
def test_developer_role(family, rendered_as):
    """Qwen2.5 renders no developer role: the turn is its system turn (no default system prompt before
    it); gpt-oss's harmony format has a developer turn of its own: kept."""
    gateway, backend, tok = setup(family)
    messages = [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi"}]
    with served(create_app(gateway)) as url, httpx.Client(base_url=url, timeout=60) as http:
        got = http.post("/s/dev/v1/chat/completions", json={"model": "m", "messages": messages})
    assert got.status_code == 200, got.text
    assert got.json()["tmpl"]["roles"]["developer"] == rendered_as
    [prompt] = prompts(backend)
    mapped = [{**m, "role": "system"} if m["role"] == "developer" and rendered_as == "system" else m for m in messages]
    assert prompt == full_render_ids(tok, mapped, None)
    text = tok.decode(prompt)
    assert "Answer in French." in text and "You are Qwen" not in text
    if family == "gpt-oss":
        assert "<|start|>developer<|message|># Instructions\n\nAnswer in French." in text


# -- count_tokens, probes, refusals ------------------------------------------------------------------------
def test_count_tokens_is_the_renders_length():
    gateway, backend, tok = setup("qwen2.5-instruct")
    small = {"model": "m", "system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}], "tools": [BASH]}
    with served(create_app(gateway)) as url, httpx.Client(base_url=url, timeout=60) as http:
        raw = http.post("/s/probe/v1/messages/count_tokens?beta=true", json=CLAUDE_CODE)
        client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
        counted = client.messages.count_tokens(**small)
    assert raw.status_code == 200, raw.text
    assert raw.json() == {"input_tokens": len(full_render_ids(tok, *anthropic_messages(CLAUDE_CODE)))}
    assert counted.input_tokens == len(full_render_ids(tok, *anthropic_messages(small)))
    assert backend.requests == [] and len(gateway.sessions) == 0


def test_start_up_probes_are_answered():
    """What Claude Code sends first (``HEAD /s/{session}``), and the other probes clients send."""
    gateway, _, _ = setup("qwen2.5-instruct")
    with served(create_app(gateway)) as url, httpx.Client(base_url=url, timeout=60) as http:
        for method, path in [("HEAD", "/s/probe"), ("HEAD", "/"), ("GET", "/"), ("GET", "/s/probe"),
                             ("GET", "/v1/models/claude-opus-4-8"), ("GET", "/s/probe/v1/models/claude-opus-4-8")]:  # fmt: skip
            got = http.request(method, path)
            assert got.status_code == 200, (method, path, got.status_code)
        model = anthropic.Anthropic(base_url=f"{url}/s/probe", api_key="unused", max_retries=0).models.retrieve(
            "claude-x"
        )
    assert model.id == "claude-x"
    assert len(gateway.sessions) == 0


def test_image_blocks_are_refused_naming_the_block():
    gateway, backend, _ = setup("qwen2.5-instruct")
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with served(create_app(gateway)) as url:
        client = anthropic.Anthropic(base_url=f"{url}/s/img", api_key="unused", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(model="m", max_tokens=8,
                                   messages=[{"role": "user", "content": [{"type": "text", "text": "What is it?"}, image]}])  # fmt: skip
    error = caught.value.body["error"]
    assert error["type"] == "invalid_request_error"
    assert "messages[0].content[1]" in error["message"] and "this template renders no images" in error["message"]
    assert backend.requests == []


def test_every_request_field_the_sdk_defines_is_accepted_and_documented():
    """The fields of the SDK's own request types (``MessageCreateParams``, beta included): each in
    docs/gateway.md's Anthropic table, and a request holding them all answered."""
    from anthropic.types import message_create_params
    from anthropic.types.beta import message_create_params as beta

    fields = set(message_create_params.MessageCreateParamsBase.__annotations__)
    fields |= set(beta.MessageCreateParamsBase.__annotations__) | {"temperature", "top_p", "top_k", "stream"}
    doc = (Path(__file__).parents[1] / "docs" / "gateway.md").read_text()
    table = doc[doc.index("### Anthropic Messages request fields") :]
    missing = sorted(f for f in fields if f"| `{f}` |" not in table)
    assert not missing, f"fields not in docs/gateway.md's Anthropic table: {missing}"
    values = {"container": "cntr_1", "mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "x"}],
              "service_tier": "auto", "speed": "standard", "inference_geo": "us", "metadata": {"user_id": "u"},
              "thinking": {"type": "enabled", "budget_tokens": 1024}, "output_config": {"effort": "low"},
              "tool_choice": {"type": "any"}, "stop_sequences": ["\nEND"], "temperature": 0.5, "top_p": 0.9,
              "top_k": 5, "stream": False, "cache_control": {"type": "ephemeral"}}  # fmt: skip
    body = {f: values.get(f, {}) for f in fields if f not in ("model", "messages", "max_tokens", "system", "tools")}
    body.update(model="m", max_tokens=8, system="S", messages=[{"role": "user", "content": "Hi"}], tools=[BASH])
    gateway, backend, _ = setup("qwen2.5-instruct")
    with served(create_app(gateway)) as url, httpx.Client(base_url=url, timeout=60) as http:
        got = http.post("/v1/messages", json=body)
    assert got.status_code == 200, got.text
    assert any("mcp_servers" in n for n in got.json()["tmpl"]["left_out"])
    assert backend.requests[0].sampling.top_k == 5
