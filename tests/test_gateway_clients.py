"""More real clients through the gateway (issue 37, item 4), unmodified, on the Qwen2.5 tokenizer over a
Scripted backend: the ``openai`` SDK's Responses API (streamed and not), the ``openai-agents`` SDK's
``Runner`` with function tools on its Chat Completions model and its Responses model, and ``smolagents``'
``ToolCallingAgent`` with ``OpenAIServerModel``; and stop strings, which smolagents sends.

Each call's prompt is checked against the engine's IDs and the template's full render of what the
client sent (the raw request bodies are kept as they arrive); an episode whose client sends its history
back unchanged is one sequence with every earlier sampled ID kept. smolagents sends its earlier calls
back as text ("Calling tools: ...") and their results as user messages ("Observation: ..."): that is the
context its model sees, so each of its calls is the template's render of it, a branch naming the message
the client rewrote.
"""

from __future__ import annotations

import json

import pytest

import tmpl
from tmpl.backends import Scripted
from tmpl.gateway import Gateway, create_app
from tmpl.gateway.dialects import openai_chat, responses

from .conftest import load_tokenizer
from .gateway_util import full_render_ids, served
from .mapping_chat import _text, chat_messages

openai = pytest.importorskip("openai", reason="the openai SDK is not installed (pip install -e '.[test]')")
pytest.importorskip("fastapi", reason="FastAPI is not installed (pip install -e '.[gateway]')")

CALL = '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call><|im_end|>'
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


class Policy:
    """A call to get_weather(Paris) until a result is in the prompt, then ``answer`` (text or a call)."""

    def __init__(self, tok, answer: str = "It is sunny in Paris.<|im_end|>") -> None:
        self.tok = tok
        self.answer = answer
        self.sampled: dict[str, list[int]] = {}

    def __call__(self, req):
        text = self.tok.decode(list(req.prompt_ids))
        seen = text.count("sunny, Paris")
        out = CALL.format(name="get_weather", args='{"city": "Paris"}') if seen == 0 else self.answer
        ids = self.tok.encode(out, add_special_tokens=False)
        self.sampled[req.request_id] = ids
        return ids


@pytest.fixture
def setup(monkeypatch):
    """A gateway on Qwen2.5 with a Scripted policy, and every raw request body as it arrived, by dialect."""
    tok = load_tokenizer("qwen2.5-instruct")
    policy = Policy(tok)
    backend = Scripted(policy)
    gateway = Gateway(tmpl.ChatTemplate(tok), backend)
    bodies: list[tuple[str, dict]] = []
    for name, module in (("chat", openai_chat), ("responses", responses)):
        real = module.parse

        def keep(body, real=real, name=name):
            bodies.append((name, json.loads(json.dumps(body))))
            return real(body)

        monkeypatch.setattr(module, "parse", keep)
    return gateway, backend, policy, bodies


def responses_messages(body: dict) -> tuple[list[dict], list | None]:
    """A Responses request's input items as chat messages, read from the raw body (here, not by tmpl)."""
    out: list[dict] = []
    if body.get("instructions"):
        out.append({"role": "system", "content": body["instructions"]})
    items = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
    for item in items:
        kind = item.get("type", "message")
        if kind == "message" and item["role"] == "assistant":
            out.append({"role": "assistant", "content": _text(item["content"])})
        elif kind == "message":
            out.append({"role": item["role"], "content": _text(item["content"])})
        elif kind == "function_call":
            if not (out and out[-1]["role"] == "assistant"):
                out.append({"role": "assistant", "content": ""})
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            out[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    tools = [
        {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
        for t in body.get("tools") or []
    ]
    return out, tools or None


def check_calls(gateway, backend, policy, key, bodies, *, one_sequence=True):
    episode = gateway.episode(key)
    calls = episode.calls
    assert len(calls) == len(bodies) >= 2
    engine = {r.request_id: list(r.prompt_ids) for r in backend.requests}
    for k, (call, (dialect, body)) in enumerate(zip(calls, bodies)):
        messages, tools = chat_messages(body) if dialect == "chat" else responses_messages(body)
        prompt = call.prompt_ids.tolist()
        assert prompt == engine[call.id]
        assert call.completion_ids.tolist() == policy.sampled[call.id]
        assert prompt == full_render_ids(gateway.tpl.tokenizer, messages, tools), f"call {k}: not the full render"
    if one_sequence:
        assert episode.num_sequences == 1, [str(s.branch) for s in episode.sequences]
        for before, after in zip(calls, calls[1:]):
            kept = before.prompt_ids.tolist() + before.completion_ids.tolist()
            assert after.prompt_ids.tolist()[: len(kept)] == kept
    assert sum(int(s.mask.sum()) for s in episode.sequences) == sum(len(c.completion_ids) for c in calls)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_openai_responses_api_episode_is_exact(setup, stream):
    gateway, backend, policy, bodies = setup
    tools = [
        {"type": "function", "name": "get_weather", "description": "The weather in a city.", "parameters": WEATHER}
    ]
    with served(create_app(gateway)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/resp/v1", api_key="unused", max_retries=0)
        items: list = [{"role": "user", "content": "Weather in Paris?"}]
        for _ in range(4):
            kwargs = dict(model="m", input=items, tools=tools, instructions="Be brief.")
            if stream:
                with client.responses.stream(**kwargs) as events:
                    kinds = [e.type for e in events]
                    reply = events.get_final_response()
                assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
            else:
                reply = client.responses.create(**kwargs)
            items += [o.model_dump(exclude_none=True) for o in reply.output]
            calls = [o for o in reply.output if o.type == "function_call"]
            if not calls:
                break
            items += [{"type": "function_call_output", "call_id": c.call_id, "output": "sunny, Paris"} for c in calls]
    assert reply.output_text == "It is sunny in Paris."
    check_calls(gateway, backend, policy, "resp", bodies)


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_openai_agents_runner_episode_is_exact(setup, api):
    agents = pytest.importorskip("agents", reason="openai-agents is not installed (pip install -e '.[test]')")
    gateway, backend, policy, bodies = setup
    agents.set_tracing_disabled(True)

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny, {city}"

    with served(create_app(gateway)) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/s/agent/v1", api_key="unused", max_retries=0)
        model = (agents.OpenAIChatCompletionsModel if api == "chat" else agents.OpenAIResponsesModel)("m", client)
        agent = agents.Agent(name="weather", instructions="Be brief.", tools=[get_weather], model=model)
        result = agents.Runner.run_sync(agent, "Weather in Paris?")
    assert result.final_output.strip() == "It is sunny in Paris."
    assert {d for d, _ in bodies} == {api}
    check_calls(gateway, backend, policy, "agent", bodies)


def test_smolagents_tool_calling_agent_gets_the_render_of_what_it_sends(setup):
    smolagents = pytest.importorskip("smolagents", reason="smolagents is not installed (pip install -e '.[test]')")
    gateway, backend, policy, bodies = setup
    policy.answer = CALL.format(name="final_answer", args='{"answer": "It is sunny in Paris."}')

    def get_weather(city: str) -> str:
        """The weather in a city.

        Args:
            city: the city
        """
        return f"sunny, {city}"

    tool = smolagents.tool(get_weather)
    with served(create_app(gateway)) as url:
        model = smolagents.OpenAIServerModel(model_id="m", api_base=f"{url}/s/smol/v1", api_key="unused")
        agent = smolagents.ToolCallingAgent(tools=[tool], model=model, max_steps=3, verbosity_level=0)
        answer = agent.run("Weather in Paris?")
    assert answer == "It is sunny in Paris."
    assert all(body.get("stop") for _, body in bodies)  # smolagents sends stop strings: served
    check_calls(gateway, backend, policy, "smol", bodies, one_sequence=False)
    episode = gateway.episode("smol")
    second = episode.sequences[1].branch  # the client sent its call back as text: a branch names it
    assert (second.kind, second.field) == ("diverged", "content") and "client changed" in second.edit


def test_a_stop_string_ends_the_reply_at_the_token_that_completes_it(setup):
    gateway, backend, policy, bodies = setup
    policy.answer = "Sunny. Observation: more text here.<|im_end|>"
    tok = gateway.tpl.tokenizer
    with served(create_app(gateway)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/stop/v1", api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "Weather? sunny, Paris"}]  # the policy answers at once
        reply = client.chat.completions.create(model="m", messages=messages, stop=["Observation:"])
        text = reply.choices[0].message.content
        ids = gateway.episode("stop").calls[0].completion_ids.tolist()
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "And?"}]
        client.chat.completions.create(model="m", messages=messages, stop=["Observation:"])
    assert text == "Sunny."
    assert reply.choices[0].finish_reason == "stop"
    full = policy.sampled[gateway.episode("stop").calls[0].id]
    assert ids == full[: len(ids)] and len(ids) < len(full)  # the engine's own tokens, cut
    assert "Observation:" in tok.decode(ids) and "Observation:" not in tok.decode(ids[:-1])
