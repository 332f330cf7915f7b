"""Cline CLI (``cline``), unmodified, end to end through the gateway: its documented OpenAI-compatible
provider (``cline auth --provider openai-compatible --baseurl ...``) at the session's base URL, its state
in a throwaway HOME (``--data-dir``: the session runs in the CLI's process, no hub daemon), telemetry
and updates off in its global settings, tools auto-approved (its default). The scripted policy calls
Cline's own ``run_commands`` tool once (it writes a file), then answers; tests/harness_util.py's
``check_episode`` asserts the run (exit 0, the file written, every prompt the template's full render of
the raw request, the answer continuing the call's prompt and sampled IDs, every sampled token in exactly
one loss mask)."""

from __future__ import annotations

import pytest

from tmpl.harness.catalog.npm_more import HARNESSES

from .harness_util import TASK, TEMPLATES, check_episode, gateway_for, npm_bin, run_spec, shell_command


@pytest.mark.parametrize("family", TEMPLATES)
def test_cline_runs_its_command_tool_through_the_gateway(family, tmp_path, monkeypatch):
    npm_bin("cline")
    with gateway_for(family, "run_commands", {"commands": [shell_command()]}, monkeypatch) as served:
        ran = run_spec(HARNESSES["cline"], served.url, "cline", TASK, tmp_path)
        episode = check_episode(served, ran, "cline")
    assert {a.dialect for a in served.arrivals} == {"chat"}
    assert episode.sequences[0].agent is None
