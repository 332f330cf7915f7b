"""A plain-list model of the trajectory spec (issue #3), written from the spec for the tests.

It knows nothing of numpy, buffers or the twins: lists grow, budgets are arithmetic. The
property tests drive it with the same operations as both twins and compare.
"""

from __future__ import annotations

import math
import operator
import struct

RUNNING, DONE, TRUNCATED, ABORTED = 0, 1, 2, 3


def as_float32(x: float) -> float:
    """``x`` rounded to float32 (inf when it overflows), with the standard library only."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


class Closed(Exception):
    """Appending to a final trajectory."""


class BadId(Exception):
    def __init__(self, position: int) -> None:
        self.position = position


class BadLogprob(Exception):
    def __init__(self, position: int) -> None:
        self.position = position


class Model:
    def __init__(self, prompt, max_length, max_completion_length, vocab_size):
        self.limit = vocab_size if vocab_size is not None else 2**31
        self.prompt = self._ids(prompt)
        self.max_length = max_length
        self.max_completion_length = max_length if max_completion_length is None else max_completion_length
        self.reset()

    def reset(self):
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.status = RUNNING
        self.cut = 0
        self.turns = 0
        self.spans: list[tuple] = []

    def room(self) -> int:
        return min(self.max_completion_length - len(self.ids), self.max_length - len(self.prompt) - len(self.ids))

    def max_new_tokens(self, requested):
        left = self.room() if self.status == RUNNING else 0
        return left if requested is None else min(requested, left)

    def _ids(self, items) -> list[int]:
        """Token IDs are integers (anything with ``__index__``) in [0, limit); the first bad one raises."""
        out = []
        for i, item in enumerate(items):
            try:
                value = operator.index(item)
            except TypeError:
                raise BadId(i) from None
            if not 0 <= value < self.limit:
                raise BadId(i)
            out.append(int(value))
        return out

    @staticmethod
    def _logprobs(items) -> list[float]:
        """Logprobs are numbers (not text) whose float32 value is finite and <= 0."""
        out = []
        for i, item in enumerate(items):
            if item is None or isinstance(item, (str, bytes)):
                raise BadLogprob(i)
            f = as_float32(float(item))
            if math.isnan(f) or math.isinf(f) or f > 0:
                raise BadLogprob(i)
            out.append(f)
        return out

    def _append(self, kind, ids, logprobs, message):
        keep = min(len(ids), self.room())
        start = len(self.ids)
        self.ids += ids[:keep]
        self.mask += [1 if kind == "completion" else 0] * keep
        self.logprobs += logprobs[:keep] if logprobs is not None else [0.0] * keep
        self.spans.append((kind, self.turns, message, start, start + keep))
        if kind == "completion":
            self.turns += 1
        if keep < len(ids):
            self.status = TRUNCATED
            self.cut = len(ids) - keep
        return keep

    def add_completion(self, ids, logprobs, message=None):
        if self.status != RUNNING:
            raise Closed()
        ids = self._ids(ids)
        if logprobs is None or len(logprobs) != len(ids):
            self.status = ABORTED
            return 0
        return self._append("completion", ids, self._logprobs(logprobs), message)

    def add_suffix(self, ids, message=None):
        if self.status != RUNNING:
            raise Closed()
        return self._append("suffix", self._ids(ids), None, message)

    def finish(self):
        if self.status == RUNNING:
            self.status = DONE
        return self.status

    def abort(self):
        if self.status == RUNNING:
            self.status = ABORTED
        return self.status
