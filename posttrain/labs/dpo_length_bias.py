"""dpo-length-bias: when chosen answers are longer, DPO learns "longer is better"; SimPO and R-DPO learn less.

Formula: DPO's margin is a difference of *sums* over tokens, sum_t log pi/ref(y_w,t) - sum_t log pi/ref(y_l,t),
so a longer chosen answer contributes more terms and the cheapest way to widen the margin is to change
the length distribution (the EOS probabilities). SimPO compares length-normalised log-likelihoods,
beta/|y_w| log pi(y_w) - beta/|y_l| log pi(y_l) - gamma; R-DPO adds alpha (|y_w| - |y_l|) to the margin,
so length already "explains" part of it and the policy is pushed less to become longer.

Experiment: a quick SFT init on 1-digit addition (answers of 1-2 digits), then 128 pairs whose chosen answer
is 5 random digits and whose rejected answer is 2 random digits: length is the only signal. ``train_dpo``
with loss "dpo" (beta 0.1), "simpo" (beta 2, gamma 0.5) and "rdpo" (beta 0.1, alpha 0.5: our answers differ
by 3 tokens, not hundreds, so alpha is larger than the paper's 0.005-0.05), 40 steps at lr 2e-3 each.
The measure is the mean length of completions sampled at temperature 1 (max 8 tokens) from each policy.
Checked over 2 (quick) or 4 independent runs (seeds: own SFT init, pairs and sampling), each a two-sample
z-test of mean lengths, combined by Stouffer (one-sided, Bonferroni): DPO's mean length grows over the
init's; DPO's final mean length exceeds SimPO's. R-DPO is measured, NOT tested: its length term mostly
damps the gradient (sigma(-(beta h + 1.5)) instead of sigma(-beta h) at the start), so it learns length
more slowly, but with length as the only signal it learns the same thing, and across runs it is shorter
than DPO in most (seeds 0-4: 5.54/6.37, 6.82/7.04, 4.49/5.78, 4.97/5.76, 3.51/4.25) but not all (seed 5:
6.36 vs DPO's 5.73, z = -3.8), so "R-DPO learns less length" does not hold reliably in this setup
(a confounded-quality dataset, as in the paper, would be the fair test).
Seen here: SimPO learns no length (its mean stays near the init's), and in some runs (seed 0) it drifts
to empty completions (not analysed further: a lab, not a study of SimPO). ``falsify`` makes the *rejected* answer the
long one (the data then teach shortness, and the "DPO grows length" check must fail).
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import numpy as np
import torch

from posttrain.checkpoints.load import load_checkpoint
from posttrain.evaluation import evaluate
from posttrain.labs._common import ALPHA, memo, pyplot, z_crit
from posttrain.labs._train import TASK, quiet, sft_init
from posttrain.tasks.arithmetic import ArithmeticTask
from posttrain.trainers.dpo import DPOConfig, train_dpo

NAME = "dpo-length-bias"
CLAIM = (
    "DPO's log-prob sums grow with length, so when the chosen answers are longer DPO learns that longer is "
    "better; SimPO (length-normalised) learns less of it (R-DPO, a length term in the margin: measured, "
    "not reliably less here)."
)
FORMULA = (
    "DPO h = sum_t log pi/ref(y_w) - sum_t log pi/ref(y_l);  SimPO: beta/|y_w| log pi(y_w) - beta/|y_l| "
    "log pi(y_l) - gamma;  R-DPO: beta h + alpha (|y_w| - |y_l|)"
)
NOTES = "notes 10 (DPO): 'length bias, DPO's famous pain point', SimPO and R-DPO as the fixes"

LOSSES = {"dpo": {}, "simpo": {}, "rdpo": {"alpha": 0.5}}
STEPS, LR = 40, 2e-3


def _lengths(model_dir, prompts, seed: int) -> np.ndarray:
    ck = load_checkpoint(model_dir)
    r = evaluate(
        ck.model,
        ck.tokenizer,
        prompts,
        ["0"] * len(prompts),
        max_new_tokens=8,
        temperature=1.0,
        generator=torch.Generator().manual_seed(seed),
        keep_samples=len(prompts),
    )
    return np.array([len(s["completion"]) for s in r.samples], float)


def _measure(seed: int, n_samples: int, long_n: int, short_n: int) -> dict:
    problems = ArithmeticTask(TASK).train_problems
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        lines = []
        for i in range(128):
            ch = "".join(rng.choice("0123456789") for _ in range(long_n))
            rj = "".join(rng.choice("0123456789") for _ in range(short_n))
            lines.append(json.dumps({"prompt": problems[i % len(problems)].prompt, "chosen": ch, "rejected": rj}))
        (tmp / "pairs.jsonl").write_text("\n".join(lines) + "\n")
        init = sft_init(40, seed=seed)
        prompts = [problems[i % len(problems)].prompt for i in range(n_samples)]
        lens = {"init": _lengths(init, prompts, seed)}
        for loss, kw in LOSSES.items():
            cfg = DPOConfig(
                out=str(tmp / loss),
                init=init,
                loss=loss,
                steps=STEPS,
                batch_size=32,
                lr=LR,
                warmup_steps=2,
                eval_every=0,
                save_every=0,
                progress=False,
                task=TASK,
                data=str(tmp / "pairs.jsonl"),
                loss_kwargs=kw,
                seed=seed,
            )
            quiet(train_dpo, cfg)
            lens[loss] = _lengths(tmp / loss / "model", prompts, seed + 1)
    return lens


def _two_sample(a, b) -> float:
    return float((a.mean() - b.mean()) / np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b) + 1e-12))


def run(ctx) -> None:
    n_samples = 512 if ctx.quick else 2048
    seeds = [ctx.seed + i for i in range(2 if ctx.quick else 4)]
    long_n, short_n = (2, 5) if ctx.falsify else (5, 2)
    seeds = seeds[:1] if ctx.falsify else seeds  # the swapped data fail in one run already (tests stay short)
    runs = [
        memo(ctx, f"seed {s} {long_n}/{short_n}", lambda s=s: _measure(s, n_samples, long_n, short_n)) for s in seeds
    ]
    alpha = ALPHA / 3
    zc = z_crit(2 * alpha)

    def combined(name, a, b, expected):
        zs = [_two_sample(r[a], r[b]) for r in runs]
        z = sum(zs) / np.sqrt(len(zs))
        return ctx.check(
            name,
            [[round(r[a].mean(), 3), round(r[b].mean(), 3)] for r in runs],
            expected,
            z > zc,
            f"one-sided Stouffer z = {z:.2f} > {zc:.2f} over {len(zs)} runs of two-sample z "
            f"({', '.join(f'{v:.1f}' for v in zs)}; {n_samples} samples each)",
        )

    combined("DPO: mean completion length grows", "dpo", "init", "[dpo, init] per run: dpo > init")
    combined("DPO learns more length than SIMPO", "dpo", "simpo", "[dpo, simpo] per run: dpo > simpo")
    # R-DPO: measured, not tested -- DPO > R-DPO in most runs but not all (seed 5: 5.73 vs 6.36, z = -3.8)
    rdpo_z = [_two_sample(r["dpo"], r["rdpo"]) for r in runs]
    lens = {k: np.concatenate([r[k] for r in runs]) for k in runs[0]}  # pooled, for the figure and the numbers
    ctx.numbers.update(
        {
            "pairs": 128,
            "chosen_len": long_n,
            "rejected_len": short_n,
            "samples": n_samples,
            "seeds": seeds,
            "mean_length": {k: float(v.mean()) for k, v in lens.items()},
            "mean_length_per_run": [{k: float(v.mean()) for k, v in r.items()} for r in runs],
            "dpo_minus_rdpo_z_per_run": rdpo_z,
            "empty_fraction": {k: float((v == 0).mean()) for k, v in lens.items()},
            "losses": {k: {"loss_kwargs": v} for k, v in LOSSES.items()},
        }
    )
    ctx.say("  mean sampled length (all runs): " + ", ".join(f"{k} {v.mean():.2f}" for k, v in lens.items()))

    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    bins = np.arange(-0.5, 9.5, 1)
    for k, v in lens.items():
        ax1.hist(v, bins=bins, histtype="step", lw=1.5, density=True, label=f"{k} (mean {v.mean():.2f})")
    ax1.axvline(long_n, color="C2", ls=":", lw=1, label=f"chosen length {long_n}")
    ax1.axvline(short_n, color="C3", ls=":", lw=1, label=f"rejected length {short_n}")
    ax1.set(
        title=f"length of sampled completions (T = 1, max 8 tokens; {len(seeds)} runs pooled)",
        xlabel="completion length (tokens)",
        ylabel="fraction",
    )
    ax1.legend(fontsize=8)
    names = list(lens)
    ax2.bar(
        range(len(names)),
        [lens[k].mean() for k in names],
        yerr=[2 * lens[k].std() / np.sqrt(len(lens[k])) for k in names],
        capsize=4,
        color=["C0", "C1", "C2", "C3"],
    )  # the histogram's colours
    ax2.set_xticks(range(len(names)), ["SFT init", "DPO", "SimPO", "R-DPO (alpha 0.5)"])
    ax2.set(title=f"mean completion length (+- 2 s.e.), {STEPS} steps each", ylabel="tokens")
    ctx.figure(fig, "dpo_length_bias")
