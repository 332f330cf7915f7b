"""Four small agents with the fixture models' two tools (``get_weather``, ``get_time``), one per wire dialect the
gateway serves, each on its vendor's own SDK and run as its own process by tests/test_harness_vllm_dialects.py:

- ``chat``: the OpenAI Agents SDK's ``Runner`` on ``OpenAIChatCompletionsModel`` (``OPENAI_BASE_URL``);
- ``responses``: the same ``Runner`` on ``OpenAIResponsesModel`` (``OPENAI_BASE_URL``);
- ``anthropic``: a tool loop on the ``anthropic`` SDK's ``messages.create`` (``ANTHROPIC_BASE_URL``);
- ``gemini``: a tool loop on ``google-genai``'s ``models.generate_content`` (``GOOGLE_GEMINI_BASE_URL``).

Each tool call it runs is appended to ``calls.txt`` (tests/harness_weather_agent.py's tools) and its final
answer written to ``answer.txt`` in the working directory.

ANTHROPIC_BASE_URL=http://127.0.0.1:8100/s/k python harness_dialect_agents.py anthropic m "What time is it in Paris?"
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from harness_weather_agent import get_time, get_weather, logged

TOOLS = {f.__name__: logged(f) for f in (get_time, get_weather)}
DESCRIPTIONS = {"get_time": "Current local time in a city.", "get_weather": "Current weather in a city."}
CITY = {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}}, "required": ["city"]}
TURNS = 4  # the fixture calls once or twice, then answers


def run_tool(name: str, arguments: dict) -> str:
    try:
        return TOOLS[name](**arguments)
    except Exception as exc:  # noqa: BLE001 - the model's call was wrong: it is told so
        return f"error: {exc}"


def agents_sdk(model_name: str, task: str, responses: bool) -> str | None:
    import agents
    import openai

    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(max_retries=0, timeout=120)  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
    kind = agents.OpenAIResponsesModel if responses else agents.OpenAIChatCompletionsModel
    model = kind(model=model_name, openai_client=client)
    tools = [agents.function_tool(f) for f in TOOLS.values()]
    agent = agents.Agent(name="assistant", instructions="", tools=tools, model=model)
    try:
        return str(agents.Runner.run_sync(agent, task, max_turns=TURNS).final_output)
    except agents.MaxTurnsExceeded:  # still calling tools at its last turn: no answer, the calls stay
        return None


def anthropic_loop(model_name: str, task: str) -> str | None:
    import anthropic

    client = anthropic.Anthropic(base_url=os.environ["ANTHROPIC_BASE_URL"], api_key="unused", max_retries=0)
    tools = [{"name": n, "description": d, "input_schema": CITY} for n, d in DESCRIPTIONS.items()]
    messages: list[dict] = [{"role": "user", "content": task}]
    for _ in range(TURNS):
        reply = client.messages.create(model=model_name, max_tokens=96, messages=messages, tools=tools)
        blocks = [b.model_dump(exclude_none=True) for b in reply.content]
        messages.append({"role": "assistant", "content": blocks})
        uses = [b for b in blocks if b["type"] == "tool_use"]
        if not uses:
            return "".join(b.get("text", "") for b in blocks)
        results = [
            {"type": "tool_result", "tool_use_id": b["id"], "content": run_tool(b["name"], b["input"])} for b in uses
        ]
        messages.append({"role": "user", "content": results})
    return None


def gemini_loop(model_name: str, task: str) -> str | None:
    from google import genai
    from google.genai import types

    client = genai.Client(
        api_key="unused", http_options=types.HttpOptions(base_url=os.environ["GOOGLE_GEMINI_BASE_URL"])
    )
    declarations = [
        types.FunctionDeclaration(name=n, description=d, parameters_json_schema=CITY) for n, d in DESCRIPTIONS.items()
    ]
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=declarations)],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        max_output_tokens=96,
    )
    contents: list[types.Content] = [types.Content(role="user", parts=[types.Part(text=task)])]
    for _ in range(TURNS):
        reply = client.models.generate_content(model=model_name, contents=contents, config=config)
        content = reply.candidates[0].content
        contents.append(content)
        calls = [p.function_call for p in content.parts or [] if p.function_call]
        if not calls:
            return "".join(p.text or "" for p in content.parts or [])
        parts = [
            types.Part(
                function_response=types.FunctionResponse(
                    id=c.id, name=c.name, response={"output": run_tool(c.name, dict(c.args or {}))}
                )
            )
            for c in calls
        ]
        contents.append(types.Content(role="user", parts=parts))
    return None


def main() -> int:
    dialect, model_name, task = sys.argv[1], sys.argv[2], sys.argv[3]
    if dialect in ("chat", "responses"):
        answer = agents_sdk(model_name, task, responses=dialect == "responses")
    elif dialect == "anthropic":
        answer = anthropic_loop(model_name, task)
    elif dialect == "gemini":
        answer = gemini_loop(model_name, task)
    else:
        raise SystemExit(f"unknown dialect {dialect!r}: chat, responses, anthropic or gemini")
    if answer is not None:
        Path("answer.txt").write_text(answer, encoding="utf-8")
    print(json.dumps({"dialect": dialect, "answer": answer}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
