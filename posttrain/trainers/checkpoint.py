"""Checkpoints: one directory each, written atomically, loaded without unpickling arbitrary objects.

Layout of a checkpoint directory::

    model.safetensors     weights (safetensors; tied weights stored once)
    config.json           {"model_type": ..., "config": {...}}
    tokenizer.json        the tokenizer (posttrain.tokenizers.load reads it)
    trainer_state.json    step, run config, last metrics, plus trainer-specific state (JSON only)
    optimizer.pt          optimizer state_dict (tensors + plain containers: loaded with weights_only=True)
    rng.pt                torch RNG state(s) (same)

A run directory keeps ``checkpoints/step-00000100/`` ... and a ``checkpoints/latest`` file naming the
newest; the final model goes to ``model/``. Each checkpoint is built in a temp directory and renamed
into place, then ``latest`` is replaced atomically: a kill at any moment leaves the previous
checkpoint intact and ``latest`` pointing at a complete one.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from posttrain.data.io import atomic_dir, atomic_write_text, recover_dir
from posttrain.errors import UserError
from posttrain.models import load_model, save_model
from posttrain.tokenizers import load as load_tokenizer
from posttrain.trainers.guards import require_finite_parameters


@dataclass
class Checkpoint:
    """What a loaded checkpoint holds; optimizer/RNG state only if it was saved for resuming."""

    path: Path
    model: torch.nn.Module
    tokenizer: Any
    state: dict = field(default_factory=dict)
    optimizer_state: dict | None = None
    rng_state: dict | None = None

    @property
    def step(self) -> int:
        return int(self.state.get("step", 0))


def save_checkpoint(
    directory: str | Path,
    model: torch.nn.Module,
    tokenizer,
    state: dict,
    optimizer: torch.optim.Optimizer | None = None,
    rng_state: dict | None = None,
) -> Path:
    """Write a complete checkpoint to ``directory`` atomically (replacing an older one there)."""
    directory = Path(directory)
    require_finite_parameters(model, directory)  # a diverged (NaN/Inf) model is refused, the old one kept
    with atomic_dir(directory) as tmp:
        save_model(model, tmp)
        tokenizer.save(tmp / "tokenizer.json")
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2, default=str) + "\n")
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        if rng_state is not None:
            torch.save(rng_state, tmp / "rng.pt")
    return directory


def rng_state(generators: dict[str, torch.Generator] | None = None) -> dict:
    st = {"torch": torch.get_rng_state()}
    for k, g in (generators or {}).items():
        st[k] = g.get_state()
    return st


def restore_rng(state: dict, generators: dict[str, torch.Generator] | None = None) -> None:
    torch.set_rng_state(state["torch"])
    for k, g in (generators or {}).items():
        if k in state:
            g.set_state(state[k])


def _is_checkpoint(p: Path) -> bool:
    return (p / "model.safetensors").is_file() and (p / "config.json").is_file()


def resolve_checkpoint(path: str | Path, prefer_latest: bool = False) -> Path:
    """A checkpoint directory, or a run directory (its ``model/``, or newest ``checkpoints/`` entry).

    With ``prefer_latest`` (resume), the newest of ``model/`` and ``checkpoints/latest`` by step wins.
    """
    p = Path(path)
    if not p.exists():
        raise UserError(f"checkpoint not found: {p}")
    if _is_checkpoint(recover_dir(p)):
        return p
    candidates = []
    final = recover_dir(p / "model")
    if _is_checkpoint(final):
        candidates.append(final)
    latest_file = p / "checkpoints" / "latest"
    if latest_file.is_file():
        latest = recover_dir(p / "checkpoints" / latest_file.read_text().strip())
        if _is_checkpoint(latest):
            candidates.append(latest)
    if not candidates:
        raise UserError(f"{p} holds no checkpoint (expected model.safetensors + config.json, model/ or checkpoints/latest)")
    if not prefer_latest:
        return candidates[0]
    return max(candidates, key=lambda c: json.loads((c / "trainer_state.json").read_text()).get("step", 0)
               if (c / "trainer_state.json").is_file() else -1)


def load_checkpoint(path: str | Path, device="cpu", with_training_state: bool = False, prefer_latest: bool = False,
                    **model_overrides) -> Checkpoint:
    p = resolve_checkpoint(path, prefer_latest=prefer_latest)
    model = load_model(p, device=device, **model_overrides)
    tokenizer = load_tokenizer(p / "tokenizer.json")
    state_file = p / "trainer_state.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else {}
    ckpt = Checkpoint(path=p, model=model, tokenizer=tokenizer, state=state)
    if with_training_state:
        if not (p / "optimizer.pt").is_file():
            raise UserError(f"{p} has no optimizer state: it cannot be resumed (only used as --init)")
        ckpt.optimizer_state = torch.load(p / "optimizer.pt", map_location=device, weights_only=True)
        if (p / "rng.pt").is_file():
            ckpt.rng_state = torch.load(p / "rng.pt", weights_only=True)
    return ckpt


class CheckpointManager:
    """Periodic checkpoints under ``run_dir/checkpoints``, keeping the newest ``keep``."""

    def __init__(self, run_dir: str | Path, keep: int = 2):
        self.root = Path(run_dir) / "checkpoints"
        self.keep = keep

    def save(self, step: int, save_fn=None, **kwargs) -> Path:
        """Write ``step-NNNNNNNN`` with ``save_fn`` (default :func:`save_checkpoint`), point ``latest`` at it, prune."""
        name = f"step-{step:08d}"
        path = (save_fn or save_checkpoint)(self.root / name, **kwargs)
        atomic_write_text(self.root / "latest", name + "\n")
        self._prune(current=name)
        return path

    def _prune(self, current: str) -> None:
        ckpts = sorted(d for d in self.root.glob("step-*") if d.is_dir() and not d.name.endswith(".old"))
        for d in ckpts[: max(0, len(ckpts) - self.keep)]:
            if d.name != current:
                shutil.rmtree(d, ignore_errors=True)
