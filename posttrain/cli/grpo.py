"""``posttrain grpo``: policy-gradient RL (REINFORCE / RLOO / GRPO) from an SFT checkpoint with a verifier reward."""

from __future__ import annotations

from posttrain.cli._common import add_preset_flags, announce, resolve

NAME = "grpo"
HELP = "RL with verifiable rewards: --algo reinforce|rloo|grpo, KL/clip/aggregation options, alarms, resume"


def add_arguments(p):
    from posttrain.config import add_config_flags
    from posttrain.trainers.policy_gradient import PRESETS, PolicyGradientConfig

    add_preset_flags(p, PRESETS)
    p.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the run in run directory DIR (or the run holding checkpoint DIR); outputs go there",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="delete a non-empty --out run directory and start a new run in it"
    )
    add_config_flags(p, PolicyGradientConfig)


def run(args) -> int:
    from posttrain.trainers.policy_gradient import PRESETS, PolicyGradientConfig, train_policy_gradient
    from posttrain.trainers.run_dir import resume_out

    cfg = resolve(PolicyGradientConfig, PRESETS, args, **resume_out(args))
    announce(cfg, cfg.out, verbose=args.verbose)
    train_policy_gradient(cfg, resume=args.resume, overwrite=args.overwrite)
    return 0
