"""A pydantic-ai ``Agent`` (tmpl/harness/agents/pydantic_ai_agent.py: ``OpenAIChatModel`` with one tool,
``shell``): run as its own process from its venv (.ci/harnesses_py), unmodified, against the gateway on three
templates; the issue's five assertions (tests/harness_util.py's ``check_episode``)."""

from __future__ import annotations

import pytest

from .harness_pypi import episode_of
from .harness_util import TEMPLATES


@pytest.mark.parametrize("family", TEMPLATES)
def test_pydantic_ai_through_the_gateway(family, monkeypatch, tmp_path):
    served, ran, episode = episode_of("pydantic-ai", family, monkeypatch, tmp_path)
    assert {a.dialect for a in served.arrivals} == {"chat"}
    assert ran.stdout.strip().endswith("Done.")  # the run's output: the policy's answer
