"""The policy version of each generated token, from what the engine reported."""

from __future__ import annotations

from ..backends.base import GenerationResult


def token_versions(result: GenerationResult, submitted: int) -> list[int]:
    """The engine's version per token when it gave one for each, else the version at submission."""
    n = len(result.token_ids)
    if result.versions is not None and len(result.versions) == n:
        return [int(v) for v in result.versions]
    return [submitted] * n
