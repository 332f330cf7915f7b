"""The OpenAI Agents SDK (``openai-agents``): tmpl's small agent script (tmpl/harness/agents/openai_agents_agent.py,
``Runner`` on ``OpenAIChatCompletionsModel`` with one function tool, ``shell``) run as its own process from its
venv, unmodified SDK, against the gateway on three templates: the issue's five assertions
(tests/harness_util.py's ``check_episode``)."""

from __future__ import annotations

import pytest

from .harness_pypi import episode_of
from .harness_util import TEMPLATES


@pytest.mark.parametrize("family", TEMPLATES)
def test_openai_agents_runner_through_the_gateway(family, monkeypatch, tmp_path):
    served, ran, episode = episode_of("openai-agents", family, monkeypatch, tmp_path)
    assert {a.dialect for a in served.arrivals} == {"chat"}
    assert ran.stdout.strip().endswith("Done.")  # the agent's final output: the policy's answer
