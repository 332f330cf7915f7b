"""mini-swe-agent (``mini``, v2: litellm chat completions with one tool, ``bash``), unmodified, from its venv
(.ci/harnesses_py), against the gateway on three templates: ``--yolo --exit-immediately``, the model and
``api_base`` by its documented ``--model`` / ``--config`` settings; the issue's five assertions
(tests/harness_util.py's ``check_episode``). mini ends when a command prints
``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``, so the policy's answer is that command."""

from __future__ import annotations

import pytest

from .harness_pypi import call_text, episode_of
from .harness_util import TEMPLATES


@pytest.mark.parametrize("family", TEMPLATES)
def test_mini_swe_agent_through_the_gateway(family, monkeypatch, tmp_path):
    answer = call_text(family, "bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})
    served, ran, episode = episode_of("mini-swe-agent", family, monkeypatch, tmp_path, tool="bash", answer=answer)
    assert {a.dialect for a in served.arrivals} == {"chat"}
    assert len(episode.calls) == 2  # the call, then the submission: no retry, no side call
