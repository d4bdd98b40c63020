"""``posttrain sft``: supervised fine-tuning on the embedded task (or a JSONL of demonstrations)."""

from __future__ import annotations

from posttrain.cli._common import add_preset_flags, announce, resolve
from posttrain.config import add_config_flags

NAME = "sft"
HELP = "supervised fine-tuning (completion-only loss) with checkpoints, resume and held-out eval"


def add_arguments(p):
    from posttrain.trainers.sft import PRESETS, SFTConfig

    add_preset_flags(p, PRESETS)
    p.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the run in run directory DIR (or the run holding checkpoint DIR); outputs go there",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="delete a non-empty --out run directory and start a new run in it"
    )
    add_config_flags(p, SFTConfig)


def run(args) -> int:
    from posttrain.trainers.run_dir import resume_out
    from posttrain.trainers.sft import PRESETS, SFTConfig, train_sft

    cfg = resolve(SFTConfig, PRESETS, args, **resume_out(args))
    announce(cfg, cfg.out, verbose=args.verbose)
    train_sft(cfg, resume=args.resume, overwrite=args.overwrite)
    return 0
