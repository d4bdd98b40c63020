"""``posttrain report RUN [RUN_B]``: print a pipeline run's report (report.md), or two runs side by side."""

from __future__ import annotations

NAME = "report"
HELP = "show a `posttrain pipeline` run's report, or compare two runs side by side"


def add_arguments(p) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN", help="one run directory (its report.md) or two (side by side)")
    p.add_argument("--output", "-o", default=None, help="also write the text to this file")


def run(args) -> int:
    from pathlib import Path

    from posttrain.data.io import atomic_write_text
    from posttrain.errors import UserError
    from posttrain.pipeline.report import compare_runs, load_run_summary

    if len(args.runs) > 2:
        raise UserError(f"report takes one or two run directories, got {len(args.runs)}")
    if len(args.runs) == 2:
        from posttrain.pipeline.stages import STAGES

        text = compare_runs(*args.runs, STAGES)
    else:
        load_run_summary(args.runs[0])
        md = Path(args.runs[0]) / "report" / "report.md"
        if not md.is_file():
            raise UserError(f"{md}: no report (the run's report stage has not run)")
        text = md.read_text(encoding="utf-8")
    print(text)
    if args.output:
        atomic_write_text(args.output, text)
    return 0
