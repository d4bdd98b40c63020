"""Tail weight averaging: the final policy is the mean of its own weights at the last K snapshot steps.

Key insight: late in an RL run on a small task, the held-out accuracy of successive checkpoints swings by several
points while the training reward keeps rising (the policy wanders along a noisy gradient around a good region);
the plain mean of a few late weights (stochastic weight averaging along one trajectory, Izmailov et al. 2018;
checkpoint averaging) lands nearer the middle of where it wanders, at no cost in training steps:

    S       = {T - i * every : i = 0 .. K-1, T - i * every >= 1}         (T = the run's last step)
    W_final = (W_{s_1} + W_{s_2} + ... + W_{s_K}) / K     s_1 < s_2 < ...; summed in step order, in the weights' dtype

Only trainable parameters are averaged (a frozen LoRA base or buffer stays bitwise what it is). The running sum
and the steps in it travel in every periodic checkpoint, so a resumed run averages exactly what an uninterrupted
one does. K = 1 is the last weights (no averaging). Under FSDP the sum is sharded like the parameters (each rank
adds its own shards) and travels in the sharded checkpoint's DCP, which reshards it on load: such a run resumes on
any number of processes, as its weights do.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from posttrain.checkpoints.files import load_tensors
from posttrain.errors import UserError
from posttrain.trainers import sharded

SUM_FILE = "weight_average_sum.safetensors"  # in a periodic checkpoint, beside the policy
SUM_KEY = "weight_average_sum"  # in a sharded checkpoint's DCP


def average_steps(steps: int, count: int, every: int) -> list[int]:
    """The steps whose weights are averaged, ascending (``count`` of them, ``every`` apart, ending at ``steps``)."""
    return sorted({steps - i * every for i in range(count) if steps - i * every >= 1})


class TailAverage:
    """Running sum of the trainable weights at :func:`average_steps`; :meth:`apply` puts their mean in the model."""

    def __init__(self, steps: int, count: int, every: int):
        self.at = average_steps(steps, count, every)
        self.total: dict[str, torch.Tensor] | None = None
        self.added: list[int] = []

    @property
    def active(self) -> bool:
        return len(self.at) > 1

    @staticmethod
    def _trainable(model) -> dict[str, torch.Tensor]:
        return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}

    def add(self, model, done: int) -> bool:
        """Add the weights after ``done`` optimizer steps when ``done`` is one of the averaged steps."""
        if not self.active or done not in self.at:
            return False
        weights = self._trainable(model)
        if self.total is None:
            self.total = {n: w.clone() for n, w in weights.items()}
        else:
            for n, w in weights.items():
                self.total[n].add_(w)  # in step order: ((W_1 + W_2) + W_3) ...
        self.added.append(done)
        return True

    def apply(self, model) -> bool:
        """Load the mean of the added weights into ``model`` (in place); False when nothing to average."""
        if self.total is None or len(self.added) < 2:
            return False
        k = len(self.added)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in self.total:
                    p.copy_(self.total[n] / k)
        return True

    # -------------------------------------------------------------------------------------------- checkpoints
    def state(self) -> dict:
        return {"at": self.at, "added": list(self.added)}

    def write(self, directory: Path) -> None:
        """Into a plain checkpoint (one process holds every weight)."""
        if self.total is not None:
            save_file({n: t.contiguous() for n, t in self.total.items()}, str(Path(directory) / SUM_FILE))

    def sharded_tensors(self) -> dict | None:
        """For a sharded checkpoint (``sharded.save_periodic(..., tensors=)``): every rank its shards of the sum."""
        return {SUM_KEY: self.total} if self.total is not None else None

    def load(self, directory: Path, state: dict | None, model) -> None:
        """Restore from a checkpoint written with :meth:`state` in its trainer state and the sum by :meth:`write`
        (plain) or :meth:`sharded_tensors` (DCP), into ``model``'s layout: plain, or sharded like its parameters."""
        from torch.distributed.tensor import DTensor, distribute_tensor

        self.added = list((state or {}).get("added", []))
        self.total = None
        if not self.added:
            return
        directory, params = Path(directory), self._trainable(model)
        if (directory / SUM_FILE).is_file():
            full = load_tensors(directory / SUM_FILE)  # corrupt: one line naming the file
            self.total = {
                n: distribute_tensor(full[n], p.device_mesh, p.placements) if isinstance(p, DTensor) else full[n]
                for n, p in params.items()
            }
        elif sharded.is_sharded_checkpoint(directory):
            templates = {n: torch.zeros_like(p) for n, p in params.items()}  # sharded like the parameters
            try:
                sharded.load_sharded_tensors(directory, {SUM_KEY: templates})
            except Exception as e:  # DCP names the missing key in a long traceback
                raise UserError(f"{directory}: the weight average's running sum is not in its shards ({e})") from e
            self.total = templates
        else:
            raise UserError(f"{directory}: the weight average's running sum ({SUM_FILE}) is missing")
