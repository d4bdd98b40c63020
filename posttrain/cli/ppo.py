"""``posttrain ppo``: PPO (critic, GAE, clipped surrogate, KL-shaped reward) from an SFT checkpoint."""

from __future__ import annotations

from posttrain.cli._common import add_preset_flags, announce, resolve

NAME = "ppo"
HELP = "PPO with a value model: --reward-model RM or --reward SPEC, presets a2c|kl_ppo|ziegler, resume"


def add_arguments(p):
    from posttrain.config import add_config_flags
    from posttrain.trainers.ppo import PRESETS, PPOConfig

    add_preset_flags(p, PRESETS)
    p.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the run in run directory DIR (or the run holding checkpoint DIR); outputs go there",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="delete a non-empty --out run directory and start a new run in it"
    )
    add_config_flags(p, PPOConfig)


def run(args) -> int:
    from posttrain.trainers.ppo import PRESETS, PPOConfig, train_ppo
    from posttrain.trainers.run_dir import resume_out

    cfg = resolve(PPOConfig, PRESETS, args, **resume_out(args))
    announce(cfg, cfg.out, verbose=args.verbose)
    train_ppo(cfg, resume=args.resume, overwrite=args.overwrite)
    return 0
