"""Supervised fine-tuning: next-token cross-entropy on completion tokens only.

    L = - (1 / N_tok) * sum_{b, t in completion(b)} log pi(y_{b,t} | y_{b,<t})

N_tok counts completion tokens (EOS included) over the whole optimizer batch, so the loss and its
gradient are the same however the batch is split into micro-batches for gradient accumulation.

A step whose loss or gradient norm is NaN/Inf is skipped (``trainers/guards.py``); ``nan_patience`` such steps in a
row stop the run with a one-line error (exit 2) and no final model; no checkpoint with a non-finite parameter is written.

Model selection: on the embedded task, ``val_fraction > 0`` switches it on and validates on the task's *dev* split
(``val_problems`` of it, or ``--val-data``'s problems; every demonstration still trains); on ``--data``,
``val_fraction`` of the *training demonstrations* (by a stable hash of the prompt) is held out. Either way the
held-out (test) split is never looked at. Every ``eval_every`` steps the validation greedy accuracy is measured and
``model/`` holds the best weights so far, the earliest on ties (``summary.json``: ``best_step``, ``best_val_accuracy``).
With ``patience`` > 0 training stops after that many evaluations without a new best. The default ``val_fraction=0``
turns it off (``model/`` = the last step; on ``--data`` with few demonstrations a split costs more than it selects:
docs/outcomes.md; use e.g. ``--val-fraction 0.1 --eval-every 25``). Held-out accuracy is the selected model's.

Shape (every trainer's, ``trainers/engine/protocol.py``): ``setup(cfg, resume, overwrite) -> SFTState`` (through the
one ``open_training``), ``train_step(state, step) -> metrics``, ``run_eval`` (held-out), ``run_val`` (selection),
``save``, ``finish``; the one loop (``trainers/engine/run.py``) drives them.

Batches are a pure function of (seed, step): the sample order is an epoch-wise permutation seeded by (seed, epoch).
With the saved weights, optimizer state, torch RNG state and the best-so-far weights and patience counter
(``best.safetensors`` + ``trainer_state.json``) a run resumed at step k ends bitwise equal to an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from posttrain.chat import chat_tokenizer, resolve_chat
from posttrain.config import Preset, check_fields, knob
from posttrain.data.batches import batch_indices
from posttrain.data.checks import LONG_POLICIES
from posttrain.data.conversations import BAD_LINE_HELP, CHAT_TEMPLATE_HELP, load_sft_data
from posttrain.data.demos import fit_demos
from posttrain.errors import ConfigError
from posttrain.evaluation import evaluate, fit_prompts, prompt_window, sample_line
from posttrain.models import digit_slots
from posttrain.models.gpt import GPT, GPTConfig
from posttrain.models.loading import model_path_knob, pad_token_knob
from posttrain.models.lora import apply_lora, lora_config, lora_knob, merge_lora
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.tasks.base import USER_FIELDS
from posttrain.tasks.files import fresh_tokenizer, task_for
from posttrain.tokenizers import load as load_tokenizer
from posttrain.trainers import common, distributed, sft_restarts, sharded
from posttrain.trainers.checkpoint import CheckpointManager, rng_state
from posttrain.trainers.engine.publish import publish_model
from posttrain.trainers.engine.run import run as engine_run
from posttrain.trainers.engine.setup import open_training
from posttrain.trainers.guards import NonFiniteGuard, finite_step
from posttrain.trainers.run_dir import read_run, run_root
from posttrain.trainers.selection import BestKeeper, save_with_best, split_validation
from posttrain.trainers.sft_eval import heldout_loss, is_demos_file
from posttrain.trainers.trainer_config import TrainerConfig, override


@dataclass
class SFTConfig(TrainerConfig):
    out: str = override("out", "runs/sft")
    steps: int = override("steps", 600)
    batch_size: int = knob(64, "sequences per optimizer step", gt=0)
    grad_accum: int = knob(1, "micro-batches per optimizer step (batch_size must divide evenly)", gt=0)
    lr: float = override("lr", 3e-3)
    warmup_steps: int = override("warmup_steps", 30)
    weight_decay: float = override("weight_decay", 0.1)
    eval_every: int = override(
        "eval_every",
        200,
        "steps between validation (and held-out) evaluations (0 = only at the end; use ~25 with val_fraction)",
    )
    val_fraction: float = knob(
        0.0,
        "fraction of the training demonstrations held out (stable hash of the prompt) to "
        "select the checkpoint by greedy validation accuracy (0 = off: model/ = last step); on the embedded "
        "task any value > 0 selects on its dev split instead (val_problems of it), every demonstration training",
        ge=0,
        lt=1,
    )
    patience: int = knob(
        0,
        "stop after this many evaluations in a row without a new best validation accuracy (0 = never stop early)",
        ge=0,
    )
    save_every: int = override("save_every", 200)
    init: str | None = knob(None, "start from this checkpoint's weights and tokenizer instead of a fresh model")
    data: str | None = knob(None, "JSONL of {prompt, answer} demonstrations (default: the embedded task's)")
    eval_data: str | None = knob(None, "JSONL of {prompt, answer} for evaluation (default: the task's held-out set)")
    max_new_tokens: int = knob(8, "generation length for evaluation", gt=0)
    long: str = knob(
        "error",
        "records longer than the model's window: error | truncate (prompt keeps its end, answer its start) | skip",
        choices=LONG_POLICIES,
    )
    model: GPTConfig = knob(factory=GPTConfig, help="model shape (ignored with init)")
    task: ArithmeticConfig = knob(factory=ArithmeticConfig, help="embedded task", unused_with=USER_FIELDS)
    chat_template: str = knob("auto", CHAT_TEMPLATE_HELP)
    on_bad_line: str = knob("error", BAD_LINE_HELP, choices=("error", "skip"))
    fsdp: bool = knob(
        False,
        "under torchrun: shard parameters, gradients and optimizer state over the processes "
        "(FSDP2); checkpoints are then sharded (DCP) and `posttrain export` consolidates them",
    )
    tokenizer: str | None = knob(
        None,
        "tokenizer.json for a fresh model (its vocabulary size sets model.vocab_size; default: the embedded task's "
        "characters, with --data the 256 byte values, any text; ignored with init)",
    )
    restarts: int = knob(
        1,
        "SFT runs from different initialisations (seed, then hashes of it); model/ = the one "
        "with the best validation accuracy (trainers/sft_restarts.py); 1 = one plain run",
        ge=1,
    )
    val_problems: int = knob(
        1024,
        "restarts on the embedded task: problems of its dev split (all of it when it has "
        "fewer), scored greedily to rank the restarts (256 mis-ranked runs "
        "1.5 points apart: docs/outcomes.md)",
        gt=0,
        unused_with=USER_FIELDS,
    )
    val_data: str | None = knob(
        None,
        "restarts: JSONL/Parquet of {prompt, answer} problems (neither demonstrations nor the "
        "evaluation set) to rank them on by greedy accuracy instead of the embedded task's "
        "val_problems; makes restarts work with --data without --val-fraction",
    )
    restart_probe: float = knob(
        0.0,
        "restarts by successive halving: train every restart to this fraction of the steps, rank "
        "them there on the validation problems, and finish only the best restart_keep (0 = every "
        "restart runs all steps)",
        ge=0,
        lt=1,
    )
    restart_keep: int = knob(1, "with restart_probe: how many restarts train past the probe", ge=1)

    def __post_init__(self):
        check_fields(self)  # choices, bounds and finiteness, from the knobs above
        if self.fsdp and self.lora_r > 0:
            raise ConfigError("fsdp with LoRA (lora_r > 0) is not supported yet; LoRA alone usually fits one device")
        if self.fsdp and self.val_fraction > 0:
            raise ConfigError(
                "fsdp with val_fraction > 0 is not supported yet (the best-so-far weights would be "
                "sharded); use one or the other"
            )
        sft_restarts.check_config(self)
        if self.batch_size % self.grad_accum:
            raise ConfigError(f"batch_size={self.batch_size} must be divisible by grad_accum={self.grad_accum}")

    # a local Hugging Face model (or posttrain checkpoint) to start from, and LoRA (models/loading.py, models/lora.py)
    model_path: str | None = model_path_knob()
    pad_token: str | None = pad_token_knob()
    lora_r: int = lora_knob("r")
    lora_alpha: float = lora_knob("alpha")
    lora_dropout: float = lora_knob("dropout")
    lora_target_modules: tuple[str, ...] = lora_knob("target_modules")
    merge_lora: bool = lora_knob("merge")


# What each preset is for (`posttrain sft --help`, docs/sft.md); the recipes they replaced are in docs/log/.
PRESETS: dict[str, dict] = {
    "tiny": Preset(
        "the default on the embedded task: 2000 steps, weight decay 3.0, 4 restarts ranked at step 1000, the best "
        "finishes",
        {"steps": 2000, "weight_decay": 3.0, "restarts": 4, "restart_probe": 0.5, "restart_keep": 1},
    ),
    "slots16": Preset(
        "the start of the strongest measured recipe, then `grpo --preset long_cosine`: digit-slot positions, 16 "
        "restarts of 600 steps ranked at step 300, the best 2 finish",
        {"restarts": 16, "restart_probe": 0.5, "restart_keep": 2, "model": {"digit_slots": 2}},
    ),
    "single": Preset("one plain run of 600 steps, no restarts: a quick check of a change", {}),
    "small": Preset(
        "a 6-layer, 192-wide model on 1024 demonstrations: when the tiny model is the limit",
        {"steps": 1500, "model": {"n_layer": 6, "n_head": 6, "d_model": 192}, "task": {"num_demos": 1024}},
    ),
}


def sft_loss(model, ids: torch.Tensor, loss_mask: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """Summed completion-token cross-entropy divided by the optimizer batch's token count."""
    width = int(loss_mask.nonzero()[:, 1].max()) + 1 if loss_mask.any() else ids.shape[1]
    ids, loss_mask = ids[:, :width], loss_mask[:, :width]  # trim right padding
    logits = model(input_ids=ids[:, :-1]).logits  # (b, L-1, V); right padding never affects real tokens
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1), reduction="none")
    return (nll * loss_mask[:, 1:].reshape(-1)).sum() / n_tokens


# ---------------------------------------------------------------------------------------------
# the trainer: setup -> train_step / evaluate / save -> finish, driven by the one loop (trainers/engine/)


@dataclass
class SFTState:
    """Everything one SFT run holds between its parts (the engine's Trainer shape: trainers/engine/protocol.py)."""

    cfg: SFTConfig
    run: common.Run
    model: torch.nn.Module
    tokenizer: object
    demos: list
    ids: torch.Tensor  # (n_train, L) training demonstrations, encoded
    loss_mask: torch.Tensor  # (n_train, L)
    vals: list  # validation demonstrations (model selection)
    evals: list  # held-out evaluation problems
    eval_window: int | None
    opt: torch.optim.Optimizer
    logger: common.MetricsLogger
    manager: CheckpointManager
    start_step: int
    best: BestKeeper = dataclasses.field(default_factory=BestKeeper)
    guard: NonFiniteGuard | None = None
    world: distributed.World = dataclasses.field(default_factory=distributed.World)
    train_model: torch.nn.Module | None = None  # the model, or its DDP wrapper under torchrun (forward + backward)
    tokens_seen: int = 0
    last_eval: object = None  # the last held-out EvalResult
    name: str = "sft"
    held: tuple | None = None  # (ids, loss mask) of held-out demonstrations: eval_loss

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
        return finish(self, self.last_eval, stopped_at, t_start)


def setup(cfg: SFTConfig, resume: str | None = None, overwrite: bool = False) -> SFTState:
    """Open the run (trainers/engine/setup.py), load or build the model, check the data."""
    task = task_for(cfg, "demonstrations")  # --data (FileTask) or the embedded task: tasks/files.py
    demos = task.demos()

    def build(start):  # the resumed checkpoint, the --init / --model start, or a fresh model of cfg.model
        if start.ckpt is not None or start.init is not None:
            model, tokenizer = (start.ckpt or start.init).model, (start.ckpt or start.init).tokenizer
        else:
            tokenizer = load_tokenizer(cfg.tokenizer) if cfg.tokenizer else fresh_tokenizer(task)  # tasks/files.py
            digit_slots.check_tokenizer(tokenizer, cfg.model.digit_slots, cfg.task.digits)  # with model.digit_slots
            model = GPT(dataclasses.replace(cfg.model, vocab_size=tokenizer.vocab_size))
        return apply_lora(model, lora_config(cfg)), tokenizer  # lora_r > 0: adapters on a frozen base

    def inputs(t):  # the demonstrations and evaluation problems, encoded and checked against the model's window
        chat = resolve_chat(cfg.chat_template, t.tokenizer, [getattr(x, "path", None) for x in (t.ckpt, t.init)])
        t.tokenizer = chat_tokenizer(t.tokenizer, chat)  # with a template, EOS is its end-of-turn token
        fitted, ids, loss_mask = fit_demos(t.tokenizer, demos, t.model, cfg.long, chat)
        keep = task.hold_out(fitted)  # no --eval-data: a held-out slice of --data is not trained on (tasks/base.py)
        held = None  # (ids, loss mask) of held-out demonstrations: eval_loss (trainers/sft_eval.py)
        if len(keep) < len(fitted):
            out_idx = sorted(set(range(len(fitted))) - set(keep))
            held = (ids[out_idx], loss_mask[out_idx])
            fitted, ids, loss_mask = [fitted[i] for i in keep], ids[keep], loss_mask[keep]
        if getattr(cfg, "eval_data", None) and is_demos_file(cfg.eval_data):  # conversations: loss + generation
            e_demos = load_sft_data(cfg.eval_data, "evaluation", on_bad_line=cfg.on_bad_line)
            e_fitted, e_ids, e_mask = fit_demos(t.tokenizer, e_demos, t.model, cfg.long, chat)
            held, evals = (e_ids, e_mask), list(e_fitted)  # generation: each one's prompt and last reply
        else:
            evals = task.eval_set(chat)  # --eval-data, that slice, or the embedded task's held-out problems
        if cfg.val_fraction > 0 and not cfg.data:  # the embedded task: choose on its dev split, train on every demo
            train_idx, vals = list(range(len(fitted))), sft_restarts.validation_problems(cfg)
        else:
            train_idx, val_idx = split_validation(fitted, cfg.val_fraction)
            vals = [fitted[i] for i in val_idx]
        evals = fit_prompts(t.tokenizer, evals, model=t.model, max_new_tokens=cfg.max_new_tokens, long=cfg.long)
        if t.world.distributed and cfg.batch_size < t.world.world_size * cfg.grad_accum:
            raise ConfigError(
                f"batch_size={cfg.batch_size} must be >= processes x grad_accum = "
                f"{t.world.world_size} x {cfg.grad_accum}"
            )
        return fitted, ids[train_idx], loss_mask[train_idx], vals, evals, held

    t = open_training(cfg, "sft", resume, overwrite, build=build, inputs=inputs)
    demos, ids, loss_mask, vals, evals, held = t.inputs
    if task.note:
        print(task.note)
    best = BestKeeper()
    if t.ckpt is not None and t.ckpt.state.get("best"):  # a periodic checkpoint (model/ holds the selection itself)
        best.load(t.ckpt.state["best"], t.ckpt.path)
    print(
        f"SFT: {len(ids)} demonstrations (+{len(vals)} for validation), {len(evals)} eval problems, model "
        f"{common.n_params(t.model) / 1e6:.2f}M params, steps {t.start_step}->{cfg.steps}"
    )
    return SFTState(
        cfg,
        t.run,
        t.model,
        t.tokenizer,
        demos,
        ids,
        loss_mask,
        vals,
        evals,
        prompt_window(t.model, cfg.max_new_tokens),
        t.opt,
        t.logger,
        t.manager,
        t.start_step,
        best,
        NonFiniteGuard(cfg.nan_patience),
        world=t.world,
        train_model=t.train_model,
        held=held,
    )


def train_step(s: SFTState, step: int) -> dict:
    """One optimizer step on batch ``step`` (gradient accumulation over ``grad_accum`` micro-batches)."""
    cfg, t0 = s.cfg, time.perf_counter()
    lr = common.lr_at(step, cfg.lr, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
    common.set_lr(s.opt, lr)
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
    gnorm = common.grad_norm_and_clip(s.model, cfg.grad_clip)
    finite_step(s.opt, loss_total, gnorm)  # a NaN/Inf loss or grad norm skips the step
    dt = time.perf_counter() - t0
    n_real = int(distributed.global_sum(int((b_ids != s.tokenizer.pad_id).sum()), s.world))
    s.tokens_seen += n_real
    return {"loss": loss_total, "lr": lr, "grad_norm": gnorm, "step_time": dt, "tokens_per_s": n_real / max(dt, 1e-9)}


def evaluate_step(s: SFTState, done: int, metrics: dict) -> None:
    """Validation (offered to the best-so-far keeper) and the held-out evaluation after step ``done``."""
    if s.vals:
        metrics["val_accuracy"] = run_val(s)
        s.best.offer(done, metrics["val_accuracy"], s.model)
    s.last_eval = run_eval(s)  # logged for the curve only: selection never looks at the evaluation split
    metrics["heldout_accuracy"] = s.last_eval.accuracy
    if s.held is not None:
        metrics["eval_loss"] = heldout_loss(s.model, *s.held, sft_loss)


def run_eval(s: SFTState):
    """Greedy accuracy on the held-out problems (logged for the curve; selection never looks at it)."""
    return evaluate(
        s.model,
        s.tokenizer,
        [p for p, _ in s.evals],
        [a for _, a in s.evals],
        max_new_tokens=s.cfg.max_new_tokens,
        keep_samples=5,
        max_prompt_tokens=s.eval_window,
    )


def run_val(s: SFTState) -> float:
    """Greedy accuracy on the validation demonstrations: what model selection looks at."""
    return evaluate(
        s.model,
        s.tokenizer,
        [p for p, _ in s.vals],
        [a for _, a in s.vals],
        max_new_tokens=s.cfg.max_new_tokens,
        max_prompt_tokens=s.eval_window,
    ).accuracy


def _state(s: SFTState, step: int, extra: dict | None = None) -> dict:
    return {
        "step": step,
        "trainer": "sft",
        "run_id": s.run.run_id,
        "config": dataclasses.asdict(s.cfg),
        **(extra or {}),
    }


def save(s: SFTState, done: int, metrics: dict) -> None:
    """A periodic checkpoint (with the best-so-far weights, for an exact resume); rank 0 writes it, or, under
    --fsdp, every rank its shards (trainers/sharded.py)."""
    if sharded.is_sharded(s.model):
        sharded.save_sharded_checkpoint(
            s.manager.root / f"step-{done:08d}",
            s.model,
            s.opt,
            s.tokenizer,
            _state(s, done, {"metrics": metrics}),
            rng_state(),
            s.world,
        )
        if s.world.is_main:  # point checkpoints/latest at it and prune, as for a plain checkpoint
            s.manager.save(done, save_fn=lambda d, **kw: d)
        return
    if not s.world.is_main:
        return
    s.manager.save(
        done,
        save_fn=lambda d, **kw: save_with_best(d, s.best, **kw),
        model=s.model,
        tokenizer=s.tokenizer,
        state=_state(s, done, {"metrics": metrics, "best": s.best.state_dict()}),
        optimizer=s.opt,
        rng_state=rng_state(),
    )


def finish(s: SFTState, last_eval, stopped_at: int | None, t_start: float) -> dict:
    """``model/`` (the selected weights), the final held-out evaluation and ``summary.json``."""
    cfg, out, best = s.cfg, s.run.dir, s.best
    last_step = stopped_at or cfg.steps
    if best.weights is not None:  # model/ = the best validation checkpoint
        s.model.load_state_dict(best.weights)
        last_eval = None
    if last_eval is None:  # the selected (or resumed-at-the-end) model
        last_eval = run_eval(s)
    if cfg.merge_lora:  # model/ with full weights, no adapter files
        s.model = merge_lora(s.model)
    selected = best.step if best.weights is not None else last_step
    extra = {"heldout_accuracy": last_eval.accuracy, "steps_trained": last_step, "selected_step": selected}
    final = publish_model(out, s.model, s.tokenizer, _state(s, cfg.steps, extra), s.opt, s.world, rng_state())
    summary = {
        "trainer": "sft",
        "steps": cfg.steps,
        "steps_trained": last_step,
        "stopped_early": stopped_at is not None,
        "best_step": best.step if best.weights is not None else last_step,
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
    path = common.write_summary(out, summary)
    print(f"held-out accuracy: {last_eval.accuracy:.3f} ({last_eval.correct}/{last_eval.n})")
    for x in last_eval.samples:
        print(sample_line(x))
    print(f"summary: {path}\nmetrics: {Path(out) / 'metrics.jsonl'}\nmodel:   {final}")
    return summary


def train_sft(cfg: SFTConfig, resume: str | None = None, overwrite: bool = False, pause_at: int | None = None) -> dict:
    """Run SFT; returns the summary dict (also written to ``cfg.out/summary.json``). ``restarts`` > 1 (or a
    resumed restarts run): that many runs, the best by validation kept (``trainers/sft_restarts.py``).
    ``pause_at``: stop after that step with a checkpoint there (resumable; returns ``{"paused_at", ...}``)."""
    resumes_restarts = resume and (read_run(run_root(resume)) or {}).get("trainer") == "sft_restarts"
    if resume and not resumes_restarts:  # --resume of one plain run continues that run
        cfg = dataclasses.replace(cfg, restarts=1)
    elif (
        cfg.restarts > 1
        and not resume
        and (cfg.init or cfg.model_path or (cfg.data and not (cfg.val_fraction or cfg.val_data)))
    ):
        print(
            f"restarts={cfg.restarts} applies to a fresh model on the embedded task (or --data with --val-data or "
            "--val-fraction to rank on): one run here"
        )
        cfg = dataclasses.replace(cfg, restarts=1)
    if cfg.restarts > 1 or resumes_restarts:  # under torchrun too: one restart after another, on all processes
        return sft_restarts.train_restarts(cfg, train_sft, resume=resume, overwrite=overwrite)
    return engine_run(setup(cfg, resume, overwrite), pause_at=pause_at)
