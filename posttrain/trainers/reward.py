"""Reward-model training: a scalar head on an LM backbone, fitted to preference pairs with Bradley-Terry.

Key insight: comparisons are learned as P(y_w > y_l) = sigma(r(x, y_w) - r(x, y_l)), so one step is

    r = rm([prompt | completion])                      (2B,)  read at the last real token (the EOS)
    L = -log sigma(r[:B] - r[B:] - margin) + c * (r[:B] + r[B:])^2      (bradley_terry_loss)

``--batch-by prompt`` draws prompts instead of pairs and scores each distinct completion of a prompt once, reading
all its pairs off those scores (InstructGPT's K-choose-2 batches, ``trainers/reward_batches.py``); with a posttrain
GPT the prompt itself also runs once for its rows (``--share-prompt-prefix``, exact). ``--sft-coef`` adds the chosen
answers' NLL under the backbone's own LM head (GRM).

The reward's offset is free under BT (only differences are seen), so after training the RM scores the
training completions once and saves their mean/std (:class:`~posttrain.models.heads.RewardStats`) beside
the weights: RL then uses z-scored rewards (``LoadedRewardModel.__call__`` in
:mod:`posttrain.rewards.reward_model`, with ``normalize``).

Data (``reward_data.py``): ``--data`` pairs, or the embedded task's pairs: on-policy samples of ``--init`` labelled by
the verifier, or, with no model to sample, the reference answer against corrupted answers. The ``tiny`` preset is the
recipe of ``docs/rm.md`` (``reward_config.py``). Held-out pairwise accuracy is reported overall and per bucket of the
pair's margin (its ``margin`` field, else the numeric distance |chosen - rejected| of the answers;
``reward_eval.py``, also ``--eval-only``). Margins must be finite numbers (a ``NaN`` margin is a ``file:line`` error
at load time). A NaN/Inf loss or gradient norm skips the step, ``nan_patience`` in a row stop the run, and a model
(or reward mean/std) that is not finite is never saved (``trainers/guards.py``).

Checkpoint = an ordinary LM checkpoint of the backbone plus ``reward_head.safetensors`` and ``reward_stats.json``,
written atomically as one directory and read back by :mod:`posttrain.rewards.reward_model` (the reward registry's
``reward_model`` entry, so RL can train against it). ``trainers/engine/`` drives this file's ``setup -> train_step /
evaluate / save -> finish``.

Not handled: Plackett-Luce rankings and pointwise scores from files (the losses exist in
``losses/ranking.py``), gradient accumulation, reward ensembles at training time.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass

import torch

from posttrain.data.batches import batch_indices
from posttrain.data.preference import collate_preference
from posttrain.errors import UserError
from posttrain.losses.ranking import bradley_terry_loss
from posttrain.models.heads import REWARD_STATS_FILE, RewardModel, RewardStats
from posttrain.models.lora import merge_lora
from posttrain.tasks.files import task_for
from posttrain.trainers import common, distributed
from posttrain.trainers.checkpoint import CheckpointManager, rng_state, save_reward_checkpoint
from posttrain.trainers.engine import device
from posttrain.trainers.engine.publish import close_run, publish_model, run_state, save_periodic
from posttrain.trainers.engine.run import run as engine_run
from posttrain.trainers.engine.setup import open_training
from posttrain.trainers.guards import NonFiniteGuard
from posttrain.trainers.reward_batches import batch_rewards, collate_prompt_groups, prompt_groups, row_rewards
from posttrain.trainers.reward_config import PRESETS, RMConfig  # noqa: F401  (the trainer registry reads them here)
from posttrain.trainers.reward_data import build_reward_model, run_pairs, user_pairs
from posttrain.trainers.reward_eval import evaluate_pairs, heldout_report, pair_rewards


@dataclass
class RMState:
    """Everything one reward-model run holds between its parts (the engine's Trainer shape)."""

    cfg: RMConfig
    # the run's parts (open_training: Training.state_parts); ``model`` is the reward model
    run: common.Run
    model: RewardModel
    tokenizer: object
    opt: torch.optim.Optimizer
    logger: common.MetricsLogger
    manager: CheckpointManager
    start_step: int
    world: distributed.World
    train_model: torch.nn.Module  # the RM, or its DDP wrapper under torchrun (forward + backward)
    # the inputs (reward_data.RewardPairs)
    train: list  # fitted training pairs
    held: list  # fitted held-out pairs
    pair_info: dict
    # the RM's own
    groups: list  # batch_by=prompt: the training pairs' indices per prompt
    guard: NonFiniteGuard
    last_eval: dict | None = None
    name: str = "rm"

    @property
    def rm(self) -> RewardModel:
        return self.model

    # the engine's Trainer shape; each part is this module's function of the state
    def train_step(self, step: int) -> dict:
        return train_step(self, step)

    def evaluate(self, done: int, metrics: dict) -> None:
        self.last_eval = run_eval(self)
        metrics.update(self.last_eval)

    def progress(self, metrics: dict) -> dict:
        heldout = {"heldout": f"{self.last_eval['heldout/accuracy']:.3f}"} if self.last_eval else {}
        return {"loss": f"{metrics['loss']:.3f}", "acc": f"{metrics['accuracy']:.2f}", **heldout}

    def early_stop(self, done: int) -> None:
        return None

    def save(self, done: int, metrics: dict) -> None:
        save(self, done, metrics)

    def finish(self, stopped_at: int | None, t_start: float) -> dict:
        return finish(self, t_start)


def setup(cfg: RMConfig, resume: str | None = None, overwrite: bool = False) -> RMState:
    """Open the run (trainers/engine/setup.py) on the reward model and pairs of ``reward_data.py``."""
    task = task_for(cfg, "preference pairs")  # --data (FileTask) or the embedded task: tasks/files.py
    t = open_training(
        cfg,
        "rm",
        resume,
        overwrite,
        build=lambda start: build_reward_model(cfg, task, start),
        inputs=lambda t: user_pairs(cfg, t),  # --data / --eval-data, checked before anything is written
        run_inputs=lambda t: run_pairs(cfg, task, t),  # the embedded task's, made in the run directory
        keep_init=True,
    )
    d = t.inputs
    print(
        f"RM: {len(d.train)} training pairs, {len(d.held)} held-out pairs, {common.n_params(t.model) / 1e6:.2f}M "
        f"params, steps {t.start_step}->{cfg.steps}"
    )
    groups = prompt_groups(d.train) if cfg.batch_by == "prompt" else []
    return RMState(cfg, **t.state_parts(), **vars(d), groups=groups, guard=NonFiniteGuard(cfg.nan_patience))


def train_step(s: RMState, step: int) -> dict:
    """One Bradley-Terry optimizer step on pair batch ``step`` (``batch_by``: random pairs, or random prompts with
    all their pairs and each completion scored once; ``trainers/reward_batches.py``)."""
    cfg, t0 = s.cfg, time.perf_counter()
    lr = common.schedule_lr(s.opt, step, cfg)
    caps = dict(max_prompt_length=cfg.max_prompt_length, max_completion_length=cfg.max_completion_length)
    if cfg.batch_by == "prompt":  # the step's prompts (seeded by step), each with all its pairs
        idx = batch_indices(len(s.groups), min(cfg.batch_size, len(s.groups)), step, cfg.seed).tolist()
        idx = distributed.shard(idx, s.world)  # this rank's prompts
        batch = device.to_device(collate_prompt_groups(s.train, [s.groups[i] for i in idx], s.tokenizer, **caps))
        n_pairs = len(batch["chosen_rows"])
        share = n_pairs / distributed.global_sum(n_pairs, s.world)  # the loss is a mean over the step's pairs
        lm_rows = torch.unique(batch["chosen_rows"]) if cfg.sft_coef > 0 else None  # each chosen row once
        if s.world.distributed:
            r = s.train_model(batch["input_ids"], batch["attention_mask"])  # (N,) DDP's forward
        else:
            r = row_rewards(s.rm, batch, cfg.share_prompt_prefix, lm_rows)  # (N,) [, nll]
        r, nll = r if lm_rows is not None else (r, None)
        chosen, rejected = r[batch["chosen_rows"]], r[batch["rejected_rows"]]  # (M,), (M,)
    else:
        idx = batch_indices(len(s.train), cfg.batch_size, step, cfg.seed).tolist()  # the global batch
        idx = distributed.shard(idx, s.world)  # this rank's pairs: the BT loss is a mean over pairs, so each rank's
        share = len(idx) / cfg.batch_size  # mean counts by its share of the global batch
        batch = device.to_device(collate_preference([s.train[i] for i in idx], s.tokenizer, **caps))  # run's device
        lm_rows = torch.arange(len(idx)) if cfg.sft_coef > 0 else None  # the chosen rows
        if s.world.distributed:  # DDP / FSDP: the wrapper's own forward, whose hooks reduce the gradients
            r = s.train_model(batch["input_ids"], batch["attention_mask"])  # (2B,)
        else:
            r = batch_rewards(s.rm, batch, cfg.share_prompt_prefix, lm_rows)  # (2B,) [, nll]
        r, nll = r if lm_rows is not None else (r, None)
        chosen, rejected = r.chunk(2)
    margin = batch.get("margin") if cfg.use_margin else None
    if cfg.use_margin and margin is None:
        raise UserError("--use-margin needs a numeric 'margin' field on every pair")
    loss, m = bradley_terry_loss(chosen, rejected, margin=margin, center_coef=cfg.center_coef)
    if nll is not None:  # GRM: the backbone stays a language model of the chosen answers
        loss = loss + cfg.sft_coef * nll
        m["chosen_nll"] = nll.detach()
    (loss * (share * distributed.ddp_loss_scale(s.world))).backward()
    loss = distributed.global_sum(loss.item() * share, s.world)  # the global batch's mean
    gnorm, _ = common.clip_and_step(s.rm, s.opt, loss, cfg.grad_clip)  # NaN/Inf loss or norm: skipped
    metrics = distributed.mean_metrics({k: v.item() for k, v in m.items()}, s.world)  # per-pair means: averaged
    return {"loss": loss, **metrics, "lr": lr, "grad_norm": gnorm, "step_time": time.perf_counter() - t0}


def run_eval(s: RMState) -> dict[str, float]:
    """Held-out pairwise accuracy (overall and per margin bucket)."""
    return evaluate_pairs(s.rm, s.held, s.tokenizer, s.cfg)


def save(s: RMState, done: int, metrics: dict) -> None:
    """A periodic checkpoint of backbone + head (``reward_model``: read back by the reward model's loader)."""
    state = run_state("rm", s.run, s.cfg, done, metrics=metrics, reward_model=True)
    save_periodic(s.manager, done, s.rm, s.opt, s.tokenizer, state, rng_state(), s.world, save=save_reward_checkpoint)


def finish(s: RMState, t_start: float) -> dict:
    """Reward mean/std on training completions, ``model/`` (backbone + head + stats) and ``summary.json``."""
    cfg, last_eval = s.cfg, s.last_eval if s.last_eval is not None else run_eval(s)  # resumed at the end: evaluate
    c, x = pair_rewards(s.rm, s.train[: cfg.stats_pairs], s.tokenizer, cfg)
    stats = RewardStats.from_rewards(torch.cat([c, x]))
    if cfg.merge_lora:  # model/ with full weights, no adapter files
        s.rm.backbone.model = merge_lora(s.rm.backbone.model)
    state = run_state("rm", s.run, cfg, cfg.steps, heldout=last_eval)
    save = functools.partial(save_reward_checkpoint, stats=stats)
    final = publish_model(s.run.dir, s.rm, s.tokenizer, state, s.opt, s.world, rng_state(), save=save)
    summary = {
        "trainer": "rm",
        "steps": cfg.steps,
        "heldout_pairwise_accuracy": last_eval["heldout/accuracy"],
        "heldout_pairs": len(s.held),
        "train_pairs": len(s.train),
        **last_eval,
        "reward_stats": dataclasses.asdict(stats),
        "pairs": s.pair_info,
        "params": common.n_params(s.rm),
        "train_seconds": time.perf_counter() - t_start,
        "model_dir": str(final),
    }
    saved = f"reward mean {stats.mean:.3f} std {stats.std:.3f} (saved in {final / REWARD_STATS_FILE})"
    return close_run(s.run.dir, summary, final, f"{heldout_report(last_eval, len(s.held))}\n{saved}")


def train_reward_model(cfg: RMConfig, resume: str | None = None, overwrite: bool = False) -> dict:
    """Train a Bradley-Terry reward model; returns the summary (also ``cfg.out/summary.json``)."""
    return engine_run(setup(cfg, resume, overwrite))
