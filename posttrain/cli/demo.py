"""``posttrain demo``: the main job on the embedded default (what ``make demo`` runs)."""

from __future__ import annotations

NAME = "demo"
HELP = "run SFT -> GRPO -> DPO on the embedded arithmetic task and print held-out accuracy per stage"


def add_arguments(p):
    p.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    p.add_argument("--sft-steps", type=int, default=None, help="override SFT steps")
    p.add_argument("--rl-steps", type=int, default=None, help="override GRPO steps")
    p.add_argument("--dpo-steps", type=int, default=None, help="override DPO steps")
    p.add_argument("--seed", type=int, default=0, help="seed of every stage (default 0; outcomes over seeds: "
                                                       "benchmarks/bench_outcomes.py)")


def run(args) -> int:
    from posttrain.errors import UserError
    from posttrain.pipeline import run_demo

    for name in ("sft_steps", "rl_steps", "dpo_steps"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise UserError(f"--{name.replace('_', '-')}={v} must be >= 1")
    if not 0 <= args.seed < 2**32:
        raise UserError(f"--seed={args.seed} must be in [0, 2**32)")
    run_demo(args.out, sft_steps=args.sft_steps, rl_steps=args.rl_steps, dpo_steps=args.dpo_steps, seed=args.seed)
    return 0
