"""``posttrain pipeline``: dedup -> tokenizer -> SFT -> RM -> DPO / GRPO / PPO -> eval -> report, cached by content.

    posttrain pipeline --preset tiny --out runs/demo             # what `make demo` runs
    posttrain pipeline --config examples/pipeline.toml --out runs/mine
    posttrain pipeline --out runs/demo --explain                  # run / cached / resumed per stage, and why
    posttrain pipeline --out runs/demo --only dpo eval report     # re-run some stages (their inputs must exist)

Top-level fields of :class:`posttrain.pipeline.config.PipelineConfig` are flags (``--seed``, ``--threads``...);
stage settings go in the ``--config`` file's sections (``[sft]``, ``[grpo]``...).
"""

from __future__ import annotations

import argparse

NAME = "pipeline"
HELP = "run the whole post-training pipeline (dedup, tokenizer, SFT, RM, DPO, GRPO, PPO, eval, report)"


def add_arguments(p) -> None:
    from posttrain import config as C
    from posttrain.cli._common import add_preset_flags
    from posttrain.pipeline.config import PRESETS, PipelineConfig
    from posttrain.pipeline.stages import BY_NAME

    add_preset_flags(p, PRESETS, user_data=False)
    p.add_argument("--out", required=True, help="run directory (one folder per stage, summary.json, report/)")
    p.add_argument(
        "--only",
        nargs="+",
        default=(),
        metavar="STAGE",
        choices=list(BY_NAME),
        help=f"run only these stages (others are used if complete): {', '.join(BY_NAME)}",
    )
    p.add_argument(
        "--skip", nargs="+", default=(), metavar="STAGE", choices=list(BY_NAME), help="do not run these stages"
    )
    p.add_argument(
        "--explain",
        action="store_true",
        help="print what each stage would do (run / cached / resumed, and which key fields changed); run nothing",
    )
    p.add_argument(
        "--quiet", action="store_true", help="one line per stage; each stage's output goes to OUT/.pipeline/STAGE.log"
    )
    top = tuple(name for name, _, _ in C.leaf_fields(PipelineConfig) if "." in name)
    C.add_config_flags(p, PipelineConfig, skip=top, title="PipelineConfig fields (stage sections: --config)")
    from posttrain.tasks.embedded import TASK_NAMES

    p.add_argument(  # the one nested setting with a flag: the embedded task every stage shares (its corpus too)
        "--task",
        dest="cfg:task.name",
        choices=TASK_NAMES,
        metavar="NAME",
        default=argparse.SUPPRESS,
        help=f"the embedded task of every stage and of the corpus's demonstrations: {', '.join(TASK_NAMES)}, with the "
        "same stage recipes ([task] in --config for its other settings) (default: arithmetic)",
    )


def run(args) -> int:
    from posttrain.cli._common import resolve
    from posttrain.pipeline.config import PRESETS, PipelineConfig
    from posttrain.pipeline.run import run_pipeline

    cfg = resolve(PipelineConfig, PRESETS, args)
    run_pipeline(
        cfg,
        args.out,
        only=tuple(args.only),
        skip=tuple(args.skip),
        explain=args.explain,
        quiet=args.quiet,
        preset=args.preset,
    )
    return 0
