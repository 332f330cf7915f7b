"""opencode 1.18.33, unmodified, through the gateway (docs/harnesses.md, "npm CLIs"): the catalog's
spec run as a real process on Qwen2.5, Llama 3.2, Qwen3; a Scripted policy makes one call of
its ``bash`` tool (a shell command writing a file), then answers. tests/harness_util.py checks the five
points (exit 0, the file, every prompt the full render of the raw request by the chat mapping, the answer
continuing the call's prompt and sampled IDs, every sampled token in exactly one mask).
"""

from __future__ import annotations

import pytest

from tmpl.harness.catalog import npm

from .harness_util import TEMPLATES, run_harness, shell_command

SPEC = npm.HARNESSES["opencode"]


@pytest.mark.parametrize("family", TEMPLATES)
def test_opencode_runs_through_the_gateway(family, tmp_path, monkeypatch):
    out = run_harness(
        SPEC, family, "bash", {"command": shell_command(), "description": "Write the file"}, tmp_path, monkeypatch
    )
    assert {a.dialect for a in out.served.arrivals} == {"chat"}
    # besides its main loop: a title call without tools, an episode lineage of its own
    side = [a for a in out.served.arrivals if not a.body.get("tools")]
    assert side and all(a.calls for a in side)
    assert any((s.agent or "").startswith("side-") for s in out.episode.sequences)
    main = [a for a in out.served.arrivals if a.body.get("tools")]
    assert [m["role"] for m in main[-1].body["messages"]][-2:] == ["assistant", "tool"]
