"""GRPO speed and learning: posttrain's PolicyGradientTrainer vs TRL's GRPOTrainer, from the same policy.

Both sides start from ONE SFT checkpoint of our tiny GPT (converted exactly to a HF ``GPT2LMHeadModel``
for TRL by ``posttrain.models.convert``), and share: prompts per step, G, completion length (EOS included),
temperature 1, beta = 0 (no reference model), the exact-match reward, clip eps 0.2, group-std advantage
scaling, the loss aggregation (``--loss``), AdamW (betas 0.9/0.95, no weight decay), LR with 10 warmup
steps then constant, gradient clipping at 1, one update per rollout batch, fp32 on CPU, ``--threads``.
The TRL side sees the task through a HF tokenizer whose ids equal our CharTokenizer's (checked at start:
[BOS] + one id per character, generation stops at our EOS id).

Measured on each side:
- s/step: median wall time of one step (generate + score + loss + backward + optimizer);
- greedy held-out accuracy every ``--eval-every`` steps with the SAME function
  (``posttrain.evaluation.evaluate``, same held-out problems) on the live model;
- train wall-clock to reach ``start accuracy + --target-gain`` (evaluation time excluded on both sides;
  resolution: one evaluation interval).

    .venv/bin/python benchmarks/bench_grpo.py [--steps 600] [--threads 1] [--init SFT_DIR] [--loss dapo|grpo|dr_grpo]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _util import print_table

from posttrain.checkpoints.load import load_checkpoint
from posttrain.evaluation import encode_prompt, evaluate
from posttrain.models.convert import gpt_to_hf_gpt2
from posttrain.rewards.verifiers import exact_match_reward
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from posttrain.tokenizers.char import SPECIALS, CharTokenizer
from posttrain.trainers.alarms import AlarmConfig
from posttrain.trainers.policy_gradient import PolicyGradientConfig, PolicyGradientTrainer
from posttrain.trainers.sft import SFTConfig, train_sft

# the same loss aggregation on both sides: --loss name -> (TRL loss_type, our loss_agg)
LOSSES = {
    "dapo": ("dapo", "token_mean"),
    "grpo": ("grpo", "seq_mean_token_mean"),
    "dr_grpo": ("dr_grpo", "seq_mean_token_sum_norm"),
}
WARMUP_STEPS = 10


class Stopwatch:
    """Train-only wall clock: runs from start(), paused while an evaluation runs."""

    def __init__(self):
        self.t0 = None
        self.paused = 0.0

    def start(self):
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0 - self.paused


class EvalLog:
    """Greedy held-out accuracy at given steps, with the train-only wall clock at each."""

    def __init__(self, tokenizer, problems, max_new_tokens: int, clock: Stopwatch):
        self.tok, self.problems, self.max_new, self.clock = tokenizer, problems, max_new_tokens, clock
        self.points: list[tuple[int, float, float]] = []  # (step, train seconds, accuracy)

    def timed(self, step: int, fn):
        """Run ``fn()`` (returning an EvalResult) with the clock paused; record its accuracy."""
        train_s = self.clock.now()
        t = time.perf_counter()
        result = fn()
        self.clock.paused += time.perf_counter() - t
        self.points.append((step, train_s, result.accuracy))
        return result

    def __call__(self, model, step: int) -> float:
        def run():
            was_training = model.training
            model.eval()
            r = evaluate(
                model,
                self.tok,
                [p.prompt for p in self.problems],
                [p.answer for p in self.problems],
                max_new_tokens=self.max_new,
            )
            model.train(was_training)
            return r

        return self.timed(step, run).accuracy

    def first_reaching(self, target: float):
        return next(((s, w) for s, w, a in self.points if a >= target - 1e-12), None)


# ------------------------------------------------------------------------------------------ HF tokenizer
def hf_char_tokenizer(char_tok: CharTokenizer):
    """A ``PreTrainedTokenizerFast`` with the CharTokenizer's ids: every character one token, [BOS] prepended."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {char_tok.id_to_token(i): i for i in range(char_tok.vocab_size)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", char_tok.bos_id)])
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )
    return tok


def check_tokenizer(hf_tok, char_tok: CharTokenizer, prompts: list[str]) -> None:
    """TRL tokenises a prompt with ``tokenizer(text=prompts)``: it must equal our encode_prompt exactly."""
    ids = hf_tok(text=prompts)["input_ids"]
    for p, got in zip(prompts, ids):
        want = encode_prompt(char_tok, p)
        if got != want:
            raise SystemExit(f"HF tokenizer mismatch on {p!r}: {got} != {want}")
    ids_c = [char_tok.encode("85"), char_tok.encode("85") + [char_tok.eos_id, char_tok.pad_id]]
    if hf_tok.batch_decode(ids_c, skip_special_tokens=True) != ["85", "85"]:
        raise SystemExit("HF tokenizer decodes differently from the CharTokenizer")
    ids_hf = (hf_tok.pad_token_id, hf_tok.bos_token_id, hf_tok.eos_token_id)
    if ids_hf != (char_tok.pad_id, char_tok.bos_id, char_tok.eos_id):
        raise SystemExit(f"HF tokenizer pad/bos/eos ids {ids_hf} differ from the CharTokenizer's")
    if tuple(hf_tok.convert_ids_to_tokens(list(range(len(SPECIALS))))) != SPECIALS:
        raise SystemExit("HF tokenizer special tokens differ from the CharTokenizer's")


# ------------------------------------------------------------------------------------------ sides
def run_trl(args, init_dir: Path, task: ArithmeticTask, work: Path) -> dict:
    import datasets
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    ckpt = load_checkpoint(init_dir)
    char_tok = ckpt.tokenizer
    model = gpt_to_hf_gpt2(ckpt.model).train()
    hf_tok = hf_char_tokenizer(char_tok)
    train_problems = task.rl_prompts()
    check_tokenizer(hf_tok, char_tok, [p.prompt for p in train_problems[:200]])
    ds = datasets.Dataset.from_list([p.to_dict() for p in train_problems])

    def exact_match(prompts, completions, answer, **_):
        return exact_match_reward(prompts, completions, answer=answer)

    trl_loss, _ = LOSSES[args.loss]
    cfg = GRPOConfig(
        output_dir=str(work / "trl"),
        max_steps=args.steps,
        per_device_train_batch_size=args.prompts * args.G,
        gradient_accumulation_steps=1,
        num_generations=args.G,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        num_iterations=1,
        epsilon=0.2,
        scale_rewards="group",
        loss_type=trl_loss,
        learning_rate=args.lr,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=WARMUP_STEPS,
        adam_beta1=0.9,
        adam_beta2=0.95,
        adam_epsilon=1e-8,
        weight_decay=0.0,
        max_grad_norm=1.0,
        use_cpu=True,
        bf16=False,
        fp16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        seed=args.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
        log_completions=False,
    )
    clock = Stopwatch()
    evals = EvalLog(char_tok, task.eval_problems(), args.max_new_tokens, clock)
    step_times: list[float] = []

    class Timing(TrainerCallback):
        def on_train_begin(self, a, state, control, model=None, **kw):
            clock.start()
            evals(model, 0)

        def on_step_begin(self, a, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, a, state, control, model=None, **kw):
            step_times.append(time.perf_counter() - self.t)
            if state.global_step % args.eval_every == 0 or state.global_step == args.steps:
                evals(model, state.global_step)

    trainer = GRPOTrainer(
        model=model, reward_funcs=exact_match, args=cfg, train_dataset=ds, processing_class=hf_tok, callbacks=[Timing()]
    )
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    torch.set_num_threads(args.threads)
    trainer.train()
    total = clock.now()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    drift = trl_position_drift(trainer, char_tok, train_problems[:64], args)
    return {"step_times": step_times, "evals": evals, "train_s": total, "rewards": rewards, "drift": drift}


@torch.no_grad()
def trl_position_drift(trainer, char_tok, problems, args) -> dict:
    """|TRL's training log-probs - the sampling log-probs| on left-padded vs unpadded rows.

    HF ``generate`` derives position ids from the attention mask; TRL's loss forward
    (``_get_per_token_logps_and_entropies``) passes only input_ids and attention_mask, so a model with
    absolute positions (GPT-2) sees left-padded rows shifted by their padding during the update.
    """
    from posttrain.generate import SamplingConfig, generate

    model = trainer.model.eval()
    gen = generate(
        model,
        [encode_prompt(char_tok, p.prompt) for p in problems],
        pad_id=char_tok.pad_id,
        eos_id=char_tok.eos_id,
        cfg=SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=1.0),
        generator=torch.Generator().manual_seed(0),
    )
    T = gen.completion_mask.shape[1]
    trl_logps, _, _ = trainer._get_per_token_logps_and_entropies(model, gen.sequences, gen.attention_mask, T)
    model.train()
    diff = (trl_logps - gen.logps).abs() * gen.completion_mask  # (N, T)
    per_row = diff.sum(-1) / gen.completion_mask.sum(-1).clamp(min=1)
    padded = gen.attention_mask[:, : gen.prompt_length].eq(0).any(-1)
    out = {"padded_frac": padded.float().mean().item()}
    for name, rows in (("padded", padded), ("unpadded", ~padded)):
        out[name] = per_row[rows].mean().item() if rows.any() else float("nan")
    return out


def run_ours(args, init_dir: Path, task_cfg: ArithmeticConfig, work: Path) -> dict:
    _, agg = LOSSES[args.loss]
    cfg = PolicyGradientConfig(
        out=str(work / "ours"),
        init=str(init_dir),
        algo="grpo",
        steps=args.steps,
        prompts_per_step=args.prompts,
        num_generations=args.G,
        max_new_tokens=args.max_new_tokens,
        temperature=1.0,
        lr=args.lr,
        warmup_steps=WARMUP_STEPS,
        min_lr_ratio=1.0,
        weight_decay=0.0,
        grad_clip=1.0,
        mu=1,
        minibatches=1,
        clip_eps_low=0.2,
        loss_agg=agg,
        scale_rewards="group",
        beta=0.0,
        reward="exact_match:1.0",
        eval_every=args.eval_every,
        save_every=0,
        seed=args.seed,
        threads=args.threads,
        progress=False,
        task=task_cfg,
        # like for like with TRL's GRPOTrainer: no dynamic sampling, no collapse restore, the last weights (no tail
        # averaging; posttrain's defaults have all three)
        dynamic_sampling=False,
        alarms=AlarmConfig(collapse_fraction=0.0),
        average_last=1,
    )
    trainer = PolicyGradientTrainer(cfg, overwrite=True)
    clock = Stopwatch()
    evals = EvalLog(trainer.tokenizer, trainer.evals, args.max_new_tokens, clock)
    done = {"step": 0}
    # the trainer's own periodic evaluation (same evaluate(), same held-out problems, greedy, outside its
    # step_time) runs through the EvalLog so the clock pauses exactly as on the TRL side
    update, own_eval = trainer.update, trainer.run_eval

    def counting_update(ro, step):
        done["step"] = step + 1
        return update(ro, step)

    trainer.update = counting_update
    trainer.run_eval = lambda: evals.timed(done["step"], own_eval)
    clock.start()
    trainer.train()
    total = clock.now()
    rows = [json.loads(line) for line in (work / "ours" / "metrics.jsonl").read_text().splitlines()]
    step_times = [r["step_time"] for r in rows if "step_time" in r]
    rewards = [r["reward_mean"] for r in rows if "reward_mean" in r]
    return {"step_times": step_times, "evals": evals, "train_s": total, "rewards": rewards}


# ------------------------------------------------------------------------------------------ main
def make_sft(args, task_cfg: ArithmeticConfig, work: Path) -> Path:
    if args.init:
        return Path(args.init)
    out = work / "sft"
    t = time.perf_counter()
    s = train_sft(
        SFTConfig(
            out=str(out),
            steps=args.sft_steps,
            task=task_cfg,
            threads=args.threads,
            progress=False,
            eval_every=0,
            save_every=0,
            seed=args.seed,
        ),
        overwrite=True,
    )  # --work may be reused
    print(
        f"SFT checkpoint: {s['steps']} steps in {time.perf_counter() - t:.0f}s, held-out accuracy "
        f"{s['heldout_accuracy']:.3f}"
    )
    return out / "model"


def summarize(name: str, res: dict, target: float) -> dict:
    ev: EvalLog = res["evals"]
    hit = ev.first_reaching(target)
    tail = res["rewards"][-50:]
    return {
        "side": name,
        "s_step": statistics.median(res["step_times"]),
        "steps": len(res["step_times"]),
        "start": ev.points[0][2],
        "final": ev.points[-1][2],
        "best": max(a for _, _, a in ev.points),
        "hit_step": hit[0] if hit else None,
        "hit_s": hit[1] if hit else None,
        "train_s": res["train_s"],
        "reward_tail": sum(tail) / max(len(tail), 1),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=600, help="RL steps per side")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step")
    ap.add_argument("--G", type=int, default=8, help="generations per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=8, help="completion length limit (EOS included)")
    ap.add_argument("--lr", type=float, default=5e-5, help="peak LR (5e-4 and 2e-4 collapse both sides here; see docs)")
    ap.add_argument("--loss", choices=tuple(LOSSES), default="dapo", help="loss aggregation (TRL's default: dapo)")
    ap.add_argument("--eval-every", type=int, default=25, help="steps between held-out evaluations")
    ap.add_argument("--target-gain", type=float, default=0.15, help="target accuracy = start accuracy + this")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init", default=None, help="SFT checkpoint to start from (default: train one now)")
    ap.add_argument("--sft-steps", type=int, default=400, help="SFT steps when no --init is given")
    ap.add_argument("--ops", default="+", help="task operators (two-digit problems)")
    ap.add_argument("--num-demos", type=int, default=512, help="SFT demonstrations")
    ap.add_argument("--num-eval", type=int, default=256, help="held-out evaluation problems")
    ap.add_argument("--sides", default="trl,ours", help="comma-separated subset of trl,ours")
    ap.add_argument("--work", default=None, help="directory for the runs (default: a temporary one)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    task_cfg = ArithmeticConfig(
        digits=2, ops=args.ops, num_demos=args.num_demos, num_eval=args.num_eval, seed=args.seed
    )
    task = ArithmeticTask(task_cfg)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        init_dir = make_sft(args, task_cfg, work)
        runners = {
            "trl": lambda: run_trl(args, init_dir, task, work),
            "ours": lambda: run_ours(args, init_dir, task_cfg, work),
        }
        results = {}
        for side in args.sides.split(","):
            t = time.perf_counter()
            results[side] = runners[side]()
            print(
                f"{side}: {len(results[side]['step_times'])} steps in {time.perf_counter() - t:.0f}s "
                f"(accuracy curve: {[(s, round(a, 3)) for s, _, a in results[side]['evals'].points]})"
            )
    start = next(iter(results.values()))["evals"].points[0][2]
    target = start + args.target_gain
    names = {"trl": "TRL GRPOTrainer (HF GPT-2)", "ours": "posttrain PolicyGradientTrainer (GPT)"}
    rows = {k: summarize(names[k], v, target) for k, v in results.items()}
    print(
        f"\nGRPO, two-digit '{args.ops}', {args.prompts} prompts x G={args.G}, {args.max_new_tokens} new tokens, "
        f"beta=0, loss={args.loss}, lr={args.lr}, {args.steps} steps, {args.threads} thread(s), "
        f"eval every {args.eval_every} steps on {args.num_eval} held-out problems (greedy); "
        f"target accuracy {target:.3f} (start + {args.target_gain}); shared noisy machine, one run"
    )
    fmt = lambda x, f: "never" if x is None else f.format(x)  # noqa: E731
    table = [
        [
            r["side"],
            r["s_step"],
            r["steps"],
            f"{r['start']:.3f}",
            f"{r['final']:.3f}",
            f"{r['best']:.3f}",
            fmt(r["hit_step"], "{}"),
            fmt(r["hit_s"], "{:.1f}"),
            f"{r['train_s']:.1f}",
            f"{r['reward_tail']:.3f}",
        ]
        for r in rows.values()
    ]
    print_table(
        [
            "side",
            "median s/step",
            "steps",
            "acc start",
            "acc final",
            "acc best",
            "target @step",
            "target @train s",
            "train s total",
            "reward (last 50)",
        ],
        table,
    )
    if "trl" in results:
        d = results["trl"]["drift"]
        print(
            f"TRL loss forward vs its sampler (no position_ids): mean |logp diff| per token {d['padded']:.3g} on "
            f"left-padded rows ({d['padded_frac']:.0%} of rows), {d['unpadded']:.3g} on unpadded rows"
        )
    if "trl" in rows and "ours" in rows:
        a, b = rows["trl"], rows["ours"]
        step_ratio = b["s_step"] / a["s_step"]
        hit = (
            f"{b['hit_s'] / a['hit_s']:.2f}x"
            if a["hit_s"] and b["hit_s"] is not None
            else "n/a (a side never reached the target)"
        )
        print(f"ratio ours/TRL: s/step {step_ratio:.2f}x (goal <= 0.5), wall-clock to target {hit} (goal <= 0.5)")


if __name__ == "__main__":
    main()
