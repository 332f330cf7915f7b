"""Codex CLI 0.171.0, unmodified, through the gateway (docs/harnesses.md, "npm CLIs"): the catalog's
spec run as a real process on Qwen2.5, Llama 3.2, Qwen3; a Scripted policy makes one call of
its ``exec_command`` tool (a shell command writing a file), then answers. tests/harness_util.py checks the five
points (exit 0, the file, every prompt the full render of the raw request by the responses mapping, the answer
continuing the call's prompt and sampled IDs, every sampled token in exactly one mask).
"""

from __future__ import annotations

import pytest

from tmpl.harness.catalog import npm

from .harness_util import TEMPLATES, run_harness, shell_command

SPEC = npm.HARNESSES["codex"]


@pytest.mark.parametrize("family", TEMPLATES)
def test_codex_runs_through_the_gateway(family, tmp_path, monkeypatch):
    out = run_harness(SPEC, family, "exec_command", {"cmd": shell_command()}, tmp_path, monkeypatch)
    bodies = [a.body for a in out.served.arrivals]
    assert {a.dialect for a in out.served.arrivals} == {"responses"}
    assert all(b["stream"] for b in bodies)
    last = bodies[-1]["input"]
    kinds = [i.get("type", "message") for i in last]
    assert "function_call" in kinds and "function_call_output" in kinds  # its history, sent back whole
    if family == "qwen3":  # the reasoning item came back, so the sampled think block stays in the sequence
        assert "reasoning" in kinds
