"""Toolbox: schemas from callables, concurrent runs with timeouts, errors as messages, metrics.

Timing asserts use generous bounds: they only need to tell "concurrent" from "one after another"
and "stopped by the timeout" from "waited for the tool".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading
import time

import pytest
from transformers.utils import get_json_schema

import tmpl
from tmpl.errors import ToolboxError, ToolSchemaError
from tmpl.toolcalls import ParseError, ToolCall, parse_completion
from tmpl.tools import FAILURE_KINDS, CallOutcome

from .toolcalls_data import assistant_message, chat_template, completion_ids

RELEASE = threading.Event()  # lets hung sync tools finish when the module's tests are done


def get_weather(city: str, days: int = 1) -> str:
    """Weather forecast for a city.

    Args:
        city: The city name.
        days: How many days ahead.
    """
    if city == "Atlantis":
        raise ValueError("no such city")
    return f"{city}: sunny for {days} day(s)"


async def search(query: str, limit: int = 3) -> dict:
    """Search the web.

    Args:
        query: What to look for.
        limit: Maximum number of results.
    """
    await asyncio.sleep(0.01)
    return {"query": query, "results": [f"r{i}" for i in range(limit)]}


async def nap(seconds: float) -> float:
    """Sleep asynchronously.

    Args:
        seconds: How long.
    """
    await asyncio.sleep(seconds)
    return seconds


def doze(seconds: float) -> float:
    """Sleep in a thread.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return seconds


def hang() -> str:
    """A sync tool that never returns on its own."""
    RELEASE.wait(30)
    return "late"


async def hang_async() -> str:
    """An async tool that never returns on its own."""
    await asyncio.sleep(30)
    return "late"


def nothing() -> None:
    """Returns None."""


@pytest.fixture(scope="module", autouse=True)
def release_hung_threads():
    yield
    RELEASE.set()


def call(name, args=None, cid=None):
    return ToolCall(id=cid or f"id{name[:6]}", name=name, arguments=args or {}, raw="")


def test_schemas_come_from_type_hints_and_docstrings():
    box = tmpl.Toolbox([get_weather, search])
    assert box.schemas == [get_json_schema(get_weather), get_json_schema(search)]
    assert box.names == ["get_weather", "search"] and "search" in box and len(box) == 2
    # the same list feeds tools= of a template
    tpl = chat_template("qwen3")
    prompt = tpl.codec.decode(tpl.prompt_ids([{"role": "user", "content": "hi"}], tools=box.schemas))
    assert '"name": "get_weather"' in prompt and "How many days ahead." in prompt
    assert tmpl.Toolbox([(get_weather, box.schemas[0])]).schemas == [box.schemas[0]]
    # the Toolbox itself can be passed as tools= (it iterates as its schemas)
    messages = [{"role": "user", "content": "hi"}]
    assert tpl.prompt_ids(messages, tools=box) == tpl.prompt_ids(messages, tools=box.schemas)
    assert tpl.prompt_ids(messages, tools=[get_weather, search]) == tpl.prompt_ids(messages, tools=box.schemas)


def test_results_errors_and_order_per_sample():
    box = tmpl.Toolbox([get_weather, search, nothing], timeout=5)
    samples = [
        [
            call("get_weather", {"city": "Paris", "days": "2"}, "a1"),
            call("search", {"query": "cats", "limit": 2}, "a2"),
            call("nothing", cid="a3"),
        ],
        [
            call("get_weather", {"city": "Atlantis"}, "b1"),
            call("fly", {}, "b2"),
            call("get_weather", {"town": "x"}, "b3"),
            ParseError("bad_json", "arguments are not valid JSON", raw="<tool_call>{", name="search", id="b4"),
        ],
        [],
    ]
    result = box.run_batch(samples)
    assert len(result) == 3 and result.stop == [False, False, False]
    first = result.messages[0]
    assert [m["tool_call_id"] for m in first] == ["a1", "a2", "a3"]
    assert first[0] == {
        "role": "tool",
        "tool_call_id": "a1",
        "name": "get_weather",
        "content": "Paris: sunny for 2 day(s)",
    }
    assert first[1]["content"] == '{"query": "cats", "results": ["r0", "r1"]}' and first[2]["content"] == ""
    second = [m["content"] for m in result.messages[1]]
    assert second[0] == "Error: get_weather raised ValueError: no such city"
    assert second[1] == "Error: unknown tool 'fly'; available: get_weather, search, nothing"
    assert second[2].startswith("Error: wrong arguments for get_weather:") and "city" in second[2]
    assert second[3].startswith("Error: the tool call to 'search' could not be read (arguments are not valid JSON)")
    assert [m["tool_call_id"] for m in result.messages[1]] == ["b1", "b2", "b3", "b4"]
    assert result.messages[2] == []
    m = result.metrics
    assert (m.calls, m.ok, m.failed, m.samples, m.samples_with_calls) == (7, 3, 4, 3, 2)
    assert m.failures == {
        "malformed_call": 1,
        "unknown_tool": 1,
        "bad_arguments": 1,
        "exception": 1,
        "timeout": 0,
        "crashed": 0,
        "refused": 0,
    }
    assert set(m.failures) == set(FAILURE_KINDS)
    assert m.as_dict()["tools/failures/unknown_tool"] == 1 and m.mean_latency >= 0


def test_on_error_stop_marks_the_sample():
    box = tmpl.Toolbox([get_weather], on_error="stop")
    result = box.run_batch([[call("get_weather", {"city": "Paris"})], [call("get_weather", {"city": "Atlantis"})]])
    assert result.stop == [False, True] and result.metrics.samples_stopped == 1
    assert result.messages[1][0]["content"].startswith("Error:")  # still answered, nothing dropped


def test_a_hanging_sync_tool_is_stopped_by_its_timeout():
    box = tmpl.Toolbox([hang, get_weather], timeout=0.2)
    start = time.perf_counter()
    result = box.run_batch([[call("hang"), call("get_weather", {"city": "Oslo"})], [call("hang")]])
    elapsed = time.perf_counter() - start
    assert elapsed < 3.0  # the tool would block for 30 s
    assert result.messages[0][0]["content"] == "Error: hang timed out after 0.2 s"
    assert result.messages[0][1]["content"] == "Oslo: sunny for 1 day(s)"
    assert result.metrics.timeouts == 2 and result.metrics.failures["timeout"] == 2
    assert result.metrics.hung_threads >= 2 and box.hung_threads >= 2


def test_a_hanging_async_tool_is_cancelled_and_per_tool_timeouts():
    box = tmpl.Toolbox([hang_async, nap], timeout=5.0, timeouts={"hang_async": 0.2})
    start = time.perf_counter()
    result = box.run_batch([[call("hang_async"), call("nap", {"seconds": 0.05})]])
    assert time.perf_counter() - start < 3.0
    assert [o.error for o in result.outcomes[0]] == ["timeout", None]
    assert result.outcomes[0][1].output == 0.05


def test_thousand_async_calls_finish_in_about_the_time_of_the_slowest():
    box = tmpl.Toolbox([nap], timeout=10.0, max_concurrency=1000)
    samples = [[call("nap", {"seconds": 0.2}, f"s{b}c{j}") for j in range(10)] for b in range(100)]
    start = time.perf_counter()
    result = box.run_batch(samples)
    elapsed = time.perf_counter() - start
    assert result.metrics.calls == 1000 and result.metrics.ok == 1000
    # one after another: 200 s; 100 at a time: 2 s. Concurrent ones take ~0.2 s plus overhead (a loaded
    # 2-core machine stretches that), so the bound tells concurrency from serial, not speed.
    assert elapsed < 20, f"1000 calls of 0.2 s took {elapsed:.2f} s: they did not all run at once"
    assert [m["tool_call_id"] for m in result.messages[7]] == [f"s7c{j}" for j in range(10)]


def test_sync_tools_run_concurrently_within_max_concurrency():
    box = tmpl.Toolbox([doze], timeout=10.0, max_concurrency=16)
    start = time.perf_counter()
    result = box.run_batch([[call("doze", {"seconds": 0.2})] for _ in range(16)])
    assert time.perf_counter() - start < 2.0 and result.metrics.ok == 16  # serially: 3.2 s
    assert 0.15 < result.metrics.mean_latency < 2.0


def test_async_twin_and_use_inside_a_running_loop():
    box = tmpl.Toolbox([search, get_weather])

    async def main():
        direct = await box.run_batch_async([[call("search", {"query": "x", "limit": 1})]])
        nested = box.run_batch([[call("get_weather", {"city": "Rome"})]])  # sync call from inside a loop
        return direct, nested

    direct, nested = asyncio.run(main())
    assert direct.messages[0][0]["content"] == '{"query": "x", "results": ["r0"]}'
    assert nested.messages[0][0]["content"] == "Rome: sunny for 1 day(s)"


def test_parsed_completions_run_end_to_end_into_suffix_ids():
    """Parse a real completion, run its calls, splice the results with the suffix engine:
    prompt + completion + suffix is the template's render of the whole conversation."""
    tpl = chat_template("qwen2.5-instruct")
    box = tmpl.Toolbox([get_weather, search])
    history = [{"role": "user", "content": "Weather in Paris, and cats?"}]
    assistant = assistant_message([("get_weather", {"city": "Paris", "days": 2}), ("search", {"query": "cats"})])
    rendered = completion_ids(tpl, assistant, tools=box.schemas, history=history)
    stop = next(i for i, t in enumerate(rendered) if t in tpl.stop_token_ids)
    completion = rendered[: stop + 1]  # generation ends at the stop token
    parsed = parse_completion(tpl, completion, tools=box)
    assert [c.name for c in parsed.tool_calls] == ["get_weather", "search"] and not parsed.errors
    result = box.run_batch([parsed])
    messages = result.messages[0]
    assert [m["content"] for m in messages] == [
        "Paris: sunny for 2 day(s)",
        '{"query": "cats", "results": ["r0", "r1", "r2"]}',
    ]
    assert [m["tool_call_id"] for m in messages] == [c.id for c in parsed.tool_calls]
    prompt = tpl.prompt_ids(history, tools=box.schemas)
    suffix = tpl.suffix_ids(messages, completion_ids=completion, tools=box.schemas)
    full = history + [parsed.to_message()] + messages
    assert prompt + completion + suffix == tpl.codec.encode(
        tpl.render(full, tools=box.schemas, add_generation_prompt=True)
    )


def test_misuse_is_a_typed_error():
    with pytest.raises(ToolboxError, match="on_error"):
        tmpl.Toolbox([get_weather], on_error="ignore")
    with pytest.raises(ToolboxError, match="timeout"):
        tmpl.Toolbox([get_weather], timeout=0)
    with pytest.raises(ToolboxError, match="two tools are named 'get_weather'"):
        tmpl.Toolbox([get_weather, get_weather])
    with pytest.raises(ToolboxError, match="timeouts given for tools that do not exist: nap"):
        tmpl.Toolbox([get_weather], timeouts={"nap": 1})

    def undocumented(x):
        return x

    with pytest.raises(ToolSchemaError, match="undocumented"):
        tmpl.Toolbox([undocumented])
    box = tmpl.Toolbox([get_weather])
    with pytest.raises(ToolboxError, match="one entry per sample"):
        box.run_batch(call("get_weather"))
    with pytest.raises(ToolboxError, match=r"samples\[0\]\[0\]"):
        box.run_batch([[42]])


def test_dict_calls_are_accepted():
    box = tmpl.Toolbox([get_weather])
    result = box.run_batch(
        [
            [
                {"id": "x1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lima"}'}},
                {"name": "get_weather", "arguments": "{'city': "},
                {"arguments": {}},
            ]
        ]
    )
    contents = [m["content"] for m in result.messages[0]]
    assert contents[0] == "Lima: sunny for 1 day(s)" and result.messages[0][0]["tool_call_id"] == "x1"
    assert contents[1].startswith("Error: the tool call to 'get_weather' could not be read")
    assert contents[2].startswith("Error: the tool call could not be read (the call has no tool name)")
    assert result.metrics.failures["malformed_call"] == 2


_SEEN = threading.local()
_THREADS = [0]


def count_thread(n: int) -> int:
    """Count the worker threads that ran calls (a new thread has fresh thread-local storage).

    Args:
        n: Any number.
    """
    if not getattr(_SEEN, "counted", False):
        _SEEN.counted = True
        _THREADS[0] += 1
    return n


def test_fast_sync_calls_reuse_worker_threads():
    """300 instant calls are served by reused workers, not a thread each; results stay in order."""
    box = tmpl.Toolbox([count_thread], timeout=10.0)
    _THREADS[0] = 0
    result = box.run_batch([[call("count_thread", {"n": b}, f"c{b}")] for b in range(300)])
    assert [m[0]["content"] for m in result.messages] == [str(b) for b in range(300)]
    assert result.metrics.ok == 300
    assert _THREADS[0] <= 32, f"{_THREADS[0]} threads for 300 instant calls"  # a thread per call: 300
    box.close()


def clock() -> float:
    """The time the call ran (perf_counter seconds)."""
    return time.perf_counter()


def test_a_stuck_worker_gets_company_and_bad_arguments_skip_the_pool():
    """A call that blocks its worker does not hold up the calls queued behind it."""
    box = tmpl.Toolbox([doze, clock, get_weather], timeout=10.0)
    start = time.perf_counter()
    result = box.run_batch([[call("doze", {"seconds": 1.0})], [call("clock")], [call("get_weather", {"town": "x"})]])
    assert time.perf_counter() - start < 5.0
    assert result.outcomes[1][0].output - start < 0.5  # it ran beside the dozing call, not after it
    assert result.outcomes[2][0].error == "bad_arguments" and result.outcomes[2][0].latency is None
    assert result.outcomes[0][0].output == 1.0


async def get_weather_async(city: str, days: int = 1) -> str:
    """Weather forecast for a city, from an async client.

    Args:
        city: The city name.
        days: How many days ahead.
    """
    return get_weather(city, days)


#: what an answered call is made of: its futures, its outcome, the call, the exception it raised
CALL_OBJECTS = (concurrent.futures.Future, asyncio.Future, CallOutcome, ToolCall, ValueError)


@pytest.mark.parametrize("tool", [get_weather, get_weather_async], ids=["sync", "async"])
def test_answered_calls_leave_nothing_for_the_garbage_collector(tool):
    """Answered calls (returned, raised, bad arguments) are freed by reference counting alone.

    A call in a reference cycle waits for the collector: at 4096 samples the collector's passes
    over ~30 objects a call were 15-18% of the rollout's time outside the engine.
    """
    box = tmpl.Toolbox([tool], timeout=10.0)
    name, cities = tool.__name__, ["Paris", "Atlantis", "Lima"]

    async def batch():
        samples = [[call(name, {"city": cities[b % 3]}, f"c{b}")] for b in range(200)]
        samples.append([call(name, {"town": "x"}, "bad")])
        return await box.run_batch_async(samples)

    async def main():
        await batch()  # warm: the worker thread, the loop's own structures
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds stays in gc.garbage, to be looked at
        try:
            result = await batch()
            gc.collect()
            # only the calls' own objects: threads of earlier tests may leave garbage of their own meanwhile
            found = [o for o in gc.garbage if isinstance(o, CALL_OBJECTS)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        return result, found

    result, found = asyncio.run(main())
    assert result.metrics.ok == 133 and result.metrics.failed == 68, result.metrics
    assert not found, f"{len(found)} objects of 201 answered calls were in reference cycles: {found[:3]}"
    box.close()
