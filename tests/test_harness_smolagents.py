"""smolagents' ``ToolCallingAgent`` (tmpl/harness/agents/smolagents_agent.py: ``OpenAIServerModel`` with one tool,
``shell``): run as its own process from its venv (.ci/harnesses_py), unmodified, against the gateway on three
templates; the issue's five assertions (tests/harness_util.py's ``check_episode``). The agent ends only through
its ``final_answer`` tool, so the policy's answer is a call of it. smolagents sends its earlier calls back as
assistant text ("Calling tools: [...]", hard-coded in its memory, no setting) and their results as user turns
("Observation: ..."): every prompt is the template's render of that, and the answer's prompt a second
sequence whose branch names the rewritten content (tests/harness_pypi.py's ``rewrites``)."""

from __future__ import annotations

import pytest

from .harness_pypi import call_text, episode_of
from .harness_util import TEMPLATES


@pytest.mark.parametrize("family", TEMPLATES)
def test_smolagents_through_the_gateway(family, monkeypatch, tmp_path):
    answer = call_text(family, "final_answer", {"answer": "Done."})
    served, ran, episode = episode_of("smolagents", family, monkeypatch, tmp_path, answer=answer, rewrites="content")
    assert {a.dialect for a in served.arrivals} == {"chat"}
    assert ran.stdout.strip().endswith("Done.")  # what agent.run returned: final_answer's argument
