"""Claude Code 2.1.197, unmodified, through the gateway (docs/harnesses.md, "npm CLIs"): the catalog's
spec run as a real process on Qwen2.5, Llama 3.2, Qwen3; a Scripted policy makes one call of
its ``Bash`` tool (a shell command writing a file), then answers. tests/harness_util.py checks the five
points (exit 0, the file, every prompt the full render of the raw request by the anthropic mapping, the answer
continuing the call's prompt and sampled IDs, every sampled token in exactly one mask).
"""

from __future__ import annotations

import pytest

from tmpl.harness.catalog import npm

from .harness_util import TEMPLATES, run_harness, shell_command

SPEC = npm.HARNESSES["claude-code"]


@pytest.mark.parametrize("family", TEMPLATES)
def test_claude_code_runs_through_the_gateway(family, tmp_path, monkeypatch):
    out = run_harness(
        SPEC, family, "Bash", {"command": shell_command(), "description": "Write the file"}, tmp_path, monkeypatch
    )
    # beyond its main loop: a HEAD probe of the base URL (answered 200), no side calls in -p mode
    assert {(m, p) for m, p, _ in out.served.routes} == {("HEAD", "/s/h1"), ("POST", "/s/h1/v1/messages")}
    bodies = [a.body for a in out.served.arrivals if a.dialect == "anthropic"]
    assert len(bodies) == len(out.served.arrivals) >= 2  # only the Messages route: no other dialect
    main = [b for b in bodies if any(t["name"] == "Bash" for t in b.get("tools") or [])]
    assert main and all(b["stream"] for b in main)  # its main loop streams
    # the result it sent back answers the call the gateway returned, by its id
    results = [
        blk
        for b in main
        for m in b["messages"]
        if isinstance(m["content"], list)
        for blk in m["content"]
        if blk["type"] == "tool_result"
    ]
    assert results and results[0]["tool_use_id"] in {
        blk["id"]
        for b in main
        for m in b["messages"]
        if m["role"] == "assistant" and isinstance(m["content"], list)
        for blk in m["content"]
        if blk["type"] == "tool_use"
    }
