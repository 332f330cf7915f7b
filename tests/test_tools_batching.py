"""A tick's sync tool calls go to the worker pool as one lot, and come back through one inbox.

``Toolbox.start_batch`` (what a rollout's tool round calls once per pass of the event loop) hands
every sync call of every sample to :meth:`WorkerPool.put` at once; workers post answers to the
batch's inbox, which wakes the loop once per drain instead of once per call. What each sample gets
(its outcomes, in call order) is what it got one call at a time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

import tmpl
from tmpl.toolcalls import ToolCall
from tmpl.tools.toolbox import _Batch
from tmpl.tools.workers import WorkerPool


def square(n: int) -> int:
    """Square a number.

    Args:
        n: The number.
    """
    return n * n


def fail(n: int) -> int:
    """Always fails.

    Args:
        n: Ignored.
    """
    raise ValueError(f"no {n}")


def call(name: str, args: dict, cid: str) -> ToolCall:
    return ToolCall(id=cid, name=name, arguments=args, raw="")


def test_pool_put_runs_every_call_and_wakes_workers_once():
    pool = WorkerPool()
    futures: list[concurrent.futures.Future[int]] = [concurrent.futures.Future() for _ in range(50)]
    pool.put([(lambda k=k: k * 3, f) for k, f in enumerate(futures)])
    assert [f.result(timeout=10) for f in futures] == [k * 3 for k in range(50)]
    pool.put([])  # nothing to do: no error, no thread
    pool.close()


@pytest.mark.parametrize("concurrency", [1000, 16])
def test_start_batch_puts_one_lot_and_drains_answers_in_few_wakeups(monkeypatch, concurrency):
    """All calls in one lot (when max_concurrency allows; else the first max_concurrency, then
    those that waited go in lots as answers free their slots)."""
    box = tmpl.Toolbox([square, fail], timeout=10.0, max_concurrency=concurrency)
    puts: list[int] = []
    drains: list[int] = []
    real_put, real_drain = WorkerPool.put, _Batch._drain

    def put(self, calls):
        puts.append(len(calls))
        return real_put(self, calls)

    def drain(self):
        drains.append(len(self.inbox))
        return real_drain(self)

    monkeypatch.setattr(WorkerPool, "put", put)
    monkeypatch.setattr(_Batch, "_drain", drain)
    samples = [
        [call("square", {"n": b}, f"s{b}")] + ([call("fail", {"n": b}, f"f{b}")] if b % 3 == 0 else [])
        for b in range(120)
    ]
    samples.append([call("square", {"m": 1}, "bad")])  # wrong arguments: answered without the pool
    calls = sum(len(s) for s in samples) - 1

    async def main():
        futures = box.start_batch(samples)
        return await asyncio.gather(*futures)

    outcomes = asyncio.run(main())
    if concurrency >= calls:
        assert puts == [calls], "the batch's sync calls went to the pool in more than one lot"
    else:
        assert puts[0] == concurrency and sum(puts) == calls
    assert sum(drains) == calls and len(drains) <= calls
    for b, got in enumerate(outcomes[:-1]):
        assert got[0].content == str(b * b) and got[0].error is None
        if b % 3 == 0:
            assert got[1].error == "exception" and f"no {b}" in got[1].content
        else:
            assert len(got) == 1
    assert outcomes[-1][0].error == "bad_arguments"
    # each answer is the one a batch of one gives
    alone = box.run_batch([[call("square", {"n": 7}, "x")]]).outcomes[0][0]
    assert alone.content == outcomes[7][0].content
    box.close()


def test_an_answer_after_the_loop_is_gone_is_dropped_quietly():
    """A call that outlives its loop (it hung past its timeout) answers into a closed loop: no error."""
    release = threading.Event()

    def hang(n: int) -> int:
        """Wait for the test.

        Args:
            n: Returned.
        """
        release.wait(10)
        return n

    box = tmpl.Toolbox([hang], timeout=0.2)
    result = box.run_batch([[call("hang", {"n": 1}, "h")]])
    assert result.outcomes[0][0].error == "timeout"
    release.set()  # the worker answers now, into the finished loop's inbox
    box.close()


def test_a_lot_inside_a_lot_goes_with_the_outer_one(monkeypatch):
    box = tmpl.Toolbox([square], timeout=10.0)
    puts: list[int] = []
    real_put = WorkerPool.put

    def put(self, calls):
        puts.append(len(calls))
        return real_put(self, calls)

    monkeypatch.setattr(WorkerPool, "put", put)

    async def main():
        batch = _Batch(box, asyncio.get_running_loop())
        with batch.together():
            first = batch.start(call("square", {"n": 2}, "a"))
            with batch.together():
                second = batch.start(call("square", {"n": 3}, "b"))
            assert puts == []  # nothing handed over before the outer block ends
        return await first, await second

    first, second = asyncio.run(main())
    assert puts == [2] and (first.content, second.content) == ("4", "9")
    box.close()


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text for this")


def unprintable(n: int) -> object:
    """Returns something that cannot become text.

    Args:
        n: Ignored.
    """
    return Unprintable()


def test_a_result_that_cannot_become_text_is_answered_as_a_failure():
    """A tool whose return value's ``str()`` raises: its call is answered (a failure naming the error),
    the batch ends, the other calls keep their answers (it used to wait forever)."""
    box = tmpl.Toolbox([square, unprintable], timeout=5.0)

    async def main():
        futures = box.start_batch([[call("unprintable", {"n": 1}, "u"), call("square", {"n": 3}, "s")]])
        return await asyncio.wait_for(asyncio.gather(*futures), 20)

    [[bad, good]] = asyncio.run(main())
    assert bad.error == "exception" and "no text for this" in bad.content
    assert good.error is None and good.content == "9"
    box.close()


def test_on_done_hands_each_sample_on_once_without_a_loop_callback():
    """``start_batch(samples, on_done)``: called once per sample, the moment its last call is answered,
    with its future already done (outcomes in call order); a sample whose calls all fail at once
    (an unknown tool) is handed on before start_batch returns. No callback per call or per sample is
    scheduled on the loop for it."""
    box = tmpl.Toolbox([square, fail], timeout=10.0)
    samples = [
        [call("square", {"n": 2}, "a"), call("fail", {"n": 1}, "b")],
        [call("nope", {}, "c")],
        [],
        [call("square", {"n": k}, f"d{k}") for k in range(5)],
    ]
    handed: list[tuple[int, list]] = []

    async def main():
        loop = asyncio.get_running_loop()
        scheduled = []
        real = loop.call_soon

        def call_soon(callback, *args, **kwargs):
            scheduled.append(getattr(callback, "__qualname__", repr(callback)))
            return real(callback, *args, **kwargs)

        loop.call_soon = call_soon
        futures = box.start_batch(samples, lambda i, future: handed.append((i, future.result())))
        returned = sorted(i for i, _ in handed)
        await asyncio.wait_for(asyncio.gather(*futures), 20)
        loop.call_soon = real
        return futures, returned, scheduled

    futures, at_return, scheduled = asyncio.run(main())
    assert at_return == [1, 2]  # answered while starting: the unknown tool, the sample with no calls
    assert sorted(i for i, _ in handed) == [0, 1, 2, 3] and len(handed) == 4
    by_sample = dict(handed)
    assert [o.content for o in by_sample[3]] == ["0", "1", "4", "9", "16"]
    assert [o.error for o in by_sample[0]] == [None, "exception"] and by_sample[1][0].error == "unknown_tool"
    assert by_sample[2] == [] and all(f.done() and f.result() == by_sample[i] for i, f in enumerate(futures))
    ours = [n for n in scheduled if not n.startswith(("gather.", "Task.")) and "_release_waiter" not in n]
    assert ours == [], ours  # asyncio.gather's own callbacks (this test's wait) aside: none
    box.close()
