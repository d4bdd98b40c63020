"""Model selection for SFT: a validation split of the *training* demonstrations and the best checkpoint on it.

Key insight: selection must never look at the evaluation split, so the validation demonstrations are a stable
hash of the prompt alone (``stable_fraction("sft-validation:" + prompt) < fraction``): the same split on every
seed, machine and data order, disjoint from what is trained on. ``BestKeeper`` holds the best-so-far weights
by greedy validation accuracy (the earliest on ties) and the evaluations since it (for ``patience``);
``save_with_best`` writes them beside a periodic checkpoint, in the same atomic directory, so a resumed run
selects exactly as an uninterrupted one.
"""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import save_file

from posttrain.checkpoints.files import load_tensors
from posttrain.errors import ConfigError, UserError
from posttrain.hashing import stable_fraction
from posttrain.trainers.checkpoint import save_with_extras

BEST_FILE = "best.safetensors"  # in each periodic checkpoint: the best-so-far weights (for an exact resume)


def is_validation(prompt: str, fraction: float) -> bool:
    """Is this demonstration in the validation split? A stable hash of the prompt alone (any seed, any order)."""
    return stable_fraction("sft-validation:" + prompt) < fraction


def split_validation(demos, fraction: float) -> tuple[list[int], list[int]]:
    """Indices of (training, validation) demonstrations; no validation when fewer than 2 demos would remain."""
    val = [i for i, (p, _) in enumerate(demos) if fraction > 0 and is_validation(p, fraction)]
    if len(demos) - len(val) < 2:
        raise ConfigError(
            f"val_fraction={fraction} leaves {len(demos) - len(val)} of {len(demos)} demonstrations "
            f"to train on; lower it"
        )
    chosen = set(val)
    return [i for i in range(len(demos)) if i not in chosen], val


class BestKeeper:
    """The best-so-far weights by validation accuracy (earliest on ties) and the evaluations since it."""

    def __init__(self):
        self.step, self.score, self.weights, self.since = None, None, None, 0

    def offer(self, step: int, score: float, model) -> bool:
        if self.score is None or score > self.score:
            self.step, self.score, self.since = step, score, 0
            self.weights = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
            return True
        self.since += 1
        return False

    def state_dict(self) -> dict:
        return {"step": self.step, "val_accuracy": self.score, "since": self.since}

    def load(self, state: dict, path: Path) -> None:
        self.step, self.score, self.since = state["step"], state["val_accuracy"], int(state["since"])
        if self.step is not None:
            if not (path / BEST_FILE).is_file():
                raise UserError(
                    f"{path}: checkpoint has no {BEST_FILE} (the best weights so far); cannot resume exactly"
                )
            self.weights = load_tensors(path / BEST_FILE)  # corrupt: one line naming the file


def save_with_best(directory, best: BestKeeper, **kwargs) -> Path:
    """:func:`save_checkpoint` plus ``best.safetensors`` (the best-so-far weights), one atomic directory."""

    def extras(tmp):
        if best.weights is not None:
            save_file(best.weights, str(tmp / BEST_FILE))

    return save_with_extras(directory, extras, **kwargs)
