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
- :func:`require_finite_model` is the last line of defence, called before every checkpoint write: a model
  with a NaN/Inf parameter, or whose forward pass over a few tokens gives NaN/Inf logits (finite weights near 1e28
  after one step at lr=1e30 overflow), is refused with a one-line :class:`~posttrain.errors.NonFiniteError` naming
  the directory and step (exit 2); :func:`refuse_nonfinite_model` is the same check for ``eval`` and ``export``.
- :class:`TrainingDiverged` is raised by a trainer that stops on the streak (a ``UserError``: one line, exit 2).

Not handled: non-finite activations that do not reach the loss (masked out), and optimizer state that
went non-finite while the loss stayed finite (the parameter check catches it at the next save).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch
from tqdm.auto import tqdm

from posttrain.errors import NonFiniteError, UserError


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


PROBE_TOKENS = 8  # the forward pass of the finiteness check: token ids 0..7 (mod the vocabulary), one row
_ATOMIC_TMP = re.compile(r"^\.(.+)\.[A-Za-z0-9_]+\.tmp$")  # posttrain.data.io.atomic_dir's temporary names


def _probe_logits(model: torch.nn.Module) -> torch.Tensor | None:
    """Logits (1, T, V) of one forward pass over token ids 0..T-1 in eval mode, no grad; None for a model that
    cannot be probed alone (sharded across processes, no ``config.vocab_size``, no parameters). Uses no RNG."""
    from posttrain.trainers.distributed import is_sharded

    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    first = next(model.parameters(), None)
    if first is None or not isinstance(vocab, int) or vocab < 1 or is_sharded(model):
        return None
    max_len = getattr(model.config, "max_seq_len", None) or getattr(model.config, "max_position_embeddings", None)
    T = min(PROBE_TOKENS, max_len) if isinstance(max_len, int) and max_len > 0 else PROBE_TOKENS
    ids = (torch.arange(T, device=first.device) % vocab)[None]  # (1, T)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(input_ids=ids)
    finally:
        model.train(was_training)
    logits = getattr(out, "logits", None)
    return logits if isinstance(logits, torch.Tensor) else None


def nonfinite_reason(model: torch.nn.Module) -> str | None:
    """Why ``model`` is unusable as numbers, or None: some parameters are NaN/Inf, or (all finite) a forward
    pass over :data:`PROBE_TOKENS` tokens gives NaN/Inf logits. Buffers are not checked (masks hold -inf)."""
    bad = total = 0
    with torch.no_grad():
        for t in model.parameters():
            if t.is_floating_point():
                total += t.numel()
                bad += int(t.numel() - torch.isfinite(t).sum())
    if bad:
        return f"{bad} of {total} parameters are NaN/Inf"
    logits = _probe_logits(model)
    if logits is not None and not bool(torch.isfinite(logits).all()):
        return "its parameters are finite but its forward pass gives NaN/Inf logits"
    return None


def require_finite_model(model: torch.nn.Module, where, step=None) -> None:
    """Refuse to save a diverged model: a one-line :class:`NonFiniteError` naming ``where`` (the checkpoint
    directory; a temporary one is shown as the directory it becomes) and ``step``.

    Example: after ``sft --lr 1e30`` -> "refusing to save run/model: its parameters are finite but its forward
    pass gives NaN/Inf logits at step 2 (the training diverged); the last good checkpoint is kept"."""
    reason = nonfinite_reason(model)
    if reason is None:
        return
    where = Path(where)
    if m := _ATOMIC_TMP.match(where.name):
        where = where.with_name(m.group(1))
    at = f" at step {step}" if isinstance(step, int) and not isinstance(step, bool) else ""
    raise NonFiniteError(
        f"refusing to save {where}: {reason}{at} (the training diverged); the last good checkpoint is kept"
    )


def refuse_nonfinite_model(model: torch.nn.Module, path, action: str) -> None:
    """``eval``/``export``: a one-line :class:`NonFiniteError` for a loaded model that :func:`nonfinite_reason`
    rejects (``action``: "evaluate", "export")."""
    reason = nonfinite_reason(model)
    if reason is not None:
        raise NonFiniteError(f"refusing to {action} {path}: {reason} (a diverged or corrupt model)")
