"""What a run writes, the same way for every trainer: its periodic checkpoints (``save_periodic``), ``model/``, its
final weights (``publish_model``), the trainer state both carry (``run_state``) and ``summary.json`` with the lines
the run ends on (``close_run``).

Under ``torchrun`` rank 0 writes and the other ranks wait for it (so ``model/`` exists when any of them returns);
under ``--fsdp`` a periodic checkpoint is every rank's shards (``trainers/sharded.py``) and ``model/`` is first
gathered whole into a plain copy on rank 0 (a collective: every rank calls these). The optimizer state goes with
``model/`` for a plain model (a resumable end point), not for a sharded one (its state is in the sharded periodic
checkpoints). ``save`` writes a directory: :func:`save_checkpoint` by default, or a trainer's own writer with extra
files (the best-so-far weights of SFT, a reward model's head, PPO's critic).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import torch

from posttrain.trainers import common, distributed, sharded
from posttrain.trainers.checkpoint import save_checkpoint


def run_state(trainer: str, run, cfg, step: int, **extra) -> dict:
    """``trainer_state.json`` of a checkpoint or ``model/``: the step, the trainer, the run's id, its whole config,
    then ``extra`` (the step's metrics, a loss's state, the best-so-far record, ...)."""
    return {"step": step, "trainer": trainer, "run_id": run.run_id, "config": dataclasses.asdict(cfg), **extra}


def save_periodic(
    manager, done: int, model, optimizer, tokenizer, state: dict, rng: dict, world, save: Callable | None = None
) -> None:
    """Checkpoint ``step-N`` through the run's ``CheckpointManager`` (``latest`` pointed at it, old ones pruned):
    written by ``save`` on rank 0, or under --fsdp every rank's shards."""
    if sharded.is_sharded(model):
        return sharded.save_periodic(manager, done, model, optimizer, tokenizer, state, rng, world)
    if world.is_main:
        manager.save(
            done, save_fn=save, model=model, tokenizer=tokenizer, state=state, optimizer=optimizer, rng_state=rng
        )


def publish_model(
    out,
    model: torch.nn.Module,
    tokenizer,
    state: dict,
    optimizer,
    world: distributed.World,
    rng: dict,
    save: Callable[..., Path] = save_checkpoint,
) -> Path:
    """Write ``out/model`` (rank 0; gathered from the shards under --fsdp) and wait for it; returns its path."""
    final, fsdp = Path(out) / "model", sharded.is_sharded(model)
    whole = sharded.published(model, world)  # FSDP: gathered to rank 0 (on CPU); else the model itself
    if world.is_main:
        save(final, model=whole, tokenizer=tokenizer, state=state, optimizer=None if fsdp else optimizer, rng_state=rng)
    distributed.barrier(world)
    return final


def close_run(out, summary: dict, final: Path, report: str) -> dict:
    """Write ``summary.json``, print ``report`` (the run's final held-out figures) and where its outputs are;
    returns the summary."""
    path = common.write_summary(out, summary)
    print(f"{report}\nsummary: {path}\nmetrics: {Path(out) / 'metrics.jsonl'}\nmodel:   {final}")
    return summary
