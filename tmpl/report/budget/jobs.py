"""Running jobs under a budget: :func:`run_budgeted` (one call), :func:`run_job` (its outcome), and
:func:`imap_budgeted` (many items over a few workers, each tokenizer kept where it was loaded)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

from .limits import DEFAULT_BUDGET, Budget
from .worker import _STEAL_MIN, _STUCK_S, I, Outcome, T, Worker, _wait, in_worker


def run_budgeted(fn: Callable[..., T], *args: Any, budget: Budget | None = None, name: str = "job", **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a forked worker under ``budget`` (default :data:`DEFAULT_BUDGET`).

    The value comes back pickled (so it must pickle); an exception raised by ``fn`` is raised here;
    a budget that runs out raises :class:`~tmpl.errors.BudgetExceededError` naming ``name`` (the
    template). Inside a worker, ``fn`` simply runs (the worker's limits already hold).

    >>> run_budgeted(sum, [1, 2, 3], budget=Budget(seconds=5))
    6
    """
    if in_worker():
        return fn(*args, **kwargs)
    return run_job(fn, *args, budget=budget, name=name, **kwargs).get()  # type: ignore[no-any-return]


def run_job(
    fn: Callable[..., Any], *args: Any, budget: Budget | None = None, name: str = "job", **kwargs: Any
) -> Outcome[Any]:
    """Like :func:`run_budgeted`, but returns the :class:`Outcome` (with the worker's measurements)."""
    worker = Worker(lambda _: fn(*args, **kwargs), budget or DEFAULT_BUDGET)
    try:
        worker.submit(0, name)
        return _wait([worker])[0][1]
    finally:
        worker.close()


def imap_budgeted(
    items: Sequence[I],
    work: Callable[[I], Any],
    *,
    budget: Budget | None = None,
    name: Callable[[I], str] = str,
    group: Callable[[I], Hashable] | None = None,
    workers: int = 2,
) -> Iterator[tuple[int, I, Outcome[Any]]]:
    """``work(item)`` for each item in budgeted workers, ``workers`` at a time; ``(index, item, outcome)``
    yielded as each finishes. One item that hangs or fails never holds up the others beyond its budget.

    A worker serves many items in turn (what it loads, a tokenizer, stays loaded for the next; each
    item gets the whole budget, memory counted from where the item starts); one that ran out of budget
    or crashed is replaced. With ``group``, a free worker takes the next item of a group it has served
    first (items sharing a tokenizer go to the worker that loaded it).
    """
    budget = budget or DEFAULT_BUDGET
    pending = list(range(len(items)))
    pool: list[Worker] = []

    def task(index: int) -> Any:
        return work(items[index])

    def pick(mine: set[Hashable], others: set[Hashable], stuck: set[Hashable]) -> int | None:
        """The next item for an idle worker that has loaded the groups ``mine``: one of those; else one of
        a group no other worker has; else one of the group with the most items waiting, when at least
        ``_STEAL_MIN`` wait (loading a tokenizer twice costs more than waiting for a few templates); else
        one of a group held only by workers ``stuck`` on a slow job (a template running out of its
        budget holds up nothing for longer than ``_STUCK_S``)."""
        if group is None:
            return pending.pop(0) if pending else None
        for rule in (mine.__contains__, lambda g: g not in others):
            for at, index in enumerate(pending):
                if rule(group(items[index])):
                    return pending.pop(at)
        waiting: dict[Hashable, int] = {}
        for index in pending:
            waiting[group(items[index])] = waiting.get(group(items[index]), 0) + 1
        biggest = max(waiting, key=waiting.__getitem__, default=None)
        if biggest is not None and waiting[biggest] >= _STEAL_MIN:
            return pick({biggest}, set(), set())
        if stuck:
            return pick(set(), others - stuck, set())
        return None

    try:
        while True:
            pool = [w for w in pool if w.alive]
            now = time.monotonic()
            slots: list[Worker | None] = [w for w in pool if w.index is None]
            slots += [None] * (max(1, workers) - len(pool))
            for worker in slots:
                mine = worker.groups if worker is not None else set()
                held = [w for w in pool if w is not worker]
                others: set[Hashable] = set().union(*(w.groups for w in held))
                free = set().union(*(w.groups for w in held if w.index is None or now - w.started < _STUCK_S))
                index = pick(mine, others, others - free)
                if index is None:
                    continue
                if worker is None:
                    worker = Worker(task, budget)
                    pool.append(worker)
                if group is not None:
                    worker.groups.add(group(items[index]))
                worker.submit(index, name(items[index]))
            busy = [w for w in pool if w.index is not None]
            if not busy:
                return
            idle = any(w.index is None for w in pool) or len(pool) < workers
            later = [w.started + _STUCK_S for w in busy if w.started + _STUCK_S > time.monotonic()]
            wake = min(later) if pending and idle and later else math.inf  # when a busy worker counts as stuck
            for index, outcome in _wait(busy, wake):
                yield index, items[index], outcome
    finally:
        for worker in pool:
            worker.close()
