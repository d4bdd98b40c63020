"""Direct preference optimisation: the DPO family trained from an SFT checkpoint against a frozen reference.

Key insight: with r(x, y) = beta * log pi(y|x) / pi_ref(y|x) the reward model disappears, and one
optimizer step is a classification step over (chosen, rejected) pairs:

    seq_logps = sum_{t in completion} log pi(y_t | x, y_<t)        (2B,)  chosen rows, then rejected rows
    loss, metrics = PREFERENCE_LOSSES[cfg.loss](policy_chosen_logps=seq_logps[:B], ...,
                                                ref_chosen_logps=ref[:B], ref_rejected_logps=ref[B:], beta=beta)

The loss is a lookup in :data:`~posttrain.losses.preference.PREFERENCE_LOSSES` (``--loss a,b,c --loss-weights``:
their weighted sum, TRL's MPO; ``resolve_loss``); what a variant needs beyond the log-probs (lengths for
SimPO/IPO/R-DPO, the chosen NLL for RPO) comes from the loss's :class:`~posttrain.losses.preference.LossSpec`
(``extras``) and ``EXTRA_INPUTS`` (``trainers/preference_data.py``), never from a branch on the loss name. The
reference model is a second copy of the init checkpoint, frozen (``eval()``, no gradients). The reference log-probs
depend only on the data, so by default they are computed once for the whole dataset before training
(``precompute_ref``), which removes one of the two forward passes per step; SimPO and SFT (``REFERENCE_FREE_LOSSES``)
need no reference at all. KTO (``UNPAIRED_LOSSES``) trains on labelled single completions; its KL reference point
uses mismatched (prompt, completion) pairs that change with each batch, so it keeps the reference model.

``loss_kwargs`` are checked when the config is built (``dpo_config.py``: each must be an option of the chosen loss,
a finite number, inside its domain). A NaN/Inf loss or gradient norm skips the step, ``nan_patience`` in a row stop
the run (``trainers/guards.py``). Around it: the config and presets (``dpo_config.py``), the policy, pairs and
reference log-probs (``dpo_data.py``), held-out pair metrics (``preference_eval.py``); ``trainers/engine/`` drives
this file's ``setup -> train_step / evaluate / save -> finish``.

Batches are a pure function of (seed, step) and the pairs are cached in the run directory
(``pairs.jsonl``), so a resumed run ends bitwise equal to an uninterrupted one on CPU (tested), as in SFT.

Not handled: gradient accumulation (beta-DPO's batch statistics would change with it).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import torch

from posttrain.data.batches import batch_indices
from posttrain.errors import UserError
from posttrain.evaluation import evaluate_problems, heldout_report, prompt_window
from posttrain.losses.preference import resolve_loss
from posttrain.models.lora import merge_lora
from posttrain.tasks.files import task_for
from posttrain.trainers import common, distributed
from posttrain.trainers.checkpoint import CheckpointManager, rng_state
from posttrain.trainers.dpo_config import PRESETS, DPOConfig  # noqa: F401  (the trainer registry reads them here)
from posttrain.trainers.dpo_data import DPOInputs
from posttrain.trainers.engine.publish import close_run, publish_model, run_state, save_periodic
from posttrain.trainers.engine.run import run as engine_run
from posttrain.trainers.engine.setup import open_training
from posttrain.trainers.guards import NonFiniteGuard
from posttrain.trainers.preference_data import PairedData, UnpairedData
from posttrain.trainers.preference_eval import PairEval, pair_eval_metrics


@dataclass
class DPOState:
    """Everything one DPO-family run holds between its parts (the engine's Trainer shape)."""

    cfg: DPOConfig
    # the run's parts (open_training: Training.state_parts); ``model`` is the policy
    run: common.Run
    model: torch.nn.Module
    tokenizer: object
    opt: torch.optim.Optimizer
    logger: common.MetricsLogger
    manager: CheckpointManager
    start_step: int
    world: distributed.World
    train_model: torch.nn.Module  # the policy, or its DDP wrapper under torchrun (forward + backward)
    # the inputs (dpo_data.PreferenceRun)
    data: PairedData | UnpairedData
    pair_info: dict
    ref_model: torch.nn.Module | None  # None: reference-free, or paired with precomputed log-probs
    ref_table: torch.Tensor | None  # (N, 2) or (N, 1) precomputed reference log-probs
    pair_eval: PairEval | None  # held-out pairs: eval_loss, eval_rewards/* (trainers/preference_eval.py)
    evals: list
    # the loss's own
    choice: object  # the resolved loss (fn, unpaired, reference_free, state_type)
    beta: float
    loss_gen: torch.Generator
    loss_state: object
    eval_window: int | None
    guard: NonFiniteGuard
    last_eval: object = None  # the last held-out EvalResult
    init_eval: object = None  # the held-out EvalResult before the first step (a fresh run)

    @property
    def name(self) -> str:
        return self.cfg.loss

    @property
    def policy(self) -> torch.nn.Module:
        return self.model

    @property
    def reference(self) -> str:
        return "none" if self.choice.reference_free else "precomputed" if self.ref_table is not None else "model"

    # the engine's Trainer shape (trainers/engine/protocol.py); each part is this module's function of the state
    def train_step(self, step: int) -> dict:
        return train_step(self, step)

    def evaluate(self, done: int, metrics: dict) -> None:
        self.last_eval = run_eval(self)
        metrics["heldout_accuracy"] = self.last_eval.accuracy
        metrics.update(pair_metrics(self))

    def progress(self, metrics: dict) -> dict:
        heldout = {"eval": f"{self.last_eval.accuracy:.3f}"} if self.last_eval else {}
        return {"loss": f"{metrics['loss']:.3f}", "acc": f"{metrics.get('rewards/accuracies', 0.0):.2f}", **heldout}

    def early_stop(self, done: int) -> None:
        return None

    def save(self, done: int, metrics: dict) -> None:
        save(self, done, metrics)

    def finish(self, stopped_at: int | None, t_start: float) -> dict:
        return finish(self, t_start)


def setup(cfg: DPOConfig, resume: str | None = None, overwrite: bool = False) -> DPOState:
    """Open the run (trainers/engine/setup.py) on the policy, reference and pairs of ``dpo_data.py``."""
    if not (cfg.init or cfg.model_path):
        raise UserError("dpo needs --init SFT_CHECKPOINT or --model DIR (the starting policy and the frozen reference)")
    task = task_for(cfg, "preference pairs")  # --data (FileTask) or the embedded task: tasks/files.py
    choice = resolve_loss(cfg.loss, cfg.loss_weights)
    beta = cfg.beta if cfg.beta is not None else choice.default_beta
    loss_gen = torch.Generator().manual_seed(cfg.seed)  # the loss's own draws (resumed with the RNG state)
    d = DPOInputs(cfg, task, choice)
    parts = dict(build=d.build, inputs=d.inputs, run_inputs=d.run_inputs, keep_init=True, generators={"loss": loss_gen})
    t = open_training(cfg, "dpo", resume, overwrite, **parts)
    loss_state = None
    if t.ckpt is not None and t.ckpt.state.get("loss_state") is not None:
        loss_state = choice.state_type(*t.ckpt.state["loss_state"])
    window = prompt_window(t.init.model, cfg.max_new_tokens)
    own = dict(choice=choice, beta=beta, loss_gen=loss_gen, loss_state=loss_state, eval_window=window)
    s = DPOState(cfg, **t.state_parts(), **vars(t.inputs), **own, guard=NonFiniteGuard(cfg.nan_patience))
    n, what, per_step = len(s.data.examples), "examples" if choice.unpaired else "pairs", examples_per_step(cfg, choice)
    steps = epoch_capped_steps(cfg.steps, n, per_step, cfg.max_epochs)
    if steps < cfg.steps:
        print(f"max_epochs={cfg.max_epochs}: {n} {what}, {per_step} a step -> {steps} steps instead of {cfg.steps}")
        s.cfg = cfg = dataclasses.replace(cfg, steps=steps)
    print(
        f"{cfg.loss}: {n} {what}, {len(s.evals)} eval "
        f"problems, beta {beta}, model {common.n_params(t.model) / 1e6:.2f}M params, reference {s.reference}, "
        f"steps {t.start_step}->{cfg.steps}"
    )
    return s


def examples_per_step(cfg: DPOConfig, choice) -> int:
    """Examples one optimizer step takes: ``batch_size`` pairs, or twice as many labelled completions (KTO)."""
    return cfg.batch_size * (2 if choice.unpaired else 1)


def epoch_capped_steps(steps: int, n: int, per_step: int, max_epochs: float | None) -> int:
    """``steps``, or fewer when ``max_epochs`` passes over ``n`` examples at ``per_step`` a step end sooner:
    min(steps, ceil(max_epochs * n / per_step)), at least 1. Example: 250 steps, 84 pairs, 32 a step, 3 epochs -> 8."""
    if max_epochs is None:
        return steps
    return max(1, min(steps, math.ceil(max_epochs * n / per_step)))


def train_step(s: DPOState, step: int) -> dict:
    """One optimizer step on batch ``step`` -> its metrics (the loss's own ones included)."""
    cfg, t0 = s.cfg, time.perf_counter()
    lr = common.schedule_lr(s.opt, step, cfg)
    per_step = examples_per_step(cfg, s.choice)
    idx = batch_indices(len(s.data.examples), per_step, step, cfg.seed).tolist()  # the global batch
    idx = distributed.shard(idx, s.world)  # this rank's pairs; the loss is a mean over pairs (not batch_coupled):
    share = len(idx) / per_step * distributed.ddp_loss_scale(s.world)  # weighted by its share of the global batch
    batch = s.data.collate(idx)
    kw = s.data.loss_inputs(s.train_model, s.ref_model, batch, s.ref_table[idx] if s.ref_table is not None else None)
    if s.choice.state_type is not None:
        kw["state"] = s.loss_state
    if s.choice.generator:
        kw["generator"] = s.loss_gen
    loss, m = s.choice.fn(**kw, beta=s.beta, **cfg.loss_kwargs)
    (loss * share).backward()
    loss = distributed.global_sum(loss.item() * len(idx) / per_step, s.world)  # the global batch's mean
    gnorm, stepped = common.clip_and_step(s.model, s.opt, loss, cfg.grad_clip)  # NaN/Inf loss or norm: skipped
    if stepped and s.choice.state_type is not None:
        s.loss_state = s.choice.state_type.from_metrics(m)
    metrics = distributed.mean_metrics({k: v.item() for k, v in m.items()}, s.world)  # per-pair means: averaged
    return {"loss": loss, **metrics, "lr": lr, "grad_norm": gnorm, "step_time": time.perf_counter() - t0}


def run_eval(s: DPOState):
    """Greedy accuracy of the policy on the held-out problems."""
    kw = dict(max_new_tokens=s.cfg.max_new_tokens, window=s.eval_window, keep_samples=5)
    return evaluate_problems(s.model, s.tokenizer, s.evals, **kw)


def pair_metrics(s: DPOState) -> dict:
    """TRL's held-out preference metrics (``eval_loss``, ``eval_rewards/accuracies``, ...), or {} without pairs."""
    if s.pair_eval is None:
        return {}
    kw = dict(choice=s.choice, beta=s.beta, loss_kwargs=s.cfg.loss_kwargs, state=s.loss_state, seed=s.cfg.seed)
    return pair_eval_metrics(s.pair_eval, policy=s.model, ref_model=s.ref_model, batch=s.cfg.batch_size, **kw)


def _state(s: DPOState, step: int, **extra) -> dict:
    loss_state = list(s.loss_state) if s.loss_state is not None else None
    return run_state("dpo", s.run, s.cfg, step, loss_state=loss_state, **extra)


def save(s: DPOState, done: int, metrics: dict) -> None:
    """A periodic checkpoint with the loss's generator and state, for an exact resume."""
    state, rng = _state(s, done, metrics=metrics), rng_state({"loss": s.loss_gen})
    save_periodic(s.manager, done, s.model, s.opt, s.tokenizer, state, rng, s.world)


def finish(s: DPOState, t_start: float) -> dict:
    """``model/``, the final held-out evaluation and ``summary.json``."""
    cfg, last_eval, init_eval = s.cfg, s.last_eval or run_eval(s), s.init_eval  # resumed at the end: evaluate it
    if cfg.merge_lora:  # model/ with full weights, no adapter files
        s.model = merge_lora(s.model)
    state = _state(s, cfg.steps, heldout_accuracy=last_eval.accuracy)
    final = publish_model(s.run.dir, s.model, s.tokenizer, state, s.opt, s.world, rng_state({"loss": s.loss_gen}))
    summary = {
        "trainer": "dpo",
        "loss": cfg.loss,
        "beta": s.beta,
        "steps": cfg.steps,
        "heldout_accuracy": last_eval.accuracy,
        "heldout_n": last_eval.n,
        **({"heldout_accuracy_init": init_eval.accuracy} if init_eval is not None else {}),
        **({**pair_metrics(s), "eval_pairs": len(s.pair_eval)} if s.pair_eval is not None else {}),
        "num_examples": len(s.data.examples),
        "pairs": s.pair_info,
        "params": common.n_params(s.model),
        "reference": s.reference,
        "train_seconds": time.perf_counter() - t_start,
        "model_dir": str(final),
        "samples": last_eval.samples,
    }
    return close_run(s.run.dir, summary, final, heldout_report(last_eval, init_eval))


def train_dpo(cfg: DPOConfig, resume: str | None = None, overwrite: bool = False) -> dict:
    """Run a DPO-family trainer; returns the summary dict (also written to ``cfg.out/summary.json``)."""
    s = setup(cfg, resume, overwrite)
    if not resume:
        s.init_eval = run_eval(s)
        print(f"held-out accuracy at init: {s.init_eval.accuracy:.3f}")
    return engine_run(s)
