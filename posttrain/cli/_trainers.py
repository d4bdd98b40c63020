"""One subcommand per trainer, generated from the registry (``trainers/engine/registry.py``): ``posttrain sft``,
``rm``, ``dpo``, ``grpo``, ``ppo`` all take ``--preset``, ``--config``, ``--resume DIR``, ``--overwrite`` and one flag
per field of the trainer's config; ``rm`` also ``--eval-only`` (its registry entry's ``evaluate_only``)."""

from __future__ import annotations

import importlib

from posttrain.cli._common import add_preset_flags, announce, resolve
from posttrain.trainers.engine.registry import TRAINERS, TrainerEntry


class TrainerCommand:
    """A subcommand with the shape of a ``posttrain/cli/<name>.py`` module: NAME, HELP, add_arguments, run."""

    def __init__(self, entry: TrainerEntry):
        self.entry, self.NAME, self.HELP = entry, entry.command, entry.help
        self.__name__ = f"posttrain.cli.{entry.command}"

    def add_arguments(self, p) -> None:
        from posttrain.config import add_config_flags

        add_preset_flags(p, self.entry.presets())
        p.add_argument(
            "--resume",
            metavar="DIR",
            help="continue the run in run directory DIR (or the run holding checkpoint DIR); outputs go there",
        )
        p.add_argument(
            "--overwrite", action="store_true", help="delete a non-empty --out run directory and start a new run in it"
        )
        if self.entry.evaluate_only:
            p.add_argument("--eval-only", action="store_true", help=self.entry.evaluate_only_help)
        add_config_flags(p, self.entry.config_class(), trl=True)

    def run(self, args) -> int:
        from posttrain.errors import UserError
        from posttrain.trainers.run_dir import restart_unstarted, resume_out

        eval_only = getattr(args, "eval_only", False)
        if eval_only and args.resume:
            raise UserError("--eval-only trains nothing, so there is nothing to --resume")
        cfg = resolve(self.entry.config_class(), self.entry.presets(), args, **resume_out(args))
        if eval_only:
            module, fn = self.entry.evaluate_only.split(":")
            getattr(importlib.import_module(module), fn)(cfg, overwrite=args.overwrite)
            return 0
        announce(cfg, cfg.out, verbose=args.verbose)
        resume = args.resume if args.overwrite else restart_unstarted(args.resume)  # no checkpoint yet: step 0
        self.entry.train_fn()(cfg, resume=resume, overwrite=args.overwrite)
        return 0


COMMANDS = [TrainerCommand(e) for e in TRAINERS.values()]
