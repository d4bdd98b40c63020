"""What GRPO and PPO share around their rollout and update, written once: their inputs (prompts, evaluation set, the
rollout engine), their KL controller, and their part of the engine's Trainer shape (evaluate, progress, the alarms
as the loop's guard, the evaluation at the start, the periodic checkpoint, the final model and summary).

Each is a function of values (the config, the task, the run being opened) or of an RL trainer's public attributes
(``cfg``, ``model``, ``run_eval``, ``alarms``, ``logger``, ``last_eval``); the algorithms themselves (advantages,
the update) stay in their trainers. Not handled here: the rollout (``rollout.py``, a function of values only).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.engines import build_engine
from posttrain.errors import ConfigError, UserError
from posttrain.losses.kl import AdaptiveKLController, FixedKLController
from posttrain.models.lora import merge_lora
from posttrain.tasks.rl import rl_data
from posttrain.trainers import common, sharded
from posttrain.trainers.checkpoint import rng_state, save_with_extras
from posttrain.trainers.engine.publish import publish_model
from posttrain.trainers.guards import TrainingDiverged


@dataclass
class RLInputs:
    """The prompts and evaluation set (``data``), and what samples the rollouts."""

    data: Any  # tasks/rl.py: .train (rows with .prompt, .answer), .evals, .score, .evaluate
    fsdp: bool  # the policy is sharded: rollouts and evaluation sample from ``replica``
    replica: Any  # a whole copy of the policy, refreshed once per step (trainers/sharded.py), or None
    engine: Any  # the rollout engine (engines/): ours, vllm or the skewed test engine


def rl_inputs(cfg, task, reward_fn, chat, t) -> RLInputs:
    """Read and check the prompts and the evaluation set against ``t``'s model and tokenizer and build the rollout
    engine: before the run directory is written (``open_training``'s ``inputs``), so a bad file, a prompt too long
    for the model or an engine that cannot start is a one-line error with nothing written."""
    data = rl_data(
        task=task,
        data=cfg.data,
        eval_data=cfg.eval_data,
        reward_fn=reward_fn,
        tokenizer=t.tokenizer,
        model=t.model,
        max_new_tokens=cfg.max_new_tokens,
        prompt_field=cfg.prompt_field,
        chat=chat,
        on_bad_line=cfg.on_bad_line,
    )
    fsdp = cfg.fsdp and t.world.distributed  # then rollouts sample from a replica (trainers/sharded.py)
    replica = sharded.rollout_replica(t.model) if fsdp else None
    engine = build_engine(cfg, replica if fsdp else t.model, t.tokenizer, model_dir=cfg.model_path)
    max_len = getattr(getattr(t.model, "config", None), "max_seq_len", None)
    if max_len is not None and not cfg.data and task.max_prompt_len + 1 + cfg.max_new_tokens > max_len:
        raise UserError(f"prompt + {cfg.max_new_tokens} new tokens exceed model.max_seq_len={max_len}")
    return RLInputs(data, fsdp, replica, engine)


def check_groups_per_rank(cfg, world) -> None:
    """Under several processes each rank samples whole groups of the step's prompts, so batch-wide statistics of the
    advantages would be per rank: refused with one line (a group baseline, or one process)."""
    if not world.distributed:
        return
    if cfg.prompts_per_step % world.world_size:
        raise ConfigError(
            f"prompts_per_step={cfg.prompts_per_step} must be divisible by the number of "
            f"processes ({world.world_size}): each rank samples whole groups"
        )
    if (cfg.algo == "grpo" and cfg.scale_rewards == "batch") or (
        cfg.algo == "reinforce" and cfg.reinforce_baseline == "batch_mean"
    ):
        raise ConfigError(
            "batch-wide advantage statistics (scale_rewards=batch, reinforce_baseline=batch_mean) "
            "are per rank under several processes; use group statistics or one process"
        )


def kl_controller(cfg):
    """The KL-to-reference coefficient: adaptive (Ziegler et al. 2019, toward ``kl_target``) or fixed at ``beta``."""
    if cfg.kl_control == "adaptive":
        return AdaptiveKLController(cfg.beta, cfg.kl_target, cfg.kl_horizon)
    return FixedKLController(cfg.beta)


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


def evaluate(tr, done: int, metrics: dict) -> None:
    """The held-out accuracy after step ``done`` (the trainer keeps it as ``last_eval``)."""
    tr.last_eval = tr.run_eval()
    metrics["heldout_accuracy"] = tr.last_eval.accuracy


def progress(tr, metrics: dict) -> dict:
    acc = {"acc": f"{tr.last_eval.accuracy:.3f}"} if tr.last_eval else {}
    return {"reward": f"{metrics['reward_mean']:.2f}", **acc}


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
