"""Continue's CLI (cn) 1.5.47, unmodified, through the gateway (docs/harnesses.md, "npm CLIs"): the catalog's
spec run as a real process on Qwen2.5, Llama 3.2, Qwen3; a Scripted policy makes one call of
its ``Bash`` tool (a shell command writing a file), then answers. tests/harness_util.py checks the five
points (exit 0, the file, every prompt the full render of the raw request by the chat mapping, the answer
continuing the call's prompt and sampled IDs, every sampled token in exactly one mask).
"""

from __future__ import annotations

import pytest

from tmpl.harness.catalog import npm

from .harness_util import TEMPLATES, run_harness, shell_command

SPEC = npm.HARNESSES["continue-cli"]


@pytest.mark.parametrize("family", TEMPLATES)
def test_continue_cli_runs_through_the_gateway(family, tmp_path, monkeypatch):
    out = run_harness(SPEC, family, "Bash", {"command": shell_command()}, tmp_path, monkeypatch)
    assert {a.dialect for a in out.served.arrivals} == {"chat"}
    last = out.served.arrivals[-1].body["messages"]
    assert [m["role"] for m in last][-2:] == ["assistant", "tool"]
