"""What a :class:`~tmpl.integrations.renderers.TmplRenderer` remembers of the prompts it built.

renderers' ``bridge_to_next_turn`` is given the previous prompt's IDs, the completion and the new
messages, never the conversation before them. Template mode must render that conversation, and a
template whose tool results depend on earlier messages (DeepSeek V3's) needs it in append mode too.
So every prompt a renderer builds (``render``/``render_ids`` with the generation prompt, and each
bridge it returns) is remembered here, keyed by its IDs: the messages it renders, the messages as it
shows them (reasoning the template dropped left out), the sampled turns it holds and the texts already
encoded (``tmpl.rollout.history.splice``'s inputs). A bridge's record is built lazily: its assistant
message is parsed from the completion only when a later turn needs the conversation.

One store per template fingerprint, shared by the renderers of a process (verifiers' renderer pool
renders a rollout's turns on several renderer instances, on threads), bounded (least recently used
prompts are forgotten first: a bridge after one then says the conversation is unknown).

>>> store = store_for(tpl.fingerprint)                                           # doctest: +SKIP
>>> store.put(prompt_ids, Known.root(messages, prompt_text, prompt_ids))         # doctest: +SKIP
>>> store.get(prompt_ids).messages                                               # doctest: +SKIP
[{'role': 'user', 'content': 'Hi'}]
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...rollout.history import SampledTurn

__all__ = ["CAPACITY", "RESOLVING", "Known", "State", "Store", "store_for"]

#: prompts remembered per template (least recently used forgotten first)
CAPACITY = 8192
#: IDs kept from each end of a prompt to check a match by hash
EDGE = 16


@dataclass(frozen=True, slots=True)
class State:
    """The conversation a prompt renders, as :func:`tmpl.rollout.history.splice` needs it.

    ``messages``: the messages rendered (with the generation prompt); ``view``: the same as the prompt
    shows them (the reasoning the template dropped left out), compared to name a branch's first
    differing message and field; ``turns``: the sampled completions the prompt holds, in order;
    ``gaps``: texts already encoded between them (the first prompt's text seeds it, so that text comes
    back as the IDs the engine was sent).
    """

    messages: list[dict[str, Any]]
    view: list[dict[str, Any]]
    turns: tuple[SampledTurn, ...]
    gaps: dict[str, list[int]]


class Known:
    """A prompt a renderer built: its :class:`State`, or how to build it (the parent prompt, the
    completion sampled after it, the messages appended, their tools and the IDs appended for them).

    >>> node = Known.root([{"role": "user", "content": "Hi"}], text, ids)        # doctest: +SKIP
    >>> node.state.turns                                                         # doctest: +SKIP
    ()
    """

    __slots__ = ("_state", "parent", "completion", "added", "tools", "tail")

    def __init__(
        self,
        state: State | None = None,
        *,
        parent: Known | None = None,
        completion: Sequence[int] = (),
        added: Sequence[Mapping[str, Any]] = (),
        tools: Any = None,
        tail: Sequence[int] = (),
    ) -> None:
        self._state = state
        self.parent = parent
        self.completion = tuple(completion)
        self.added = [dict(m) for m in added]
        self.tools = tools
        self.tail = list(tail)

    @classmethod
    def root(cls, messages: Sequence[Mapping[str, Any]], text: str, ids: Sequence[int]) -> Known:
        """A prompt rendered from ``messages`` (no sampled IDs in it): its text encodes to ``ids``."""
        msgs = [dict(m) for m in messages]
        return cls(State(msgs, msgs, (), {text: list(ids)}))

    @property
    def state(self) -> State | None:
        """The state, once built (see :meth:`TmplRenderer._state_of`)."""
        return self._state

    def resolve(self, state: State) -> None:
        """Keep ``state``; the parent and the completion are no longer needed."""
        self._state = state
        self.parent = None
        self.completion = ()
        self.added = []
        self.tail = []


class Store:
    """Prompts by their IDs, bounded, safe to share between threads. A prompt is found by its length
    and the hash of its IDs, checked against its first and last IDs (the IDs themselves are not kept).

    >>> s = Store(2); s.put([1, 2], node); s.get([1, 2]) is node                 # doctest: +SKIP
    True
    """

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._items: OrderedDict[tuple[int, int], tuple[tuple[int, ...], Known]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _key(ids: Sequence[int]) -> tuple[tuple[int, int], tuple[int, ...]]:
        ids = tuple(ids)  # int-like IDs hash and compare as ints do
        return (len(ids), hash(ids)), ids[:EDGE] + ids[-EDGE:]

    def get(self, ids: Sequence[int]) -> Known | None:
        """The prompt whose IDs are ``ids`` (None: never built here, or forgotten)."""
        key, edges = self._key(ids)
        with self._lock:
            found = self._items.get(key)
            if found is None or found[0] != edges:
                return None
            self._items.move_to_end(key)
            return found[1]

    def put(self, ids: Sequence[int], node: Known) -> None:
        """Remember ``node`` as the prompt ``ids`` (the least recently used one goes past capacity)."""
        key, edges = self._key(ids)
        with self._lock:
            self._items[key] = (edges, node)
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


#: held while a bridge's record is built from its parent's (:meth:`Known.resolve` clears what built it)
RESOLVING = threading.Lock()

_STORES: dict[str, Store] = {}
_STORES_LOCK = threading.Lock()


def store_for(fingerprint: str) -> Store:
    """The process's store of prompts built with the template of ``fingerprint``."""
    with _STORES_LOCK:
        store = _STORES.get(fingerprint)
        if store is None:
            store = _STORES[fingerprint] = Store()
        return store
