"""entropy-collapse: without an entropy bonus, policy-gradient RL collapses onto one answer per prompt.

Formula: L = -E[log pi(y) A] - c_ent H(pi), H = -sum_v p_v log p_v per token (posttrain: ``entropy_coef``).
With c_ent = 0, every update raises the probability of answers that happened to be sampled and rewarded,
a rich-get-richer dynamic: when several answers share the top reward the policy ends on one or two of
them; the bonus keeps probability spread over the equally good answers.

Experiment: a quick SFT init on 1-digit addition, then ``train_policy_gradient`` (GRPO, G = 8, 8 prompts per
step, lr 1e-2, 60 steps) with a reward under which any single-digit answer is right (ten answers share the
top reward, so collapse is about exploration, not correctness), entropy_coef 0 vs 1e-2 (the notes'
typical range 1e-3..1e-2). Per step: the trainer's logged token entropy, and the number of distinct answers
among each prompt's G samples (recorded from the reward calls). 2 independent runs (quick) or 4 (seeds
of the RL runs), 60 steps each. Checked (one-sided Stouffer tests combining each run's Welch z,
Bonferroni): with coefficient 0 the distinct answers per prompt fall (last 10 steps vs the first 5, over
prompt groups); with 1e-2 the last 10 steps keep more distinct answers than with 0; the mean entropy over
the last 10 steps is higher with the bonus (z over the steps, treated as independent, which they are not
quite). Collapse is a tendency, not a certainty: single runs differ (one seed still has 3.4 distinct
answers of 8 after 80 steps), which is why runs are combined. ``falsify`` asks for *fewer* distinct answers with the bonus.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from posttrain.labs import _train
from posttrain.labs._common import ALPHA, memo, pyplot, z_crit
from posttrain.labs._train import TASK, distinct_per_group, metrics, quiet, register_lab_rewards, sft_init
from posttrain.trainers.policy_gradient import PolicyGradientConfig, train_policy_gradient

NAME = "entropy-collapse"
CLAIM = (
    "Without entropy regularisation RL collapses onto one or two high-reward answers (mode collapse); an "
    "entropy bonus of ~1e-2 keeps the policy exploring."
)
FORMULA = "L = -E[log pi(y) A] - c_ent * H(pi),  H = -sum_v p_v log p_v (mean over tokens)"
NOTES = "notes 6 (policy gradient), 'what entropy regularisation does': c_ent = 0 -> mode collapse; 1e-3..1e-2 typical"

G, STEPS, COEFS = 8, 60, (0.0, 1e-2)


def _z(a, b) -> float:
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float((a.mean() - b.mean()) / np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b) + 1e-12))


def run(ctx) -> None:
    register_lab_rewards()
    seeds = [ctx.seed + i for i in range(2 if ctx.quick else 4)]
    init = sft_init(100, seed=ctx.seed)

    def measure():
        res = {c: {"distinct": [], "entropy": []} for c in COEFS}
        with tempfile.TemporaryDirectory() as tmp:
            for s in seeds:
                for c in COEFS:
                    _train.RECORDED.clear()
                    out = Path(tmp) / f"c{c}-s{s}"
                    quiet(
                        train_policy_gradient,
                        PolicyGradientConfig(
                            init=init,
                            out=str(out),
                            steps=STEPS,
                            prompts_per_step=8,
                            num_generations=G,
                            max_new_tokens=4,
                            lr=1e-2,
                            warmup_steps=0,
                            eval_every=0,
                            save_every=0,
                            progress=False,
                            task=TASK,
                            seed=s,
                            reward="lab_one_digit",
                            entropy_coef=c,
                            dynamic_sampling=False,
                        ),
                    )
                    rows = [r for r in metrics(out) if "entropy" in r]
                    res[c]["entropy"].append([r["entropy"] for r in rows])
                    res[c]["distinct"].append([distinct_per_group(x, G) for x in _train.RECORDED])
        return res

    res = memo(ctx, "runs", measure)
    alpha = ALPHA / 3
    zc = z_crit(2 * alpha)

    def runs_of(c, sl):  # per run: the distinct-answer counts of every prompt group in steps sl
        return [[g for step in run[sl] for g in step] for run in res[c]["distinct"]]

    def combined(name, a, b, expected, what):
        zs = [_z(x, y) for x, y in zip(a, b)]
        z = sum(zs) / np.sqrt(len(zs))
        return ctx.check(
            name,
            [[round(float(np.mean(x)), 3), round(float(np.mean(y)), 3)] for x, y in zip(a, b)],
            expected,
            z > zc,
            f"one-sided Stouffer z = {z:.2f} > {zc:.2f} over {len(zs)} runs "
            f"(per-run z: {', '.join(f'{v:.1f}' for v in zs)}; {what})",
        )

    first, last = {c: runs_of(c, slice(0, 5)) for c in COEFS}, {c: runs_of(c, slice(-10, None)) for c in COEFS}
    combined(
        "coef 0: distinct answers per prompt fall",
        first[0.0],
        last[0.0],
        "per run [first 5, last 10]: first > last",
        "Welch z over prompt groups",
    )
    a, b = (last[0.0], last[1e-2]) if ctx.falsify else (last[1e-2], last[0.0])
    combined(
        "coef 1e-2 keeps more distinct answers than coef 0",
        a,
        b,
        "per run [coef 1e-2, coef 0]: " + ("1e-2 < 0" if ctx.falsify else "1e-2 > 0"),
        "last 10 steps, over prompt groups",
    )
    ent = {c: [run[-10:] for run in res[c]["entropy"]] for c in COEFS}
    combined(
        "coef 1e-2: higher token entropy than coef 0",
        ent[1e-2],
        ent[0.0],
        "per run [coef 1e-2, coef 0]: 1e-2 > 0",
        "Welch z over the last 10 steps of each run, steps treated as independent",
    )
    first = {c: [g for x in first[c] for g in x] for c in COEFS}
    last = {c: [g for x in last[c] for g in x] for c in COEFS}
    ent_last = {c: [e for x in ent[c] for e in x] for c in COEFS}
    ctx.numbers.update(
        {
            "seeds": seeds,
            "steps": STEPS,
            "G": G,
            "lr": 1e-2,
            "distinct_first5": {str(c): float(np.mean(first[c])) for c in COEFS},
            "distinct_last10": {str(c): float(np.mean(last[c])) for c in COEFS},
            "entropy_start": {str(c): float(np.mean([r[0] for r in res[c]["entropy"]])) for c in COEFS},
            "entropy_last10": {str(c): float(np.mean(ent_last[c])) for c in COEFS},
        }
    )
    for c in COEFS:
        ctx.say(
            f"  entropy_coef {c:g}: distinct answers / prompt {np.mean(first[c]):.2f} -> {np.mean(last[c]):.2f}, "
            f"entropy {ctx.numbers['entropy_start'][str(c)]:.3f} -> {np.mean(ent_last[c]):.3f}"
        )

    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    for c, color in zip(COEFS, ("C3", "C0")):
        ent = np.array(res[c]["entropy"])
        dist = np.array([[np.mean(step) for step in run] for run in res[c]["distinct"]])
        label = f"entropy_coef = {c:g}"
        ax1.plot(range(1, ent.shape[1] + 1), ent.mean(0), color=color, label=label)
        ax2.plot(range(1, dist.shape[1] + 1), dist.mean(0), color=color, label=label)
    ax1.set(
        title=f"mean token entropy of the samples (GRPO, {len(seeds)} seed(s))", xlabel="step", ylabel="entropy (nats)"
    )
    ax2.set(title=f"distinct answers among each prompt's G = {G} samples", xlabel="step", ylabel="distinct answers")
    for ax in (ax1, ax2):
        ax.legend()
    ctx.figure(fig, "entropy_collapse")
