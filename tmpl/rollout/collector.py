"""Fewer garbage-collector passes while a rollout runs.

A rollout allocates many small containers per sample and turn (messages, parsed calls, futures)
that mostly die young, on top of a heap that holds every module imported before it (transformers,
torch: millions of objects). With the default thresholds (a young collection every 700
allocations) the collector was about a third of the loop thread's time outside the engine
(measured: 0.32 of 0.85 ms per sample-turn, 1024 samples x 8 turns, benchmarks/rollout_scale.py).

Inside :func:`fewer_collections` the objects that exist when it starts are frozen (``gc.freeze``:
full collections no longer walk them) and a young collection waits for ``YOUNG`` allocations
instead of 700. Cycles are still collected, less often; on exit the objects are unfrozen and the
thresholds restored (by the last of nested or concurrent users).

The rollout's own objects are freed by reference counting (answered tool calls used to leave
cycles, see ``tools/toolbox.py``), so a collection finds nothing to free and costs only its
walk over the young objects, token-ID lists included: at 4096 samples x 8 turns, 18 young
collections at 20,000 took 1.0-1.1 s of a 21 s run, 3 at 100,000 took 0.3-0.4 s.

>>> with fewer_collections():
...     import gc; gc.get_threshold()[0] >= YOUNG
True
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: allocations between two young collections inside a rollout (the interpreter's default: 700)
YOUNG = 100_000

_lock = threading.Lock()
_users = 0
_saved: tuple[int, ...] | None = None


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Freeze the objects that exist now and collect young objects less often, until the block ends."""
    global _users, _saved
    with _lock:
        if _users == 0:
            _saved = gc.get_threshold()
            gc.freeze()
            gc.set_threshold(max(_saved[0], YOUNG), *_saved[1:])
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0 and _saved is not None:
                gc.set_threshold(*_saved)
                gc.unfreeze()
                _saved = None
