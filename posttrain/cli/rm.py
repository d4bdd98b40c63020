"""``posttrain rm``: a Bradley-Terry reward model on preference pairs (embedded task or a JSONL file)."""

from __future__ import annotations

from posttrain.cli._common import add_preset_flags, announce, resolve
from posttrain.config import add_config_flags

NAME = "rm"
HELP = "reward model (scalar head, Bradley-Terry loss) with held-out pairwise accuracy and saved reward stats"


def add_arguments(p):
    from posttrain.trainers.reward import PRESETS, RMConfig

    add_preset_flags(p, PRESETS)
    p.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the run in run directory DIR (or the run holding checkpoint DIR); outputs go there",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="delete a non-empty --out run directory and start a new run in it"
    )
    p.add_argument(
        "--eval-only",
        action="store_true",
        help="train nothing: pairwise accuracy of the RM --init on the "
        "{prompt, chosen, rejected} JSONL --eval-data, written to --out/summary.json (pairwise_accuracy, n)",
    )
    add_config_flags(p, RMConfig)


def run(args) -> int:
    from posttrain.errors import UserError
    from posttrain.trainers.reward import PRESETS, RMConfig, train_reward_model
    from posttrain.trainers.reward_eval import eval_reward_model
    from posttrain.trainers.run_dir import resume_out

    if args.eval_only and args.resume:
        raise UserError("--eval-only trains nothing, so there is nothing to --resume")
    cfg = resolve(RMConfig, PRESETS, args, **resume_out(args))
    if args.eval_only:
        eval_reward_model(cfg, overwrite=args.overwrite)
        return 0
    announce(cfg, cfg.out, verbose=args.verbose)
    train_reward_model(cfg, resume=args.resume, overwrite=args.overwrite)
    return 0
