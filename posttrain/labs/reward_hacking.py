"""reward-hacking: RL against an imperfect reward finds its flaw; a KL penalty to the reference holds it back.

Formula: the RLHF objective max E[r(x, y)] - beta KL(pi || pi_ref), here as the notes write it for PPO,
folded into the reward: r'(x, y) = r(x, y) - beta sum_t (log pi(y_t) - log pi_ref(y_t)) (posttrain:
``beta``, ``kl_in="reward"``). With beta = 0 nothing ties the policy to the reference, so any flaw of r
that is cheaper to exploit than the task is exploited.

Experiment: a quick SFT init on 1-digit addition (answers of 1-2 digits), then ``train_policy_gradient``
(GRPO, 8 prompts x G = 8, lr 3e-3, 40 steps, up to 6 tokens) against a flawed reward: exact match + 0.3
per character (a "reward model" that likes long answers: six wrong digits score 1.8, a right answer 1.3
at most). beta = 1e-6 ("no penalty": a non-zero beta makes the trainer build the reference model and
log the KL; 1e-6 changes no update measurably) against beta = 0.5. Per sample (from the reward calls):
the flawed reward and the verifier's exact match; per step: the trainer's KL estimate. Checked (z-tests,
Bonferroni): without the penalty the flawed reward rises and the verifier accuracy falls (last 10 steps
vs first 5, over samples); the KL of the last 10 steps is larger without the penalty (Welch z over steps,
treated as independent); with the penalty the last 10 steps' accuracy is higher. ``falsify`` asks for a
*smaller* KL without the penalty.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from posttrain.labs import _train
from posttrain.labs._common import ALPHA, memo, pyplot, z_crit
from posttrain.labs._train import TASK, metrics, quiet, register_lab_rewards, sft_init
from posttrain.trainers.policy_gradient import PolicyGradientConfig, train_policy_gradient

NAME = "reward-hacking"
CLAIM = (
    "A reward model is an imperfect proxy: without a KL penalty the policy games it (here: long answers), so the "
    "reward rises while the verifier's accuracy falls and the KL to the reference grows; the KL penalty "
    "(beta > 0) keeps the policy near the reference and the hack away."
)
FORMULA = "r' = r - beta * KL(pi || pi_ref) per sequence (kl_in = reward);  flawed r = exact_match + 0.3 * len(y)"
NOTES = "notes 5 (reward model: reward hacking, length cheating) and 8 (PPO: the KL term prevents reward hacking)"

BETAS = (1e-6, 0.5)
STEPS = 40


def _z(a, b) -> float:
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float((a.mean() - b.mean()) / np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b) + 1e-12))


def run(ctx) -> None:
    register_lab_rewards()
    init = sft_init(100, seed=ctx.seed)

    def measure():
        res = {}
        with tempfile.TemporaryDirectory() as tmp:
            for beta in BETAS:
                _train.RECORDED.clear()
                out = Path(tmp) / f"b{beta}"
                quiet(
                    train_policy_gradient,
                    PolicyGradientConfig(
                        init=init,
                        out=str(out),
                        steps=STEPS,
                        prompts_per_step=8,
                        num_generations=8,
                        max_new_tokens=6,
                        lr=3e-3,
                        warmup_steps=0,
                        eval_every=0,
                        save_every=0,
                        progress=False,
                        task=TASK,
                        seed=ctx.seed,
                        reward="lab_long_answer",
                        beta=beta,
                        kl_in="reward",
                        dynamic_sampling=False,
                    ),
                )
                steps = [[(0.3 * len(c.strip()) + e, e, len(c.strip())) for c, e in batch] for batch in _train.RECORDED]
                rows = [r for r in metrics(out) if "kl" in r]
                res[beta] = {"samples": np.array(steps), "kl": np.array([r["kl"] for r in rows])}  # (steps, N, 3)
        return res

    res = memo(ctx, "runs", measure)
    alpha = ALPHA / 4
    zc = z_crit(2 * alpha)
    free, held = res[BETAS[0]], res[BETAS[1]]

    def part(r, sl, k):
        return r["samples"][sl, :, k].reshape(-1)

    z = _z(part(free, slice(-10, None), 0), part(free, slice(0, 5), 0))
    ctx.check(
        "beta ~ 0: flawed reward rises",
        [round(part(free, slice(0, 5), 0).mean(), 3), round(part(free, slice(-10, None), 0).mean(), 3)],
        "last 10 steps > first 5",
        z > zc,
        f"one-sided z = {z:.2f} > {zc:.2f} over samples",
    )
    z = _z(part(free, slice(0, 5), 1), part(free, slice(-10, None), 1))
    ctx.check(
        "beta ~ 0: verifier accuracy falls",
        [round(part(free, slice(0, 5), 1).mean(), 3), round(part(free, slice(-10, None), 1).mean(), 3)],
        "last 10 steps < first 5",
        z > zc,
        f"one-sided z = {z:.2f} > {zc:.2f} over samples",
    )
    sign = -1 if ctx.falsify else 1
    z = sign * _z(free["kl"][-10:], held["kl"][-10:])
    ctx.check(
        "KL(pi || ref), last 10 steps: beta ~ 0 > beta 0.5",
        [round(free["kl"][-10:].mean(), 4), round(held["kl"][-10:].mean(), 4)],
        "beta~0 < beta 0.5" if ctx.falsify else "beta~0 > beta 0.5",
        z > zc,
        f"one-sided Welch z = {z:.2f} > {zc:.2f} over steps",
    )
    z = _z(part(held, slice(-10, None), 1), part(free, slice(-10, None), 1))
    ctx.check(
        "beta 0.5 keeps a higher verifier accuracy",
        [round(part(held, slice(-10, None), 1).mean(), 3), round(part(free, slice(-10, None), 1).mean(), 3)],
        "beta 0.5 > beta~0 (last 10 steps)",
        z > zc,
        f"one-sided z = {z:.2f} > {zc:.2f} over samples",
    )
    ctx.numbers.update(
        {
            "steps": STEPS,
            "betas": list(BETAS),
            "per_beta": {
                str(b): {
                    "reward_first5": float(part(r, slice(0, 5), 0).mean()),
                    "reward_last10": float(part(r, slice(-10, None), 0).mean()),
                    "accuracy_first5": float(part(r, slice(0, 5), 1).mean()),
                    "accuracy_last10": float(part(r, slice(-10, None), 1).mean()),
                    "length_last10": float(part(r, slice(-10, None), 2).mean()),
                    "kl_last10": float(r["kl"][-10:].mean()),
                }
                for b, r in res.items()
            },
        }
    )
    for b, v in ctx.numbers["per_beta"].items():
        ctx.say(
            f"  beta {b}: reward {v['reward_first5']:.2f} -> {v['reward_last10']:.2f}, accuracy {v['accuracy_first5']:.2f} -> "
            f"{v['accuracy_last10']:.2f}, length {v['length_last10']:.1f}, KL {v['kl_last10']:.3f}"
        )

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for b, color in zip(BETAS, ("C3", "C0")):
        r = res[b]
        label = "beta = 0 (1e-6)" if b < 1e-3 else f"beta = {b}"
        x = np.arange(1, r["samples"].shape[0] + 1)
        axes[0].plot(x, r["samples"][:, :, 0].mean(1), color=color, label=label)
        axes[1].plot(x, r["samples"][:, :, 1].mean(1), color=color, label=label)
        axes[2].plot(np.arange(1, len(r["kl"]) + 1), r["kl"], color=color, label=label)
    axes[0].set(title="flawed reward (exact match + 0.3/char)", xlabel="step", ylabel="mean reward of the samples")
    axes[1].set(title="verifier accuracy of the samples", xlabel="step", ylabel="exact match")
    axes[2].set(title="KL(pi || pi_ref) per token (trainer's k3)", xlabel="step", ylabel="KL (nats)")
    for ax in axes:
        ax.legend()
    ctx.figure(fig, "reward_hacking")
