"""Running tools for multi-turn RL: a Toolbox of callables, run safely in batches.

>>> box = tmpl.Toolbox([get_weather, search], timeout=10.0)          # doctest: +SKIP
>>> result = box.run_batch([parsed])                                  # doctest: +SKIP

:mod:`.toolbox` (the batch runner), :mod:`.workers` (reused threads), :mod:`.procpool` and
:mod:`.procworker` (``isolation="process"``), :mod:`.proctree` (a worker's process tree killed with
it), :mod:`.sandbox` (``isolation="sandbox"``: :class:`Sandbox`), :mod:`.outputs` (long results
cut), :mod:`.metrics` (what the calls did). Parsing the calls from token IDs is :mod:`tmpl.toolcalls`.
"""

from .metrics import FAILURE_KINDS, CallOutcome, ToolMetrics
from .sandbox import Sandbox
from .toolbox import BatchResult, Toolbox, as_toolbox

__all__ = ["FAILURE_KINDS", "BatchResult", "CallOutcome", "Sandbox", "ToolMetrics", "Toolbox", "as_toolbox"]
