"""Loop pieces every trainer shares: optimizer, LR schedule, metrics logging, run directory set-up, cadence.

Every trainer (``sft.py``, ``reward.py``, ``dpo.py``, ``policy_gradient.py``, ``ppo.py``) has the same shape
(``trainers/engine/protocol.py``) and is driven by the one set-up (``engine/setup.py::open_training``) and the one
loop (``engine/run.py::run``); the pieces those two use live here: ``check_resume_step``, ``should_eval``,
``should_save``, ``progress_bar``, the optimizer, the LR schedule and the metrics log.

- ``open_run`` / ``begin_run`` (from :mod:`posttrain.trainers.run_dir`): ``open_training`` calls ``open_run(cfg,
  "sft", resume, overwrite)`` first (checks ``--out``, picks the checkpoint to resume; writes nothing), has the
  trainer load and validate its inputs, then ``begin_run(run, cfg)`` (clears for ``--overwrite``, writes
  ``run.json`` and ``config.resolved.*``) before anything else is written into the run directory.

- ``lr_at(step)``: linear warmup to the peak, then cosine decay to ``min_lr_ratio * peak``. A pure function
  of the step, so resuming needs no scheduler state.
- ``MetricsLogger`` (:mod:`posttrain.loggers`): one JSON line per step in ``metrics.jsonl``, plus TensorBoard and
  W&B when asked; on resume, lines past the resumed step are dropped first, so the file reads like one run.
- ``make_optimizer``: AdamW with weight decay on matrices (linear and embedding weights), none on biases and norms:
  the usual GPT recipe.
"""

from __future__ import annotations

import math
import os
import random
from pathlib import Path

import numpy as np
import torch

from posttrain.data.io import atomic_write_json
from posttrain.errors import UserError
from posttrain.loggers import MetricsLogger  # noqa: F401 - the trainers' logger (metrics.jsonl + sinks)
from posttrain.progress import tqdm  # a bar on a terminal, a line every 10 % in a log
from posttrain.trainers import distributed
from posttrain.trainers.engine import device
from posttrain.trainers.guards import finite_step
from posttrain.trainers.run_dir import Run, begin_run, open_run  # noqa: F401  (re-exported for the trainers)


def check_resume_step(ckpt_path, start_step: int, steps: int) -> None:
    """A resumed checkpoint past the configured ``steps`` cannot be continued: a one-line UserError."""
    if start_step > steps:
        raise UserError(f"checkpoint {ckpt_path} is at step {start_step}, beyond steps={steps}")


def should_eval(done: int, every: int, total: int) -> bool:
    """Evaluate after step ``done`` (1-based): every ``every`` steps (0 = never periodically) and at the end."""
    return bool(every and done % every == 0) or done == total


def should_save(done: int, every: int, total: int) -> bool:
    """Periodic checkpoint after step ``done``: every ``every`` steps, never at the end (``model/`` is saved then)."""
    return bool(every and done % every == 0) and done != total


def progress_bar(start: int, total: int, desc: str, enabled: bool):
    """The training loop's iterator: steps ``start..total-1`` with a bar (or a line every 10 % in a log)."""
    enabled = enabled and distributed.world().is_main  # under torchrun: rank 0's bar only
    return tqdm(
        range(start, total),
        initial=start,
        total=total,
        desc=desc,
        disable=not enabled,
        dynamic_ncols=True,
        mininterval=1.0,
    )


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def lr_at(step: int, peak: float, warmup: int, total: int, min_ratio: float = 0.1) -> float:
    """LR for optimizer step ``step`` (0-based): warmup 1/w..1, then cosine to min_ratio over the rest."""
    if warmup > 0 and step < warmup:
        return peak * (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float, betas=(0.9, 0.95), eps: float = 1e-8):
    decay, no_decay, seen = [], [], set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, foreach=True)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = lr


def schedule_lr(optimizer: torch.optim.Optimizer, step: int, cfg) -> float:
    """Set and return step ``step``'s LR: :func:`lr_at` of the config's ``lr``, ``warmup_steps``, ``steps`` and
    ``min_lr_ratio``."""
    lr = lr_at(step, cfg.lr, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
    set_lr(optimizer, lr)
    return lr


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def grad_norm_and_clip(model: torch.nn.Module, max_norm: float | None) -> float:
    """The global gradient L2 norm (before clipping), clipping to ``max_norm`` when it is > 0. Sharded (FSDP)
    gradients give the norm over all shards. Under ``--dtype fp16`` the gradients are unscaled first, and an
    overflow drops them (the optimizer step then changes nothing) and reads 0 (``engine/device.py``)."""
    params = [p for p in model.parameters() if p.grad is not None]
    device.unscale_grads(params)  # fp16: the loss-scaled gradients back to their size (else nothing)
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm and max_norm > 0 else float("inf"))
    return device.after_clip(params, float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))


def clip_and_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss: float, max_norm: float | None):
    """Clip the gradients (:func:`grad_norm_and_clip`) and step, unless the loss or the norm is NaN/Inf: then the
    step is skipped (``guards.finite_step``; gradients zeroed either way). Returns (grad norm, stepped)."""
    gnorm = grad_norm_and_clip(model, max_norm)
    return gnorm, finite_step(optimizer, loss, gnorm)


def _plain(v):
    if isinstance(v, torch.Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    return v


def write_summary(out: str | Path, summary: dict) -> Path:
    """``out/summary.json`` (atomically; rank 0 only under ``torchrun``); during a training run with the run's device
    figures added (``engine/device.py``: device, dtype, train_tokens_per_s, mfu, peak_memory_gb, ...)."""
    path = Path(out) / "summary.json"
    run_device = device.active()  # a training run: its device, dtype, tokens/s, MFU and peak memory
    summary = {**summary, **run_device.summary()} if run_device is not None else summary
    if distributed.world().is_main:
        atomic_write_json(path, {k: _plain(v) for k, v in summary.items()})
    return path


_TORCH_THREADS = torch.get_num_threads()  # torch's default (its count of physical cores, or OMP_NUM_THREADS)


def set_threads(n: int | None) -> None:
    """torch's CPU threads: ``n``, or for None every usable core (torch's default within this process's CPU
    affinity, e.g. a container's or taskset's share; OMP_NUM_THREADS when set)."""
    if n:
        torch.set_num_threads(n)
    elif os.environ.get("OMP_NUM_THREADS") is None:
        torch.set_num_threads(max(1, min(_TORCH_THREADS, usable_cores())))
    else:
        torch.set_num_threads(_TORCH_THREADS)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. a container's or ``taskset``'s share), >= 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def frozen(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` as a reference: eval mode (no dropout) and no gradients; during a training run also on its device
    with weights in the compute dtype (``engine/device.py``; on the CPU in fp32 unchanged). Returns it (in place)."""
    model.eval()
    model.requires_grad_(False)
    run_device = device.active()
    return device.place_frozen(model, run_device) if run_device is not None else model
