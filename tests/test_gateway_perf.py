"""The gateway's hot-path pieces of issue #52 (benchmarks/gateway.py --agents): cheap checks, no HTTP server.

- :class:`tmpl.gateway.loopwatch.LoopWatch` sees a loop held by a blocking call, and ``GET /metrics`` shows it;
- :mod:`tmpl.gateway.jsonio` reads and writes what ``json`` does (msgspec, with ``json`` where msgspec refuses);
- the durable store's :func:`~tmpl.gateway.durable.resume.same_value` (a message sent again is compared, not
  hashed again) agrees with the digest it stands for;
- only a lineage's newest head keeps its prompt as a list of ints, and a client retrying an older turn (the
  head without one) still gets the template's full render of its history as the prompt.
"""

from __future__ import annotations

import asyncio
import json
import math
import time

import pytest

import tmpl
from tmpl.backends import Scripted
from tmpl.gateway import CallParams, Gateway
from tmpl.gateway.durable.resume import digest, same_value
from tmpl.gateway.jsonio import dumps, exact_dumps, loads
from tmpl.gateway.loopwatch import LoopWatch

from .conftest import load_tokenizer
from .gateway_util import full_render_ids
from .test_gateway import TOOLS

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'


def test_the_loop_watch_sees_a_blocking_call_and_nothing_when_the_loop_is_free():
    async def run(block: float) -> LoopWatch:
        watch = LoopWatch(every=0.002, threshold=0.010)
        watch.start()
        await asyncio.sleep(0.03)
        if block:
            time.sleep(block)  # the loop held, as a full collection or a long parse holds it
        await asyncio.sleep(0.03)
        watch.stop()
        return watch

    held = asyncio.run(run(0.08))
    assert held.over >= 1 and 0.07 <= held.longest < 1.0, held.report()
    assert any(p >= 0.07 for _, p in held.pauses)
    assert held.report()["over"] == held.over and held.report()["longest_ms"] >= 70
    with pytest.raises(ValueError, match="every"):
        LoopWatch(every=0)


@pytest.fixture(scope="module")
def tpl():
    return tmpl.ChatTemplate(load_tokenizer("qwen2.5-instruct"))


def test_metrics_reports_the_loop_and_the_collector(tpl):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi", reason="FastAPI is not installed (pip install -e '.[gateway]')")
    from tmpl.gateway import create_app

    app = create_app(Gateway(tpl, Scripted(lambda req: [tpl.stop_token_ids[0]])))

    async def go() -> dict:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            await client.get("/metrics")  # starts the watch on this loop
            await asyncio.sleep(0.02)  # its first wakes
            time.sleep(0.05)
            await asyncio.sleep(0.02)
            return (await client.get("/metrics")).json()

    body = asyncio.run(go())
    assert body["loop"]["over"] >= 1 and body["loop"]["longest_ms"] >= 40, body
    assert len(body["gc"]) == 3 and body["sessions"] == 0


@pytest.mark.parametrize(
    "raw",
    [
        b'{"messages": [{"role": "user", "content": "caf\\u00e9 \\ud83d\\ude00"}], "temperature": 0.7}',
        b'{"x": NaN, "y": -Infinity}',  # json takes these, msgspec does not
        b'{"s": "\\ud800"}',  # a lone surrogate: json's str, msgspec's error
        b'{"n": 123456789012345678901234567890}',  # past 64 bits: an int still (orjson reads a float)
        b'[1e-05, -0.0, 1.5e300, "\\u0000"]',
    ],
)
def test_loads_reads_what_json_reads(raw):
    ours, theirs = loads(raw), json.loads(raw)
    assert json.dumps(ours) == json.dumps(theirs)  # NaN-safe comparison, types and order included


@pytest.mark.parametrize("raw", [b'{"a": 1,}', b"", b'{"a": "\xff"}', b"[" * 5000])
def test_loads_refuses_what_json_refuses(raw):
    with pytest.raises((ValueError, RecursionError)):
        json.loads(raw)
    with pytest.raises((ValueError, RecursionError)):
        loads(raw)


def test_dumps_writes_what_json_reads_back_the_same():
    value = {"a": [1, 2.5, None, True, 1e-05], "é": 'ü\n"', "n": {1: "int key"}, "big": 2**70, "t": (1, 2)}
    expected = json.loads(json.dumps(value, default=str))
    assert json.loads(dumps(value)) == expected
    nan = json.loads(exact_dumps({"r": float("nan")}))["r"]
    assert math.isnan(nan)  # a reward's NaN is kept as NaN, where msgspec writes null


def test_same_value_agrees_with_the_digest():
    pairs = [
        ({"role": "tool", "content": "x" * 5000}, {"role": "tool", "content": "x" * 5000}),
        ({"n": 1}, {"n": 1.0}),
        ({"n": True}, {"n": 1}),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        ({"v": 0.0}, {"v": -0.0}),
        ({"c": [{"id": "1", "f": {"x": "y"}}]}, {"c": [{"id": "1", "f": {"x": "y"}}]}),
        ({"c": [1, 2]}, {"c": (1, 2)}),
        ({"v": float("nan")}, {"v": float("nan")}),
    ]
    for a, b in pairs:
        if same_value(a, b):
            assert digest(a) == digest(b), (a, b)
    assert same_value(*pairs[0]) and same_value(*pairs[5])
    assert not any(same_value(a, b) for a, b in pairs[1:5])


def test_only_the_newest_head_keeps_a_list_and_a_retry_of_an_older_turn_is_the_full_render(tpl):
    tok = tpl.tokenizer
    call_ids = tok.encode(CALL, add_special_tokens=False)
    gateway = Gateway(tpl, Scripted(lambda req: call_ids))

    async def episode() -> list[list[dict]]:
        messages: list[dict] = [{"role": "user", "content": "Weather in Paris, three times?"}]
        histories = []
        for t in range(3):
            done = await gateway.complete("s", messages, TOOLS, CallParams(max_tokens=64))
            reply = done.replies[0].message
            result = {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": f"{20 + t} C"}
            messages = [*messages, reply, result]
            histories.append(messages)
        # a retry of the second call's continuation: its head is an older one now
        retry = await gateway.complete("s", histories[0], TOOLS, CallParams(max_tokens=64))
        assert retry.plan.mode == "append"
        assert retry.plan.prompt_ids == full_render_ids(tok, histories[0], TOOLS)
        return histories

    asyncio.run(episode())
    session = gateway.session("s")
    heads = list(session.lineages.values())[0].heads
    assert len(heads) == 4
    assert [h.prompt is None for h in heads] == [True, True, True, False]
    calls = {c.id: c for c in session.episode.calls}
    for h in heads:  # the array holds what the list held: the call's prompt, then what it sampled
        call = calls[h.call]
        assert h.ids() == h.array.tolist() == call.prompt_ids.tolist() + call.completion_ids.tolist()
