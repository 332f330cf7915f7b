"""``tmpl view``: a token-level inspector of rollouts, one self-contained HTML page (no server, no network).

The page opens a tmpl export (JSONL, Parquet) or an ATIF file: per sample the tokens as the model saw them,
coloured by origin (prompt, sampled, appended tool result or generation prompt, branch context), the loss
mask, logprobs as a heat scale, policy versions and staleness, each token's ID and text on hover, tool calls
and results folded in place; the drift point with its cause and the re-rendered IDs beside the kept ones;
an episode's calls as a tree and each training sequence's mask; a table across samples to filter and sort,
with histograms. The export is streamed (:mod:`tmpl.view.read`), each sample carried as a compact blob
(:mod:`tmpl.view.compact`) and the page written as it goes (:mod:`tmpl.view.page`). docs/view.md has it all.

>>> from tmpl.view import write_page
>>> summary = write_page("rollouts.jsonl", "view.html")        # doctest: +SKIP
>>> summary.shown, summary.problem_count                        # doctest: +SKIP
(128, 0)
"""

from __future__ import annotations

from .page import PICKS, ViewSummary, write_page
from .read import Problem, detect_format, iter_items

__all__ = ["PICKS", "Problem", "ViewSummary", "detect_format", "iter_items", "write_page"]
