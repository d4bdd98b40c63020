"""The DPO-family trainer's configuration and presets (``knob`` declarations, the CLI flags come from them), and
the check of ``loss_kwargs`` against each loss's declared options; the loop is ``trainers/dpo.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.config import Preset, check_fields, check_value, knob
from posttrain.data.checks import LONG_POLICIES
from posttrain.data.conversations import BAD_LINE_HELP, CHAT_TEMPLATE_HELP
from posttrain.data.preference_pairs import PairDataConfig
from posttrain.errors import ConfigError
from posttrain.losses.preference import PREFERENCE_LOSSES, resolve_loss
from posttrain.models.loading import model_path_knob, pad_token_knob
from posttrain.models.lora import lora_knob
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.tasks.base import USER_FIELDS
from posttrain.trainers.trainer_config import TrainerConfig, override


@dataclass
class DPOConfig(TrainerConfig):
    out: str = override("out", "runs/dpo")
    init: str | None = knob(None, "SFT checkpoint: the policy's starting point and the frozen reference (required)")
    loss: str = knob(
        "dpo",
        f"preference loss: one of {', '.join(PREFERENCE_LOSSES)}, or TRL's loss_type name (sigmoid = dpo); or "
        "several joined by commas (weighted sum). Default dpo; the embedded task's presets use rpo (DPO + NLL of "
        "the chosen answer: it beat SFT on every seed of docs/outcomes.md)",
    )
    loss_weights: str | None = knob(
        None, "weights of a combined --loss a,b,c, e.g. '0.8,0.2,1.0' (default 1 each; TRL's loss_weights)"
    )
    beta: float | None = knob(None, "loss temperature beta (None = the loss's default: 0.1, SimPO 2.0)", gt=0)
    loss_kwargs: dict = knob(factory=dict, help="extra loss arguments as JSON, e.g. '{\"label_smoothing\": 0.2}'")
    steps: int = override("steps", 250)
    max_epochs: float | None = knob(
        None,
        "train at most this many passes over the pairs: the run's steps become min(steps, ceil(max_epochs * pairs / "
        "batch_size)) once the pairs are built (None = steps alone); a policy that is right almost everywhere leaves "
        "few on-policy pairs, and 250 steps over a hundred of them memorise those and unlearn the rest",
        gt=0,
    )
    batch_size: int = knob(32, "pairs per optimizer step (KTO: 2x this many labelled completions)", gt=0)
    lr: float = override("lr", 1e-4)
    precompute_ref: bool = knob(True, "compute reference log-probs once for the dataset (one forward pass per step)")
    save_every: int = override("save_every", 50)
    seed: int = override("seed", 0, "seed for data order and the loss's own sampling (beta-DPO filtering)")
    data: str | None = knob(
        None,
        "JSONL of {prompt, chosen, rejected} pairs (KTO: {prompt, completion, label}); "
        "default: on-policy pairs sampled from --init on the embedded task",
    )
    eval_data: str | None = knob(None, "JSONL of {prompt, answer} for evaluation (default: the task's held-out set)")
    max_prompt_length: int | None = knob(None, "keep the last N prompt tokens (None = all)", gt=0)
    max_completion_length: int | None = knob(None, "keep the first N completion tokens (None = all)", gt=0)
    max_new_tokens: int = knob(8, "generation length for evaluation", gt=0)
    long: str = knob(
        "error",
        "records longer than the model's window: error | truncate (prompt keeps its end, "
        "completions their start) | skip",
        choices=LONG_POLICIES,
    )
    pairs: PairDataConfig = knob(factory=PairDataConfig, help="embedded on-policy pairs", unused_with=USER_FIELDS)
    task: ArithmeticConfig = knob(factory=ArithmeticConfig, help="embedded task", unused_with=USER_FIELDS)
    chat_template: str = knob("auto", CHAT_TEMPLATE_HELP)
    on_bad_line: str = knob("error", BAD_LINE_HELP, choices=("error", "skip"))

    def __post_init__(self):
        check_fields(self)  # choices, bounds and finiteness, from the knobs above
        self.loss = resolve_loss(self.loss, self.loss_weights).name  # names (TRL's -> ours), weights, combinability
        check_loss_kwargs(self.loss, self.loss_kwargs)
        if self.fsdp and self.lora_r > 0:
            raise ConfigError("fsdp with LoRA (lora_r > 0) is not supported yet; LoRA alone usually fits one device")

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
        "under torchrun: shard the policy's parameters, gradients and optimizer state over the "
        "processes (FSDP2; the reference, unless precomputed, stays whole on each); checkpoints are "
        "then sharded (DCP) and `posttrain export` consolidates them",
    )


# What each preset is for (`posttrain dpo --help`, docs/preference.md); plain DPO is `--loss dpo`.
PRESETS: dict[str, dict] = {
    "tiny": Preset(
        "the default on the embedded task: RPO (DPO + the chosen answers' NLL) on on-policy pairs, at most 6 passes "
        "over them (a policy right almost everywhere leaves few pairs; docs/outcomes.md)",
        {"loss": "rpo", "max_epochs": 6.0},
    ),
    "small": Preset(
        "500 steps on 8192 prompts: from a `sft --preset small` model",
        {"loss": "rpo", "max_epochs": 6.0, "steps": 500, "pairs": {"num_prompts": 8192}},
    ),
}


def loss_options(loss: str) -> list[str]:
    """Keyword arguments of a loss that a user may set through ``loss_kwargs`` (declared in its ``LossSpec``)."""
    return list(resolve_loss(loss).options)


def check_loss_kwargs(loss: str, kwargs) -> None:
    """ConfigError unless every ``loss_kwargs`` entry is an option of ``loss``, a finite number, in its domain
    (the ``options`` of its :class:`~posttrain.losses.preference.LossSpec`; a combined loss: each component's).

    Example: ``check_loss_kwargs("cdpo", {"label_smoothing": 5})`` raises
    "loss_kwargs.label_smoothing=5 must be in [0, 0.5] (loss 'cdpo')".
    """
    if not isinstance(kwargs, dict):
        raise ConfigError(f"loss_kwargs must be a JSON object, got {kwargs!r}")
    options = resolve_loss(loss).options
    unknown = sorted(set(kwargs) - set(options))
    if unknown:
        raise ConfigError(
            f"loss_kwargs {unknown} not accepted by loss {loss!r}; its options: {', '.join(options) or '(none)'}"
        )
    for k, v in kwargs.items():
        name = f"loss_kwargs.{k}"
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{name}={v!r} is not a number (loss {loss!r})")
        try:
            if isinstance(v, int) and abs(v) > 2**53:
                raise ConfigError(f"{name}={v!r} is out of range")
            for bounds in options[k].values():  # each component that takes the option: its domain
                check_value(name, v, bounds=bounds or None)
        except ConfigError as e:
            raise ConfigError(f"{e} (loss {loss!r})") from None
