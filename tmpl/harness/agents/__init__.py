"""Small agents on agent SDKs, shipped as standalone scripts a harness spec runs with the SDK's own venv.

Each module here imports only the standard library and its SDK (never ``tmpl``): it runs as
``<venv>/bin/python <path of the module> --model M TASK`` in the run's working directory, reads the
OpenAI-compatible endpoint from ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` (the documented variables of the
``openai`` client every one of these SDKs builds on), gives its model one tool, ``shell(command)``, that
runs a command in the working directory, prints the final answer and exits 0. The specs are in
:mod:`tmpl.harness.catalog.pypi`.

======================= ====================================================================
module                  SDK and loop
======================= ====================================================================
``smolagents_agent``    ``smolagents.ToolCallingAgent`` on ``OpenAIServerModel``
``openai_agents_agent`` ``agents.Runner`` (OpenAI Agents SDK) on ``OpenAIChatCompletionsModel``
``langgraph_agent``     ``langgraph.prebuilt.create_react_agent`` on ``langchain_openai.ChatOpenAI``
``pydantic_ai_agent``   ``pydantic_ai.Agent`` on its OpenAI chat model
``openhands_agent``     ``openhands.sdk.Agent`` with its own ``TerminalTool`` (tool ``terminal``)
======================= ====================================================================

(A module is not named after its SDK: the script's folder is first on ``sys.path`` and would shadow it.)

>>> from pathlib import Path
>>> sorted(p.stem for p in Path(__file__).parent.glob("*.py") if p.stem != "__init__")
['_shell', 'langgraph_agent', 'openai_agents_agent', 'openhands_agent', 'pydantic_ai_agent', 'smolagents_agent']
"""
