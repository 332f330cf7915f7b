"""A check's budget as data: :class:`Budget` (seconds, memory, output characters), parsed from a flag, and
:data:`DEFAULT_BUDGET` with the measurements behind it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_MB = 1 << 20


@dataclass(frozen=True)
class Budget:
    """What one job (a report, a fix, a matrix row) may spend: wall-clock ``seconds``, ``memory_mb`` of
    address space beyond what the process held when the worker forked, and ``output_chars``, the longest
    text (or list) one render may build.

    >>> Budget.parse("30s,2GB,10M")
    Budget(seconds=30.0, memory_mb=2048, output_chars=10000000)
    >>> str(Budget(seconds=3, memory_mb=1024))
    '3s,1GB,10M'
    """

    seconds: float = 60.0
    memory_mb: int = 4096
    output_chars: int = 10_000_000

    def __post_init__(self) -> None:
        for name in ("seconds", "memory_mb", "output_chars"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"Budget.{name} must be a positive number, not {value!r}")

    _UNITS = {
        "ms": ("seconds", 0.001),
        "s": ("seconds", 1.0),
        "min": ("seconds", 60.0),
        "h": ("seconds", 3600.0),
        "kb": ("memory_mb", 1 / 1024),
        "mb": ("memory_mb", 1.0),
        "gb": ("memory_mb", 1024.0),
        "tb": ("memory_mb", 1024.0 * 1024),
        "c": ("output_chars", 1),
        "chars": ("output_chars", 1),
        "k": ("output_chars", 1_000),
        "kchars": ("output_chars", 1_000),
        "m": ("output_chars", 1_000_000),
        "mchars": ("output_chars", 1_000_000),
        "g": ("output_chars", 1_000_000_000),
    }
    _PART = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]+)\s*")

    @classmethod
    def parse(cls, text: str) -> Budget:
        """A budget from a flag: comma-separated parts in any order, each a number and a unit; parts left
        out keep their defaults. Time: ``ms``, ``s``, ``min``, ``h``; memory: ``KB``, ``MB``, ``GB``, ``TB``
        (binary: 1GB = 1024MB); output characters: ``k``, ``M``, ``G`` or ``chars``.

        >>> Budget.parse("5s")
        Budget(seconds=5.0, memory_mb=4096, output_chars=10000000)
        >>> Budget.parse("2min, 512MB, 500k")
        Budget(seconds=120.0, memory_mb=512, output_chars=500000)
        >>> Budget.parse("30")
        Traceback (most recent call last):
        ...
        ValueError: budget '30': part '30' has no unit; write a time (30s, 500ms, 2min), a memory size (512MB, 2GB) or a number of output characters (500k, 10M)
        """
        example = (
            "write a time (30s, 500ms, 2min), a memory size (512MB, 2GB) or a number of output characters (500k, 10M)"
        )
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"budget {text!r} is empty; {example}")
        values: dict[str, float] = {}
        for part in text.split(","):
            m = cls._PART.fullmatch(part)
            if m is None:
                bare = part.strip()
                if re.fullmatch(r"\d+(?:\.\d*)?", bare):
                    raise ValueError(f"budget {text!r}: part {bare!r} has no unit; {example}")
                raise ValueError(f"budget {text!r}: cannot read {bare!r}; {example}")
            number, unit = float(m.group(1)), m.group(2)
            key = unit.lower()  # "M" and "m" are characters, "MB" memory, "ms" and "min" time
            if key not in cls._UNITS:
                raise ValueError(f"budget {text!r}: unknown unit {unit!r} in {part.strip()!r}; {example}")
            name, scale = cls._UNITS[key]
            if name in values:
                raise ValueError(f"budget {text!r}: {name} given twice; {example}")
            if number <= 0:
                raise ValueError(f"budget {text!r}: {part.strip()!r} must be more than zero; {example}")
            values[name] = number * scale
        kwargs: dict[str, Any] = {}
        if "seconds" in values:
            kwargs["seconds"] = float(values["seconds"])
        if "memory_mb" in values:
            kwargs["memory_mb"] = max(1, int(round(values["memory_mb"])))
        if "output_chars" in values:
            kwargs["output_chars"] = max(1, int(values["output_chars"]))
        return cls(**kwargs)

    def __str__(self) -> str:
        return f"{_fmt_seconds(self.seconds)},{_fmt_mb(self.memory_mb)},{_fmt_chars(self.output_chars)}"

    def describe(self, what: str) -> str:
        """One limit in words: ``describe("seconds")`` -> ``'60 s of wall time'``."""
        if what == "seconds":
            return f"{_fmt_seconds(self.seconds).removesuffix('s')} s of wall time"
        if what == "memory_mb":
            return f"{self.memory_mb:,} MB of memory"
        return f"{self.output_chars:,} characters of output"


def _fmt_seconds(s: float) -> str:
    return f"{s:g}s"


def _fmt_mb(mb: int) -> str:
    return f"{mb // 1024}GB" if mb % 1024 == 0 else f"{mb}MB"


def _fmt_chars(n: int) -> str:
    for unit, scale in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}chars"


#: the budget of a check of a template tmpl did not ship (see the module docstring for the measurements)
DEFAULT_BUDGET = Budget()
