"""A real local Ray cluster for the tests, started again where its start fails on a loaded machine.

Ray's raylet waits a fixed ~15 s for its dashboard agent to write its port file; beside the suite's
other worker (a vLLM server importing on the other core) the agent was seen to take longer, the raylet
stopped ("Timed out waiting for file .../metrics_agent_port_...") and ``ray.init`` raised. That says
nothing about tmpl: the cluster is shut down and started again, up to three times, and the last
error is raised with the earlier ones named.

>>> with local_ray() as ray:  # doctest: +SKIP
...     ray.cluster_resources()
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import REPO

TRIES = 3


@contextlib.contextmanager
def local_ray(tries: int = TRIES) -> Iterator[Any]:
    """``ray.init`` on this machine (2 CPUs, no dashboard, this repository importable by actors),
    shut down on the way out."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'tmpl[ray]')")
    if ray.is_initialized():
        pytest.skip("a Ray cluster is already initialized in this process")
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])  # actors import the test modules
    failures: list[str] = []
    for attempt in range(1, tries + 1):
        try:
            ray.init(
                num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path}}
            )
            break
        except Exception as exc:
            failures.append(f"try {attempt}: {type(exc).__name__}: {str(exc)[:300]}")
            with contextlib.suppress(Exception):
                ray.shutdown()
            if attempt == tries:
                raise RuntimeError(f"a local Ray cluster did not start in {tries} tries: {failures}") from exc
            time.sleep(2)
    try:
        yield ray
    finally:
        ray.shutdown()
