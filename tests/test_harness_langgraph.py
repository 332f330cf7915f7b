"""A LangGraph ReAct agent (tmpl/harness/agents/langgraph_agent.py: ``create_react_agent`` on
``langchain-openai``'s ``ChatOpenAI`` with one tool, ``shell``): run as its own process from its venv (.ci/harnesses_py), unmodified, against the gateway on three
templates; the issue's five assertions (tests/harness_util.py's ``check_episode``). ``ChatOpenAI`` neither
reads nor sends back ``reasoning_content`` (its documentation sends such servers to provider-specific
subclasses): on Qwen3 the answer's prompt is the template's render of what it sent, a second sequence
(tests/harness_pypi.py's ``drops_reasoning``)."""

from __future__ import annotations

import pytest

from .harness_pypi import episode_of
from .harness_util import TEMPLATES


@pytest.mark.parametrize("family", TEMPLATES)
def test_langgraph_through_the_gateway(family, monkeypatch, tmp_path):
    served, ran, episode = episode_of("langgraph", family, monkeypatch, tmp_path, drops_reasoning=True)
    assert {a.dialect for a in served.arrivals} == {"chat"}
    assert ran.stdout.strip().endswith("Done.")  # the last message: the policy's answer
