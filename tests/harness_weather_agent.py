"""An OpenAI Agents SDK agent with the fixture models' two tools (``get_weather``, ``get_time``), run as its own
process by tests/test_integrations_trl_harness.py: ``Runner`` on ``OpenAIChatCompletionsModel`` at
``OPENAI_BASE_URL`` (the gateway session). Each tool call it runs is appended to ``calls.txt`` and its final
answer written to ``answer.txt`` in the working directory, for the verifier to read.

OPENAI_BASE_URL=http://127.0.0.1:8100/s/k/v1 python harness_weather_agent.py MODEL "What time is it in Paris?"
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def get_time(city: str) -> str:
    """Current local time in a city.

    Args:
        city: City name
    """
    return f"It is 10:00 in {city}."


def get_weather(city: str) -> str:
    """Current weather in a city.

    Args:
        city: City name
    """
    return f"Sunny in {city}, 21 C."


def logged(function):
    def call(city: str) -> str:
        with Path("calls.txt").open("a", encoding="utf-8") as f:
            f.write(json.dumps({"name": function.__name__, "city": city}) + "\n")
        return function(city)

    call.__name__, call.__doc__ = function.__name__, function.__doc__
    return call


def main() -> int:
    import agents
    import openai

    model_name, task = sys.argv[1], sys.argv[2]
    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(max_retries=0, timeout=120)  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
    model = agents.OpenAIChatCompletionsModel(model=model_name, openai_client=client)
    tools = [agents.function_tool(logged(f)) for f in (get_weather, get_time)]
    agent = agents.Agent(name="assistant", instructions="", tools=tools, model=model)
    try:
        result = agents.Runner.run_sync(agent, task, max_turns=4)
    except agents.MaxTurnsExceeded:  # still calling tools at its last turn: no answer, the calls stay
        return 0
    Path("answer.txt").write_text(str(result.final_output), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
