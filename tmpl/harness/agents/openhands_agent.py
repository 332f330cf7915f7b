"""An OpenHands SDK agent (``openhands.sdk.Agent`` in a local ``Conversation``) with the SDK's own terminal tool
(``openhands.tools.terminal.TerminalTool``, named ``terminal``), on an OpenAI-compatible endpoint through the SDK's
``LLM`` (litellm). See :mod:`tmpl.harness.agents`; the SDK needs Python >= 3.12.

    OPENAI_BASE_URL=http://127.0.0.1:8100/s/k/v1 python openhands_agent.py --model m "make hello.txt"
"""

from __future__ import annotations

import os

try:
    from ._shell import parse_args
except ImportError:  # run as a script: its folder is on sys.path
    from _shell import parse_args  # type: ignore[no-redef]


def main() -> int:
    from openhands.sdk import LLM, Agent, Conversation, Tool
    from openhands.tools.terminal import TerminalTool

    args = parse_args("openhands_agent")
    llm = LLM(
        model=f"openai/{args.model}",
        base_url=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
        usage_id="agent",
        num_retries=0,
    )
    agent = Agent(llm=llm, tools=[Tool(name=TerminalTool.name)])
    conversation = Conversation(
        agent=agent, workspace=os.getcwd(), max_iteration_per_run=args.max_steps, visualizer=None
    )
    conversation.send_message(args.task)
    conversation.run()
    print(conversation.state.execution_status.value)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
