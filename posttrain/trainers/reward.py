"""Reward-model training: a scalar head on an LM backbone, fitted to preference pairs with Bradley-Terry.

Key insight: comparisons are learned as P(y_w > y_l) = sigma(r(x, y_w) - r(x, y_l)), so one step is

    r = rm([prompt | completion])                      (2B,)  read at the last real token (the EOS)
    L = -log sigma(r[:B] - r[B:] - margin) + c * (r[:B] + r[B:])^2      (bradley_terry_loss)

``--batch-by prompt`` draws prompts instead of pairs and scores each distinct completion of a prompt once, reading
all its pairs off those scores (InstructGPT's K-choose-2 batches, ``trainers/reward_batches.py``); with a posttrain
GPT the prompt itself also runs once for its rows (``--share-prompt-prefix``, exact). The configuration and presets
are ``trainers/reward_config.py``.

The reward's offset is free under BT (only differences are seen), so after training the RM scores the
training completions once and saves their mean/std (:class:`~posttrain.models.heads.RewardStats`) beside
the weights: RL then uses z-scored rewards (``LoadedRewardModel.__call__`` in
:mod:`posttrain.rewards.reward_model`, with ``normalize``).

Data: ``--data`` pairs, or the embedded task's pairs: on-policy samples of ``--init`` labelled by the
verifier (chosen correct, rejected wrong), or, with no model to sample, the reference answer against
corrupted answers (:func:`~posttrain.data.preference_pairs.synthetic_pairs`). The ``tiny`` preset is the
recipe of ``docs/rm.md`` (``RECIPE``: 16 samples on every training prompt, up to 8 pairs each, 2000 steps;
held-out pairwise accuracy ~0.9 from an SFT ``--init``), ``classic`` the old 300-step default. Held-out pairs
come from the task's held-out split the same way (never a training prompt); held-out pairwise accuracy is reported overall and per bucket of the
pair's margin (its ``margin`` field, else the numeric distance |chosen - rejected| of the answers).
Margins must be finite numbers (a ``NaN`` margin is a ``file:line`` error at load time). A NaN/Inf loss or
gradient norm skips the step, ``nan_patience`` in a row stop the run, and a model (or reward mean/std)
that is not finite is never saved (``trainers/guards.py``).

Checkpoint = an ordinary LM checkpoint of the backbone (loadable by ``load_checkpoint``) plus
``reward_head.safetensors`` and ``reward_stats.json``, written atomically as one directory.
:func:`posttrain.rewards.reward_model.load_reward_model` reads it back; the reward registry lists a
``reward_model`` entry (``fn(prompts, completions) -> list[float]``) so RL can train against it.

Shape (every trainer's, ``trainers/engine/protocol.py``): ``setup(cfg, resume, overwrite) -> RMState``,
``train_step(state, step) -> metrics``, ``run_eval`` (held-out pairs), ``save`` (a periodic checkpoint through
the run's one ``CheckpointManager``), ``finish`` (reward mean/std, ``model/``, ``summary.json``);
the one loop (``trainers/engine/run.py``) drives them. ``reward_eval.eval_reward_model`` (``--eval-only``) scores any RM
checkpoint on a ``{prompt, chosen, rejected}`` file: ``summary.json`` with ``pairwise_accuracy`` and ``n``.

Not handled: Plackett-Luce rankings and pointwise scores from files (the losses exist in
``losses/ranking.py``), gradient accumulation, reward ensembles at training time.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from posttrain.chat import chat_tokenizer, resolve_chat
from posttrain.checkpoints.load import load_policy
from posttrain.data.batches import batch_indices
from posttrain.data.checks import model_window
from posttrain.data.io import atomic_dir
from posttrain.data.preference import collate_preference, fit_pairs, load_preference_pairs
from posttrain.data.preference_pairs import cached_pairs, stats_dict, synthetic_pairs
from posttrain.errors import ConfigError, UserError
from posttrain.losses.ranking import bradley_terry_loss
from posttrain.models.gpt import GPT
from posttrain.models.heads import REWARD_STATS_FILE, RewardModel, RewardStats
from posttrain.models.lora import apply_lora, lora_config, merge_lora
from posttrain.on_policy_pairs import TrainPairsConfig, on_policy_pairs, restart_models, training_pairs
from posttrain.rewards.reward_model import HEAD_FILE, load_reward_model
from posttrain.tasks.arithmetic import ArithmeticTask
from posttrain.tasks.base import heldout_note, heldout_split
from posttrain.tasks.files import fresh_tokenizer, task_for
from posttrain.trainers import common, distributed, sharded
from posttrain.trainers.checkpoint import CheckpointManager, rng_state, save_checkpoint, writing
from posttrain.trainers.engine import device
from posttrain.trainers.engine.run import run as engine_run
from posttrain.trainers.engine.setup import open_training
from posttrain.trainers.guards import NonFiniteGuard, finite_step, require_finite_parameters
from posttrain.trainers.reward_batches import (
    batch_rewards,
    collate_prompt_groups,
    has_lm_head,
    prompt_groups,
    row_rewards,
)
from posttrain.trainers.reward_config import PRESETS, RMConfig  # noqa: F401  (the trainer registry reads them here)
from posttrain.trainers.reward_eval import evaluate_pairs, pair_rewards

# ---------------------------------------------------------------------------------------------
# checkpoints and loading


def save_reward_checkpoint(
    directory: str | Path,
    rm: RewardModel,
    tokenizer,
    state: dict,
    optimizer=None,
    rng: dict | None = None,
    stats: RewardStats | None = None,
) -> Path:
    """Backbone LM checkpoint + ``reward_head.safetensors`` (+ ``reward_stats.json``), as one atomic directory."""
    directory = Path(directory)
    require_finite_parameters(rm, directory)  # backbone and head: never write a diverged model
    if stats is not None and not (math.isfinite(stats.mean) and math.isfinite(stats.std)):
        raise UserError(f"refusing to save {directory}: the reward mean/std are not finite ({stats.mean}, {stats.std})")
    with atomic_dir(directory) as tmp:
        save_checkpoint(
            tmp,
            model=rm.backbone.model,
            tokenizer=tokenizer,
            state={**state, "reward_model": True},
            optimizer=optimizer,
            rng_state=rng,
        )
        with writing(directory):
            save_file({k: v.detach().contiguous() for k, v in rm.head.state_dict().items()}, str(tmp / HEAD_FILE))
        if stats is not None:
            stats.save(tmp / REWARD_STATS_FILE)
    return directory


# ---------------------------------------------------------------------------------------------
# evaluation


# ---------------------------------------------------------------------------------------------
# the trainer


def _load_other(path):
    ck = load_policy(path, role="rm --train-pairs.restarts")
    return ck.model, ck.tokenizer


def _embedded_pairs(cfg: RMConfig, task: ArithmeticTask, init, out: Path):
    source = cfg.source if cfg.source != "auto" else ("policy" if init is not None else "synthetic")
    if source == "policy" and init is None:
        raise UserError("--source policy samples the --init model: pass --init SFT_CHECKPOINT")
    rng_problems = random.Random(f"rm-prompts:{cfg.pairs.seed}")
    train_p = rng_problems.sample(task.train_problems, min(cfg.pairs.num_prompts, len(task.train_problems)))
    held_p = rng_problems.sample(task.heldout_problems, min(cfg.eval_prompts, len(task.heldout_problems)))
    meta = {
        "source": source,
        "init": str(Path(cfg.init).resolve()) if cfg.init else None,
        "pairs": dataclasses.asdict(cfg.pairs),
        "task": dataclasses.asdict(cfg.task),
        "eval_prompts": cfg.eval_prompts,
    }

    def build(problems):
        if source == "synthetic":
            pairs = synthetic_pairs(problems, per_prompt=cfg.pairs.max_pairs_per_prompt, seed=cfg.pairs.seed)
            return pairs, {"source": "synthetic", "prompts": len(problems), "pairs": len(pairs)}
        pairs, st = on_policy_pairs(init.model, init.tokenizer, problems, cfg.pairs, num_prompts=len(problems))
        return pairs, {"source": "policy", **stats_dict(st)}

    plain = source == "synthetic" or cfg.train_pairs == TrainPairsConfig()  # the pairs of before --train-pairs
    if source == "synthetic" and cfg.train_pairs_requested():
        raise UserError("--train-pairs.* shapes on-policy training pairs: pass --init SFT_CHECKPOINT (--source policy)")

    def build_train():  # the held-out pairs never see --train-pairs.* (the test stays the same)
        if plain:
            return build(train_p)
        mode = cfg.train_pairs.restarts
        paths = restart_models(cfg.init, mode == "on", cfg.train_pairs.max_restarts) if mode != "off" else []
        others = [(str(p), *_load_other(p)) for p in paths]
        return training_pairs(init.model, init.tokenizer, train_p, cfg.pairs, cfg.train_pairs, others)

    print(f"building {source} preference pairs ...")
    train_meta = meta if plain else {**meta, "train_pairs": dataclasses.asdict(cfg.train_pairs)}
    train, info = cached_pairs(out / "pairs.jsonl", train_meta, build_train)
    held, held_info = cached_pairs(out / "eval_pairs.jsonl", meta, lambda: build(held_p))
    return train, held, {"train": info, "heldout": held_info}


# ---------------------------------------------------------------------------------------------
# the trainer: setup -> train_step / run_eval / save -> finish (the shape every trainer has; trainers/common.py)


@dataclass
class RMState:
    """Everything one reward-model run holds between its parts (the engine's Trainer shape)."""

    cfg: RMConfig
    run: common.Run
    rm: RewardModel
    tokenizer: object
    train: list  # fitted training pairs
    held: list  # fitted held-out pairs
    pair_info: dict
    opt: torch.optim.Optimizer
    logger: common.MetricsLogger
    manager: CheckpointManager
    start_step: int
    guard: NonFiniteGuard
    world: distributed.World = dataclasses.field(default_factory=distributed.World)
    train_model: torch.nn.Module | None = None  # the RM, or its DDP wrapper under torchrun (forward + backward)
    groups: list = dataclasses.field(default_factory=list)  # batch_by=prompt: the training pairs' indices per prompt
    last_eval: dict | None = None
    name: str = "rm"

    @property
    def model(self) -> torch.nn.Module:
        return self.rm

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
        return finish(self, self.last_eval, t_start)


def setup(cfg: RMConfig, resume: str | None = None, overwrite: bool = False) -> RMState:
    """Open the run (trainers/engine/setup.py), load or build the reward model, load (or build and cache) and
    check the pairs."""
    task = task_for(cfg, "preference pairs")  # --data (FileTask) or the embedded task: tasks/files.py

    def build(start):  # the resumed RM, a head on the --init / --model start, or a fresh GPT with a head
        if start.ckpt is not None and sharded.is_sharded_checkpoint(start.ckpt.path):  # weights come with the optimizer
            rm, tokenizer = RewardModel(start.ckpt.model), start.ckpt.tokenizer
        elif start.ckpt is not None:
            loaded = load_reward_model(start.ckpt.path)
            rm, tokenizer = loaded.model, loaded.tokenizer
        elif start.init is not None:
            rm, tokenizer = RewardModel(start.init.model), start.init.tokenizer  # pairs are sampled from it first
        else:
            tokenizer = fresh_tokenizer(task)  # --data: bytes; the embedded task: its characters
            rm = RewardModel(GPT(dataclasses.replace(cfg.model, vocab_size=tokenizer.vocab_size)))
        apply_lora(rm.backbone.model, lora_config(cfg))  # lora_r > 0: adapters on the frozen backbone; the head trains
        return rm, tokenizer

    def inputs(t):  # --data / --eval-data pairs (the embedded task's are made in the run directory, below)
        if t.world.distributed and cfg.batch_size < t.world.world_size:
            raise ConfigError(f"batch_size={cfg.batch_size} must be >= the number of processes ({t.world.world_size})")
        if cfg.sft_coef > 0 and (t.world.distributed or not has_lm_head(t.model)):
            raise UserError(
                "--sft-coef needs a language-model backbone (posttrain's GPT or a Hugging Face causal LM, not an "
                "encoder) on one process: the NLL comes from the backbone's own LM head; pass --sft-coef 0 to train "
                "without it"
            )
        if not cfg.data:
            if cfg.eval_data:
                raise UserError("--eval-data needs --data (the training pairs), or neither for the embedded task")
            return None
        chat = resolve_chat(cfg.chat_template, t.tokenizer, [getattr(t.init, "path", None)])
        t.tokenizer = chat_tokenizer(t.tokenizer, chat)  # with a template, EOS is its end-of-turn token
        train = load_preference_pairs(cfg.data, chat=chat, on_bad_line=cfg.on_bad_line)
        if cfg.eval_data:
            return train, load_preference_pairs(cfg.eval_data, chat=chat, on_bad_line=cfg.on_bad_line)
        keep, held = heldout_split([p.prompt for p in train])  # the one rule (tasks/base.py): a slice of --data
        print(heldout_note(len(held), len(train), cfg.data, "held-out pairwise accuracy"))
        return [train[i] for i in keep], [train[i] for i in held]

    def run_inputs(t):  # the embedded task's pairs (sampled and cached in the run directory), then all pairs fitted
        if t.inputs is not None:
            (train, held), pair_info = t.inputs, {}
        else:
            with distributed.main_first(t.world):  # rank 0 samples and caches the pairs; the others read the cache
                train, held, pair_info = _embedded_pairs(cfg, task, t.init, Path(t.run.dir))
        fit = dict(window=model_window(t.model), long=cfg.long, max_prompt_length=cfg.max_prompt_length)
        fit["max_completion_length"] = cfg.max_completion_length
        train, held = (
            fit_pairs(x, t.tokenizer, what=what, **fit) for x, what in ((train, "training"), (held, "held-out"))
        )
        return train, held, pair_info

    t = open_training(cfg, "rm", resume, overwrite, build=build, inputs=inputs, run_inputs=run_inputs, keep_init=True)
    train, held, pair_info = t.inputs
    print(
        f"RM: {len(train)} training pairs, {len(held)} held-out pairs, {common.n_params(t.model) / 1e6:.2f}M params, "
        f"steps {t.start_step}->{cfg.steps}"
    )
    return RMState(
        cfg,
        t.run,
        t.model,
        t.tokenizer,
        train,
        held,
        pair_info,
        t.opt,
        t.logger,
        t.manager,
        t.start_step,
        NonFiniteGuard(cfg.nan_patience),
        t.world,
        t.train_model,
        prompt_groups(train) if cfg.batch_by == "prompt" else [],
    )


def train_step(s: RMState, step: int) -> dict:
    """One Bradley-Terry optimizer step on pair batch ``step`` (``batch_by``: random pairs, or random prompts with
    all their pairs and each completion scored once; ``trainers/reward_batches.py``)."""
    cfg, t0 = s.cfg, time.perf_counter()
    lr = common.lr_at(step, cfg.lr, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
    common.set_lr(s.opt, lr)
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
    gnorm = common.grad_norm_and_clip(s.rm, cfg.grad_clip)
    finite_step(s.opt, loss, gnorm)  # a NaN/Inf loss or grad norm skips the step
    metrics = distributed.mean_metrics({k: v.item() for k, v in m.items()}, s.world)  # per-pair means: averaged
    return {"loss": loss, **metrics, "lr": lr, "grad_norm": gnorm, "step_time": time.perf_counter() - t0}


def run_eval(s: RMState) -> dict[str, float]:
    """Held-out pairwise accuracy (overall and per margin bucket)."""
    return evaluate_pairs(s.rm, s.held, s.tokenizer, s.cfg)


def _state(s: RMState, step: int, extra: dict | None = None) -> dict:
    return {"step": step, "trainer": "rm", "run_id": s.run.run_id, "config": dataclasses.asdict(s.cfg), **(extra or {})}


def save(s: RMState, done: int, metrics: dict) -> None:
    """A periodic checkpoint through the run's one :class:`CheckpointManager` (rank 0 writes it; under --fsdp
    every rank its shards of backbone + head, trainers/sharded.py)."""
    if sharded.is_sharded(s.rm):
        state = {**_state(s, done, {"metrics": metrics}), "reward_model": True}
        return sharded.save_periodic(s.manager, done, s.rm, s.opt, s.tokenizer, state, rng_state(), s.world)
    if not s.world.is_main:
        return
    s.manager.save(
        done,
        save_fn=save_reward_checkpoint,
        rm=s.rm,
        tokenizer=s.tokenizer,
        state=_state(s, done, {"metrics": metrics}),
        optimizer=s.opt,
        rng=rng_state(),
    )


def finish(s: RMState, last_eval: dict | None, t_start: float) -> dict:
    """Reward mean/std on training completions, ``model/`` (backbone + head + stats) and ``summary.json``."""
    cfg, out = s.cfg, s.run.dir
    if last_eval is None:
        last_eval = run_eval(s)
    c, x = pair_rewards(s.rm, s.train[: cfg.stats_pairs], s.tokenizer, cfg)
    stats = RewardStats.from_rewards(torch.cat([c, x]))
    if cfg.merge_lora:  # model/ with full weights, no adapter files
        s.rm.backbone.model = merge_lora(s.rm.backbone.model)
    final, fsdp = Path(out) / "model", sharded.is_sharded(s.rm)
    rm = sharded.published(s.rm, s.world)  # --fsdp: gathered whole to rank 0 (on CPU)
    if s.world.is_main:  # under torchrun rank 0 writes model/, the others wait for it
        save_reward_checkpoint(
            final,
            rm,
            s.tokenizer,
            _state(s, cfg.steps, {"heldout": last_eval}),
            optimizer=None if fsdp else s.opt,
            rng=rng_state(),
            stats=stats,
        )
    distributed.barrier(s.world)
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
    path = common.write_summary(out, summary)
    print(f"held-out pairwise accuracy: {last_eval['heldout/accuracy']:.3f} on {len(s.held)} pairs")
    for k, v in last_eval.items():
        if k.startswith("heldout/accuracy/bucket_"):
            name = k.rsplit("/", 1)[-1]
            print(f"  |chosen - rejected| in {name[7:]}: {v:.3f} ({int(last_eval['heldout/count/' + name])} pairs)")
    print(f"reward mean {stats.mean:.3f} std {stats.std:.3f} (saved in {final / REWARD_STATS_FILE})")
    print(f"summary: {path}\nmetrics: {Path(out) / 'metrics.jsonl'}\nmodel:   {final}")
    return summary


def train_reward_model(cfg: RMConfig, resume: str | None = None, overwrite: bool = False) -> dict:
    """Train a Bradley-Terry reward model; returns the summary (also ``cfg.out/summary.json``)."""
    return engine_run(setup(cfg, resume, overwrite))
