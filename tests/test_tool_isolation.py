"""Tools are untrusted code: hangs, exits, segfaults, memory hogs, floods and chatter each end as
their own tool message, the other samples finish unharmed, and the pools stay within their size.

Real tokenizer and template (Qwen2.5), Scripted backend (as tests/test_rollout.py). No timing
asserts: a tool that is not stopped shows up as a test that never ends.
"""

from __future__ import annotations

import gc
import multiprocessing
import threading
import time

import pytest

import tmpl
from tmpl.backends import Scripted
from tmpl.errors import ToolboxError, ToolIsolationError

from . import test_tool_isolation_tools as hostile

RELEASE = threading.Event()  # lets the thread-mode hangs end when the module is done
WORKERS = 3
EXPECTED = {  # tool -> what its message says
    "hang": "Error: hang timed out after 2 s",
    "hang_async": "Error: hang_async timed out after 2 s",
    "exits": "Error: exits crashed: its worker process exited with code 3",
    "segfaults": "Error: segfaults crashed: its worker process was killed by SIGSEGV",
    "allocates": "Error: allocates crashed: it ran out of its memory limit of 256 MB",
    "floods": "\n[tool output cut: ",
    "chatty": "Paris: said it all",
    "get_weather": "Paris: 21 C, sunny",
}
KINDS = {"hang": "timeout", "hang_async": "timeout", "exits": "crashed", "segfaults": "crashed", "allocates": "crashed"}


def hang_in_thread(city: str) -> str:
    """A sync tool that hangs until the module's tests are done.

    Args:
        city: The city.
    """
    RELEASE.wait(600)
    return "late"


@pytest.fixture(scope="module", autouse=True)
def release_hung_threads():
    yield
    RELEASE.set()


def _tpl(tokenizer_of):
    return tmpl.ChatTemplate(tokenizer_of("qwen2.5-instruct"), name="qwen2.5")


def _policy(tpl, names):
    """Sample i calls ``names[i]`` once, then answers."""
    final = tpl.codec.encode("Done.<|im_end|>")
    calls = {
        name: tpl.codec.encode(
            f'<tool_call>\n{{"name": "{name}", "arguments": {{"city": "Paris"}}}}\n</tool_call><|im_end|>'
        )
        for name in set(names)
    }

    def policy(req):
        i, _, turn = req.request_id.split("-")[:3]
        return calls[names[int(i)]] if turn == "0" else final

    return policy


def _run(tpl, box, names, **kwargs):
    rollout = tmpl.Rollout(tpl, Scripted(_policy(tpl, names)), tools=box, max_turns=3, **kwargs)
    results = rollout.run([[{"role": "user", "content": f"Weather, question {i}?"}] for i in range(len(names))])
    return rollout, results


def _tool_message(result):
    [msg] = [m for m in result.messages if m["role"] == "tool"]
    return msg["content"]


def _pool_processes():
    return [p for p in multiprocessing.active_children() if p.name == "tmpl-tool-process"]


def _pool_threads(name):
    return [t for t in threading.enumerate() if t.name == name and t.is_alive()]


def test_process_isolation_every_hostile_tool_ends_as_its_message(tokenizer_of, capfd):
    tpl = _tpl(tokenizer_of)
    box = tmpl.Toolbox(hostile.ALL, isolation="process", workers=WORKERS, timeout=2.0, memory_mb=256)
    names = [t.__name__ for t in hostile.HOSTILE] + ["get_weather"] * 9
    rollout, results = _run(tpl, box, names, max_length=8192, max_completion_length=4096)
    for name, r in zip(names, results):
        content = _tool_message(r)
        assert content.startswith(EXPECTED[name]) or (name == "floods" and EXPECTED[name] in content), (name, content)
        assert r.tool_failure_kinds.get(KINDS.get(name, "none"), 0) == (name in KINDS), (name, r.tool_failure_kinds)
        if name == "floods":  # cut to what its sample had left, so its suffix overflowed the budget by a little
            assert content.endswith("of 52428800 characters shown]")
            assert len(tpl.codec.encode(content)) <= 4096 and r.status.name == "TRUNCATED"
        else:
            assert r.status.name == "DONE" and r.turns == 2, (name, r.reason)
    assert rollout.metrics.to_dict()["rollout/tool_outputs_cut"] == 1
    assert rollout.metrics.to_dict()["rollout/tool_failures/crashed"] == 3
    assert "CHATTER" not in capfd.readouterr().out  # a worker's stdout is not the trainer's
    # every worker that failed was replaced; never more workers or dispatchers than configured
    assert box.pool.started > WORKERS
    assert box.pool.processes <= WORKERS and len(_pool_processes()) <= WORKERS
    assert box.pool.threads <= WORKERS and len(_pool_threads("tmpl-tool-process")) <= WORKERS
    assert box.hung_threads == 0
    # the pool goes on: the same Toolbox answers a second batch, hostile calls included
    again = box.run_batch(
        [[{"name": "exits", "arguments": {"city": "x"}}], [{"name": "get_weather", "arguments": {"city": "Rome"}}]]
    )
    assert again.messages[0][0]["content"].startswith(EXPECTED["exits"])
    assert again.messages[1][0]["content"] == "Rome: 21 C, sunny" and again.metrics.failures["crashed"] == 1
    box.close()
    assert _pool_processes() == [] and _pool_threads("tmpl-tool-process") == []


def test_thread_isolation_bounds_hung_threads_and_cuts_floods(tokenizer_of, monkeypatch):
    tpl = _tpl(tokenizer_of)
    box = tmpl.Toolbox(
        [hang_in_thread, hostile.hang_async, hostile.floods, hostile.chatty, hostile.get_weather],
        timeout=3.0,  # generous: on a loaded 2-core machine a queued ordinary call must not reach it
        max_hung=2,
    )
    longest = {"n": 0}
    real = tpl.codec._encode_ids, tpl.codec._encode

    def watch(fn):
        def wrapped(texts, *args, **kwargs):
            for t in [texts] if isinstance(texts, str) else texts:
                longest["n"] = max(longest["n"], len(t) if isinstance(t, str) else 0)
            return fn(texts, *args, **kwargs)

        return wrapped

    # the codec is the tokenizer's, shared by the session's tests: watched through monkeypatch, undone after
    monkeypatch.setattr(tpl.codec, "_encode_ids", watch(real[0]))
    monkeypatch.setattr(tpl.codec, "_encode", watch(real[1]))
    fast = tpl.codec.fast  # text (the flood too) is encoded here, not by the backend, where it serves
    if fast is not None:
        monkeypatch.setattr(fast, "encode", watch(fast.encode))
    names = ["hang_in_thread"] * 3 + ["hang_async", "floods", "chatty"] + ["get_weather"] * 4
    rollout, results = _run(tpl, box, names, max_length=4096, max_completion_length=2048)
    for name, r in zip(names, results):
        content = _tool_message(r)
        if name == "hang_in_thread":
            assert content == "Error: hang_in_thread timed out after 3 s"
        elif name == "hang_async":
            assert content == "Error: hang_async timed out after 3 s" and r.status.name == "DONE"
        elif name == "floods":
            assert content.endswith("of 52428800 characters shown]") and len(tpl.codec.encode(content)) <= 2048
        else:
            assert content == EXPECTED[name] and r.status.name == "DONE"
    # nothing tokenized megabytes: the flood was cut to 1,000,000 characters, then tokenized a head only
    assert longest["n"] < 2048 * 128 and rollout.metrics.to_dict()["rollout/tool_outputs_cut"] == 1
    assert box.hung_threads == 3
    # the bound: with 3 calls of hang_in_thread hung (max_hung=2), its next calls are refused, no thread starts
    _, again = _run(tpl, box, ["hang_in_thread"] * 4 + ["get_weather"], max_length=4096)
    assert [_tool_message(r) for r in again[:4]] == [
        "Error: hang_in_thread was not run: 2 earlier calls of it still hang past their timeout"
    ] * 4
    assert again[0].tool_failure_kinds == {"refused": 1} and _tool_message(again[4]) == EXPECTED["get_weather"]
    assert box.hung_threads == 3
    box.close()  # idle workers end now; the three hung ones stay (a thread cannot be killed)
    for _ in range(200):
        if box._workers.threads <= 3:
            break
        time.sleep(0.05)
    assert box._workers.threads == 3
    RELEASE.set()


def test_tools_that_cannot_reach_a_worker_are_a_typed_error_and_a_factory_builds_them_there():
    def get_weather(city: str) -> str:
        """Current weather.

        Args:
            city: The city.
        """
        return "local"

    with pytest.raises(ToolIsolationError) as err:
        tmpl.Toolbox([hostile.chatty, get_weather], isolation="process")
    assert err.value.tool == "get_weather" and "worker_tools" in str(err.value)
    assert isinstance(err.value, ToolboxError)
    # the local function gives the schema; the worker builds its own get_weather from the factory
    with tmpl.Toolbox([get_weather], isolation="process", workers=1, worker_tools=hostile.make_tools) as box:
        out = box.run_batch([[{"name": "get_weather", "arguments": {"city": "Oslo"}}]])
        assert out.messages[0][0]["content"] == "Oslo: 21 C, sunny" and out.outcomes[0][0].output == "Oslo: 21 C, sunny"

    def missing(city: str) -> str:
        """Not in the factory.

        Args:
            city: The city.
        """
        return ""

    with pytest.raises(ToolIsolationError) as err:
        tmpl.Toolbox([missing], isolation="process", workers=1, worker_tools=hostile.make_tools)
    assert err.value.tool == "missing" and "lack missing" in str(err.value)
    with pytest.raises(ToolIsolationError) as err:
        tmpl.Toolbox([get_weather], isolation="process", worker_tools=lambda: [get_weather])
    assert "worker_tools does not pickle" in str(err.value)
    with pytest.raises(ToolboxError, match="isolation must be one of"):
        tmpl.Toolbox([hostile.chatty], isolation="container")


def test_outputs_are_cut_on_characters_then_exactly_in_tokens(tokenizer_of):
    from tmpl.tools.outputs import body, cut_chars, cut_to_tokens

    codec = _tpl(tokenizer_of).codec
    text = "The quick brown fox jumps over the lazy dog. " * 50_000
    cut = cut_to_tokens(codec, text, 1000)
    assert cut is not None and cut.endswith(f"of {len(text)} characters shown]")
    assert 990 <= len(codec.encode(cut)) <= 1000 and text.startswith(body(cut, len(text)))
    assert cut_to_tokens(codec, "short", 1000) is None
    # an output cut on characters before keeps its first total in the marker
    pre = cut_chars(text, 100_000)
    again = cut_to_tokens(codec, body(pre, len(text)), 1000, len(text))
    assert (
        again is not None and again.endswith(f"of {len(text)} characters shown]") and len(codec.encode(again)) <= 1000
    )
    # a text made of the vocabulary's longest tokens still ends within budget
    spaces = " " * 300_000
    cut = cut_to_tokens(codec, spaces, 500)
    assert cut is not None and len(codec.encode(cut)) <= 500


def test_queued_calls_keep_their_deadline_and_cpu_hogs_meet_their_limit():
    # one worker, three hanging calls: the first is killed at its timeout; the other two, still
    # queued at theirs, are answered as timed out without a worker being started for them
    with tmpl.Toolbox(hostile.ALL, isolation="process", workers=1, timeout=1.0) as box:
        out = box.run_batch([[{"name": "hang", "arguments": {"city": "x"}}]] * 3)
        assert [m[0]["content"] for m in out.messages] == ["Error: hang timed out after 1 s"] * 3
        assert out.metrics.timeouts == 3 and box.pool.started == 1 and box.pool.processes == 0
    # CPU time is limited per call, even when the wall-clock timeout is far away
    spin = [hostile.spins, hostile.get_weather]
    with tmpl.Toolbox(spin, isolation="process", workers=1, timeout=120.0, cpu_seconds=1) as box:
        out = box.run_batch(
            [[{"name": "spins", "arguments": {"city": "x"}}], [{"name": "get_weather", "arguments": {"city": "Rome"}}]]
        )
        assert out.messages[0][0]["content"] == (
            "Error: spins crashed: its worker process was killed by SIGXCPU (its CPU time limit of 1 s)"
        )
        assert out.messages[1][0]["content"] == "Rome: 21 C, sunny" and out.outcomes[0][0].error == "crashed"


def test_a_dropped_toolbox_leaves_no_workers():
    box = tmpl.Toolbox([hostile.get_weather], isolation="process", workers=2)
    box.run_batch([[{"name": "get_weather", "arguments": {"city": "Oslo"}}]] * 4)
    pool = box.pool
    assert 1 <= pool.processes <= 2
    del box
    gc.collect()
    assert pool.processes == 0 and pool.threads == 0


def test_a_long_completion_is_parsed_off_the_event_loop(tokenizer_of, monkeypatch):
    """Item 3 of issue 29 for parsing: a completion past PARSE_OFF_LOOP tokens is parsed on a worker
    thread (the loop serves the other samples meanwhile); an ordinary one in place. Both parse the same."""
    from tmpl.rollout import loop

    tpl = _tpl(tokenizer_of)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    long = tpl.codec.encode("Let me think. " * 1500 + call)
    short = tpl.codec.encode(call)
    assert len(long) > loop.PARSE_OFF_LOOP > len(short)
    final = tpl.codec.encode("Done.<|im_end|>")
    seen: list[tuple[int, bool]] = []  # (completion length, parsed on the loop's thread)

    def policy(req):
        i, _, turn = req.request_id.split("-")[:3]
        return (long if i == "0" else short) if turn == "0" else final

    box = tmpl.Toolbox([hostile.get_weather])
    rollout = tmpl.Rollout(tpl, Scripted(policy), tools=box, max_turns=2, max_length=16384, max_completion_length=12000)
    real = rollout._read  # the rollout's parser of each turn's completion

    def watched(ids, **kwargs):
        seen.append((len(ids), threading.current_thread() is threading.main_thread()))
        return real(ids, **kwargs)

    monkeypatch.setattr(rollout, "_read", watched)
    results = rollout.run([[{"role": "user", "content": f"Weather, question {i}?"}] for i in range(2)])
    assert [r.status.name for r in results] == ["DONE", "DONE"]
    assert [_tool_message(r) for r in results] == [EXPECTED["get_weather"]] * 2  # the long one's call was found
    assert (len(long), False) in seen and (len(short), True) in seen
    assert all(on_loop == (n <= loop.PARSE_OFF_LOOP) for n, on_loop in seen)
    box.close()
