"""A LangGraph ReAct agent (``create_react_agent``) on ``langchain_openai.ChatOpenAI`` with a shell tool
(see :mod:`tmpl.harness.agents`).

    OPENAI_BASE_URL=http://127.0.0.1:8100/s/k/v1 python langgraph_agent.py --model m "make hello.txt"
"""

from __future__ import annotations

import os
import warnings

try:
    from ._shell import DESCRIPTION, parse_args, run_shell
except ImportError:  # run as a script: its folder is on sys.path
    from _shell import DESCRIPTION, parse_args, run_shell  # type: ignore[no-redef]


def main() -> int:
    from langchain_core.tools import StructuredTool
    from langchain_openai import ChatOpenAI

    with warnings.catch_warnings():  # langgraph 1.x marks create_react_agent deprecated; it still ships
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

    args = parse_args("langgraph_agent")

    def shell(command: str) -> str:
        """Run a shell command."""
        return run_shell(command)

    tool = StructuredTool.from_function(shell, name="shell", description=DESCRIPTION)
    model = ChatOpenAI(
        model=args.model, base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"], max_retries=0
    )
    agent = create_react_agent(model, [tool])
    state = agent.invoke(
        {"messages": [{"role": "user", "content": args.task}]}, {"recursion_limit": 2 * args.max_steps + 1}
    )
    print(state["messages"][-1].content)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
