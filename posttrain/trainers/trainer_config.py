"""The fields every trainer config shares, declared once: outputs, length, optimiser, schedule, cadence, seed, logs,
device and precision (declared in ``trainers/device_config.py``; what they do: ``trainers/engine/device.py``).

Key insight: torchtune's lesson — share a *shape*, not behaviour. Every trainer's config (``SFTConfig``,
``RMConfig``, ``DPOConfig``, ``PolicyGradientConfig``, ``PPOConfig``) is a dataclass that *includes* these
fields by inheriting :class:`TrainerConfig`; the loops stay in their own files. A trainer that needs another
default re-declares the field with :func:`override`, which copies the help text and the bounds from here
(so ``--lr`` is checked as ``> 0`` in every trainer, from this one declaration)::

    @dataclass
    class SFTConfig(TrainerConfig):
        out: str = override("out", "runs/sft")
        lr: float = override("lr", 3e-3)

A re-declared field keeps its place in the field order (and so in ``--help`` and the printed config); the
trainer's own fields follow these. The LR schedule all trainers use is ``common.lr_at``: linear warmup over
``warmup_steps``, then cosine decay from ``lr`` to ``min_lr_ratio * lr`` at ``steps`` (1 = constant).

Not handled: fields with different *meanings* per trainer (``init`` is optional for SFT, required for RL;
``data`` holds demonstrations, pairs or prompts): each trainer declares those itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from posttrain.config import check_fields, knob
from posttrain.loggers import LOGGER_HELP, check_loggers
from posttrain.trainers.device_config import device_field


@dataclass
class TrainerConfig:
    out: str = knob(
        "runs/train", "output directory (run.json, config.yaml, metrics.jsonl, summary.json, checkpoints/, model/)"
    )
    steps: int = knob(100, "optimizer steps", gt=0)
    lr: float = knob(1e-3, "peak learning rate (AdamW): linear warmup, then cosine decay to min_lr_ratio x lr", gt=0)
    min_lr_ratio: float = knob(
        0.1, "final LR as a fraction of the peak (cosine decay; 1 = constant after warmup)", ge=0, le=1
    )
    warmup_steps: int = knob(10, "linear LR warmup steps", ge=0)
    weight_decay: float = knob(0.0, "AdamW weight decay on matrices", ge=0)
    grad_clip: float = knob(1.0, "max global gradient norm (0 = no clipping)", ge=0)
    nan_patience: int = knob(3, "consecutive non-finite loss/grad-norm steps (each skipped) before the run stops", ge=1)
    eval_every: int = knob(50, "steps between held-out evaluations (0 = only at the start and the end)", ge=0)
    save_every: int = knob(100, "steps between checkpoints (0 = only the final model)", ge=0)
    keep_checkpoints: int = knob(2, "periodic checkpoints to keep", gt=0)
    seed: int = knob(0, "seed for init, data order, sampling and dropout", ge=0, lt=2**32)
    logger: str = knob("jsonl", LOGGER_HELP, check=check_loggers)
    threads: int | None = knob(
        None,
        "torch CPU threads (None: every usable core, i.e. torch's default within the CPU affinity, or "
        "OMP_NUM_THREADS when set; 1 never stalls on a busy machine). posttrain's own model trains to the same bits "
        "on any count (ops/thread_invariant.py)",
        ge=1,
    )
    progress: bool = knob(True, "show a progress bar (plain lines every 10% when not a terminal)")
    device: str = device_field("device")  # declared in device_config.py (the pipeline and the labs take it too)
    dtype: str = device_field("dtype")
    grad_checkpointing: bool = knob(
        False, "recompute each transformer block's activations in the backward pass (less memory, ~1/3 more compute)"
    )
    compile: bool = knob(False, "torch.compile the model's blocks (opt-in; the eager path is the default)")

    def __post_init__(self):
        check_fields(self)  # choices, bounds and finiteness, from the knobs (subclasses' included)


def override(name: str, default: Any, help: str | None = None) -> Any:
    """Re-declare the shared field ``name`` with another default (and optionally more specific help text),
    keeping its bounds and choices: ``lr: float = override("lr", 3e-3)``."""
    base = {f.name: f for f in dataclasses.fields(TrainerConfig)}
    if name not in base:
        raise KeyError(f"{name!r} is not a TrainerConfig field; declare it with knob() instead")
    meta = dict(base[name].metadata)
    if help is not None:
        meta["help"] = help
    return dataclasses.field(default=default, metadata=meta)
