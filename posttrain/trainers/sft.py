"""Supervised fine-tuning: next-token cross-entropy on completion tokens only.

    L = - (1 / N_tok) * sum_{b, t in completion(b)} log pi(y_{b,t} | y_{b,<t})

N_tok counts completion tokens (EOS included) over the whole optimizer batch, so the loss and its
gradient are the same however the batch is split into micro-batches for gradient accumulation.

Batches are a pure function of (seed, step): the sample order is an epoch-wise permutation seeded by
(seed, epoch). Together with the saved weights, optimizer state and torch RNG state this makes a run
resumed at step k end bitwise equal to an uninterrupted run on CPU.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from posttrain.progress import tqdm  # a bar on a terminal, a line every 10 % in a log

from posttrain.config import check_choice, check_positive, knob
from posttrain.data.io import iter_jsonl
from posttrain.errors import ConfigError, DataError, UserError
from posttrain.evaluation import encode_prompt, evaluate
from posttrain.models.gpt import GPT, GPTConfig
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from posttrain.tokenizers.char import CharTokenizer
from posttrain.trainers import common
from posttrain.trainers.checkpoint import CheckpointManager, load_checkpoint, restore_rng, rng_state, save_checkpoint


@dataclass
class SFTConfig:
    out: str = knob("runs/sft", "output directory (metrics.jsonl, summary.json, checkpoints/, model/)")
    steps: int = knob(600, "optimizer steps")
    batch_size: int = knob(64, "sequences per optimizer step")
    grad_accum: int = knob(1, "micro-batches per optimizer step (batch_size must divide evenly)")
    lr: float = knob(3e-3, "peak learning rate (AdamW)")
    min_lr_ratio: float = knob(0.1, "final LR as a fraction of the peak (cosine decay)")
    warmup_steps: int = knob(30, "linear warmup steps")
    weight_decay: float = knob(0.1, "AdamW weight decay on matrices")
    grad_clip: float = knob(1.0, "max global gradient norm (0 = no clipping)")
    eval_every: int = knob(200, "steps between held-out evaluations (0 = only at the end)")
    save_every: int = knob(200, "steps between checkpoints (0 = only the final model)")
    keep_checkpoints: int = knob(2, "periodic checkpoints to keep")
    seed: int = knob(0, "seed for init, data order and dropout")
    logger: str = knob("jsonl", "metrics sink: jsonl | tensorboard (also writes jsonl)", choices=("jsonl", "tensorboard"))
    threads: int | None = knob(1, "torch CPU threads (tiny models run fastest on 1, and never stall on a busy machine; None = torch default)")
    init: str | None = knob(None, "start from this checkpoint's weights and tokenizer instead of a fresh model")
    data: str | None = knob(None, "JSONL of {prompt, answer} demonstrations (default: the embedded task's)")
    eval_data: str | None = knob(None, "JSONL of {prompt, answer} for evaluation (default: the task's held-out set)")
    max_new_tokens: int = knob(8, "generation length for evaluation")
    progress: bool = knob(True, "show a progress bar")
    model: GPTConfig = knob(factory=GPTConfig, help="model shape (ignored with init)")
    task: ArithmeticConfig = knob(factory=ArithmeticConfig, help="embedded task")

    def __post_init__(self):
        for name in ("steps", "batch_size", "grad_accum", "lr"):
            check_positive(name, getattr(self, name))
        for name in ("warmup_steps", "eval_every", "save_every", "weight_decay", "grad_clip"):
            check_positive(name, getattr(self, name), allow_zero=True)
        if self.batch_size % self.grad_accum:
            raise ConfigError(f"batch_size={self.batch_size} must be divisible by grad_accum={self.grad_accum}")
        check_choice("logger", self.logger, ("jsonl", "tensorboard"))
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError("min_lr_ratio must be in [0, 1]")
        check_positive("keep_checkpoints", self.keep_checkpoints)


PRESETS: dict[str, dict] = {
    "tiny": {},
    "small": {"steps": 1500, "model": {"n_layer": 6, "n_head": 6, "d_model": 192}, "task": {"num_demos": 1024}},
}


def load_pairs(path: str, what: str) -> list[tuple[str, str]]:
    """{prompt, answer} JSONL -> list of pairs, with file:line errors for bad records."""
    pairs = []
    for line, rec in iter_jsonl(path, required=("prompt", "answer")):
        p, a = rec["prompt"], rec["answer"]
        if not isinstance(p, str) or not isinstance(a, (str, int, float)):
            raise DataError(f"{path}:{line}: 'prompt' must be a string and 'answer' a string or number")
        pairs.append((p, str(a)))
    if not pairs:
        raise DataError(f"{path}: no {what} records (the file is empty)")
    return pairs


def encode_demos(tokenizer, pairs: list[tuple[str, str]]) -> tuple[torch.Tensor, torch.Tensor]:
    """[BOS] prompt answer [EOS], right-padded; loss mask on answer + EOS. -> ids (n, L), mask (n, L)."""
    seqs, masks = [], []
    for p, a in pairs:
        pi, ai = encode_prompt(tokenizer, p), tokenizer.encode(a) + [tokenizer.eos_id]
        seqs.append(pi + ai)
        masks.append([0] * len(pi) + [1] * len(ai))
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tokenizer.pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(m)] = torch.tensor(m)
    return ids, mask


def batch_indices(n: int, batch_size: int, step: int, seed: int) -> torch.Tensor:
    """Indices of step ``step``'s batch: positions [step*B, (step+1)*B) of the concatenated epoch permutations."""
    out, start = [], step * batch_size
    while len(out) < batch_size:
        epoch, offset = divmod(start + len(out), n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
        take = min(batch_size - len(out), n - offset)
        out.extend(perm[offset : offset + take].tolist())
    return torch.tensor(out)


def sft_loss(model, ids: torch.Tensor, loss_mask: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """Summed completion-token cross-entropy divided by the optimizer batch's token count."""
    width = int(loss_mask.nonzero()[:, 1].max()) + 1 if loss_mask.any() else ids.shape[1]
    ids, loss_mask = ids[:, :width], loss_mask[:, :width]  # trim right padding
    logits = model(input_ids=ids[:, :-1]).logits  # (b, L-1, V); right padding never affects real tokens
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1), reduction="none")
    return (nll * loss_mask[:, 1:].reshape(-1)).sum() / n_tokens


def train_sft(cfg: SFTConfig, resume: str | None = None) -> dict:
    """Run SFT; returns the summary dict (also written to ``cfg.out/summary.json``)."""
    common.set_threads(cfg.threads)
    out = common.prepare_run_dir(cfg.out, cfg, resume=resume is not None)
    task = ArithmeticTask(cfg.task)
    demos = load_pairs(cfg.data, "training") if cfg.data else [(p.prompt, p.answer) for p in task.demonstrations()]
    evals = load_pairs(cfg.eval_data, "evaluation") if cfg.eval_data else [(p.prompt, p.answer) for p in task.eval_problems()]

    common.seed_everything(cfg.seed)
    start_step, ckpt = 0, None
    if resume:
        ckpt = load_checkpoint(resume, with_training_state=True, prefer_latest=True)
        model, tokenizer = ckpt.model, ckpt.tokenizer
        start_step = ckpt.step
        if start_step > cfg.steps:
            raise UserError(f"checkpoint {ckpt.path} is at step {start_step}, beyond steps={cfg.steps}")
    elif cfg.init:
        init = load_checkpoint(cfg.init)
        model, tokenizer = init.model, init.tokenizer
    else:
        tokenizer = CharTokenizer(task.alphabet)
        model = GPT(dataclasses.replace(cfg.model, vocab_size=tokenizer.vocab_size))
    ids, loss_mask = encode_demos(tokenizer, demos)
    max_len = getattr(getattr(model, "config", None), "max_seq_len", None)
    if max_len is not None and ids.shape[1] + cfg.max_new_tokens > max_len:
        raise UserError(f"sequences of {ids.shape[1]} tokens (+{cfg.max_new_tokens} generated) exceed model.max_seq_len={max_len}")

    opt = common.make_optimizer(model, cfg.lr, cfg.weight_decay)
    if ckpt is not None:
        opt.load_state_dict(ckpt.optimizer_state)
        if ckpt.rng_state is not None:
            restore_rng(ckpt.rng_state)
    logger = common.MetricsLogger(out, cfg.logger, resume_step=start_step if resume else None)
    manager = CheckpointManager(out, keep=cfg.keep_checkpoints)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"SFT: {len(demos)} demonstrations, {len(evals)} eval problems, model {n_params / 1e6:.2f}M params, "
          f"steps {start_step}->{cfg.steps}")

    def run_eval():
        r = evaluate(model, tokenizer, [p for p, _ in evals], [a for _, a in evals],
                     max_new_tokens=cfg.max_new_tokens, keep_samples=5)
        return r

    def state(step, extra=None):
        return {"step": step, "trainer": "sft", "config": dataclasses.asdict(cfg), **(extra or {})}

    micro = cfg.batch_size // cfg.grad_accum
    last_eval, t_start, tokens_seen = None, time.perf_counter(), 0
    bar = tqdm(range(start_step, cfg.steps), initial=start_step, total=cfg.steps, desc="sft",
               disable=not cfg.progress, dynamic_ncols=True, mininterval=1.0)
    model.train()
    for step in bar:
        t0 = time.perf_counter()
        lr = common.lr_at(step, cfg.lr, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
        common.set_lr(opt, lr)
        idx = batch_indices(len(demos), cfg.batch_size, step, cfg.seed)
        b_ids, b_mask = ids[idx], loss_mask[idx]
        n_tok = int(b_mask[:, 1:].sum())
        loss_total = 0.0
        for m in range(cfg.grad_accum):
            sl = slice(m * micro, (m + 1) * micro)
            loss = sft_loss(model, b_ids[sl], b_mask[sl], n_tok)
            loss.backward()
            loss_total += loss.item()
        gnorm = common.grad_norm_and_clip(model, cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        n_real = int((b_ids != tokenizer.pad_id).sum())
        tokens_seen += n_real
        metrics = {"loss": loss_total, "lr": lr, "grad_norm": gnorm, "step_time": dt, "tokens_per_s": n_real / max(dt, 1e-9)}
        done = step + 1
        if (cfg.eval_every and done % cfg.eval_every == 0) or done == cfg.steps:
            last_eval = run_eval()
            metrics["heldout_accuracy"] = last_eval.accuracy
            model.train()
        logger.log(done, metrics)
        bar.set_postfix(loss=f"{loss_total:.3f}", **({"acc": f"{last_eval.accuracy:.3f}"} if last_eval else {}))
        if cfg.save_every and done % cfg.save_every == 0 and done != cfg.steps:
            manager.save(done, model=model, tokenizer=tokenizer, state=state(done, {"metrics": metrics}),
                         optimizer=opt, rng_state=rng_state())
    bar.close()
    logger.close()
    if last_eval is None:  # resumed at the end: evaluate the loaded model
        last_eval = run_eval()
    final = save_checkpoint(Path(out) / "model", model=model, tokenizer=tokenizer,
                            state=state(cfg.steps, {"heldout_accuracy": last_eval.accuracy}),
                            optimizer=opt, rng_state=rng_state())
    summary = {
        "trainer": "sft", "steps": cfg.steps, "heldout_accuracy": last_eval.accuracy, "heldout_n": last_eval.n,
        "num_demos": len(demos), "params": n_params, "train_seconds": time.perf_counter() - t_start,
        "tokens_seen": tokens_seen, "model_dir": str(final), "samples": last_eval.samples,
    }
    path = common.write_summary(out, summary)
    print(f"held-out accuracy: {last_eval.accuracy:.3f} ({last_eval.correct}/{last_eval.n})")
    for s in last_eval.samples:
        print(f"  {s['prompt']}{s['completion']!s:<6} {'ok' if s['correct'] else 'want ' + s['answer']}")
    print(f"summary: {path}\nmetrics: {Path(out) / 'metrics.jsonl'}\nmodel:   {final}")
    return summary
