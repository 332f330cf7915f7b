"""The OpenHands SDK (``openhands-sdk`` with ``openhands-tools``): tmpl's small agent script
(tmpl/harness/agents/openhands_agent.py: the SDK's ``Agent`` in a local ``Conversation`` with the SDK's own
``TerminalTool``) run as its own process from its Python >= 3.12 venv, unmodified SDK, against the gateway on
three templates; the issue's five assertions (tests/harness_util.py's ``check_episode``). The SDK sends
``reasoning_content`` back only to the models its own list names (DeepSeek reasoners, Kimi K2 thinking...; no
setting adds one): on Qwen3 the answer's prompt is the template's render of what it sent, a second sequence
(tests/harness_pypi.py's ``drops_reasoning``)."""

from __future__ import annotations

import pytest

from .harness_pypi import episode_of
from .harness_util import TEMPLATES


@pytest.mark.parametrize("family", TEMPLATES)
def test_openhands_sdk_through_the_gateway(family, monkeypatch, tmp_path):
    served, ran, episode = episode_of("openhands", family, monkeypatch, tmp_path, tool="terminal", drops_reasoning=True)
    assert {a.dialect for a in served.arrivals} == {"chat"}
    assert ran.stdout.strip().endswith("finished")  # the conversation's execution status
