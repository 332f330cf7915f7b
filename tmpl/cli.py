"""Command line: ``tmpl check`` (one template), ``tmpl matrix`` (many), ``tmpl replay`` (drift),
``tmpl fix`` (a training-safe rewrite of a template, proven).

    tmpl check MODEL_OR_DIR [--template FILE] [--json]
    tmpl fix PATH_OR_NAME [-o FIXED.jinja] [--tokenizer DIR]
    tmpl matrix [SOURCE ...] [--format md|html|json] [-o FILE] [--tokenizer DIR]
    tmpl replay FILE.jsonl [--model MODEL_OR_DIR [--template FILE] [--tools TOOLS.json]]

``tmpl replay`` prints the drift of exported samples as a table: with ``--model`` it re-renders
each sample's messages with that template (and the tool schemas of ``--tools``, as the rollout
rendered them) and explains the difference afresh; without, it prints the causes stored at export.

With no SOURCE, ``tmpl matrix`` reports on the training-safe templates tmpl ships, offline.
``tmpl fix`` takes a tokenizer folder, a hub id, or a ``.jinja`` file (rendered with ``--tokenizer``);
it prints the changes line by line and the proof, and writes the fixed template with ``-o``.

Exit status: 0 on success, 1 when ``tmpl fix`` refuses (the reason is printed), 2 on usage or
input errors (with a one-line message).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import TmplError


def _check(args: argparse.Namespace) -> int:
    from .chat_template import ChatTemplate
    from .report import check

    tpl = ChatTemplate.from_pretrained(args.model, chat_template=args.template)
    report = check(tpl)
    print(report.to_json(indent=1) if args.json else report.to_markdown(), end="" if not args.json else "\n")
    return 0


def _fix(args: argparse.Namespace) -> int:
    from .chat_template import ChatTemplate
    from .errors import TemplateFixError
    from .report import make_training_safe

    source = Path(args.source)
    if source.suffix == ".jinja":
        if not args.tokenizer:
            print("tmpl fix: a .jinja file needs --tokenizer DIR to render with", file=sys.stderr)
            return 2
        from transformers import AutoTokenizer

        tpl = ChatTemplate(AutoTokenizer.from_pretrained(args.tokenizer), source, name=source.name)
    else:
        tpl = ChatTemplate.from_pretrained(args.source, chat_template=args.template)
    try:
        result = make_training_safe(tpl)
    except TemplateFixError as exc:
        print(f"tmpl fix: refused: {exc}", file=sys.stderr)
        for line in exc.attempted:
            print(f"  tried: {line}", file=sys.stderr)
        return 1
    sys.stdout.write(result.to_text())
    if args.output:
        Path(args.output).write_text(result.source, encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _matrix(args: argparse.Namespace) -> int:
    from .report import matrix

    sources = matrix.sources_from_paths(args.sources, tokenizer=args.tokenizer)
    rows = matrix.run_matrix(sources, progress=None if not args.quiet else False)
    render = {"md": matrix.to_markdown, "html": matrix.to_html, "json": matrix.to_json}[args.format]
    text = render(rows)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output} ({len(rows)} templates)", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _replay(args: argparse.Namespace) -> int:
    import json

    from .export import from_jsonl
    from .rollout.drift import DriftCause, rerender_drift

    results = from_jsonl(args.file)
    rows = []
    if args.model:
        from .chat_template import ChatTemplate

        tpl = ChatTemplate.from_pretrained(args.model, chat_template=args.template)
        tools = json.loads(Path(args.tools).read_text(encoding="utf-8")) if args.tools else None
        for r in results:
            drift, detail = rerender_drift(tpl, r.messages, r.prompt_ids.tolist() + r.completion_ids.tolist(), tools)
            rows.append((r, drift, detail))
    else:
        rows = [(r, r.drift, r.drift_detail) for r in results]
    print("| index | sample | status | drift | cause | token | ours | re-rendered |")
    print("|---|---|---|---|---|---|---|---|")
    for r, drift, d in rows:
        shown = "not measured" if drift is None else str(drift).lower()
        cause, where, ours, theirs = (
            (d.cause.value, str(d.position), _cell(d.ours), _cell(d.rendered)) if d else ("",) * 4
        )
        print(f"| {r.index} | {r.sample} | {r.status.name} | {shown} | {cause} | {where} | {ours} | {theirs} |")
    measured = [d for _, drift, d in rows if drift is not None]
    counts = {c.value: sum(1 for d in measured if d is not None and d.cause is c) for c in DriftCause}
    print(
        f"\n{len(rows)} samples, {len(measured)} measured, {sum(counts.values())} drifted: "
        + ", ".join(f"{k} {v}" for k, v in counts.items() if v)
    )
    return 0


def _cell(text: str, width: int = 60) -> str:
    """A table cell: escapes visible (repr without quotes), pipes escaped, long text cut."""
    shown = repr(text)[1:-1].replace("|", "\\|")
    return shown if len(shown) <= width else shown[: width - 1] + "…"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tmpl", description="Chat-template checks for token-in/token-out RL.")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="report on one tokenizer and its chat template")
    check.add_argument("model", help="a local model/tokenizer folder or a hub id")
    check.add_argument("--template", help="a .jinja file to use instead of the tokenizer's template")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.set_defaults(run=_check)
    fix = sub.add_parser("fix", help="rewrite a template so earlier turns render as when last, and prove it")
    fix.add_argument("source", help="a model/tokenizer folder, a hub id, or a .jinja file (with --tokenizer)")
    fix.add_argument("-o", "--output", help="write the fixed template to this file")
    fix.add_argument("--tokenizer", help="tokenizer folder to render a bare .jinja file with")
    fix.add_argument("--template", help="a .jinja file to use instead of the folder's template")
    fix.set_defaults(run=_fix)
    mat = sub.add_parser("matrix", help="report on many templates")
    mat.add_argument(
        "sources",
        nargs="*",
        help="catalog .json, model folders, .jinja files or folders of them (none: the templates tmpl ships)",
    )
    mat.add_argument("--format", choices=("md", "html", "json"), default="md")
    mat.add_argument("-o", "--output", help="write to this file instead of stdout")
    mat.add_argument("--tokenizer", help="tokenizer folder to render bare .jinja files with")
    mat.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    mat.set_defaults(run=_matrix)
    rep = sub.add_parser("replay", help="drift of exported samples (tmpl.export.to_jsonl), as a table")
    rep.add_argument("file", help="a .jsonl or .jsonl.gz file written by tmpl.export.to_jsonl")
    rep.add_argument("--model", help="re-render with this tokenizer's template (a local folder or hub id)")
    rep.add_argument("--template", help="a .jinja file to use instead of the tokenizer's template")
    rep.add_argument("--tools", help="a JSON file with the tool schemas the rollout rendered with")
    rep.set_defaults(run=_replay)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (TmplError, OSError) as exc:
        print(f"tmpl {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
