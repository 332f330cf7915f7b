"""kimi-cli (``kimi``, Python >= 3.12), unmodified, from its venv (.ci/harnesses_py), against the gateway on three
templates: ``--print --yolo --prompt``, the session's chat-completions endpoint as the only model of its
``~/.kimi/config.toml`` (an ``openai_legacy`` provider), its own ``Shell`` tool; the issue's five assertions
(tests/harness_util.py's ``check_episode``)."""

from __future__ import annotations

import pytest

from .harness_pypi import episode_of
from .harness_util import TEMPLATES


@pytest.mark.parametrize("family", TEMPLATES)
def test_kimi_cli_through_the_gateway(family, monkeypatch, tmp_path):
    served, ran, episode = episode_of("kimi-cli", family, monkeypatch, tmp_path, tool="Shell")
    assert {a.dialect for a in served.arrivals} == {"chat"}
    assert "TurnEnd()" in ran.stdout  # print mode ran its turn to the end
