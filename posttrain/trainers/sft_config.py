"""SFT's configuration: :class:`SFTConfig` (each option declared once, with its help, as a ``knob``; the CLI flags
are generated from it) and its named starting points, :data:`PRESETS`. The trainer is ``trainers/sft.py``; the
restarts options are run by ``trainers/sft_restarts.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.config import Preset, check_fields, knob
from posttrain.data.checks import LONG_POLICIES
from posttrain.data.conversations import BAD_LINE_HELP, CHAT_TEMPLATE_HELP
from posttrain.errors import ConfigError
from posttrain.models.gpt import GPTConfig
from posttrain.models.loading import model_path_knob, pad_token_knob
from posttrain.models.lora import lora_knob
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.tasks.base import USER_FIELDS
from posttrain.trainers import sft_restarts
from posttrain.trainers.trainer_config import TrainerConfig, override


@dataclass
class SFTConfig(TrainerConfig):
    out: str = override("out", "runs/sft")
    steps: int = override("steps", 600)
    batch_size: int = knob(64, "sequences per optimizer step", gt=0)
    grad_accum: int = knob(1, "micro-batches per optimizer step (batch_size must divide evenly)", gt=0)
    lr: float = override("lr", 3e-3)
    warmup_steps: int = override("warmup_steps", 30)
    weight_decay: float = override("weight_decay", 0.1)
    eval_every: int = override(
        "eval_every",
        200,
        "steps between validation (and held-out) evaluations (0 = only at the end; use ~25 with val_fraction)",
    )
    val_fraction: float = knob(
        0.0,
        "fraction of the training demonstrations held out (stable hash of the prompt) to "
        "select the checkpoint by greedy validation accuracy (0 = off: model/ = last step); on the embedded "
        "task any value > 0 selects on its dev split instead (val_problems of it), every demonstration training",
        ge=0,
        lt=1,
    )
    patience: int = knob(
        0,
        "stop after this many evaluations in a row without a new best validation accuracy (0 = never stop early)",
        ge=0,
    )
    save_every: int = override("save_every", 200)
    init: str | None = knob(None, "start from this checkpoint's weights and tokenizer instead of a fresh model")
    data: str | None = knob(None, "JSONL of {prompt, answer} demonstrations (default: the embedded task's)")
    eval_data: str | None = knob(None, "JSONL of {prompt, answer} for evaluation (default: the task's held-out set)")
    max_new_tokens: int = knob(8, "generation length for evaluation", gt=0)
    long: str = knob(
        "error",
        "records longer than the model's window: error | truncate (prompt keeps its end, answer its start) | skip",
        choices=LONG_POLICIES,
    )
    model: GPTConfig = knob(factory=GPTConfig, help="model shape (ignored with init)")
    task: ArithmeticConfig = knob(factory=ArithmeticConfig, help="embedded task", unused_with=USER_FIELDS)
    chat_template: str = knob("auto", CHAT_TEMPLATE_HELP)
    on_bad_line: str = knob("error", BAD_LINE_HELP, choices=("error", "skip"))
    fsdp: bool = knob(
        False,
        "under torchrun: shard parameters, gradients and optimizer state over the processes "
        "(FSDP2); checkpoints are then sharded (DCP) and `posttrain export` consolidates them",
    )
    tokenizer: str | None = knob(
        None,
        "tokenizer.json for a fresh model (its vocabulary size sets model.vocab_size; default: the embedded task's "
        "characters, with --data the 256 byte values, any text; ignored with init)",
    )
    restarts: int = knob(
        1,
        "SFT runs from different initialisations (seed, then hashes of it); model/ = the one "
        "with the best validation accuracy (trainers/sft_restarts.py); 1 = one plain run",
        ge=1,
    )
    val_problems: int = knob(
        1024,
        "restarts on the embedded task: problems of its dev split (all of it when it has "
        "fewer), scored greedily to rank the restarts (256 mis-ranked runs "
        "1.5 points apart: docs/outcomes.md)",
        gt=0,
        unused_with=USER_FIELDS,
    )
    val_data: str | None = knob(
        None,
        "restarts: JSONL/Parquet of {prompt, answer} problems (neither demonstrations nor the "
        "evaluation set) to rank them on by greedy accuracy instead of the embedded task's "
        "val_problems; makes restarts work with --data without --val-fraction",
    )
    restart_probe: float = knob(
        0.0,
        "restarts by successive halving: train every restart to this fraction of the steps, rank "
        "them there on the validation problems, and finish only the best restart_keep (0 = every "
        "restart runs all steps)",
        ge=0,
        lt=1,
    )
    restart_keep: int = knob(1, "with restart_probe: how many restarts train past the probe", ge=1)
    restart_jobs: int = knob(
        0,
        "restarts trained at a time, each in its own process on --threads threads; 0 = as many as the usable cores "
        "hold (on the CPU, restarts of 100+ steps; 1 otherwise); every restart, and so model/, ends bit for bit as "
        "one at a time; each worker's output goes to restarts/K.log (spawned processes: a script calling train_sft "
        "needs the `if __name__ == '__main__':` guard for them)",
        ge=0,
    )

    def __post_init__(self):
        check_fields(self)  # choices, bounds and finiteness, from the knobs above
        if self.fsdp and self.lora_r > 0:
            raise ConfigError("fsdp with LoRA (lora_r > 0) is not supported yet; LoRA alone usually fits one device")
        if self.fsdp and self.val_fraction > 0:
            raise ConfigError(
                "fsdp with val_fraction > 0 is not supported yet (the best-so-far weights would be "
                "sharded); use one or the other"
            )
        sft_restarts.check_config(self)
        if self.batch_size % self.grad_accum:
            raise ConfigError(f"batch_size={self.batch_size} must be divisible by grad_accum={self.grad_accum}")

    # a local Hugging Face model (or posttrain checkpoint) to start from, and LoRA (models/loading.py, models/lora.py)
    model_path: str | None = model_path_knob()
    pad_token: str | None = pad_token_knob()
    lora_r: int = lora_knob("r")
    lora_alpha: float = lora_knob("alpha")
    lora_dropout: float = lora_knob("dropout")
    lora_target_modules: tuple[str, ...] = lora_knob("target_modules")
    merge_lora: bool = lora_knob("merge")


# What each preset is for (`posttrain sft --help`, docs/sft.md); the recipes they replaced are in docs/log/.
PRESETS: dict[str, dict] = {
    "tiny": Preset(
        "the default on the embedded task: 2000 steps, weight decay 3.0, 4 restarts ranked at step 1000, the best "
        "finishes",
        {"steps": 2000, "weight_decay": 3.0, "restarts": 4, "restart_probe": 0.5, "restart_keep": 1},
    ),
    "slots16": Preset(
        "the start of the strongest measured recipe, then `grpo --preset long_cosine`: digit-slot positions, 16 "
        "restarts of 600 steps ranked at step 300, the best 2 finish",
        {"restarts": 16, "restart_probe": 0.5, "restart_keep": 2, "model": {"digit_slots": 2}},
    ),
    "single": Preset("one plain run of 600 steps, no restarts: a quick check of a change", {}),
    "small": Preset(
        "a 6-layer, 192-wide model on 1024 demonstrations: when the tiny model is the limit",
        {"steps": 1500, "model": {"n_layer": 6, "n_head": 6, "d_model": 192}, "task": {"num_demos": 1024}},
    ),
}
