"""pi (``@mariozechner/pi-coding-agent``), unmodified, end to end through the gateway: its documented
custom provider (``~/.pi/agent/models.json``, ``api: openai-completions``) at the session's base URL, a
throwaway HOME, offline (no update check, no telemetry), print mode. The scripted policy calls pi's own
``bash`` tool once (it writes a file), then answers; tests/harness_util.py's ``check_episode`` asserts the
run (exit 0, the file written, every prompt the template's full render of the raw request, the answer
continuing the call's prompt and sampled IDs, every sampled token in exactly one loss mask)."""

from __future__ import annotations

import pytest

from tmpl.harness.catalog.npm_more import HARNESSES

from .harness_util import TASK, TEMPLATES, check_episode, gateway_for, npm_bin, run_spec, shell_command


@pytest.mark.parametrize("family", TEMPLATES)
def test_pi_runs_its_bash_tool_through_the_gateway(family, tmp_path, monkeypatch):
    npm_bin("pi")
    with gateway_for(family, "bash", {"command": shell_command()}, monkeypatch) as served:
        ran = run_spec(HARNESSES["pi"], served.url, "pi", TASK, tmp_path)
        episode = check_episode(served, ran, "pi")
    assert {a.dialect for a in served.arrivals} == {"chat"}
    assert episode.sequences[0].agent is None
