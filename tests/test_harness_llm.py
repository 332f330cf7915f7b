"""Simon Willison's ``llm`` CLI (an OpenAI-compatible model from its extra-openai-models.yaml, one tool
``shell`` from ``--functions``): run as its own process from its venv (.ci/harnesses_py), unmodified, against the gateway on three
templates; the issue's five assertions (tests/harness_util.py's ``check_episode``). ``llm`` sends no
``reasoning_content`` back (and has no setting that would): on Qwen3 the answer's prompt is the template's render
of what it sent, a second sequence (tests/harness_pypi.py's ``drops_reasoning``)."""

from __future__ import annotations

import pytest

from .harness_pypi import episode_of
from .harness_util import TEMPLATES


@pytest.mark.parametrize("family", TEMPLATES)
def test_llm_through_the_gateway(family, monkeypatch, tmp_path):
    served, ran, episode = episode_of("llm", family, monkeypatch, tmp_path, drops_reasoning=True)
    assert {a.dialect for a in served.arrivals} == {"chat"}
    assert ran.stdout.strip().endswith("Done.")  # what it printed: the policy's answer
