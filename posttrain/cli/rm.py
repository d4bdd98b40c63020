"""``posttrain rm``: a Bradley-Terry reward model on preference pairs (embedded task or a JSONL file)."""

from __future__ import annotations

from posttrain.cli._common import add_preset_flags, announce, resolve
from posttrain.config import add_config_flags

NAME = "rm"
HELP = "reward model (scalar head, Bradley-Terry loss) with held-out pairwise accuracy and saved reward stats"


def add_arguments(p):
    from posttrain.trainers.reward import PRESETS, RMConfig

    add_preset_flags(p, PRESETS)
    p.add_argument("--resume", metavar="DIR", help="continue the run saved in DIR (a run dir or checkpoint dir)")
    add_config_flags(p, RMConfig)


def run(args) -> int:
    from posttrain.trainers.reward import PRESETS, RMConfig, train_reward_model

    cfg = resolve(RMConfig, PRESETS, args)
    announce(cfg, cfg.out)
    train_reward_model(cfg, resume=args.resume)
    return 0
