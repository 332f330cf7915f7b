"""Kilo Code CLI (``@kilocode/cli``, ``kilo run``), unmodified, end to end through the gateway: a
provider on the AI SDK's OpenAI-compatible package at the session's base URL in the config file
``KILO_CONFIG`` names (opencode's format), a throwaway HOME, telemetry, update checks, sharing and its
daemon off, ``--auto`` approving its tools. The scripted policy calls Kilo's own ``bash`` tool once (it
writes a file), then answers; tests/harness_util.py's ``check_episode`` asserts the run (exit 0, the file
written, every prompt the template's full render of the raw request, the answer continuing the call's
prompt and sampled IDs, every sampled token in exactly one loss mask)."""

from __future__ import annotations

import pytest

from tmpl.harness.catalog.npm_more import HARNESSES

from .harness_util import TASK, TEMPLATES, check_episode, gateway_for, npm_bin, run_spec, shell_command


@pytest.mark.parametrize("family", TEMPLATES)
def test_kilo_runs_its_bash_tool_through_the_gateway(family, tmp_path, monkeypatch):
    npm_bin("kilo")
    arguments = {"command": shell_command(), "description": "Write the proof file"}  # both required by its schema
    with gateway_for(family, "bash", arguments, monkeypatch) as served:
        ran = run_spec(HARNESSES["kilo"], served.url, "kilo", TASK, tmp_path)
        episode = check_episode(served, ran, "kilo")
    assert {a.dialect for a in served.arrivals} == {"chat"}
    assert episode.sequences[0].agent is None
