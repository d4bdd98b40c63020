"""``posttrain dpo``: the DPO family (dpo, ipo, hinge, robust, cdpo, kto, simpo, rpo, rdpo, beta_dpo) from an SFT checkpoint."""

from __future__ import annotations

from posttrain.cli._common import add_preset_flags, announce, resolve
from posttrain.config import add_config_flags

NAME = "dpo"
HELP = "preference optimisation (DPO family) on on-policy pairs or a JSONL of pairs, with a frozen reference"


def add_arguments(p):
    from posttrain.trainers.dpo import PRESETS, DPOConfig

    add_preset_flags(p, PRESETS)
    p.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the run in run directory DIR (or the run holding checkpoint DIR); outputs go there",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="delete a non-empty --out run directory and start a new run in it"
    )
    add_config_flags(p, DPOConfig)


def run(args) -> int:
    from posttrain.trainers.dpo import PRESETS, DPOConfig, train_dpo
    from posttrain.trainers.run_dir import resume_out

    cfg = resolve(DPOConfig, PRESETS, args, **resume_out(args))
    announce(cfg, cfg.out, verbose=args.verbose)
    train_dpo(cfg, resume=args.resume, overwrite=args.overwrite)
    return 0
