"""A pydantic-ai ``Agent`` with a shell tool, on its OpenAI chat-completions model (see :mod:`tmpl.harness.agents`).

OPENAI_BASE_URL=http://127.0.0.1:8100/s/k/v1 python pydantic_ai_agent.py --model m "make hello.txt"
"""

from __future__ import annotations

import os

try:
    from ._shell import DESCRIPTION, parse_args, run_shell
except ImportError:  # run as a script: its folder is on sys.path
    from _shell import DESCRIPTION, parse_args, run_shell  # type: ignore[no-redef]


def main() -> int:
    from pydantic_ai import Agent, Tool
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    args = parse_args("pydantic_ai_agent")

    def shell(command: str) -> str:
        """Run a shell command.

        Args:
            command: the command line, run with sh -c
        """
        return run_shell(command)

    provider = OpenAIProvider(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"])
    model = OpenAIChatModel(args.model, provider=provider)
    agent = Agent(model, tools=[Tool(shell, name="shell", description=DESCRIPTION)])
    result = agent.run_sync(args.task)
    print(result.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
