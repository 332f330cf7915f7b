"""Write the page: one self-contained HTML file, streamed sample by sample (no network, no server).

Each kept sample's detail goes into the file as soon as it is read, in its own inert
``<script type="application/json" id="s<row>">`` element (parsed by the page only when the sample is opened);
only the summary rows (a few numbers each), the token IDs seen and the problems stay in memory until the end.
Every ``<`` inside the data is written as ``\\u003c``, so no message or tool result can close its element.

>>> summary = write_page("rollouts.jsonl", "view.html", max_samples=10_000)   # doctest: +SKIP
>>> summary.shown, summary.total, len(summary.problems)                        # doctest: +SKIP
(10000, 10000, 0)
"""

from __future__ import annotations

import html
import json
import math
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from ._assets import CSS, JS, SKELETON
from .compact import ROW_FIELDS, compact, version_tokens
from .read import Problem, count_items, detect_format, iter_items

__all__ = ["MAX_PROBLEMS", "PICKS", "ViewSummary", "write_page"]

#: problems listed in the page (all are counted)
MAX_PROBLEMS = 1000
#: how samples are chosen when an export holds more than ``max_samples``
PICKS = ("spread", "first")


@dataclass
class ViewSummary:
    """What a page holds: ``shown`` of ``total`` records (``unreadable`` of them could not be shown), the
    problems found (the first :data:`MAX_PROBLEMS`; ``problem_count`` all)."""

    path: Path
    source: str
    format: str
    shown: int
    total: int
    problems: list[Problem] = field(default_factory=list)
    problem_count: int = 0
    unreadable: int = 0
    note: str = ""
    bytes: int = 0


def _safe_json(value: Any) -> str:
    """JSON that cannot end the ``<script>`` element it sits in (``<`` escaped) nor hold NaN."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str, allow_nan=False)
    except ValueError:  # NaN or infinity somewhere in the messages: null, as JSON has no such numbers
        text = json.dumps(_finite(value), ensure_ascii=False, separators=(",", ":"), default=str)
    return text.replace("<", "\\u003c")


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class _Decoder:
    """Token text and drift re-renders from a template (``--tokenizer``); None when none was given."""

    def __init__(self, tpl: Any, tools: Any) -> None:
        self.tpl = tpl
        self.tools = tools

    def vocab(self, ids: set[int]) -> dict[str, str]:
        order = sorted(ids)
        texts = self.tpl.tokenizer.batch_decode([[i] for i in order], skip_special_tokens=False)
        return {str(i): t for i, t in zip(order, texts)}

    def rerendered(self, messages: Any, position: int) -> list[int] | None:
        """The re-render's IDs from the drift position on (the kept ones are the sample's)."""
        from ..errors import TmplError

        if not isinstance(messages, list) or not messages:
            return None
        try:
            gen = messages[-1].get("role") != "assistant"
            text = self.tpl.renderer.text(messages, tools=self.tools, add_generation_prompt=gen)
            rendered = self.tpl.codec.encode_reference(text)
        except (TmplError, ValueError, TypeError, KeyError, AttributeError):
            return None
        return [int(t) for t in rendered[position : position + 16]]


def write_page(
    source: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    max_samples: int | None = 10_000,
    pick: str = "spread",
    tpl: Any = None,
    tools: Any = None,
    title: str | None = None,
    verdict: str | None = None,
    on_problem: Callable[[Problem], None] | None = None,
) -> ViewSummary:
    """Stream ``source`` (an export: JSONL, Parquet, ATIF) into the page ``output``.

    ``max_samples`` (None: all) caps the samples the page carries; ``pick`` chooses them when the export holds
    more: ``"spread"`` (every k-th, over the whole file) or ``"first"``; the page says so. ``tpl`` (a
    :class:`tmpl.ChatTemplate`) adds each token's text and the drifted samples' re-rendered IDs (rendered with
    ``tools``); ``on_problem`` is called with each problem as it is found.
    """
    if pick not in PICKS:
        raise ValueError(f"pick must be one of {PICKS}, not {pick!r}")
    src = Path(source)
    fmt = detect_format(src)
    total = count_items(src, fmt)
    stride = 1
    if max_samples is not None and total > max_samples:
        stride = math.ceil(total / max_samples) if pick == "spread" else 1
    decoder = _Decoder(tpl, tools) if tpl is not None else None
    columns: dict[str, list[Any]] = {k: [] for k in ROW_FIELDS}
    versions: Counter[int] = Counter()
    used: set[int] = set()
    summary = ViewSummary(Path(output), str(src), fmt, 0, total)

    def problem(p: Problem) -> None:
        summary.problem_count += 1
        if len(summary.problems) < MAX_PROBLEMS:
            summary.problems.append(p)
        if on_problem is not None:
            on_problem(p)

    out_path = Path(output)
    with open(out_path, "w", encoding="utf-8") as out:
        _head(out, title or f"tmpl view: {src.name}")
        for k, item in enumerate(iter_items(src, fmt)):
            if k % stride:
                continue
            if max_samples is not None and summary.shown >= max_samples:
                break
            if item.record is None:
                assert item.problem is not None
                problem(item.problem)
                summary.unreadable += 1
                continue
            row = summary.shown
            try:
                cells, detail, problems = compact(item.record, item.where, row)
            except Exception as exc:  # noqa: BLE001 - one unreadable record must not hide the rest
                problem(Problem(item.where, None, f"cannot be shown: {type(exc).__name__}: {exc}"))
                summary.unreadable += 1
                continue
            for p in problems:
                problem(p)
            ids = np.frombuffer(_b64decode(detail["ids"]), "<i4") if detail["ids"] else np.zeros(0, np.int32)
            if decoder is not None:
                used.update(np.unique(ids).tolist())
                if detail["drift"] is not None:
                    detail["drift"]["rendered_ids"] = decoder.rerendered(
                        detail["messages"], detail["drift"]["position"]
                    )
            if detail["ver"] is not None:
                versions.update(version_tokens(np.frombuffer(_b64decode(detail["ver"]), "<i4")))
            elif cells["sampled"] and cells["version"] is not None:
                versions[cells["version"]] += cells["sampled"]
            for key in ROW_FIELDS:
                columns[key].append(cells.get(key))
            out.write(f'<script type="application/json" id="s{row}">{_safe_json(detail)}</script>\n')
            summary.shown += 1
        if summary.shown + summary.unreadable < total:
            how = f"every {stride}th sample" if stride > 1 else f"the first {summary.shown}"
            summary.note = (
                f"This page shows {summary.shown} of the {total} samples in the file ({how}; "
                f"--max-samples {max_samples}). Use --max-samples or --pick to choose others."
            )
        meta = {
            "title": title or f"tmpl view: {src.name}",
            "source": src.name,
            "format": fmt,
            "shown": summary.shown,
            "total": total,
            "unreadable": summary.unreadable,
            "note": summary.note,
            "tokenizer": getattr(tpl, "name", None) if tpl is not None else None,
            "verdict": verdict,
        }
        data = {
            "meta": meta,
            "columns": columns,
            "version_tokens": {str(v): c for v, c in sorted(versions.items())},
            "vocab": decoder.vocab(used) if decoder is not None else {},
            "problems": [p.to_dict() for p in summary.problems],
            "problem_count": summary.problem_count,
        }
        out.write(f'<script type="application/json" id="tmpl-summary">{_safe_json(data)}</script>\n')
        out.write(f"<script>{JS}</script>\n</body></html>\n")
    summary.bytes = out_path.stat().st_size
    return summary


def _b64decode(text: str) -> bytes:
    import base64

    return base64.b64decode(text)


def _head(out: TextIO, title: str) -> None:
    out.write(
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">"
        f"<title>{html.escape(title)}</title>\n<style>{CSS}</style></head><body>\n{SKELETON}"
    )
