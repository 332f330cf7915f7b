"""The compatibility matrix: a :class:`~tmpl.report.TemplateReport` for many templates.

Sources:
- nothing: the training-safe templates tmpl ships, each with an offline synthetic tokenizer
  built from its metadata (no download, no network);
- a ``catalog.json``: entries ``{"template": path, "host_tokenizer": folder}`` relative to the
  catalog's parent folder (the format of ``../shared/tokenizers/templates/catalog.json``);
- a model folder (tokenizer files with a chat template);
- a ``*.jinja`` file or a folder of them, rendered with ``--tokenizer``.

Each template is checked in its own budgeted worker process (:mod:`tmpl.report.budget`), two at a
time; a template that hangs, fails or runs out of budget gets a row saying why and holds up no other.

>>> rows = run_matrix(sources_from_paths(["catalog.json"]))  # doctest: +SKIP
>>> print(to_markdown(rows))                                  # doctest: +SKIP
>>> for index, row in iter_matrix(sources):                   # doctest: +SKIP
...     print(row_line(row))                                  # as each finishes
"""

from __future__ import annotations

import html
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import BudgetExceededError, TemplateError, TmplError
from .api import check, template_info, unproven_report
from .budget import Budget, Outcome, imap_budgeted, progress, worker_crashed
from .report import SAFE, SAFE_WITH, UNPROVEN, UNSAFE, UNSUPPORTED, TemplateReport


@dataclass
class Source:
    """One template to report on: where its text and its tokenizer come from."""

    name: str
    load: Callable[[], Any]  # returns a ChatTemplate
    origin: str  # shown in the table (a relative path or "shipped")
    group: str = ""  # sources with the same group share a tokenizer (the matrix checks them in one worker)


@dataclass
class Row:
    name: str
    origin: str
    report: TemplateReport | None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "origin": self.origin,
            "error": self.error,
            "report": self.report.to_dict() if self.report else None,
        }


_TOKENIZERS: dict[str, Any] = {}


def _tokenizer(folder: str | Path):
    key = str(Path(folder).resolve())
    if key not in _TOKENIZERS:
        from transformers import AutoTokenizer

        _TOKENIZERS[key] = AutoTokenizer.from_pretrained(key)
    return _TOKENIZERS[key]


def _template(tokenizer_dir, template_path: Path | None, name: str):
    from ..chat_template import ChatTemplate

    tok = _tokenizer(tokenizer_dir)
    if template_path is None:
        return ChatTemplate(tok, name=name)
    return ChatTemplate(tok, template_path.read_text(encoding="utf-8"), name=name)


def shipped_sources() -> list[Source]:
    """The training-safe templates in the package, with offline synthetic tokenizers."""
    from .. import templates
    from ..chat_template import ChatTemplate

    def loader(name: str):
        return lambda: ChatTemplate(templates.synthetic_tokenizer(name), templates.load(name), name=name)

    return [Source(info.name, loader(info.name), "shipped") for info in templates.available()]


def catalog_sources(path: Path) -> list[Source]:
    entries = json.loads(path.read_text(encoding="utf-8"))
    root = path.parent.parent if path.parent.name == "templates" else path.parent
    out = []
    for entry in entries:
        template = root / entry["template"]
        host = root / entry["host_tokenizer"]
        folder = Path(entry["template"]).parent.name

        def load(template=template, host=host, name=template.name):
            if not host.is_dir():
                raise TmplError(f"host tokenizer folder {host.name!r} not found next to the catalog")
            return _template(host, template, name)

        out.append(Source(template.name, load, f"{folder} @ {entry['host_tokenizer']}", str(host)))
    return out


def _is_model_dir(path: Path) -> bool:
    return (path / "tokenizer_config.json").is_file() or (path / "tokenizer.json").is_file()


def sources_from_paths(paths: Sequence[str | Path], tokenizer: str | None = None) -> list[Source]:
    """Turn command-line paths into sources (see the module docstring)."""
    if not paths:
        return shipped_sources()
    out: list[Source] = []
    for raw in paths:
        path = Path(raw)
        if path.is_file() and path.suffix == ".json":
            out += catalog_sources(path)
        elif path.is_dir() and _is_model_dir(path):
            out.append(Source(path.name, lambda p=path: _template(p, None, p.name), path.name))
        elif path.is_dir() or path.suffix == ".jinja":
            files = sorted(path.glob("*.jinja")) if path.is_dir() else [path]
            if tokenizer is None:
                raise TmplError(
                    f"{path}: .jinja templates need --tokenizer (a folder with the tokenizer to render with)"
                )
            for f in files:
                out.append(Source(f.name, lambda f=f: _template(tokenizer, f, f.name), f.name, str(tokenizer)))
        else:
            raise TmplError(f"{path}: not a catalog .json, a model folder, a .jinja file or a folder of them")
    return out


def _row(source: Source, outcome: Outcome[Any]) -> Row:
    """A source's row from its job: a report, an UNPROVEN one when the budget ran out, or why it failed."""
    error = outcome.error
    if error is None:
        return Row(source.name, source.origin, outcome.value)
    if isinstance(error, BudgetExceededError) or worker_crashed(error):
        assert isinstance(error, TemplateError)
        if outcome.info is not None:  # the template was loaded: a report that says what ran out
            name, fingerprint, tokenizer = outcome.info
            return Row(source.name, source.origin, unproven_report(name, fingerprint, tokenizer, error))
        return Row(source.name, source.origin, None, f"{type(error).__name__} while loading: {error}")
    if isinstance(error, (TmplError, OSError, ValueError)):
        return Row(source.name, source.origin, None, f"{type(error).__name__}: {error}")
    return Row(source.name, source.origin, None, f"{type(error).__name__}: {error} (an error inside tmpl)")


def _check_in_worker(source: Source) -> TemplateReport:
    """In a worker: load the template (its tokenizer stays loaded for the worker's next template)
    and check it, under the job's budget."""
    tpl = source.load()
    progress(template_info(tpl))
    return check(tpl)


def _group(source: Source) -> str:
    return source.group or source.name


def iter_matrix(
    sources: Iterable[Source], *, budget: Budget | None = None, workers: int = 2
) -> Iterator[tuple[int, Row]]:
    """``(index, row)`` for every source, as each finishes (not in order).

    Each template is loaded and checked in a budgeted worker process (:mod:`tmpl.report.budget`;
    default :data:`~tmpl.report.budget.DEFAULT_BUDGET`), ``workers`` at a time; templates that share
    a tokenizer go to the worker that loaded it. A template that fails, crashes its worker or runs
    out of budget gets a row that says why (``SKIPPED (...)`` or ``UNPROVEN (budget exceeded: ...)``)
    and never holds up the others.
    """
    listed = list(sources)
    for index, source, outcome in imap_budgeted(
        listed, _check_in_worker, budget=budget, name=lambda s: s.name, group=_group, workers=workers
    ):
        yield index, _row(source, outcome)


def run_matrix(
    sources: Iterable[Source],
    *,
    progress: bool | None = None,
    budget: Budget | None = None,
    workers: int = 2,
    on_row: Callable[[Row], None] | None = None,
) -> list[Row]:
    """Report on every source, ``workers`` budgeted jobs at a time (see :func:`iter_matrix`); errors
    (a missing tokenizer, a broken template, a budget that ran out) become rows. Rows come back in
    the sources' order; ``on_row`` is called with each as it finishes."""
    sources = list(sources)
    if progress is None:
        progress = sys.stderr.isatty()
    bar = None
    if progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=len(sources), desc="templates", unit="tpl", file=sys.stderr)
        except ImportError:  # pragma: no cover - tqdm comes with transformers
            bar = None
    rows: list[Row | None] = [None] * len(sources)
    try:
        for index, row in iter_matrix(sources, budget=budget, workers=workers):
            rows[index] = row
            if on_row is not None:
                on_row(row)
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(row.name[:30])
    finally:
        if bar is not None:
            bar.close()
    return [row for row in rows if row is not None]


def row_line(row: Row) -> str:
    """One row in a line of text (what ``tmpl matrix`` prints as each template finishes)."""
    cells = _cells(row)
    line = f"{cells[0]} ({cells[1]}): tool loop {cells[2]}" + (f"; several user turns {cells[3]}" if cells[3] else "")
    return line + (f"; images {cells[8]}" if cells[8] not in ("", "-") else "")


COLUMNS = (
    "template",
    "source",
    "tool loop",
    "several user turns",
    "turn close",
    "calls",
    "parser",
    "suffix path",
    "images",
    "history",
)


def _cells(row: Row) -> list[str]:
    r = row.report
    if r is None:
        return [row.name, row.origin, f"SKIPPED ({row.error})", "", "", "", "", "", "", ""]
    fast = "fast (" + ", ".join(sorted(set(r.fast_path.values()))) + ")" if r.fast_path else "render per call"
    if r.history_dependence:
        fast = "render per call (history-dependent)"
    if not r.tool_renders:
        fast = "-"
    return [
        row.name,
        row.origin,
        r.verdicts["tool_loop"].label,
        r.verdicts["multi_user"].label,
        r.tool_close or r.plain_close or "-",
        str(r.max_parallel_calls),
        r.parser or "-",
        fast,
        r.images.label if r.images is not None else "-",
        r.history_mode()[0],
    ]


def _summary(rows: Sequence[Row]) -> str:
    counts: dict[str, int] = {}
    for row in rows:
        level = row.report.verdicts["tool_loop"].level if row.report else "SKIPPED"
        counts[level] = counts.get(level, 0) + 1
    order = [SAFE, SAFE_WITH, UNSAFE, UNSUPPORTED, UNPROVEN, "SKIPPED"]
    return ", ".join(f"{counts[k]} {k}" for k in order if k in counts)


def to_markdown(rows: Sequence[Row], title: str = "Compatibility matrix") -> str:
    """A reproducible markdown table (no timings, no dates)."""

    def esc(cell: str) -> str:
        return cell.replace("|", "\\|").replace("\n", " ")

    lines = [
        f"# {title}",
        "",
        "Generated by `tmpl matrix`. Verdicts are for token-in/token-out training:",
        "*tool loop* = rounds of tool calls within a user turn; *several user turns* = the",
        "conversation goes on with new user messages. See docs/concepts.md for what is checked.",
        "*images* (templates that render image parts): image placeholders expanded as the",
        "processor's own full render, and the suffix of a tool result with an image; see docs/vision.md.",
        "*history*: the `Rollout(history=...)` that trains on what the deployed template renders:",
        "`append` where both uses are SAFE, else `template`; `-` where no turn closes as tmpl needs",
        '(docs/rollouts.md, "History modes").',
        "",
        f"Tool loop: {_summary(rows)}.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for row in rows:
        cells = _cells(row)
        cells[4] = f"`{cells[4]}`" if cells[4] not in ("", "-") else cells[4]
        lines.append("| " + " | ".join(esc(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def to_json(rows: Sequence[Row]) -> str:
    return json.dumps([r.to_dict() for r in rows], ensure_ascii=False, indent=1)


_CLASS = {SAFE: "safe", SAFE_WITH: "safewith", UNSAFE: "unsafe", UNSUPPORTED: "unsupported", UNPROVEN: "unproven"}


def _use_counterexample(report: TemplateReport, use: str) -> tuple[str, dict[str, Any]] | None:
    """The counterexample that made ``use`` (``tool_loop``, ``multi_user``) fail: ``(check name, counterexample)``."""
    from .search import USES

    found = report.counterexamples()
    for name in USES.get(use, ()):
        if name in found:
            return name, found[name]
    return None


def to_html(rows: Sequence[Row], title: str = "tmpl compatibility matrix") -> str:
    """One self-contained HTML page with a sortable table (click a header to sort); each verdict cell that
    failed links to its counterexample (the messages, both renders at the first difference), below the table.

    >>> page = to_html(run_matrix(sources_from_paths(["catalog.json"])))   # doctest: +SKIP
    >>> '<a href="#ce-3-tool_loop">' in page                                 # doctest: +SKIP
    True
    """
    from .search import counterexample_text

    head = "".join(f'<th onclick="sortBy({i})">{html.escape(c)}<span></span></th>' for i, c in enumerate(COLUMNS))
    body, sections = [], []
    for k, row in enumerate(rows):
        cells = _cells(row)
        uses = ("tool_loop", "multi_user")
        levels = [row.report.verdicts[u].level for u in uses] if row.report else ["", ""]
        tds = []
        for i, cell in enumerate(cells):
            cls = _CLASS.get(levels[i - 2], "skipped") if i in (2, 3) else ""
            if i == 2 and row.report is None:
                cls = "skipped"
            text = html.escape(cell)
            found = _use_counterexample(row.report, uses[i - 2]) if i in (2, 3) and row.report else None
            if found is not None:
                anchor = f"ce-{k}-{uses[i - 2]}"
                text = f'<a href="#{anchor}" title="counterexample: {html.escape(found[0])}">{text}</a>'
                sections.append(
                    f'<section id="{anchor}"><h2>{html.escape(row.name)}: {html.escape(COLUMNS[i])} '
                    f"({html.escape(found[0])})</h2><pre>{html.escape(counterexample_text(found[1]))}</pre>"
                    '<p><a href="#matrix">back to the table</a></p></section>'
                )
            tds.append(f'<td class="{cls}">{text}</td>')
        body.append("<tr>" + "".join(tds) + "</tr>")
    examples = ("<h2>Counterexamples</h2>\n" + "\n".join(sections)) if sections else ""
    return _HTML.format(
        title=html.escape(title),
        summary=html.escape(_summary(rows)),
        head=head,
        body="\n".join(body),
        n=len(rows),
        examples=examples,
    )


_HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1b1b1b; }}
h1 {{ font-size: 20px; }}
table {{ border-collapse: collapse; width: 100%; }}
th, td {{ border: 1px solid #d0d0d0; padding: 4px 8px; text-align: left; vertical-align: top; }}
th {{ background: #f2f2f2; cursor: pointer; position: sticky; top: 0; user-select: none; }}
th span::after {{ content: " \\2195"; color: #999; }}
tr:nth-child(even) td {{ background: #fafafa; }}
td.safe {{ background: #d9f2d9 !important; }}
td.safewith {{ background: #e3ecfb !important; }}
td.unsafe {{ background: #fde2c8 !important; }}
td.unsupported {{ background: #f6d2d2 !important; }}
td.unproven {{ background: #ececec !important; }}
td.skipped {{ color: #777; }}
input {{ margin: 8px 0 12px; padding: 4px 8px; width: 320px; }}
td a {{ color: inherit; }}
section {{ margin-top: 18px; }}
section h2 {{ font-size: 15px; }}
section:target {{ outline: 3px solid #ffb000; }}
pre {{ background: #f6f6f6; padding: 8px; overflow-x: auto; white-space: pre-wrap; }}
</style></head><body>
<h1>{title}</h1>
<p>{n} templates. Tool loop: {summary}. Click a column header to sort; type to filter.</p>
<input id="filter" placeholder="filter rows..." oninput="filterRows(this.value)">
<table id="matrix"><thead><tr>{head}</tr></thead><tbody>
{body}
</tbody></table>
{examples}
<script>
var dir = {{}};
function sortBy(col) {{
  var tbody = document.querySelector('#matrix tbody');
  var rows = Array.from(tbody.rows);
  dir[col] = !dir[col];
  rows.sort(function (a, b) {{
    var x = a.cells[col].textContent, y = b.cells[col].textContent;
    var nx = parseFloat(x), ny = parseFloat(y);
    var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
    return dir[col] ? c : -c;
  }});
  rows.forEach(function (r) {{ tbody.appendChild(r); }});
}}
function filterRows(q) {{
  q = q.toLowerCase();
  Array.from(document.querySelectorAll('#matrix tbody tr')).forEach(function (r) {{
    r.style.display = r.textContent.toLowerCase().indexOf(q) >= 0 ? '' : 'none';
  }});
}}
</script>
</body></html>
"""
