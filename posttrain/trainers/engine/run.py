"""The one training loop: :func:`run` drives any :class:`~posttrain.trainers.engine.protocol.Trainer`.

Per step, in this order (the same for every trainer)::

    metrics = trainer.train_step(step)                      # done = step + 1
    guard.record(...)   -> a NaN/Inf step was skipped; nan_patience in a row: guard.stop (exit 2, no model/)
    every eval_every steps and at the end: trainer.evaluate(done, metrics)
    logger.log(done, metrics); the progress bar shows trainer.progress(metrics)
    trainer.early_stop(done) -> a reason: stop here (finish with stopped_at = done)
    every save_every steps (never at the end: model/ is written then), or at pause_at: trainer.save(done, metrics)

then ``trainer.finish(stopped_at, t_start)``: the final model and ``summary.json``.

``pause_at`` (a step): stop after that step with a checkpoint there, without ``finish``; the run resumes from it
(``{"paused_at": step, "train_seconds": ...}`` is returned). A run resumed at or past its pause returns at once.
"""

from __future__ import annotations

import time

from posttrain.progress import tqdm  # a bar on a terminal, a line every 10 % in a log
from posttrain.trainers import common
from posttrain.trainers.engine import device
from posttrain.trainers.engine.protocol import Trainer


def run(t: Trainer, pause_at: int | None = None) -> dict:
    """Train ``t`` from ``t.start_step`` to ``t.cfg.steps`` and finish it; returns the summary. However it ends
    (finished, paused, stopped by an error), the run's device is released: nothing after it in this process is
    placed or summarised as its part (``engine/device.py``)."""
    try:
        return _run(t, pause_at)
    finally:
        device.activate(None)


def _run(t: Trainer, pause_at: int | None) -> dict:
    cfg = t.cfg
    if pause_at is not None and t.start_step >= pause_at:  # a paused run, resumed with the same pause
        t.logger.close()
        return {"paused_at": t.start_step, "train_seconds": 0.0}
    t_start, stopped_at = time.perf_counter(), None
    bar = common.progress_bar(t.start_step, cfg.steps, t.name, cfg.progress)
    t.model.train()
    run_device = device.active()
    for step in bar:
        t0 = time.perf_counter()
        metrics = t.train_step(step)
        if run_device is not None:  # train_tokens_per_s, mfu, rollout_tokens_per_s, loss_scale (engine/device.py)
            metrics.update(run_device.step_metrics(time.perf_counter() - t0))
        done = step + 1
        diverged = t.guard is not None and t.guard.record(t.name, done, metrics)  # a NaN/Inf step: skipped, marked
        if diverged:  # nan_patience in a row: stop (RL: its alarms, which watch the step inside train_step)
            t.guard.stop(t.name, done, metrics, t.logger, bar, t.run.dir)
        if common.should_eval(done, cfg.eval_every, cfg.steps):
            t.evaluate(done, metrics)
            t.model.train()
        t.logger.log(done, metrics)
        bar.set_postfix(**t.progress(metrics))
        reason = t.early_stop(done)
        if reason:
            tqdm.write(f"early stop at step {done}: {reason}")
            stopped_at = done
            break
        if common.should_save(done, cfg.save_every, cfg.steps) or done == pause_at:
            t.save(done, metrics)
        if done == pause_at:
            break
    bar.close()
    t.logger.close()
    if pause_at is not None and stopped_at is None and pause_at < cfg.steps:
        return {"paused_at": pause_at, "train_seconds": time.perf_counter() - t_start}
    return t.finish(stopped_at, t_start)  # summary.json gets the run's device figures
