"""The reward-model trainer's configuration and its presets (the recipes of ``docs/rm.md``): one declaration per
option (``knob``), the CLI flags generated from it; the loop is ``trainers/reward.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.config import Preset, check_fields, knob
from posttrain.data.checks import LONG_POLICIES
from posttrain.data.conversations import BAD_LINE_HELP, CHAT_TEMPLATE_HELP
from posttrain.data.preference_pairs import PairDataConfig
from posttrain.errors import ConfigError
from posttrain.models.gpt import GPTConfig
from posttrain.models.loading import model_path_knob, pad_token_knob
from posttrain.models.lora import lora_knob
from posttrain.on_policy_pairs import TrainPairsConfig
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.tasks.base import USER_FIELDS
from posttrain.trainers.reward_batches import BATCH_BY
from posttrain.trainers.trainer_config import TrainerConfig, override


@dataclass
class RMConfig(TrainerConfig):
    out: str = override("out", "runs/rm")
    init: str | None = knob(None, "backbone from this (SFT) checkpoint; without it a fresh GPT of --model shape")
    source: str = knob(
        "auto",
        "embedded pairs: policy (samples of --init) | synthetic (corrupted answers) | auto",
        choices=("auto", "policy", "synthetic"),
        unused_with=USER_FIELDS,
    )
    steps: int = override("steps", 300)
    batch_size: int = knob(
        32, "pairs per optimizer step (with batch_by=prompt: prompts, each with all its pairs)", gt=0
    )
    batch_by: str = knob(
        "pair",
        "pair: batch_size random pairs, 2 rows each | prompt: batch_size random prompts with all their pairs, "
        "each distinct completion scored once (InstructGPT's K-choose-2 batches; trainers/reward_batches.py)",
        choices=BATCH_BY,
    )
    warmup_steps: int = override("warmup_steps", 20)
    share_prompt_prefix: bool = knob(
        True,
        "run each pair's prompt once for its chosen and rejected rows (exact: same rewards and gradients; "
        "a posttrain GPT backbone on one process; otherwise the full forward)",
    )
    sft_coef: float = knob(
        0.0,
        "GRM regulariser (Yang et al. 2024): + sft_coef x the chosen completions' token NLL under the backbone's "
        "own LM head (posttrain GPT: from the same forward; a Hugging Face causal LM: a second forward over the chosen "
        "rows; one process)",
        ge=0,
    )
    center_coef: float = knob(0.0, "reward-centring coefficient c in c * (r_w + r_l)^2 (Eisenstein et al. 2023)", ge=0)
    use_margin: bool = knob(False, "subtract each pair's 'margin' field inside the BT loss (Llama 2)")
    bucket_edges: tuple[float, ...] = knob((1.5, 10.0, 100.0), "margin-bucket edges for held-out accuracy")
    eval_prompts: int = knob(512, "held-out prompts used to build held-out pairs", gt=0, unused_with=USER_FIELDS)
    stats_pairs: int = knob(1024, "training pairs whose completions define the saved reward mean/std", gt=0)
    eval_every: int = override("eval_every", 100)
    data: str | None = knob(None, "JSONL of {prompt, chosen, rejected[, margin]} training pairs (default: embedded)")
    eval_data: str | None = knob(None, "JSONL of held-out pairs (default: embedded, from the held-out split)")
    max_prompt_length: int | None = knob(None, "keep the last N prompt tokens (None = all)", gt=0)
    max_completion_length: int | None = knob(None, "keep the first N completion tokens (None = all)", gt=0)
    long: str = knob(
        "error",
        "pairs longer than the model's window: error | truncate (prompt keeps its end, completions their start) | skip",
        choices=LONG_POLICIES,
    )
    pairs: PairDataConfig = knob(factory=PairDataConfig, help="embedded pairs", unused_with=USER_FIELDS)
    model: GPTConfig = knob(factory=GPTConfig, help="backbone shape (ignored with init)")
    task: ArithmeticConfig = knob(factory=ArithmeticConfig, help="embedded task", unused_with=USER_FIELDS)
    chat_template: str = knob("auto", CHAT_TEMPLATE_HELP)
    on_bad_line: str = knob("error", BAD_LINE_HELP, choices=("error", "skip"))

    def train_pairs_requested(self) -> bool:
        """Whether ``train_pairs`` asks for anything beyond the default pairs; the `tiny` preset's own sampling (32
        per prompt) does not, so ``rm --preset tiny`` with ``--data FILE`` or without ``--init`` keeps working."""
        return self.train_pairs.requested() and self.train_pairs != TrainPairsConfig(**RECIPE["train_pairs"])

    def __post_init__(self):
        check_fields(self)  # choices, bounds and finiteness, from the knobs above
        if list(self.bucket_edges) != sorted(self.bucket_edges):
            raise ConfigError(f"bucket_edges must be increasing, got {self.bucket_edges}")
        if self.fsdp and self.lora_r > 0:
            raise ConfigError("fsdp with LoRA (lora_r > 0) is not supported yet; LoRA alone usually fits one device")
        if self.data and self.train_pairs_requested():
            raise ConfigError(
                "train_pairs.* shapes the embedded training pairs; with --data it would do nothing: drop it"
            )

    # a local Hugging Face model (or posttrain checkpoint) to start from, and LoRA (models/loading.py, models/lora.py)
    model_path: str | None = model_path_knob()
    pad_token: str | None = pad_token_knob()
    lora_r: int = lora_knob("r")
    lora_alpha: float = lora_knob("alpha")
    lora_dropout: float = lora_knob("dropout")
    lora_target_modules: tuple[str, ...] = lora_knob("target_modules")
    merge_lora: bool = lora_knob("merge")
    fsdp: bool = knob(
        False,
        "under torchrun: shard the reward model's parameters, gradients and optimizer state over the processes "
        "(FSDP2); checkpoints are then sharded (DCP) and `posttrain export` consolidates them",
    )
    train_pairs: TrainPairsConfig = knob(
        factory=TrainPairsConfig,
        help="training pairs only (more samples, restarts, synthetic); held-out pairs keep --pairs",
        unused_with=USER_FIELDS,
    )


# The recipe behind the 0.96-0.98 held-out pairwise accuracy of docs/rm.md on seeds 0-2: verifier-labelled pairs are
# free, so sample the --init SFT model 32 times on every training prompt (train_pairs.samples_per_prompt), keep up to
# 8 (correct, wrong) pairs per prompt (the reference answer as chosen where no sample is right), train 3000 steps of
# 64 pairs with the GRM regulariser (sft_coef 1: + the chosen answers' NLL under the backbone's LM head). Held-out
# pairs: the same model's 16 samples on each of 1000 held-out prompts (--pairs). Without --init: synthetic pairs.
RECIPE: dict = {
    "steps": 3000,
    "batch_size": 64,
    "eval_every": 250,
    "save_every": 500,
    "eval_prompts": 1000,
    "sft_coef": 1.0,
    "pairs": {"num_prompts": 9000, "samples_per_prompt": 16, "max_pairs_per_prompt": 8, "gold_chosen": True},
    "train_pairs": {"restarts": "off", "samples_per_prompt": 32},
}

# What each preset is for (`posttrain rm --help`, docs/rm.md); the recipes they replaced are in docs/log/.
PRESETS: dict[str, dict] = {
    "tiny": Preset(
        "the default on the embedded task: pairs from 32 samples of the --init SFT model per prompt, 3000 steps of 64 "
        "pairs with the GRM term",
        RECIPE,
    ),
    "small": Preset(
        "a 6-layer, 192-wide backbone, 800 steps on 4096 prompts: with `sft --preset small`",
        {"steps": 800, "pairs": {"num_prompts": 4096}, "model": {"n_layer": 6, "n_head": 6, "d_model": 192}},
    ),
}
