"""The one list of trainers: :data:`TRAINERS`, read by the command line (one generated subcommand each), the pipeline
(its training stages), torchrun (the command a stage runs on N processes) and the run directory (:func:`command_of`:
the command that made a run, named in its messages).

Each entry names its module and the names in it by string, so that reading the registry imports neither torch nor a
trainer: ``posttrain --help`` stays fast and a stage imports only its own trainer. Adding a trainer = one entry here
(and its module: a config dataclass, ``PRESETS`` and a ``train_*(cfg, resume=None, overwrite=False) -> summary``).

    >>> TRAINERS["grpo"].module, TRAINERS["grpo"].train
    ('posttrain.trainers.policy_gradient', 'train_policy_gradient')
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class TrainerEntry:
    """One trainer: its command, where it lives and what its command line says about it."""

    command: str  # the subcommand and the pipeline stage: "sft", "rm", "dpo", "grpo", "ppo"
    module: str  # the trainer's module: "posttrain.trainers.sft"
    config: str  # its config dataclass in that module: "SFTConfig"
    train: str  # its entry point in that module: train(cfg, resume=None, overwrite=False) -> summary dict
    help: str  # one line for `posttrain --help` and the subcommand's description
    evaluate_only: str | None = None  # "module:function(cfg, overwrite)" scoring a trained model with no training
    evaluate_only_help: str = ""
    trainer: str | None = None  # the name its runs record (run.json, trainer_state.json); None: the command
    variants: tuple[tuple[str, str], ...] = ()  # other runs the command makes: (recorded name, the flag making them)

    @property
    def recorded(self) -> str:
        """The trainer name this command's runs record: "policy_gradient" for grpo, else the command."""
        return self.trainer or self.command

    def load(self):
        return importlib.import_module(self.module)

    def config_class(self):
        return getattr(self.load(), self.config)

    def presets(self) -> dict[str, dict]:
        return self.load().PRESETS

    def train_fn(self):
        return getattr(self.load(), self.train)


TRAINERS: dict[str, TrainerEntry] = {
    e.command: e
    for e in (
        TrainerEntry(
            "sft",
            "posttrain.trainers.sft",
            "SFTConfig",
            "train_sft",
            "supervised fine-tuning (completion-only loss) with checkpoints, resume and held-out eval",
            variants=(("sft_restarts", "--restarts"),),
        ),
        TrainerEntry(
            "rm",
            "posttrain.trainers.reward",
            "RMConfig",
            "train_reward_model",
            "reward model (scalar head, Bradley-Terry loss) with held-out pairwise accuracy and saved reward stats",
            evaluate_only="posttrain.trainers.reward_eval:eval_reward_model",
            evaluate_only_help="train nothing: pairwise accuracy of the RM --init on the "
            "{prompt, chosen, rejected} JSONL --eval-data, written to --out/summary.json (pairwise_accuracy, n)",
            variants=(("rm_eval", "--eval-only"),),
        ),
        TrainerEntry(
            "dpo",
            "posttrain.trainers.dpo",
            "DPOConfig",
            "train_dpo",
            "preference optimisation (DPO family) on on-policy pairs or a JSONL of pairs, with a frozen reference",
        ),
        TrainerEntry(
            "grpo",
            "posttrain.trainers.policy_gradient",
            "PolicyGradientConfig",
            "train_policy_gradient",
            "RL with verifiable rewards: --algo reinforce|rloo|grpo, KL/clip/aggregation options, alarms, resume",
            trainer="policy_gradient",
        ),
        TrainerEntry(
            "ppo",
            "posttrain.trainers.ppo",
            "PPOConfig",
            "train_ppo",
            "PPO with a value model: --reward-model RM or --reward SPEC, presets a2c|kl_ppo|ziegler, resume",
        ),
    )
}
"""Command -> trainer, in the order the pipeline runs them."""


def by_module(module: str) -> TrainerEntry:
    """The entry of a trainer module ("posttrain.trainers.reward" -> the ``rm`` entry)."""
    return next(e for e in TRAINERS.values() if e.module == module)


def command_of(trainer: str) -> str:
    """The command line that makes runs recorded as ``trainer`` (in ``run.json`` / ``trainer_state.json``); a name no
    entry records, as it is.

    Examples: "policy_gradient" -> "grpo"; "sft_restarts" -> "sft --restarts"; "rm_eval" -> "rm --eval-only";
    "ppo" -> "ppo".
    """
    for e in TRAINERS.values():
        if trainer == e.recorded:
            return e.command
        for name, flag in e.variants:
            if trainer == name:
                return f"{e.command} {flag}"
    return str(trainer)
