"""The shape every trainer has: what the one loop (:func:`posttrain.trainers.engine.run.run`) calls.

Key insight (torchtune's recipe interface): share a *shape*, not an implementation. A trainer is any object with
these attributes and methods; there is no base class to inherit from, so a trainer file reads top to bottom on its
own. ``setup`` is the trainer's constructor (a module-level ``setup(cfg, resume, overwrite) -> state`` that calls
:func:`posttrain.trainers.engine.setup.open_training`); the loop then drives the state through ``train_step``,
``evaluate`` (every ``eval_every`` steps and at the end), ``save`` (every ``save_every`` steps) and ``finish``.

What a trainer owns: its batch, its loss call, its metrics, what it evaluates and what its ``model/`` and
``summary.json`` hold. What the loop owns: the cadence, the progress bar, the non-finite guard, early stop,
pausing, and closing the metrics log.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from posttrain.trainers.common import MetricsLogger
from posttrain.trainers.run_dir import Run


class StepGuard(Protocol):
    """Watches each step's metrics: ``record`` marks a non-finite (skipped) step and says whether the run must stop
    (``nan_patience`` in a row); ``stop`` ends it with a one-line error (``trainers/guards.py``:
    :class:`NonFiniteGuard`; the RL trainers' alarms through ``trainers/rl/common.py``: ``AlarmsGuard``)."""

    def record(self, trainer: str, step: int, metrics: dict) -> bool: ...

    def stop(self, trainer: str, step: int, metrics: dict, logger, bar, out) -> None: ...


class Trainer(Protocol):
    """What :func:`~posttrain.trainers.engine.run.run` needs from a trainer's state."""

    name: str  # the progress bar's label and the guard's word for the run ("sft", "rm", "dpo", ...)
    cfg: Any  # a TrainerConfig: steps, eval_every, save_every, progress
    run: Run  # the run directory
    model: torch.nn.Module  # what trains (put in train mode before the first step and after each evaluation)
    start_step: int  # 0, or the resumed checkpoint's step
    logger: MetricsLogger
    guard: StepGuard | None  # NonFiniteGuard (SFT, RM, DPO) or the alarms (GRPO, PPO: rl.AlarmsGuard); None: none

    def train_step(self, step: int) -> dict:
        """One optimizer step on batch ``step`` (0-based); returns the step's metrics."""
        ...

    def evaluate(self, done: int, metrics: dict) -> None:
        """Evaluate after step ``done`` and add what the log shows to ``metrics``; the trainer keeps the last result."""
        ...

    def progress(self, metrics: dict) -> dict[str, str]:
        """What the progress bar shows after a step: {"loss": "0.123", ...}."""
        ...

    def early_stop(self, done: int) -> str | None:
        """A one-line reason to stop after step ``done`` (patience ran out), or None to go on."""
        ...

    def save(self, done: int, metrics: dict) -> None:
        """A periodic checkpoint at step ``done`` (resumable)."""
        ...

    def finish(self, stopped_at: int | None, t_start: float) -> dict:
        """``model/``, the final evaluation and ``summary.json``; returns the summary."""
        ...
