"""baseline-variance: a baseline that does not depend on the action leaves the policy gradient unbiased and
cuts its variance; one that depends on the action biases it.

Formula: grad J = E_a~pi[grad log pi(a) R(a)], and E[grad log pi(a) b] = b grad sum_a pi(a) = 0 for any b
independent of a. For a softmax policy pi = softmax(theta) over K arms, grad_theta log pi(a) = e_a - pi and
the exact gradient is grad J = pi * (rbar - <pi, rbar>). The variance-optimal constant baseline per
component is b*_k = E[(d_k log pi)^2 R] / E[(d_k log pi)^2].

Experiment: K = 6 arms, rewards rbar(a) + N(0, 0.3^2) with rbar in [5, 6] (a large offset, as with
unnormalised rewards), M groups of G = 4 samples; per group the estimate (1/G) sum_i (e_{a_i} - pi) A_i with
A from posttrain's ``reinforce_advantages`` (no baseline), ``grpo_advantages(scale_rewards="none")`` (group
mean), ``rloo_advantages`` and ``grpo_advantages`` (group z-score), and A = r - b* computed here. Checked:
no baseline, RLOO and b* have mean grad J (z-test per component, Bonferroni); the group mean includes r_i
itself, so its mean is exactly (1 - 1/G) grad J (tested against that); the action-dependent baseline
b(a) = rbar(a) (the arm's own mean reward) is biased: its mean is 0, not grad J (tested); RLOO and b* have a smaller total variance than
no baseline (paired bootstrap, upper 99.9 % bound of the ratio < 1). GRPO's division by the group std
makes it an estimator of a rescaled gradient; it is measured, not tested. ``falsify`` counts the
action-dependent baseline among the unbiased ones.
"""

from __future__ import annotations

import numpy as np
import torch

from posttrain.labs._common import ALPHA, pyplot, z_crit
from posttrain.losses.advantages import grpo_advantages, reinforce_advantages, rloo_advantages

NAME = "baseline-variance"
CLAIM = (
    "Subtracting a baseline b that does not depend on the action leaves the policy gradient unbiased, "
    "E[grad log pi * b] = b * grad sum pi = 0, but lowers its variance; a baseline that depends on the action "
    "biases it."
)
FORMULA = (
    "E[grad log pi(a) (R - b)] = grad J  iff  E[grad log pi(a) b] = 0;  b*_k = E[(d_k log pi)^2 R] / E[(d_k log pi)^2]"
)
NOTES = "notes 6 (REINFORCE / policy gradient): proof that a baseline does not change the expectation; optimal baseline"

K_ARMS, G, NOISE = 6, 4, 0.3


def run(ctx) -> None:
    rng = torch.Generator().manual_seed(ctx.seed)
    M = 4000 if ctx.quick else 40000
    theta = torch.randn(K_ARMS, generator=rng, dtype=torch.float64)
    pi = torch.softmax(theta, 0)
    rbar = 5 + torch.rand(K_ARMS, generator=rng, dtype=torch.float64)
    exact = pi * (rbar - (pi * rbar).sum())
    score = torch.eye(K_ARMS, dtype=torch.float64) - pi  # row a: grad log pi(a)
    w = pi[:, None] * score**2  # (a, k)
    b_star = (w * rbar[:, None]).sum(0) / w.sum(0)  # (k,)

    a = torch.multinomial(pi, M * G, replacement=True, generator=rng)  # prompt-major: groups of G
    r = rbar[a] + NOISE * torch.randn(M * G, generator=rng, dtype=torch.float64)
    sc = score[a]  # (M*G, K)
    adv = {
        "none": reinforce_advantages(r, G, baseline="none")[0],
        "group mean": grpo_advantages(r, G, scale_rewards="none")[0],
        "rloo": rloo_advantages(r, G)[0],
        "grpo (z-score)": grpo_advantages(r, G, scale_rewards="group")[0],
        "action-dependent b(a)": r - rbar[a],
    }
    est = {n: (sc * A.double()[:, None]).view(M, G, K_ARMS).mean(1) for n, A in adv.items()}  # (M, K)
    est["optimal b*"] = (sc * (r[:, None] - b_star)).view(M, G, K_ARMS).mean(1)
    expect = {
        "none": exact,
        "rloo": exact,
        "optimal b*": exact,
        "group mean": (1 - 1 / G) * exact,
        "action-dependent b(a)": exact if ctx.falsify else 0 * exact,
    }
    alpha = ALPHA / (len(expect) * K_ARMS + 2)
    z = z_crit(alpha)
    for n, mu in expect.items():
        e = est[n]
        se = e.std(0) / np.sqrt(M)
        zs = ((e.mean(0) - mu) / se).abs()
        what = {"group mean": " = (1 - 1/G) grad J", "action-dependent b(a)": " = 0"}.get(n, " = grad J")
        if ctx.falsify and n == "action-dependent b(a)":
            what = " = grad J"
        ctx.check(
            f"{n}: mean{what}",
            e.mean(0).numpy().round(5),
            mu.numpy().round(5),
            bool((zs <= z).all()),
            f"max |z| over {K_ARMS} components = {zs.max().item():.2f} <= {z:.2f} (level {alpha:.2g} each)",
        )
    d = {n: ((e - e.mean(0)) ** 2).sum(1).numpy() for n, e in est.items()}  # per-group squared deviation
    var = {n: float(v.mean()) for n, v in d.items()}
    boot = np.random.default_rng(ctx.seed).integers(0, M, size=(500, M))
    for n in ("rloo", "optimal b*"):
        ratios = np.array([d[n][i].mean() / d["none"][i].mean() for i in boot])
        upper = float(np.quantile(ratios, 1 - 1e-3))
        ctx.check(
            f"{n}: total variance < no baseline",
            round(var[n] / var["none"], 5),
            "< 1",
            upper < 1,
            f"paired bootstrap (500 resamples), upper 99.9 % bound of the ratio = {upper:.4f}",
        )
    cos = {n: float(torch.nn.functional.cosine_similarity(e.mean(0), exact, dim=0)) for n, e in est.items()}
    ctx.numbers.update(
        {
            "groups": M,
            "G": G,
            "pi": pi,
            "rbar": rbar,
            "exact_grad": exact,
            "b_star": b_star,
            "mean_estimate": {n: e.mean(0) for n, e in est.items()},
            "total_variance": var,
            "cosine_to_exact": cos,
        }
    )
    ctx.say("  estimator               total variance   vs none   cos(mean, grad J)")
    for n in est:
        ctx.say(f"  {n:<22}  {var[n]:<15.5f}  {var[n] / var['none']:<8.4f}  {cos[n]:.4f}")

    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    names = list(est)
    width = 0.8 / (len(names) + 1)
    xs = np.arange(K_ARMS)
    ax1.bar(xs - 0.4, exact.numpy(), width, color="k", label="exact grad J", align="edge")
    for i, n in enumerate(names):
        e = est[n]
        ax1.bar(
            xs - 0.4 + (i + 1) * width,
            e.mean(0).numpy(),
            width,
            yerr=(2 * e.std(0) / np.sqrt(M)).numpy(),
            label=n,
            align="edge",
            capsize=1,
        )
    ax1.set(
        title=f"mean gradient estimate per arm ({M} groups of G={G}, +-2 s.e.)",
        xlabel="arm (component of theta)",
        ylabel="d J / d theta_k",
    )
    ax1.legend(fontsize=7)
    ax2.bar(range(len(names)), [var[n] for n in names], color=[f"C{i}" for i in range(len(names))])
    ax2.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
    ax2.set(yscale="log", title="total variance of one group's estimate (trace of covariance)", ylabel="variance")
    ctx.figure(fig, "baseline_variance")
