"""What GRPO and PPO share of the engine's Trainer shape, written once: evaluation (at the start and every
``eval_every``), progress, the alarms as the loop's guard, the periodic checkpoint, the final model and summary.

Each is a function of an RL trainer's public attributes (``cfg``, ``model``, ``replica``, ``data``, ``alarms``,
``collapse``, ``logger``, ``last_eval``, ...); a trainer takes ``evaluate``, ``progress``, ``early_stop`` and
``run_eval`` as they are (class attributes: ``evaluate = rl.evaluate``). The set-up is ``setup.py``; the algorithms
(advantages, the update) stay in their trainers; the rollout (``rollout.py``) is a function of values only.
"""

from __future__ import annotations

import time
from pathlib import Path

from posttrain.models.lora import merge_lora
from posttrain.trainers import common, sharded
from posttrain.trainers.checkpoint import rng_state, save_with_extras
from posttrain.trainers.engine.publish import publish_model
from posttrain.trainers.guards import TrainingDiverged


def heldout_eval(model, replica, data, tokenizer, max_new_tokens: int):
    """Greedy held-out accuracy of the policy (under --fsdp on its replica, refreshed first: no collectives); both
    are back in train mode after."""
    sharded.sync_replica(replica, model)
    sampler = model if replica is None else replica
    r = data.evaluate(sampler, tokenizer, max_new_tokens=max_new_tokens, keep_samples=5)
    sampler.train()
    model.train()
    return r


def start_eval(tr) -> None:
    """A fresh run's held-out accuracy before the first step (``tr.initial``), logged at step 0; the run's clock
    (``tr.t_start``, for ``train_seconds``) starts before it."""
    tr.t_start = time.perf_counter()
    tr.initial = tr.run_eval() if tr.start_step == 0 else None
    if tr.initial is not None:
        print(f"held-out accuracy at start: {tr.initial.accuracy:.3f}")
        tr.logger.log(0, {"heldout_accuracy": tr.initial.accuracy})


def run_eval(tr):
    """The trainer's held-out evaluation (greedy, on its replica under --fsdp)."""
    return heldout_eval(tr.model, tr.replica, tr.data, tr.tokenizer, tr.cfg.max_new_tokens)


def evaluate(tr, done: int, metrics: dict) -> None:
    """The held-out accuracy after step ``done`` (the trainer keeps it as ``last_eval``)."""
    tr.last_eval = tr.run_eval()
    metrics["heldout_accuracy"] = tr.last_eval.accuracy


def progress(tr, metrics: dict) -> dict:
    acc = {"acc": f"{tr.last_eval.accuracy:.3f}"} if tr.last_eval else {}
    return {"reward": f"{metrics['reward_mean']:.2f}", **acc}


def no_early_stop(tr, done: int) -> None:
    return None  # a non-finite streak is the guard's (the alarms: AlarmsGuard)


def save_periodic(tr, done: int, parts: dict | None = None, tensors: dict | None = None) -> None:
    """An RL trainer's periodic checkpoint ``step-N``: its state with the collapse guard's (``tr._state``) and, in a
    plain checkpoint, its extra files (``tr._extras``: the guard's snapshot, ...); rank 0 writes it. Under --fsdp
    every rank writes its shards of the policy (and of ``parts``, {name: (module, optimizer)}, and ``tensors``),
    without the snapshot."""
    state = tr._state(done, {"collapse": tr.collapse.state_dict()})
    if sharded.is_sharded(tr.model):
        return sharded.save_periodic(
            tr.manager, done, tr.model, tr.opt, tr.tokenizer, state, rng_state(), tr.world, parts, tensors
        )
    if not tr.world.is_main:
        return
    tr.manager.save(
        done,
        save_fn=lambda d, **kw: save_with_extras(d, tr._extras, **kw),
        model=tr.model,
        tokenizer=tr.tokenizer,
        state=state,
        optimizer=tr.opt,
        rng_state=rng_state(),
    )


def publish(tr, final_step: int, last, save=None):
    """``model/``: the policy (its LoRA adapters merged with ``merge_lora``: full weights, no adapter files) with the
    run's state (``tr._state``) and held-out accuracy ``last``; rank 0 writes, gathered from the shards under --fsdp.
    ``save``: how the directory is written (PPO's adds the critic); returns its path."""
    if tr.cfg.merge_lora:
        tr.model = merge_lora(tr.model)
    state = tr._state(final_step, {"heldout_accuracy": last.accuracy})
    kw = {} if save is None else {"save": save}
    return publish_model(tr.out, tr.model, tr.tokenizer, state, tr.opt, tr.world, rng_state(), **kw)


def summary(tr, final_step: int, stopped: bool, last, final, t_start: float, **extra) -> dict:
    """``summary.json``'s fields every RL run has (``extra``: the algorithm's own, after ``trainer``); ``t_start``:
    when the loop started (``train_seconds``)."""
    initial = tr.initial
    return {
        "trainer": tr.name,
        **extra,
        "steps": final_step,
        "stopped_early": stopped,
        "heldout_accuracy": last.accuracy,
        "heldout_accuracy_start": initial.accuracy if initial else None,
        "heldout_n": last.n,
        "train_seconds": time.perf_counter() - t_start,
        "alarms": tr.alarms.summary(),
        "restores": tr.collapse.restores,
        "model_dir": str(final) if final else None,
        "samples": last.samples,
    }


def close_run(tr, summary: dict, stopped_at: int | None, final, last) -> dict:
    """``summary.json``; a run its alarms stopped then fails with one line (exit 2, as SFT/DPO/RM do); else the final
    model's held-out accuracy ``last`` (from the start's, when there is one) and where the outputs are, printed."""
    path = common.write_summary(tr.out, summary)
    if stopped_at is not None:  # summary.json says stopped_early
        raise TrainingDiverged(tr.alarms.nan.stop_message(tr.name, stopped_at, tr.out))
    start = f"{tr.initial.accuracy:.3f} -> " if tr.initial else ""
    print(f"held-out accuracy: {start}{last.accuracy:.3f} ({last.correct}/{last.n})")
    print(f"summary: {path}\nmetrics: {Path(tr.out) / 'metrics.jsonl'}" + (f"\nmodel:   {final}" if final else ""))
    return summary


class AlarmsGuard:
    """An RL trainer's alarms as the loop's one non-finite guard (``trainers/engine/run.py``: ``record`` then
    ``stop``, as :class:`~posttrain.trainers.guards.NonFiniteGuard` for SFT, RM and DPO). The alarms watch each
    step inside ``train_step`` (where the collapse guard can restore the weights and a non-finite update is skipped);
    ``record`` says whether they call for a stop (``nan_patience`` non-finite updates in a row). ``stop`` logs the
    step, then ends the run as an RL run ends: ``summary.json`` with ``stopped_early``, no ``model/``, and a one-line
    :class:`TrainingDiverged` (exit 2) raised by the trainer's ``finish``."""

    def __init__(self, tr):
        self.tr = tr

    def record(self, trainer: str, step: int, metrics: dict) -> bool:
        return self.tr.alarms.should_stop

    def stop(self, trainer: str, step: int, metrics: dict, logger, bar, out) -> None:
        logger.log(step, metrics)
        bar.close()
        logger.close()
        self.tr.finish(step, self.tr.t_start)  # raises TrainingDiverged once summary.json is written
