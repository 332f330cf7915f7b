"""An OpenAI Agents SDK agent (``agents.Runner``) with a shell tool (see :mod:`tmpl.harness.agents`).

OPENAI_BASE_URL=http://127.0.0.1:8100/s/k/v1 python openai_agents_agent.py --model m "make hello.txt"
"""

from __future__ import annotations

try:
    from ._shell import DESCRIPTION, parse_args, run_shell
except ImportError:  # run as a script: its folder is on sys.path
    from _shell import DESCRIPTION, parse_args, run_shell  # type: ignore[no-redef]


def main() -> int:
    import agents
    import openai

    args = parse_args("openai_agents_agent")
    agents.set_tracing_disabled(True)  # no upload of traces to OpenAI's platform

    @agents.function_tool(name_override="shell", description_override=DESCRIPTION)
    def shell(command: str) -> str:
        """Run a shell command.

        Args:
            command: the command line, run with sh -c
        """
        return run_shell(command)

    client = openai.AsyncOpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    # the SDK's documented hook: send the model's reasoning_content back with its turn (by default the SDK
    # replays it to DeepSeek models only); a template that renders earlier reasoning (Qwen3's last turns)
    # then gets the turn as the model wrote it, and the next prompt continues the sampled tokens
    model = agents.OpenAIChatCompletionsModel(
        model=args.model, openai_client=client, should_replay_reasoning_content=lambda _context: True
    )
    agent = agents.Agent(name="shell agent", instructions="You are a helpful assistant.", tools=[shell], model=model)
    result = agents.Runner.run_sync(agent, args.task, max_turns=args.max_steps)
    print(result.final_output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
