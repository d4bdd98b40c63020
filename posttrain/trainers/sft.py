"""Supervised fine-tuning: next-token cross-entropy on completion tokens only.

    L = - (1 / N_tok) * sum_{b, t in completion(b)} log pi(y_{b,t} | y_{b,<t})

N_tok counts completion tokens (EOS included) over the whole optimizer batch, so the loss and its
gradient are the same however the batch is split into micro-batches for gradient accumulation.

Model selection (``val_fraction > 0``; its split: ``sft_data.py``): every ``eval_every`` steps the greedy validation
accuracy is measured and ``model/`` holds the best weights so far, the earliest on ties (``summary.json``:
``best_step``, ``best_val_accuracy``); ``patience`` > 0 stops after that many evaluations without a new best. The
held-out (test) split is never looked at; held-out accuracy is the selected model's. Off by default (``model/`` = the
last step; on ``--data`` with few demonstrations a split costs more than it selects: docs/outcomes.md).

A NaN/Inf loss or gradient norm skips the step, ``nan_patience`` in a row stop the run (exit 2, no ``model/``:
``trainers/guards.py``). Batches are a pure function of (seed, step): an epoch-wise permutation seeded by (seed,
epoch). With the weights, optimizer and RNG state and the best-so-far weights and record in each checkpoint, a run
resumed at step k ends bitwise equal to an uninterrupted one.

Around it: the config and presets (``sft_config.py``), the model and encoded inputs (``sft_data.py``), ``eval_loss``
(``sft_eval.py``), restarts (``sft_restarts.py``); ``trainers/engine/`` drives this file's ``setup -> train_step /
evaluate / save -> finish``.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from posttrain.data.batches import batch_indices
from posttrain.evaluation import evaluate_problems, heldout_report, prompt_window
from posttrain.models.lora import merge_lora
from posttrain.tasks.files import task_for
from posttrain.trainers import common, distributed, sft_restarts, sharded
from posttrain.trainers.checkpoint import CheckpointManager, rng_state
from posttrain.trainers.engine.publish import close_run, publish_model, run_state, save_periodic
from posttrain.trainers.engine.run import run as engine_run
from posttrain.trainers.engine.setup import open_training
from posttrain.trainers.guards import NonFiniteGuard
from posttrain.trainers.selection import BestKeeper, save_with_best
from posttrain.trainers.sft_config import PRESETS, SFTConfig  # noqa: F401  (the trainer registry reads them here)
from posttrain.trainers.sft_data import SFTInputs, build_model, sft_inputs
from posttrain.trainers.sft_eval import heldout_loss


def sft_loss(model, ids: torch.Tensor, loss_mask: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """Summed completion-token cross-entropy divided by the optimizer batch's token count."""
    width = int(loss_mask.nonzero()[:, 1].max()) + 1 if loss_mask.any() else ids.shape[1]
    ids, loss_mask = ids[:, :width], loss_mask[:, :width]  # trim right padding
    logits = model(input_ids=ids[:, :-1]).logits  # (b, L-1, V); right padding never affects real tokens
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1), reduction="none")
    return (nll * loss_mask[:, 1:].reshape(-1)).sum() / n_tokens


@dataclass
class SFTState:
    """Everything one SFT run holds between its parts (the engine's Trainer shape: trainers/engine/protocol.py)."""

    cfg: SFTConfig
    # the run's parts (open_training: Training.state_parts)
    run: common.Run
    model: torch.nn.Module
    tokenizer: object
    opt: torch.optim.Optimizer
    logger: common.MetricsLogger
    manager: CheckpointManager
    start_step: int
    world: distributed.World
    train_model: torch.nn.Module  # the model, or its DDP wrapper under torchrun (forward + backward)
    # the inputs (sft_data.SFTInputs)
    demos: list
    ids: torch.Tensor  # (n_train, L) training demonstrations, encoded
    loss_mask: torch.Tensor  # (n_train, L)
    vals: list  # validation problems (model selection)
    evals: list  # held-out evaluation problems
    held: tuple | None  # (ids, loss mask) of held-out demonstrations: eval_loss
    # SFT's own
    best: BestKeeper
    guard: NonFiniteGuard
    tokens_seen: int = 0
    last_eval: object = None  # the last held-out EvalResult
    name: str = "sft"

    # the engine's Trainer shape; each part is this module's function of the state (so it can be replaced in tests)
    def train_step(self, step: int) -> dict:
        return train_step(self, step)

    def evaluate(self, done: int, metrics: dict) -> None:
        evaluate_step(self, done, metrics)

    def progress(self, metrics: dict) -> dict:
        acc = {"acc": f"{self.last_eval.accuracy:.3f}"} if self.last_eval else {}
        return {"loss": f"{metrics['loss']:.3f}", **acc}

    def early_stop(self, done: int) -> str | None:
        if self.cfg.patience and self.vals and self.best.since >= self.cfg.patience:
            return f"no better validation accuracy in {self.best.since} evaluations"
        return None

    def save(self, done: int, metrics: dict) -> None:
        save(self, done, metrics)

    def finish(self, stopped_at: int | None, t_start: float) -> dict:
        return finish(self, stopped_at, t_start)


def setup(cfg: SFTConfig, resume: str | None = None, overwrite: bool = False) -> SFTState:
    """Open the run (trainers/engine/setup.py) on the model and inputs of ``sft_data.py``."""
    task = task_for(cfg, "demonstrations")  # --data (FileTask) or the embedded task: tasks/files.py
    demos = task.demos()
    build, inputs = (lambda start: build_model(cfg, task, start)), (lambda t: sft_inputs(cfg, task, demos, t))
    t = open_training(cfg, "sft", resume, overwrite, build=build, inputs=inputs)
    d: SFTInputs = t.inputs
    if task.note:
        print(task.note)
    best = BestKeeper()
    if t.ckpt is not None and t.ckpt.state.get("best"):  # a periodic checkpoint (model/ holds the selection itself)
        best.load(t.ckpt.state["best"], t.ckpt.path)
    print(
        f"SFT: {len(d.ids)} demonstrations (+{len(d.vals)} for validation), {len(d.evals)} eval problems, model "
        f"{common.n_params(t.model) / 1e6:.2f}M params, steps {t.start_step}->{cfg.steps}"
    )
    return SFTState(cfg, **t.state_parts(), **vars(d), best=best, guard=NonFiniteGuard(cfg.nan_patience))


def train_step(s: SFTState, step: int) -> dict:
    """One optimizer step on batch ``step`` (gradient accumulation over ``grad_accum`` micro-batches)."""
    cfg, t0 = s.cfg, time.perf_counter()
    lr = common.schedule_lr(s.opt, step, cfg)
    idx = batch_indices(len(s.ids), cfg.batch_size, step, cfg.seed)  # the global batch (every rank draws it)
    n_tok = int(s.loss_mask[idx][:, 1:].sum())  # the global normaliser: the same on every rank
    idx = distributed.shard(idx, s.world)  # this rank's rows (all of them on one process)
    b_ids, b_mask = s.ids[idx], s.loss_mask[idx]
    model, scale, loss_total = s.train_model or s.model, distributed.ddp_loss_scale(s.world), 0.0
    micros = [m for m in torch.tensor_split(torch.arange(len(idx)), cfg.grad_accum) if len(m)]
    for k, m in enumerate(micros):
        with sharded.no_sync(model, last=k == len(micros) - 1):  # gradients are reduced on the last micro-batch
            loss = sft_loss(model, b_ids[m], b_mask[m], n_tok)
            (loss * scale).backward()
        loss_total += loss.item()
    loss_total = distributed.global_sum(loss_total, s.world)
    gnorm, _ = common.clip_and_step(s.model, s.opt, loss_total, cfg.grad_clip)  # NaN/Inf loss or norm: skipped
    dt = time.perf_counter() - t0
    n_real = int(distributed.global_sum(int((b_ids != s.tokenizer.pad_id).sum()), s.world))
    s.tokens_seen += n_real
    return {"loss": loss_total, "lr": lr, "grad_norm": gnorm, "step_time": dt, "tokens_per_s": n_real / max(dt, 1e-9)}


def run_eval(s: SFTState, problems: list, keep_samples: int = 5):
    """Greedy accuracy on ``problems``: the held-out ones (logged for the curve; selection never looks at them), or
    the validation ones (what selection looks at)."""
    window = prompt_window(s.model, s.cfg.max_new_tokens)
    kw = dict(max_new_tokens=s.cfg.max_new_tokens, window=window, keep_samples=keep_samples)
    return evaluate_problems(s.model, s.tokenizer, problems, **kw)


def evaluate_step(s: SFTState, done: int, metrics: dict) -> None:
    """Validation (offered to the best-so-far keeper) and the held-out evaluation after step ``done``."""
    if s.vals:
        metrics["val_accuracy"] = run_eval(s, s.vals, keep_samples=0).accuracy
        s.best.offer(done, metrics["val_accuracy"], s.model)
    s.last_eval = run_eval(s, s.evals)
    metrics["heldout_accuracy"] = s.last_eval.accuracy
    if s.held is not None:
        metrics["eval_loss"] = heldout_loss(s.model, *s.held, sft_loss)


def save(s: SFTState, done: int, metrics: dict) -> None:
    """A periodic checkpoint with the best-so-far weights and record, for an exact resume."""
    state = run_state("sft", s.run, s.cfg, done, metrics=metrics, best=s.best.state_dict())
    save_with = functools.partial(save_with_best, best=s.best)
    save_periodic(s.manager, done, s.model, s.opt, s.tokenizer, state, rng_state(), s.world, save=save_with)


def finish(s: SFTState, stopped_at: int | None, t_start: float) -> dict:
    """``model/`` (the selected weights), the final held-out evaluation and ``summary.json``."""
    cfg, best, last_eval = s.cfg, s.best, s.last_eval
    last_step = stopped_at or cfg.steps
    if best.weights is not None:  # model/ = the best validation checkpoint
        s.model.load_state_dict(best.weights)
        last_eval = None
    if last_eval is None:  # the selected (or resumed-at-the-end) model
        last_eval = run_eval(s, s.evals)
    if cfg.merge_lora:  # model/ with full weights, no adapter files
        s.model = merge_lora(s.model)
    selected = best.step if best.weights is not None else last_step
    extra = {"heldout_accuracy": last_eval.accuracy, "steps_trained": last_step, "selected_step": selected}
    state = run_state("sft", s.run, cfg, cfg.steps, **extra)
    final = publish_model(s.run.dir, s.model, s.tokenizer, state, s.opt, s.world, rng_state())
    summary = {
        "trainer": "sft",
        "steps": cfg.steps,
        "steps_trained": last_step,
        "stopped_early": stopped_at is not None,
        "best_step": selected,
        "best_val_accuracy": best.score,
        "val_n": len(s.vals),
        "heldout_accuracy": last_eval.accuracy,
        "heldout_n": last_eval.n,
        **({"eval_loss": heldout_loss(s.model, *s.held, sft_loss), "eval_demos": len(s.held[0])} if s.held else {}),
        "num_demos": len(s.demos),
        "train_demos": len(s.ids),
        "params": common.n_params(s.model),
        "train_seconds": time.perf_counter() - t_start,
        "tokens_seen": s.tokens_seen,
        "model_dir": str(final),
        "samples": last_eval.samples,
    }
    return close_run(s.run.dir, summary, final, heldout_report(last_eval))


def train_sft(cfg: SFTConfig, resume: str | None = None, overwrite: bool = False, pause_at: int | None = None) -> dict:
    """Run SFT; returns the summary dict (also written to ``cfg.out/summary.json``). ``restarts`` > 1 (or a
    resumed restarts run): that many runs, the best by validation kept (``trainers/sft_restarts.py``).
    ``pause_at``: stop after that step with a checkpoint there (resumable; returns ``{"paused_at", ...}``)."""
    cfg, restarts = sft_restarts.plan(cfg, resume)
    if restarts:  # under torchrun too: one restart after another, on all processes
        return sft_restarts.train_restarts(cfg, train_sft, resume=resume, overwrite=overwrite)
    return engine_run(setup(cfg, resume, overwrite), pause_at=pause_at)
