"""Non-finite guards shared by every trainer: a NaN/Inf step is skipped, repeats stop the run, and a model
with a non-finite parameter is never written.

Key insight: one bad optimizer step (an inf loss, a NaN gradient) turns every weight into NaN, and the run
then "trains" on to the end and saves garbage. So each optimizer step goes through one gate:

    loss, grad_norm finite?  yes -> optimizer.step()        no -> skip it (the weights stay as they were)
    zero the grads either way; after ``patience`` skipped steps in a row -> stop, keep the last good checkpoint

- :func:`finite_step` is the gate (SFT, DPO, RM and the policy-gradient minibatch update all call it).
- :class:`NonFiniteGuard` counts the streak and says when to stop: SFT/DPO/RM call ``record`` once per
  step (it prints the skip and marks ``"skipped": 1`` in the step's metrics); the policy-gradient trainer
  reads it through :class:`~posttrain.trainers.alarms.Alarms`. Its state is a plain dict (SFT/DPO/RM do
  not checkpoint it: a resumed run starts a fresh streak).
- :func:`require_finite_parameters` is the last line of defence, called before every checkpoint write: a
  model whose parameters are not all finite is refused with a one-line :class:`UserError` (exit 2).
- :class:`TrainingDiverged` is raised by a trainer that stops on the streak (a ``UserError``: one line, exit 2).

Not handled: non-finite activations that do not reach the loss (masked out), and optimizer state that
went non-finite while the loss stayed finite (the parameter check catches it at the next save).
"""

from __future__ import annotations

import math

import torch
from tqdm.auto import tqdm

from posttrain.errors import UserError


class TrainingDiverged(UserError):
    """Training stopped after repeated non-finite steps; nothing non-finite was saved."""


def finite_step(optimizer: torch.optim.Optimizer, loss: float, grad_norm: float) -> bool:
    """``optimizer.step()`` only if ``loss`` and ``grad_norm`` are finite; grads are zeroed either way.

    Returns whether the step was applied. Example: loss=nan -> False, parameters unchanged.
    """
    ok = math.isfinite(loss) and math.isfinite(grad_norm)
    if ok:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return ok


class NonFiniteGuard:
    """Streak of non-finite steps: ``update(loss=..., grad_norm=...)`` returns a message for a bad step, else None.

    Example (patience 2): nan -> "...step skipped (1 in a row)"; 0.3 -> None (streak reset);
    nan, nan -> the second message ends with "stopping" and ``should_stop`` is True.
    """

    def __init__(self, patience: int = 3):
        self.patience = patience
        self.streak = 0
        self.skipped = 0
        self.should_stop = False

    def update(self, **values: float) -> str | None:
        bad = {k: v for k, v in values.items() if v is not None and not math.isfinite(float(v))}
        if not bad:
            self.streak = 0
            return None
        self.streak += 1
        self.skipped += 1
        msg = (
            f"non-finite {', '.join(f'{k}={float(v)}' for k, v in bad.items())}: step skipped ({self.streak} in a row)"
        )
        if self.streak >= self.patience:
            self.should_stop = True
            msg += f"; {self.patience} in a row: stopping, the last good checkpoint is kept"
        return msg

    def record(self, trainer: str, step: int, metrics: dict) -> bool:
        """Update from ``metrics["loss"]`` / ``["grad_norm"]``; print and mark (``"skipped": 1``) a bad step.

        Returns ``should_stop``: the trainer then logs ``metrics`` and raises ``TrainingDiverged(stop_message(...))``.
        """
        note = self.update(loss=metrics.get("loss"), grad_norm=metrics.get("grad_norm"))
        if note is not None:
            tqdm.write(f"{trainer} step {step}: {note}")
            metrics["skipped"] = 1
        return self.should_stop

    def stop_message(self, trainer: str, step: int, out) -> str:
        """The one line a trainer raises (as :class:`TrainingDiverged`) when it stops on the streak."""
        return (
            f"{trainer} stopped at step {step}: {self.streak} steps in a row with a non-finite loss or gradient "
            f"norm (each skipped); no final model was written, the last good checkpoint (if any) is in "
            f"{out}/checkpoints; lower the learning rate or check the data"
        )

    def stop(self, trainer: str, step: int, metrics: dict, logger, bar, out) -> None:
        """End a run that hit the streak: log this step's metrics, close the bar and the log, raise
        :class:`TrainingDiverged` with :meth:`stop_message` (the one line the CLI prints, exit 2)."""
        logger.log(step, metrics)
        bar.close()
        logger.close()
        raise TrainingDiverged(self.stop_message(trainer, step, out))

    def state_dict(self) -> dict:
        return {"streak": self.streak, "skipped": self.skipped, "should_stop": self.should_stop}

    def load_state_dict(self, state: dict) -> None:
        self.streak, self.skipped = int(state["streak"]), int(state["skipped"])
        self.should_stop = bool(state["should_stop"])


def require_finite_parameters(model: torch.nn.Module, where) -> None:
    """Raise a one-line UserError (naming ``where``) unless every floating parameter is finite.

    Buffers are not checked: attention masks legitimately hold -inf.
    """
    bad = total = 0
    with torch.no_grad():
        for t in model.parameters():
            if t.is_floating_point():
                total += t.numel()
                bad += int(t.numel() - torch.isfinite(t).sum())
    if bad:
        raise UserError(
            f"refusing to save {where}: {bad} of {total} parameters are NaN/Inf "
            f"(the training diverged); the last good checkpoint is kept"
        )
