"""Crush 0.96.1, unmodified, through the gateway (docs/harnesses.md, "npm CLIs"): the catalog's
spec run as a real process on Qwen2.5, Llama 3.2, Qwen3; a Scripted policy makes one call of
its ``bash`` tool (a shell command writing a file), then answers. tests/harness_util.py checks the five
points (exit 0, the file, every prompt the full render of the raw request by the chat mapping, the answer
continuing the call's prompt and sampled IDs, every sampled token in exactly one mask).
"""

from __future__ import annotations

import pytest

from tmpl.harness.catalog import npm

from .harness_util import NPM_BIN, TEMPLATES, run_harness, shell_command

SPEC = npm.HARNESSES["crush"]

# crush's npm package holds no binary: its postinstall downloads it from github.com (.ci/harnesses)
if not (NPM_BIN.parent / "@charmland" / "crush" / "bin" / "crush").exists():
    pytest.skip(
        "crush's binary is not installed: @charmland/crush's postinstall downloads it from github.com, "
        "unreachable here (.ci/harnesses reports it)",
        allow_module_level=True,
    )


@pytest.mark.parametrize("family", TEMPLATES)
def test_crush_runs_through_the_gateway(family, tmp_path, monkeypatch):
    out = run_harness(SPEC, family, "bash", {"command": shell_command()}, tmp_path, monkeypatch)
    assert {a.dialect for a in out.served.arrivals} == {"chat"}
