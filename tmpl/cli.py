"""Command line: ``tmpl check`` (one template), ``tmpl fix`` (a training-safe rewrite, proven),
``tmpl matrix`` (many templates), ``tmpl replay`` (drift of exported samples). docs/cli.md has it all.

    tmpl check SOURCE [--template FILE] [--require USES] [--budget B] [--json] [--hub-timeout S]
    tmpl fix SOURCE [-o FIXED.jinja] [--tokenizer DIR] [--template FILE] [--require USES] [--budget B]
    tmpl matrix [SOURCE ...] [--format md|html|json] [-o FILE] [--tokenizer DIR] [--require USES] [--budget B]
    tmpl replay FILE.jsonl|FILE.atif.json [--model SOURCE [--template FILE] [--tools TOOLS.json]]
    tmpl view RESULTS [-o view.html] [--max-samples N] [--tokenizer SOURCE [--tools TOOLS.json]]

A SOURCE is a local tokenizer folder, or a hub id ``owner/name`` (tried only when no such path
exists; the hub gets ``--hub-timeout`` / ``TMPL_HUB_TIMEOUT`` seconds, 5 by default, then the local
hub cache is used, or the command fails naming ``HF_HUB_OFFLINE=1`` and the local-folder form).
``--template FILE`` is always a file, never template text. ``tmpl fix`` also takes a template file
(rendered with ``--tokenizer DIR``); ``tmpl matrix`` takes a catalog ``.json``, model folders,
``.jinja`` files or folders of them, and with no SOURCE reports on the templates tmpl ships, offline.
``tmpl replay`` prints the drift of exported samples: with ``--model`` it re-renders each sample's
messages with that template (and the tool schemas of ``--tools``) and explains the difference afresh;
without, it prints the causes stored at export. It reads ATIF trajectories too (known by content: a
``schema_version`` ``ATIF-...``), written by tmpl or anyone else; their tools are the agent's
``tool_definitions`` unless ``--tools`` is given.

``--require tool_loop,multi_user,images,env_turns`` chooses the verdicts that decide the exit status (default
``tool_loop``; ``env_turns``: user and system turns after an assistant turn, as environments append them;
``images``: the images check of a template that renders image parts, nothing to gate
for one that renders none). A verdict ``SAFE WITH tmpl TEMPLATE X`` gates as the given template's own verdict
(the template given is not safe; the shipped X is). Exit status:

==== ===============================================================================================
0    everything asked is SAFE (``fix``: the rewrite is proven; ``replay``: no measured sample drifted)
1    something is UNSAFE, its reason and counterexample printed (``fix``: refused, the template is
     unsafe and no proven rewrite exists; ``replay``: a measured sample drifted)
2    bad input or usage: a path that does not exist or holds no template, a bad flag (argparse's code);
     one line ``tmpl <command>: <message>`` on stderr, no traceback
3    something is UNPROVEN or UNSUPPORTED: a check that could not run, a budget that ran out, a
     template that cannot render a tool conversation, a matrix row that failed to load
==== ===============================================================================================

When some verdicts are UNSAFE and others UNPROVEN or UNSUPPORTED, the status is 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ExportError, SourceNotFoundError, TmplError

if TYPE_CHECKING:
    from .chat_template import ChatTemplate
    from .report import TemplateReport, Verdict
    from .report.budget import Budget

#: exit statuses (see the module docstring)
EXIT_SAFE, EXIT_UNSAFE, EXIT_USAGE, EXIT_UNPROVEN = 0, 1, 2, 3
#: the uses a report judges, in the order they are printed
USES = ("tool_loop", "multi_user", "images", "env_turns")


# -- gating --------------------------------------------------------------------------------------


def gated_level(verdict: Verdict) -> str:
    """The level a verdict gates as: its own, or for ``SAFE WITH tmpl TEMPLATE X`` the level of the
    template given, which that verdict keeps as its reason (``"UNSAFE (thinking stripped ...)"``)."""
    from .report import SAFE, SAFE_WITH, UNPROVEN, UNSAFE, UNSUPPORTED

    if verdict.level != SAFE_WITH:
        return verdict.level
    level = verdict.reason.partition(" (")[0]
    return level if level in (SAFE, UNSAFE, UNSUPPORTED, UNPROVEN) else UNPROVEN


def exit_status(levels: Iterable[str]) -> int:
    """0 when every level is SAFE, 1 when one is UNSAFE, else 3 (UNPROVEN, UNSUPPORTED, anything else)."""
    from .report import SAFE, UNSAFE

    seen = set(levels)
    if UNSAFE in seen:
        return EXIT_UNSAFE
    return EXIT_UNPROVEN if seen - {SAFE} else EXIT_SAFE


def _failures(report: TemplateReport, uses: Sequence[str]) -> list[tuple[str, str]]:
    """``(level, what)`` for every gated use that is not SAFE, in words."""
    from .report import SAFE, SAFE_WITH

    out = []
    for use in uses:
        for name, verdict in use_verdicts(report, use):
            level = gated_level(verdict)
            if level == SAFE:
                continue
            what = f"{name} is {verdict.label}"
            if verdict.level == SAFE_WITH:
                what = f"{name} is {verdict.reason}; tmpl ships a safe template for it: {verdict.template}"
            out.append((level, what))
    return out


def use_verdicts(report: TemplateReport, use: str) -> list[tuple[str, Verdict]]:
    """``(name, verdict)`` of the checks that gate ``use``. ``images``: the images check's two verdicts,
    none for a template that renders no image parts, UNPROVEN where the report was not made (a budget
    ran out before it)."""
    from .report import UNPROVEN, Verdict

    if use != "images":
        return [(use, report.verdicts[use])]
    if report.images is not None:
        return [("images placeholders", report.images.placeholders), ("images suffix", report.images.suffix)]
    if report.plain_renders is None:  # not found out (api.unproven_report)
        return [("images", Verdict(UNPROVEN, f"not checked: {report.verdicts['tool_loop'].reason}"))]
    return []


def _gate(command: str, report: TemplateReport, uses: Sequence[str]) -> int:
    failures = _failures(report, uses)
    status = exit_status(level for level, _ in failures)
    if failures:
        print(f"tmpl {command}: {'; '.join(w for _, w in failures)}", file=sys.stderr)
    return status


def _worst(levels: Iterable[str]) -> str:
    """The level that decides :func:`exit_status` among ``levels`` (UNSAFE, then any other, then SAFE)."""
    from .report import SAFE, UNSAFE

    seen = list(levels)
    if UNSAFE in seen:
        return UNSAFE
    return next((level for level in seen if level != SAFE), SAFE)


# -- loading -------------------------------------------------------------------------------------


def _load(source: str, template: str | None, hub_timeout: float | None) -> ChatTemplate:
    """A ChatTemplate from a SOURCE and an optional ``--template`` file (a path, never text)."""
    from .chat_template import ChatTemplate

    if template is None:
        return ChatTemplate.from_pretrained(source, hub_timeout=hub_timeout)
    path = Path(template)
    return ChatTemplate.from_pretrained(source, chat_template=path, hub_timeout=hub_timeout, name=path.name)


def _could_not_run(command: str, exc: BaseException) -> int:
    print(f"tmpl {command}: the check could not finish: {_one_line(exc)}", file=sys.stderr)
    return EXIT_UNPROVEN


# -- commands ------------------------------------------------------------------------------------


def _check(args: argparse.Namespace) -> int:
    from .report import check

    tpl = _load(args.model, args.template, args.hub_timeout)
    try:
        report = check(tpl, budget=args.budget)
    except (TmplError, ValueError) as exc:
        return _could_not_run("check", exc)
    print(report.to_json(indent=1) if args.json else report.to_markdown(), end="\n" if args.json else "")
    return _gate("check", report, args.require)


def _fix_template(args: argparse.Namespace) -> ChatTemplate | None:
    """The template to fix: a SOURCE, or a template file with ``--tokenizer`` (None: a usage error, printed)."""
    from .chat_template import ChatTemplate
    from .sources import is_hub_id, load_tokenizer, read_template_file

    source = Path(args.source)
    expected = "a tokenizer folder, a hub id like owner/name, or a chat template file (with --tokenizer)"
    if source.is_file():
        text = read_template_file(source, expected=expected)
        if args.tokenizer is None or args.template is not None:
            print(
                f"tmpl fix: {source} is a template file: pass --tokenizer DIR (a tokenizer folder) to render it "
                "with, and no --template",
                file=sys.stderr,
            )
            return None
        return ChatTemplate(load_tokenizer(args.tokenizer), text, name=source.name)
    if not source.exists() and not is_hub_id(args.source):
        raise SourceNotFoundError(args.source, f"does not exist; expected {expected}")
    return _load(args.source, args.template, args.hub_timeout)


def _fix(args: argparse.Namespace) -> int:
    from .errors import TemplateFixError
    from .report import SAFE, UNSAFE, check, make_training_safe_budgeted

    tpl = _fix_template(args)
    if tpl is None:
        return EXIT_USAGE
    try:
        result = make_training_safe_budgeted(tpl, budget=args.budget)
    except TemplateFixError as exc:
        print(f"tmpl fix: refused: {exc}", file=sys.stderr)
        for line in exc.attempted:
            print(f"  tried: {line}", file=sys.stderr)
        if exc.counterexample is not None:
            from .report.search import counterexample_text

            print(counterexample_text(exc.counterexample), file=sys.stderr)
        try:  # the template's own verdict says which: unsafe (1), or unsupported / unproven (3)
            level = gated_level(check(tpl, budget=args.budget).verdicts["tool_loop"])
        except (TmplError, ValueError):
            return EXIT_UNPROVEN
        return EXIT_UNPROVEN if level not in (SAFE, UNSAFE) else EXIT_UNSAFE
    except (TmplError, ValueError) as exc:  # a budget that ran out, a check that raised
        return _could_not_run("fix", exc)
    sys.stdout.write(result.to_text())
    if args.output:
        Path(args.output).write_text(result.source, encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    if set(args.require) - {"tool_loop"}:  # proven for the tool loop; the rewrite gates the other uses asked for
        try:
            return _gate("fix", check(result.template, budget=args.budget), args.require)
        except (TmplError, ValueError) as exc:
            return _could_not_run("fix", exc)
    return EXIT_SAFE


def _matrix(args: argparse.Namespace) -> int:
    from .report import matrix
    from .sources import tokenizer_folder

    for raw in args.sources:
        if not Path(raw).exists():
            raise SourceNotFoundError(
                raw, "does not exist; expected a catalog .json, a model folder, a .jinja file or a folder of them"
            )
    if args.tokenizer is not None:
        tokenizer_folder(args.tokenizer)
    sources = matrix.sources_from_paths(args.sources, tokenizer=args.tokenizer)

    def print_row(row: matrix.Row) -> None:  # as each template finishes
        print(matrix.row_line(row), file=sys.stderr, flush=True)

    rows = matrix.run_matrix(sources, progress=False, budget=args.budget, on_row=None if args.quiet else print_row)
    render = {"md": matrix.to_markdown, "html": matrix.to_html, "json": matrix.to_json}[args.format]
    text = render(rows)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output} ({len(rows)} templates)", file=sys.stderr)
    else:
        sys.stdout.write(text)
    levels = [
        "SKIPPED"
        if row.report is None
        else _worst(gated_level(v) for use in args.require for _, v in use_verdicts(row.report, use))
        for row in rows
    ]
    status = exit_status(levels)
    if status != EXIT_SAFE:
        counts = {level: levels.count(level) for level in dict.fromkeys(levels) if level != "SAFE"}
        print(
            f"tmpl matrix: {', '.join(f'{n} {level}' for level, n in counts.items())} "
            f"(of {len(rows)} templates; gated on {','.join(args.require)})",
            file=sys.stderr,
        )
    return status


def _replay(args: argparse.Namespace) -> int:
    from .atif import document_tools, looks_like_atif
    from .export import from_atif, from_jsonl
    from .rollout.drift import DriftCause, DriftDetail, rerender_drift

    expected = "a .jsonl or .jsonl.gz file written by tmpl.export.to_jsonl, or an ATIF trajectory file"
    if not Path(args.file).is_file():
        raise ExportError(
            args.file, f"{'is a folder' if Path(args.file).is_dir() else 'does not exist'}; expected {expected}"
        )
    atif = looks_like_atif(args.file)  # by content: ATIF from any program, whatever its name
    try:
        results = from_atif(args.file) if atif else from_jsonl(args.file)
    except (UnicodeDecodeError, EOFError, OSError) as exc:  # binary, a broken .gz
        raise ExportError(args.file, f"cannot be read ({_one_line(exc)}); expected {expected}") from exc
    harness_runs = [k for k, r in enumerate(results) if not hasattr(r, "from_calls")]  # tmpl.export.harness
    if harness_runs:
        raise ExportError(
            args.file,
            f"sample {harness_runs[0]} is a harness run (its calls' prompts are the template's render of what the "
            "harness sent, kept as IDs; no messages to re-render): open it with `tmpl view`",
        )
    # per sample: --tools, else (ATIF) the tool definitions its trajectory names
    sample_tools = document_tools(args.file) if atif else [None] * len(results)
    rows = []
    # samples whose calls were exported (template mode, a hook, sub-agents): each prompt was the render
    rendered = {id(r) for r in results if r.from_calls}
    if args.model:
        from .report.budget import DEFAULT_BUDGET, run_budgeted

        tpl = _load(args.model, args.template, args.hub_timeout)
        tools = _tools(args.tools) if args.tools else None

        def rerender_all() -> list[tuple[bool | None, DriftDetail | None]]:  # in a worker: untrusted template
            return [
                (None, None)  # template mode: each prompt was the render itself; no one sequence to re-render
                if id(r) in rendered
                else rerender_drift(
                    tpl, r.messages, r.prompt_ids.tolist() + r.completion_ids.tolist(), tools or own_tools
                )
                for r, own_tools in zip(results, sample_tools)
            ]

        try:
            drifts = run_budgeted(rerender_all, budget=DEFAULT_BUDGET, name=tpl.name)
        except TmplError as exc:  # a budget that ran out
            return _could_not_run("replay", exc)
        rows = [(r, drift, detail) for r, (drift, detail) in zip(results, drifts)]
    else:
        rows = [(r, r.drift, r.drift_detail) for r in results]
    print("| index | sample | status | sequences | drift | cause | token | ours | re-rendered | versions | stale |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r, drift, d in rows:
        shown = "not measured" if drift is None else str(drift).lower()
        if id(r) in rendered and drift is None:
            shown = "not measured (history: template)"
        cause, where, ours, theirs = (
            (d.cause.value, str(d.position), _cell(d.ours), _cell(d.rendered)) if d else ("",) * 4
        )
        stale = f"{r.staleness} ({r.stale_action})" if r.stale_action else str(r.staleness)
        print(
            f"| {r.index} | {r.sample} | {r.status.name} | {len(r.sequences)} | {shown} | {cause} | {where} | {ours} "
            f"| {theirs} "
            f"| {_versions_cell(r.versions)} | {stale} |"
        )
    measured = [d for _, drift, d in rows if drift is not None]
    counts = {c.value: sum(1 for d in measured if d is not None and d.cause is c) for c in DriftCause}
    drifted = sum(1 for _, drift, _ in rows if drift)
    print(
        f"\n{len(rows)} samples, {len(measured)} measured, {sum(counts.values())} drifted: "
        + ", ".join(f"{k} {v}" for k, v in counts.items() if v)
    )
    return EXIT_UNSAFE if drifted else EXIT_SAFE


def _versions_cell(versions: Any) -> str:
    """The policy versions of a sample's tokens as runs: ``v3 x12, - x40, v4 x7`` (-: appended tokens).

    >>> _versions_cell([3, 3, -1, 4])
    'v3 x2, - x1, v4 x1'
    """
    runs: list[list[int]] = []
    for v in (int(x) for x in versions):
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    shown = [f"{'-' if v < 0 else f'v{v}'} x{n}" for v, n in runs]
    return ", ".join(shown[:8]) + (f", ... ({len(shown) - 8} more runs)" if len(shown) > 8 else "")


def _tools(path: str) -> list[object]:
    """The tool schemas of ``--tools``: a JSON list, read from a file that must exist."""
    from .errors import ToolsFileError

    expected = "a JSON file with a list of tool schemas"
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ToolsFileError(path, f"does not exist; expected {expected}") from None
    except (OSError, ValueError) as exc:
        raise ToolsFileError(path, f"cannot be read as JSON ({_one_line(exc)}); expected {expected}") from None
    if not isinstance(data, list):
        raise ToolsFileError(path, f"holds a JSON {type(data).__name__}; expected {expected}")
    return data


def _cell(text: str, width: int = 60) -> str:
    """A table cell: escapes visible (repr without quotes), pipes escaped, long text cut."""
    shown = repr(text)[1:-1].replace("|", "\\|")
    return shown if len(shown) <= width else shown[: width - 1] + "…"


def _one_line(exc: BaseException) -> str:
    """An error's message on one line (the first line of a multi-line one)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _view(args: argparse.Namespace) -> int:
    """``tmpl view``: the export as one HTML page; 0 written, 1 written but some records had problems."""
    from .view import write_page
    from .view.read import Problem

    tpl = _load(args.tokenizer, args.template, args.hub_timeout) if args.tokenizer else None
    tools = _tools(args.tools) if args.tools else None
    verdict = None
    if tpl is not None and args.check:
        from .report import check

        verdict = check(tpl, budget=args.budget).verdicts["tool_loop"].label
    default = Path(args.file).with_name(Path(args.file).name.split(".")[0] + ".html")
    output = Path(args.output) if args.output else default
    shown = 0

    def on_problem(p: Problem) -> None:
        nonlocal shown
        shown += 1
        if shown <= 20:
            print(f"tmpl view: {p}", file=sys.stderr)

    summary = write_page(
        args.file,
        output,
        max_samples=args.max_samples or None,
        pick=args.pick,
        tpl=tpl,
        tools=tools,
        verdict=verdict,
        on_problem=on_problem,
    )
    if summary.problem_count > 20:
        print(f"tmpl view: ... {summary.problem_count - 20} more problem(s), listed in the page", file=sys.stderr)
    if summary.note:
        print(f"tmpl view: {summary.note}", file=sys.stderr)
    print(
        f"wrote {output} ({summary.shown} of {summary.total} records, {summary.bytes / 1e6:.1f} MB"
        f"{f', {summary.unreadable} unreadable' if summary.unreadable else ''}"
        f"{f', {summary.problem_count} problem(s)' if summary.problem_count else ''})",
        file=sys.stderr,
    )
    return EXIT_UNSAFE if summary.problem_count else EXIT_SAFE


# -- arguments -----------------------------------------------------------------------------------


def _uses(text: str) -> tuple[str, ...]:
    """``--require``: comma-separated uses, each one of :data:`USES`."""
    uses = tuple(dict.fromkeys(u.strip() for u in text.split(",") if u.strip()))
    unknown = [u for u in uses if u not in USES]
    if unknown or not uses:
        raise argparse.ArgumentTypeError(
            f"unknown use {', '.join(map(repr, unknown)) or repr(text)}; choose from {', '.join(USES)} (comma-separated)"
        )
    return uses


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, not {text!r}")
    return value


def _budget(text: str) -> Budget:
    from .report.budget import Budget

    try:
        return Budget.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _common(cmd: argparse.ArgumentParser, *, hub: bool = True) -> None:
    cmd.add_argument(
        "--require",
        type=_uses,
        default=("tool_loop",),
        metavar="USES",
        help="verdicts that decide the exit status, comma-separated: tool_loop, multi_user, images, env_turns "
        "(default: tool_loop)",
    )
    cmd.add_argument(
        "--budget",
        type=_budget,
        default=None,
        metavar="B",
        help="what one check may spend, e.g. 30s,2GB,10M (time, memory, output characters; see docs/cli.md)",
    )
    if hub:
        _hub(cmd)


def _hub(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--hub-timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help="seconds to wait for the hub per try before failing (default: $TMPL_HUB_TIMEOUT or 5)",
    )


EPILOG = (
    "exit status: 0 everything asked is SAFE; 1 something UNSAFE (counterexample printed); "
    "2 bad input or usage; 3 something UNPROVEN or UNSUPPORTED (a budget ran out, a check could not run). "
    "See docs/cli.md."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tmpl", description="Chat-template checks for token-in/token-out RL.", epilog=EPILOG
    )
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="report on one tokenizer and its chat template", epilog=EPILOG)
    check.add_argument("model", metavar="SOURCE", help="a local tokenizer folder, or a hub id owner/name")
    check.add_argument("--template", metavar="FILE", help="a chat template file to use instead of the folder's")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    _common(check)
    check.set_defaults(run=_check)
    fix = sub.add_parser(
        "fix", help="rewrite a template so earlier turns render as when last, and prove it", epilog=EPILOG
    )
    fix.add_argument(
        "source", metavar="SOURCE", help="a tokenizer folder, a hub id, or a template file (with --tokenizer)"
    )
    fix.add_argument("-o", "--output", help="write the fixed template to this file")
    fix.add_argument("--tokenizer", metavar="DIR", help="tokenizer folder to render a template file with")
    fix.add_argument("--template", metavar="FILE", help="a chat template file to use instead of the folder's")
    _common(fix)
    fix.set_defaults(run=_fix)
    mat = sub.add_parser("matrix", help="report on many templates", epilog=EPILOG)
    mat.add_argument(
        "sources",
        nargs="*",
        metavar="SOURCE",
        help="catalog .json, model folders, .jinja files or folders of them (none: the templates tmpl ships)",
    )
    mat.add_argument("--format", choices=("md", "html", "json"), default="md")
    mat.add_argument(
        "--html", dest="format", action="store_const", const="html", help="the same as --format html: a page"
    )
    mat.add_argument("-o", "--output", help="write to this file instead of stdout")
    mat.add_argument("--tokenizer", metavar="DIR", help="tokenizer folder to render bare .jinja files with")
    mat.add_argument("-q", "--quiet", action="store_true", help="no line per template as it finishes")
    _common(mat, hub=False)
    mat.set_defaults(run=_matrix)
    rep = sub.add_parser(
        "replay",
        help="drift of exported samples (tmpl.export.to_jsonl, or ATIF trajectories), as a table",
        epilog="exit status: 0 no measured sample drifted; 1 one did; 2 bad input or usage. See docs/cli.md.",
    )
    rep.add_argument(
        "file", help="a .jsonl or .jsonl.gz file written by tmpl.export.to_jsonl, or an ATIF trajectory file"
    )
    rep.add_argument(
        "--model",
        "--tokenizer",
        dest="model",
        metavar="SOURCE",
        help="re-render with this tokenizer's template (a folder or hub id; --tokenizer as in tmpl view)",
    )
    rep.add_argument("--template", metavar="FILE", help="a chat template file to use instead of the tokenizer's")
    rep.add_argument("--tools", metavar="FILE", help="a JSON file with the tool schemas the rollout rendered with")
    _hub(rep)
    rep.set_defaults(run=_replay)
    view = sub.add_parser(
        "view",
        help="a rollout export (JSONL, Parquet, ATIF) as one self-contained HTML page",
        epilog="exit status: 0 written; 1 written, but some records had problems (named); 2 bad input or usage. "
        "See docs/view.md.",
    )
    view.add_argument("file", metavar="RESULTS", help="a .jsonl/.jsonl.gz/.parquet export of tmpl, or an ATIF .json")
    view.add_argument("-o", "--output", help="the page to write (default: RESULTS' name with .html)")
    view.add_argument(
        "--max-samples",
        type=int,
        default=10_000,
        metavar="N",
        help="samples the page carries (default 10000; 0: all); the page says when it shows fewer",
    )
    view.add_argument(
        "--pick", choices=("spread", "first"), default="spread", help="which samples over N: every k-th, or the first"
    )
    view.add_argument("--tokenizer", metavar="SOURCE", help="show token text and re-render drift with this template")
    view.add_argument("--template", metavar="FILE", help="a chat template file to use instead of the tokenizer's")
    view.add_argument("--tools", metavar="FILE", help="a JSON file with the tool schemas the rollout rendered with")
    view.add_argument("--check", action="store_true", help="with --tokenizer: show the template's tool-loop verdict")
    _common(view)
    view.set_defaults(run=_view)
    from .gateway import serve

    serve.add_parser(sub).set_defaults(run=serve.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit status (argparse exits with 2 itself on a usage error)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except (TmplError, OSError, ValueError) as exc:
        print(f"tmpl {args.command}: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
