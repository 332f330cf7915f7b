"""Harness specs: see :mod:`tmpl.harness.catalog`."""

from __future__ import annotations

from ..spec import Harness

__all__ = ["HARNESSES"]

HARNESSES: dict[str, Harness] = {}
