"""A smolagents ``ToolCallingAgent`` with a shell tool (see :mod:`tmpl.harness.agents`).

OPENAI_BASE_URL=http://127.0.0.1:8100/s/k/v1 python smolagents_agent.py --model m "make hello.txt"
"""

from __future__ import annotations

import os

try:
    from ._shell import parse_args, run_shell
except ImportError:  # run as a script: its folder is on sys.path
    from _shell import parse_args, run_shell  # type: ignore[no-redef]


def main() -> int:
    import smolagents

    args = parse_args("smolagents_agent")

    def shell(command: str) -> str:  # smolagents reads the description and the argument's from the docstring
        """Run a shell command in the working directory and return its output and exit status.

        Args:
            command: the command line, run with sh -c
        """
        return run_shell(command)

    model = smolagents.OpenAIServerModel(
        model_id=args.model, api_base=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"]
    )
    agent = smolagents.ToolCallingAgent(
        tools=[smolagents.tool(shell)], model=model, max_steps=args.max_steps, verbosity_level=0
    )
    print(agent.run(args.task))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
