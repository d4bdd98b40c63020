"""``model/``: a run's final weights, published once by every trainer the same way (``publish_model``).

Under ``torchrun`` rank 0 writes it and the other ranks wait for it (so it exists when any of them returns); under
``--fsdp`` the shards are first gathered whole into a plain copy on rank 0 (a collective: every rank calls this).
The optimizer state goes with it for a plain model (a resumable end point), not for a sharded one (its state is in
the sharded periodic checkpoints). ``save`` writes the directory: :func:`save_checkpoint` by default, or a trainer's
own writer with extra files (PPO's critic).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from posttrain.trainers import distributed, sharded
from posttrain.trainers.checkpoint import save_checkpoint


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
