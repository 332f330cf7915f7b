"""The policy version of each generated token, from what the engine reported.

Versions are kept as ``array("i")`` (int32, the dtype of :attr:`RolloutResult.versions`): a
turn's versions are one repeat of a value, extending a sample's versions is a copy of bytes, and
its result reads them without converting each token (as a list: 4% of a rollout's time outside
the engine in benchmarks/rollout_scale.py).
"""

from __future__ import annotations

import logging
from array import array

from ..backends.base import GenerationResult
from ..trajectory.types import APPENDED, APPENDED_VERSION

__all__ = ["APPENDED", "APPENDED_VERSION", "token_versions"]

logger = logging.getLogger("tmpl.rollout")


def token_versions(result: GenerationResult, submitted: int, current: int | None = None) -> array[int]:
    """The engine's version per token when it gave one for each, else the version at submission.

    ``current``: the rollout's version now. An engine label newer than it means the engine and the
    rollout disagree about which weights are which (an engine left at "2" by an earlier run, a
    rollout built with ``version=0``): the engine's label is kept, as the truth about its weights,
    and a warning says how to line them up (staleness would otherwise read negative unnoticed).

    >>> token_versions(GenerationResult("r", [5, 6], None, "stop", versions=[3, 4]), submitted=3).tolist()
    [3, 4]
    """
    n = len(result.token_ids)
    if result.versions is not None and len(result.versions) == n:
        versions = array("i", [int(v) for v in result.versions])
        if current is not None and versions and versions[-1] > current:  # versions only rise in a request
            logger.warning(
                "request %s: the engine labels its weights version %d, newer than this Rollout's version %d; "
                "start the Rollout with version=%d or call update_weights() so staleness counts right",
                result.request_id,
                versions[-1],
                current,
                versions[-1],
            )
        return versions
    return array("i", [submitted]) * n
