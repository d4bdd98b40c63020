"""Supervised fine-tuning: next-token cross-entropy on completion tokens only.

    L = - (1 / N_tok) * sum_{b, t in completion(b)} log pi(y_{b,t} | y_{b,<t})

N_tok counts completion tokens (EOS included) over the whole optimizer batch, so the loss and its
gradient are the same however the batch is split into micro-batches for gradient accumulation.

A step whose loss or gradient norm is NaN/Inf is skipped (``trainers/guards.py``); ``nan_patience`` such
steps in a row stop the run with a one-line error (exit 2) and no final model, and no checkpoint with a
non-finite parameter is ever written.

Model selection: ``val_fraction`` of the *training demonstrations* (chosen by a stable hash of the prompt,
the same on every seed and machine; the task's evaluation split is never looked at) is held out as a
validation set. Every ``eval_every`` steps the greedy validation accuracy is measured; the weights with the
best one so far (the earliest on ties; validation loss breaks no ties) are kept, and ``model/`` holds
*those* weights, not the last step's (``summary.json``: ``best_step``, ``best_val_accuracy``). With
``patience`` > 0 training stops after that many evaluations in a row without a new best. The default,
``val_fraction=0``, turns selection off (``model/`` = the last step): on the embedded task, with 320
demonstrations, a 30-47 problem validation split costs more than it selects (docs/outcomes.md); use e.g.
``--val-fraction 0.1 --eval-every 25``. Held-out accuracy in the summary is measured on the selected model.

Shape (every trainer's, ``trainers/common.py``): ``setup(cfg, resume, overwrite) -> SFTState``,
``train_step(state, step) -> metrics``, ``run_eval`` (held-out) and ``run_val`` (selection), ``save`` (a periodic
checkpoint), ``finish`` (``model/``, ``summary.json``); :func:`train_sft` is the loop over them.

Batches are a pure function of (seed, step): the sample order is an epoch-wise permutation seeded by
(seed, epoch). Together with the saved weights, optimizer state, torch RNG state and the best-so-far
weights and patience counter (``best.safetensors`` + ``trainer_state.json`` in each checkpoint) this makes
a run resumed at step k end bitwise equal to an uninterrupted run on CPU.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from posttrain.config import check_fields, knob
from posttrain.data.batches import batch_indices  # noqa: F401  (also imported from here by older callers)
from posttrain.data.checks import LONG_POLICIES, Located, fit_sequences, model_window
from posttrain.data.pairs import load_pairs
from posttrain.errors import ConfigError, UserError
from posttrain.evaluation import encode_prompt, evaluate, fit_prompts, prompt_window, sample_line
from posttrain.models.gpt import GPT, GPTConfig
from posttrain.progress import tqdm  # a bar on a terminal, a line every 10 % in a log
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask, stable_fraction
from posttrain.tokenizers import load as load_tokenizer
from posttrain.tokenizers.char import CharTokenizer
from posttrain.trainers import common
from posttrain.trainers.checkpoint import (
    POLICY,
    CheckpointManager,
    load_checkpoint,
    restore_rng,
    rng_state,
    save_checkpoint,
    save_with_extras,
)
from posttrain.trainers.guards import NonFiniteGuard, finite_step


@dataclass
class SFTConfig:
    out: str = knob("runs/sft", "output directory (metrics.jsonl, summary.json, checkpoints/, model/)")
    steps: int = knob(600, "optimizer steps", gt=0)
    batch_size: int = knob(64, "sequences per optimizer step", gt=0)
    grad_accum: int = knob(1, "micro-batches per optimizer step (batch_size must divide evenly)", gt=0)
    lr: float = knob(3e-3, "peak learning rate (AdamW)", gt=0)
    min_lr_ratio: float = knob(0.1, "final LR as a fraction of the peak (cosine decay)", ge=0, le=1)
    warmup_steps: int = knob(30, "linear warmup steps", ge=0)
    weight_decay: float = knob(0.1, "AdamW weight decay on matrices", ge=0)
    grad_clip: float = knob(1.0, "max global gradient norm (0 = no clipping)", ge=0)
    nan_patience: int = knob(3, "consecutive non-finite loss/grad-norm steps (each skipped) before the run stops", ge=1)
    eval_every: int = knob(200, "steps between validation (and held-out) evaluations (0 = only at the end; use ~25 "
                                "with val_fraction)", ge=0)
    val_fraction: float = knob(0.0, "fraction of the training demonstrations held out (stable hash of the prompt) to "
                                     "select the checkpoint by greedy validation accuracy (0 = off: model/ = last step)",
                               ge=0, lt=1)
    patience: int = knob(0, "stop after this many evaluations in a row without a new best validation accuracy "
                            "(0 = never stop early)", ge=0)
    save_every: int = knob(200, "steps between checkpoints (0 = only the final model)", ge=0)
    keep_checkpoints: int = knob(2, "periodic checkpoints to keep", gt=0)
    seed: int = knob(0, "seed for init, data order and dropout", ge=0, lt=2**32)
    logger: str = knob("jsonl", "metrics sink: jsonl | tensorboard (also writes jsonl)", choices=("jsonl", "tensorboard"))
    threads: int | None = knob(1, "torch CPU threads (tiny models run fastest on 1, and never stall on a busy machine; None = torch default)", ge=1)
    init: str | None = knob(None, "start from this checkpoint's weights and tokenizer instead of a fresh model")
    data: str | None = knob(None, "JSONL of {prompt, answer} demonstrations (default: the embedded task's)")
    eval_data: str | None = knob(None, "JSONL of {prompt, answer} for evaluation (default: the task's held-out set)")
    max_new_tokens: int = knob(8, "generation length for evaluation", gt=0)
    progress: bool = knob(True, "show a progress bar")
    long: str = knob("error", "records longer than the model's window: error | truncate (prompt keeps its end, "
                              "answer its start) | skip", choices=LONG_POLICIES)
    model: GPTConfig = knob(factory=GPTConfig, help="model shape (ignored with init)")
    task: ArithmeticConfig = knob(factory=ArithmeticConfig, help="embedded task")
    tokenizer: str | None = knob(None, "tokenizer.json for a fresh model (its vocabulary size sets model.vocab_size; "
                                       "default: the task's characters; ignored with init)")

    def __post_init__(self):
        check_fields(self)  # choices, bounds and finiteness, from the knobs above
        if self.batch_size % self.grad_accum:
            raise ConfigError(f"batch_size={self.batch_size} must be divisible by grad_accum={self.grad_accum}")


PRESETS: dict[str, dict] = {
    "tiny": {},
    "small": {"steps": 1500, "model": {"n_layer": 6, "n_head": 6, "d_model": 192}, "task": {"num_demos": 1024}},
}


def encode_demos(tokenizer, pairs: list[tuple[str, str]], fitted=None) -> tuple[torch.Tensor, torch.Tensor]:
    """[BOS] prompt answer [EOS], right-padded; loss mask on answer + EOS. -> ids (n, L), mask (n, L).
    ``fitted``: the pairs' token ids as checked by ``fit_sequences`` (then ``pairs`` is not re-encoded)."""
    if fitted is None:
        encoded = [(encode_prompt(tokenizer, p), tokenizer.encode(a) + [tokenizer.eos_id]) for p, a in pairs]
    else:
        encoded = [(f.prompt, f.completions[0]) for f in fitted]
    seqs, masks = [], []
    for pi, ai in encoded:
        seqs.append(pi + ai)
        masks.append([0] * len(pi) + [1] * len(ai))
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tokenizer.pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(m)] = torch.tensor(m)
    return ids, mask


def fit_demos(tokenizer, demos, model, long: str):
    """Check demonstrations (unknown characters, the model's window) -> (kept demos, ids, loss mask)."""
    kept, fitted = fit_sequences(tokenizer, demos, lambda r: (r[0], [("answer", r[1])]), window=model_window(model),
                                 long=long, what="training")
    demos = demos.subset(kept) if isinstance(demos, Located) else [demos[i] for i in kept]
    return (demos, *encode_demos(tokenizer, demos, fitted))


def sft_loss(model, ids: torch.Tensor, loss_mask: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """Summed completion-token cross-entropy divided by the optimizer batch's token count."""
    width = int(loss_mask.nonzero()[:, 1].max()) + 1 if loss_mask.any() else ids.shape[1]
    ids, loss_mask = ids[:, :width], loss_mask[:, :width]  # trim right padding
    logits = model(input_ids=ids[:, :-1]).logits  # (b, L-1, V); right padding never affects real tokens
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1), reduction="none")
    return (nll * loss_mask[:, 1:].reshape(-1)).sum() / n_tokens


BEST_FILE = "best.safetensors"  # in each periodic checkpoint: the best-so-far weights (for an exact resume)


def is_validation(prompt: str, fraction: float) -> bool:
    """Is this demonstration in the validation split? A stable hash of the prompt alone (any seed, any order)."""
    return stable_fraction("sft-validation:" + prompt) < fraction


def split_validation(demos, fraction: float) -> tuple[list[int], list[int]]:
    """Indices of (training, validation) demonstrations; no validation when fewer than 2 demos would remain."""
    val = [i for i, (p, _) in enumerate(demos) if fraction > 0 and is_validation(p, fraction)]
    if len(demos) - len(val) < 2:
        raise ConfigError(f"val_fraction={fraction} leaves {len(demos) - len(val)} of {len(demos)} demonstrations "
                          f"to train on; lower it")
    chosen = set(val)
    return [i for i in range(len(demos)) if i not in chosen], val


class BestKeeper:
    """The best-so-far weights by validation accuracy (earliest on ties) and the evaluations since it."""

    def __init__(self):
        self.step, self.score, self.weights, self.since = None, None, None, 0

    def offer(self, step: int, score: float, model) -> bool:
        if self.score is None or score > self.score:
            self.step, self.score, self.since = step, score, 0
            self.weights = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
            return True
        self.since += 1
        return False

    def state_dict(self) -> dict:
        return {"step": self.step, "val_accuracy": self.score, "since": self.since}

    def load(self, state: dict, path: Path) -> None:
        self.step, self.score, self.since = state["step"], state["val_accuracy"], int(state["since"])
        if self.step is not None:
            if not (path / BEST_FILE).is_file():
                raise UserError(f"{path}: checkpoint has no {BEST_FILE} (the best weights so far); cannot resume exactly")
            self.weights = load_file(str(path / BEST_FILE))


def save_with_best(directory, best: BestKeeper, **kwargs) -> Path:
    """:func:`save_checkpoint` plus ``best.safetensors`` (the best-so-far weights), one atomic directory."""
    def extras(tmp):
        if best.weights is not None:
            save_file(best.weights, str(tmp / BEST_FILE))
    return save_with_extras(directory, extras, **kwargs)


# ---------------------------------------------------------------------------------------------
# the trainer: setup -> train_step / run_eval / save -> finish (the shape every trainer has; trainers/common.py)


@dataclass
class SFTState:
    """Everything one SFT run holds between its parts."""

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
    tokens_seen: int = 0


def setup(cfg: SFTConfig, resume: str | None = None, overwrite: bool = False) -> SFTState:
    """Open the run, load or build the model, check the data, then write the run directory's header."""
    common.set_threads(cfg.threads)
    run = common.open_run(cfg, "sft", resume=resume, overwrite=overwrite)
    task = ArithmeticTask(cfg.task)
    demos = load_pairs(cfg.data, "training") if cfg.data else [(p.prompt, p.answer) for p in task.demonstrations()]
    evals = load_pairs(cfg.eval_data, "evaluation") if cfg.eval_data else [(p.prompt, p.answer) for p in task.eval_problems()]

    common.seed_everything(cfg.seed)
    start_step, ckpt = 0, None
    if resume:
        ckpt = load_checkpoint(run.resume_from, with_training_state=True, expect_trainer="sft")
        model, tokenizer = ckpt.model, ckpt.tokenizer
        start_step = ckpt.step
        common.check_resume_step(ckpt.path, start_step, cfg.steps)
    elif cfg.init:
        init = load_checkpoint(cfg.init, accept_kinds=POLICY, role="sft --init")
        model, tokenizer = init.model, init.tokenizer
    else:
        tokenizer = load_tokenizer(cfg.tokenizer) if cfg.tokenizer else CharTokenizer(task.alphabet)
        model = GPT(dataclasses.replace(cfg.model, vocab_size=tokenizer.vocab_size))
    demos, ids, loss_mask = fit_demos(tokenizer, demos, model, cfg.long)
    train_idx, val_idx = split_validation(demos, cfg.val_fraction)
    vals = [demos[i] for i in val_idx]
    ids, loss_mask = ids[train_idx], loss_mask[train_idx]
    evals = fit_prompts(tokenizer, evals, model=model, max_new_tokens=cfg.max_new_tokens, long=cfg.long)
    eval_window = prompt_window(model, cfg.max_new_tokens)
    common.begin_run(run, cfg)  # inputs validated: from here on the run directory is written
    best = BestKeeper()
    if ckpt is not None and ckpt.state.get("best"):  # a periodic checkpoint (model/ holds the selection itself)
        best.load(ckpt.state["best"], ckpt.path)

    opt = common.make_optimizer(model, cfg.lr, cfg.weight_decay)
    if ckpt is not None:
        opt.load_state_dict(ckpt.optimizer_state)
        if ckpt.rng_state is not None:
            restore_rng(ckpt.rng_state)
    logger = common.MetricsLogger(run.dir, cfg.logger, resume_step=start_step if resume else None)
    manager = CheckpointManager(run.dir, keep=cfg.keep_checkpoints)
    print(f"SFT: {len(train_idx)} demonstrations (+{len(vals)} for validation), {len(evals)} eval problems, model "
          f"{common.n_params(model) / 1e6:.2f}M params, steps {start_step}->{cfg.steps}")
    return SFTState(cfg, run, model, tokenizer, demos, ids, loss_mask, vals, evals, eval_window, opt, logger, manager,
                    start_step, best, NonFiniteGuard(cfg.nan_patience))


def train_step(s: SFTState, step: int) -> dict:
    """One optimizer step on batch ``step`` (gradient accumulation over ``grad_accum`` micro-batches)."""
    cfg, t0 = s.cfg, time.perf_counter()
    lr = common.lr_at(step, cfg.lr, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
    common.set_lr(s.opt, lr)
    idx = batch_indices(len(s.ids), cfg.batch_size, step, cfg.seed)
    b_ids, b_mask = s.ids[idx], s.loss_mask[idx]
    n_tok = int(b_mask[:, 1:].sum())
    micro, loss_total = cfg.batch_size // cfg.grad_accum, 0.0
    for m in range(cfg.grad_accum):
        sl = slice(m * micro, (m + 1) * micro)
        loss = sft_loss(s.model, b_ids[sl], b_mask[sl], n_tok)
        loss.backward()
        loss_total += loss.item()
    gnorm = common.grad_norm_and_clip(s.model, cfg.grad_clip)
    finite_step(s.opt, loss_total, gnorm)  # a NaN/Inf loss or grad norm skips the step
    dt = time.perf_counter() - t0
    n_real = int((b_ids != s.tokenizer.pad_id).sum())
    s.tokens_seen += n_real
    return {"loss": loss_total, "lr": lr, "grad_norm": gnorm, "step_time": dt, "tokens_per_s": n_real / max(dt, 1e-9)}


def run_eval(s: SFTState):
    """Greedy accuracy on the held-out problems (logged for the curve; selection never looks at it)."""
    return evaluate(s.model, s.tokenizer, [p for p, _ in s.evals], [a for _, a in s.evals],
                    max_new_tokens=s.cfg.max_new_tokens, keep_samples=5, max_prompt_tokens=s.eval_window)


def run_val(s: SFTState) -> float:
    """Greedy accuracy on the validation demonstrations: what model selection looks at."""
    return evaluate(s.model, s.tokenizer, [p for p, _ in s.vals], [a for _, a in s.vals],
                    max_new_tokens=s.cfg.max_new_tokens, max_prompt_tokens=s.eval_window).accuracy


def _state(s: SFTState, step: int, extra: dict | None = None) -> dict:
    return {"step": step, "trainer": "sft", "run_id": s.run.run_id, "config": dataclasses.asdict(s.cfg), **(extra or {})}


def save(s: SFTState, done: int, metrics: dict) -> None:
    """A periodic checkpoint (with the best-so-far weights, for an exact resume)."""
    s.manager.save(done, save_fn=lambda d, **kw: save_with_best(d, s.best, **kw), model=s.model, tokenizer=s.tokenizer,
                   state=_state(s, done, {"metrics": metrics, "best": s.best.state_dict()}), optimizer=s.opt,
                   rng_state=rng_state())


def finish(s: SFTState, last_eval, stopped_at: int | None, t_start: float) -> dict:
    """``model/`` (the selected weights), the final held-out evaluation and ``summary.json``."""
    cfg, out, best = s.cfg, s.run.dir, s.best
    last_step = stopped_at or cfg.steps
    if best.weights is not None:  # model/ = the best validation checkpoint
        s.model.load_state_dict(best.weights)
        last_eval = None
    if last_eval is None:  # the selected (or resumed-at-the-end) model
        last_eval = run_eval(s)
    final = save_checkpoint(Path(out) / "model", model=s.model, tokenizer=s.tokenizer,
                            state=_state(s, cfg.steps, {"heldout_accuracy": last_eval.accuracy, "steps_trained": last_step,
                                                        "selected_step": best.step if best.weights is not None else last_step}),
                            optimizer=s.opt, rng_state=rng_state())
    summary = {
        "trainer": "sft", "steps": cfg.steps, "steps_trained": last_step, "stopped_early": stopped_at is not None,
        "best_step": best.step if best.weights is not None else last_step, "best_val_accuracy": best.score,
        "val_n": len(s.vals), "heldout_accuracy": last_eval.accuracy, "heldout_n": last_eval.n,
        "num_demos": len(s.demos), "train_demos": len(s.ids), "params": common.n_params(s.model),
        "train_seconds": time.perf_counter() - t_start, "tokens_seen": s.tokens_seen, "model_dir": str(final),
        "samples": last_eval.samples,
    }
    path = common.write_summary(out, summary)
    print(f"held-out accuracy: {last_eval.accuracy:.3f} ({last_eval.correct}/{last_eval.n})")
    for x in last_eval.samples:
        print(sample_line(x))
    print(f"summary: {path}\nmetrics: {Path(out) / 'metrics.jsonl'}\nmodel:   {final}")
    return summary


def train_sft(cfg: SFTConfig, resume: str | None = None, overwrite: bool = False) -> dict:
    """Run SFT; returns the summary dict (also written to ``cfg.out/summary.json``)."""
    s = setup(cfg, resume, overwrite)
    last_eval, t_start, stopped_at = None, time.perf_counter(), None
    bar = common.progress_bar(s.start_step, cfg.steps, "sft", cfg.progress)
    s.model.train()
    for step in bar:
        metrics = train_step(s, step)
        done = step + 1
        if s.guard.record("sft", done, metrics):  # a NaN/Inf step was skipped; nan_patience in a row: stop
            s.guard.stop("sft", done, metrics, s.logger, bar, s.run.dir)
        if common.should_eval(done, cfg.eval_every, cfg.steps):
            if s.vals:
                metrics["val_accuracy"] = run_val(s)
                s.best.offer(done, metrics["val_accuracy"], s.model)
            last_eval = run_eval(s)  # logged for the curve only: selection never looks at the evaluation split
            metrics["heldout_accuracy"] = last_eval.accuracy
            s.model.train()
        s.logger.log(done, metrics)
        bar.set_postfix(loss=f"{metrics['loss']:.3f}", **({"acc": f"{last_eval.accuracy:.3f}"} if last_eval else {}))
        if cfg.patience and s.vals and s.best.since >= cfg.patience:
            tqdm.write(f"early stop at step {done}: no better validation accuracy in {s.best.since} evaluations")
            stopped_at = done
            break
        if common.should_save(done, cfg.save_every, cfg.steps):
            save(s, done, metrics)
    bar.close()
    s.logger.close()
    return finish(s, last_eval, stopped_at, t_start)
