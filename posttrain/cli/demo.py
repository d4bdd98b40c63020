"""``posttrain demo``: an alias of ``posttrain pipeline --preset tiny`` (what ``make demo`` runs)."""

from __future__ import annotations

NAME = "demo"
HELP = "alias of `posttrain pipeline --preset tiny --out runs/demo` (the whole pipeline on the embedded task)"


def add_arguments(p):
    from posttrain.cli import pipeline

    pipeline.add_arguments(p)
    p.set_defaults(out="runs/demo")
    for a in p._actions:  # --out is optional here (default runs/demo)
        if a.dest == "out":
            a.required = False


def run(args) -> int:
    from posttrain.cli import pipeline

    return pipeline.run(args)
