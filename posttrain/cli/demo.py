"""``posttrain demo``: the main job on the embedded default (what ``make demo`` runs)."""

from __future__ import annotations

NAME = "demo"
HELP = "run the pipeline on the embedded arithmetic task and print held-out accuracy per stage"


def add_arguments(p):
    p.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    p.add_argument("--sft-steps", type=int, default=None, help="override SFT steps")


def run(args) -> int:
    from posttrain.pipeline import run_demo

    run_demo(args.out, sft_steps=args.sft_steps)
    return 0
