"""Direct preference optimisation: the DPO family trained from an SFT checkpoint against a frozen reference.

Key insight: with r(x, y) = beta * log pi(y|x) / pi_ref(y|x) the reward model disappears, and one
optimizer step is a classification step over (chosen, rejected) pairs:

    seq_logps = sum_{t in completion} log pi(y_t | x, y_<t)        (2B,)  chosen rows, then rejected rows
    loss, metrics = PREFERENCE_LOSSES[cfg.loss](policy_chosen_logps=seq_logps[:B], ...,
                                                ref_chosen_logps=ref[:B], ref_rejected_logps=ref[B:], beta=beta)

The loss is a lookup in :data:`~posttrain.losses.preference.PREFERENCE_LOSSES` (``--loss a,b,c --loss-weights``:
their weighted sum, TRL's MPO; ``resolve_loss``); what a variant needs
beyond the log-probs (lengths for SimPO/IPO/R-DPO, the chosen NLL for RPO) comes from
the loss's :class:`~posttrain.losses.preference.LossSpec` (``extras``) and :data:`EXTRA_INPUTS` below, never from a branch on
the loss name. The reference model is a second copy of the init checkpoint, frozen (``eval()``, no
gradients). The reference log-probs depend only on the data, so by default they are computed once
for the whole dataset before training (``precompute_ref``), which removes one of the two forward
passes per step; SimPO and SFT (``REFERENCE_FREE_LOSSES``) need no reference at all. KTO
(:data:`UNPAIRED_LOSSES`) trains on labelled single completions; its KL reference point uses
mismatched (prompt, completion) pairs that change with each batch, so it keeps the reference model.

``loss_kwargs`` are checked when the config is built: each must be an option of the chosen loss, a finite
number, inside its domain (its ``LossSpec.options``, e.g. cDPO's label_smoothing in [0, 0.5]). A NaN/Inf
loss or gradient norm skips the step, ``nan_patience`` in a row stop the run (``trainers/guards.py``).

Shape (every trainer's, ``trainers/common.py``): ``setup(cfg, resume, overwrite) -> DPOState`` (policy,
reference or precomputed reference log-probs, data), ``train_step(state, step) -> metrics``,
``run_eval``, ``save``, ``finish``; :func:`train_dpo` is the loop over them.

Batches are a pure function of (seed, step) and the pairs are cached in the run directory
(``pairs.jsonl``), so a resumed run ends bitwise equal to an uninterrupted one on CPU (tested), as in SFT.

Not handled: gradient accumulation (beta-DPO's batch statistics would change with it), multi-GPU.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from posttrain.chat import chat_tokenizer, resolve_chat
from posttrain.data.batches import batch_indices
from posttrain.data.checks import model_window
from posttrain.data.preference import fit_kto, fit_pairs, load_preference_pairs, pairs_to_kto
from posttrain.data.preference_pairs import PAIRS_FILE, PairDataConfig, cached_pairs, stats_dict
from posttrain.errors import ConfigError, UserError
from posttrain.evaluation import evaluate, fit_prompts, prompt_window, sample_line
from posttrain.losses.preference import resolve_loss
from posttrain.models.lora import apply_lora, lora_config, merge_lora, reference_model
from posttrain.on_policy_pairs import on_policy_pairs
from posttrain.tasks.arithmetic import ArithmeticTask
from posttrain.tasks.files import task_for
from posttrain.trainers import common, distributed, sharded
from posttrain.trainers.checkpoint import CheckpointManager, rng_state
from posttrain.trainers.dpo_config import PRESETS, DPOConfig  # noqa: F401  (the trainer registry reads them here)
from posttrain.trainers.engine.publish import publish_model
from posttrain.trainers.engine.run import run as engine_run
from posttrain.trainers.engine.setup import open_training
from posttrain.trainers.guards import NonFiniteGuard, finite_step
from posttrain.trainers.preference_data import (  # noqa: F401  (seq_logps, PairedData: also imported from here)
    EXTRA_INPUTS,
    PairedData,
    UnpairedData,
    load_user_data,
    reference_logps,
    seq_logps,
)
from posttrain.trainers.preference_eval import PairEval, is_pairs_file, pair_eval_metrics

# ---------------------------------------------------------------------------------------------
# the trainer: setup -> train_step / run_eval / save -> finish (the shape every trainer has; trainers/common.py)


@dataclass
class DPOState:
    """Everything one DPO-family run holds between its parts."""

    cfg: DPOConfig
    run: common.Run
    policy: torch.nn.Module
    tokenizer: object
    choice: object  # the resolved loss (fn, unpaired, reference_free, state_type)
    beta: float
    data: PairedData | UnpairedData
    pair_info: dict
    ref_model: torch.nn.Module | None  # None: reference-free, or paired with precomputed log-probs
    ref_table: torch.Tensor | None  # (N, 2) or (N, 1) precomputed reference log-probs
    evals: list
    eval_window: int | None
    opt: torch.optim.Optimizer
    loss_gen: torch.Generator
    loss_state: object
    logger: common.MetricsLogger
    manager: CheckpointManager
    start_step: int
    guard: NonFiniteGuard
    world: distributed.World = dataclasses.field(default_factory=distributed.World)
    train_model: torch.nn.Module | None = None  # the policy, or its DDP wrapper under torchrun (forward + backward)
    pair_eval: PairEval | None = None  # held-out pairs: eval_loss, eval_rewards/* (trainers/preference_eval.py)
    last_eval: object = None  # the last held-out EvalResult
    init_eval: object = None  # the held-out EvalResult before the first step (a fresh run)

    @property
    def reference(self) -> str:
        return "none" if self.choice.reference_free else "precomputed" if self.ref_table is not None else "model"

    # the engine's Trainer shape (trainers/engine/protocol.py); each part is this module's function of the state
    @property
    def name(self) -> str:
        return self.cfg.loss

    @property
    def model(self) -> torch.nn.Module:
        return self.policy

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
        return finish(self, self.last_eval, self.init_eval, t_start)


def setup(cfg: DPOConfig, resume: str | None = None, overwrite: bool = False) -> DPOState:
    """Open the run (trainers/engine/setup.py), load the policy and the frozen reference, load (or sample and cache)
    and check the data."""
    if not (cfg.init or cfg.model_path):
        raise UserError("dpo needs --init SFT_CHECKPOINT or --model DIR (the starting policy and the frozen reference)")
    task = task_for(cfg, "preference pairs")  # --data (FileTask) or the embedded task: tasks/files.py
    choice = resolve_loss(cfg.loss, cfg.loss_weights)
    unpaired = choice.unpaired
    beta = cfg.beta if cfg.beta is not None else choice.default_beta
    loss_gen = torch.Generator().manual_seed(cfg.seed)  # the loss's own draws (resumed with the RNG state)
    chat = None

    def build(start):  # the resumed policy, or the start's copy (with LoRA: the start itself, its base = reference)
        nonlocal chat
        chat = resolve_chat(cfg.chat_template, start.init.tokenizer, [start.init.path])
        tokenizer = chat_tokenizer(start.init.tokenizer, chat)  # with a template, EOS is its end-of-turn token
        if start.ckpt is not None:
            return start.ckpt.model, tokenizer
        return (
            apply_lora(start.init.model, lora_config(cfg)) if cfg.lora_r else copy.deepcopy(start.init.model)
        ), tokenizer

    def fit(examples, tokenizer, init_model):  # encode once, check unknown characters and lengths (--long)
        return (fit_kto if unpaired else fit_pairs)(
            examples,
            tokenizer,
            window=model_window(init_model),
            long=cfg.long,
            max_prompt_length=cfg.max_prompt_length,
            max_completion_length=cfg.max_completion_length,
        )

    def inputs(
        t,
    ):  # the user's file (with its held-out slice) and the evaluation set, checked before anything is written
        world, tokenizer, init = t.world, t.tokenizer, t.init
        if world.distributed and choice.batch_coupled:
            raise ConfigError(
                f"loss={cfg.loss!r} couples the examples of a batch (batch statistics, sorting or a shared "
                f"state): split over {world.world_size} processes it would change; run it in one process"
            )
        if world.distributed and cfg.batch_size < world.world_size:
            raise ConfigError(f"batch_size={cfg.batch_size} must be >= the number of processes ({world.world_size})")
        examples = (
            fit(load_user_data(cfg.data, unpaired, chat, cfg.on_bad_line), tokenizer, init.model) if cfg.data else None
        )
        held_pairs = None  # held-out (prompt, chosen, rejected): TRL's eval metrics (paired losses)
        if examples is not None:  # no --eval-data: a held-out slice of --data is not trained on (tasks/base.py)
            keep = task.hold_out(examples, key=lambda x: x.prompt, as_problem=_problem)
            if len(keep) < len(examples):
                kept = set(keep)
                held_pairs = [examples[i] for i in range(len(examples)) if i not in kept]
                examples = examples.subset(keep) if hasattr(examples, "subset") else [examples[i] for i in keep]
        if cfg.eval_data and is_pairs_file(cfg.eval_data):  # --eval-data of pairs: scored by the loss, and generation
            pairs = load_preference_pairs(cfg.eval_data, chat=chat, on_bad_line=cfg.on_bad_line)
            held_pairs = fit_pairs(
                pairs,
                tokenizer,
                window=model_window(init.model),
                long=cfg.long,
                max_prompt_length=cfg.max_prompt_length,
                max_completion_length=cfg.max_completion_length,
            )
            evals = [(p.prompt, p.chosen) for p in held_pairs]  # generation: the preferred answer, exact match
        else:
            evals = task.eval_set(chat)  # --eval-data, that slice as (prompt, chosen), or the embedded task's problems
        evals = fit_prompts(tokenizer, evals, model=init.model, max_new_tokens=cfg.max_new_tokens, long=cfg.long)
        if task.note:
            print(task.note)
        return examples, held_pairs, evals

    def run_inputs(t):  # on-policy pairs sampled from the start (cached in the run dir); the reference's log-probs
        examples, held_pairs, evals = t.inputs
        init, tokenizer, pair_info = t.init, t.tokenizer, {}
        if examples is None:
            meta = {
                "init": str(Path(cfg.init or cfg.model_path).resolve()),
                "pairs": dataclasses.asdict(cfg.pairs),
                "task": dataclasses.asdict(cfg.task),
            }
            print(f"sampling preference pairs from {cfg.init or cfg.model_path} ...")
            with distributed.main_first(t.world):  # rank 0 samples and caches them; the others read the cache
                pairs, pair_info = cached_pairs(
                    Path(t.run.dir) / PAIRS_FILE, meta, lambda: _build_pairs(init, task, cfg.pairs)
                )
            examples = fit(pairs_to_kto(pairs) if unpaired else pairs, tokenizer, init.model)
        data = (UnpairedData if unpaired else PairedData)(examples, tokenizer, cfg)
        ref_model = None if choice.reference_free else reference_model(t.model, lambda: common.frozen(init.model))
        ref_table = None
        pair_eval = PairEval(PairedData(held_pairs, tokenizer, cfg)) if held_pairs and not unpaired else None
        if ref_model is not None and cfg.precompute_ref:
            t0 = time.perf_counter()
            ref_table = data.precompute(ref_model)  # (N, 2) or (N, 1)
            if pair_eval is not None:
                pair_eval.ref_table = pair_eval.data.precompute(ref_model)  # (M, 2)
            print(f"reference log-probs precomputed for {len(examples)} examples in {time.perf_counter() - t0:.1f}s")
            if not unpaired:
                ref_model = None  # no longer needed: one forward pass per step
        return data, pair_info, ref_model, ref_table, pair_eval, evals

    t = open_training(
        cfg,
        "dpo",
        resume,
        overwrite,
        build=build,
        inputs=inputs,
        run_inputs=run_inputs,
        keep_init=True,
        generators={"loss": loss_gen},
    )
    data, pair_info, ref_model, ref_table, pair_eval, evals = t.inputs
    loss_state = None
    if t.ckpt is not None and t.ckpt.state.get("loss_state") is not None:
        loss_state = choice.state_type(*t.ckpt.state["loss_state"])
    s = DPOState(
        cfg,
        t.run,
        t.model,
        t.tokenizer,
        choice,
        beta,
        data,
        pair_info,
        ref_model,
        ref_table,
        evals,
        prompt_window(t.init.model, cfg.max_new_tokens),
        t.opt,
        loss_gen,
        loss_state,
        t.logger,
        t.manager,
        t.start_step,
        NonFiniteGuard(cfg.nan_patience),
        t.world,
        t.train_model,
        pair_eval,
    )
    print(
        f"{cfg.loss}: {len(data.examples)} {'examples' if unpaired else 'pairs'}, {len(evals)} eval problems, "
        f"beta {beta}, model {common.n_params(t.model) / 1e6:.2f}M params, reference {s.reference}, "
        f"steps {t.start_step}->{cfg.steps}"
    )
    return s


def train_step(s: DPOState, step: int) -> dict:
    """One optimizer step on batch ``step`` -> its metrics (the loss's own ones included)."""
    cfg, t0 = s.cfg, time.perf_counter()
    lr = common.lr_at(step, cfg.lr, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
    common.set_lr(s.opt, lr)
    per_step = cfg.batch_size * (2 if s.choice.unpaired else 1)
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
    gnorm = common.grad_norm_and_clip(s.policy, cfg.grad_clip)
    stepped = finite_step(s.opt, loss, gnorm)  # a NaN/Inf loss or grad norm skips the step
    if stepped and s.choice.state_type is not None:
        s.loss_state = s.choice.state_type.from_metrics(m)
    metrics = distributed.mean_metrics({k: v.item() for k, v in m.items()}, s.world)  # per-pair means: averaged
    return {"loss": loss, **metrics, "lr": lr, "grad_norm": gnorm, "step_time": time.perf_counter() - t0}


def run_eval(s: DPOState):
    """Greedy accuracy of the policy on the held-out problems."""
    return evaluate(
        s.policy,
        s.tokenizer,
        [p for p, _ in s.evals],
        [a for _, a in s.evals],
        max_new_tokens=s.cfg.max_new_tokens,
        keep_samples=5,
        max_prompt_tokens=s.eval_window,
    )


def pair_metrics(s: DPOState) -> dict:
    """TRL's held-out preference metrics (``eval_loss``, ``eval_rewards/accuracies``, ...), or {} without pairs."""
    if s.pair_eval is None:
        return {}
    return pair_eval_metrics(
        s.pair_eval,
        policy=s.policy,
        ref_model=s.ref_model,
        choice=s.choice,
        beta=s.beta,
        loss_kwargs=s.cfg.loss_kwargs,
        state=s.loss_state,
        seed=s.cfg.seed,
        batch=s.cfg.batch_size,
    )


def _state(s: DPOState, step: int, extra: dict | None = None) -> dict:
    return {
        "step": step,
        "trainer": "dpo",
        "run_id": s.run.run_id,
        "config": dataclasses.asdict(s.cfg),
        "loss_state": list(s.loss_state) if s.loss_state is not None else None,
        **(extra or {}),
    }


def save(s: DPOState, done: int, metrics: dict) -> None:
    """A periodic checkpoint (with the loss's generator and state, for an exact resume); rank 0 writes it, or,
    under --fsdp, every rank its shards (trainers/sharded.py)."""
    if sharded.is_sharded(s.policy):
        sharded.save_sharded_checkpoint(
            s.manager.root / f"step-{done:08d}",
            s.policy,
            s.opt,
            s.tokenizer,
            _state(s, done, {"metrics": metrics}),
            rng_state({"loss": s.loss_gen}),
            s.world,
        )
        if s.world.is_main:  # point checkpoints/latest at it and prune, as for a plain checkpoint
            s.manager.save(done, save_fn=lambda d, **kw: d)
        return
    if not s.world.is_main:
        return
    s.manager.save(
        done,
        model=s.policy,
        tokenizer=s.tokenizer,
        state=_state(s, done, {"metrics": metrics}),
        optimizer=s.opt,
        rng_state=rng_state({"loss": s.loss_gen}),
    )


def finish(s: DPOState, last_eval, init_eval, t_start: float) -> dict:
    """``model/``, the final held-out evaluation and ``summary.json``."""
    cfg, out = s.cfg, s.run.dir
    if last_eval is None:  # resumed at the end: evaluate the loaded model
        last_eval = run_eval(s)
    if cfg.merge_lora:  # model/ with full weights, no adapter files
        s.policy = merge_lora(s.policy)
    state = _state(s, cfg.steps, {"heldout_accuracy": last_eval.accuracy})
    final = publish_model(out, s.policy, s.tokenizer, state, s.opt, s.world, rng_state({"loss": s.loss_gen}))
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
        "params": common.n_params(s.policy),
        "reference": s.reference,
        "train_seconds": time.perf_counter() - t_start,
        "model_dir": str(final),
        "samples": last_eval.samples,
    }
    path = common.write_summary(out, summary)
    before = f"{init_eval.accuracy:.3f} -> " if init_eval is not None else ""
    print(f"held-out accuracy: {before}{last_eval.accuracy:.3f} ({last_eval.correct}/{last_eval.n})")
    for x in last_eval.samples:
        print(sample_line(x))
    print(f"summary: {path}\nmetrics: {Path(out) / 'metrics.jsonl'}\nmodel:   {final}")
    return summary


def train_dpo(cfg: DPOConfig, resume: str | None = None, overwrite: bool = False) -> dict:
    """Run a DPO-family trainer; returns the summary dict (also written to ``cfg.out/summary.json``)."""
    s = setup(cfg, resume, overwrite)
    if not resume:
        s.init_eval = run_eval(s)
        print(f"held-out accuracy at init: {s.init_eval.accuracy:.3f}")
    return engine_run(s)


def _problem(x) -> tuple[str, str] | None:
    """A held-out pair (or KTO example) as a generation problem: its prompt and the preferred answer (an
    undesirable KTO completion is none)."""
    if hasattr(x, "chosen"):
        return x.prompt, x.chosen
    return (x.prompt, x.completion) if x.label else None


def _build_pairs(init, task: ArithmeticTask, pcfg: PairDataConfig):
    pairs, stats = on_policy_pairs(init.model, init.tokenizer, task.rl_prompts(), pcfg)
    info = stats_dict(stats)
    print(
        f"  {info['pairs']} pairs from {info['prompts_with_pairs']}/{info['prompts']} prompts "
        f"(sample accuracy {info['sample_accuracy']:.3f})"
    )
    return pairs, info
