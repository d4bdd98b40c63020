"""softmax-sqrt-d: dividing the logits by sqrt(D) keeps their variance at 1, so the softmax does not saturate.

Formula: for q, k with i.i.d. unit-variance entries, Var(q . k) = sum_d Var(q_d k_d) = D. Without scaling the
logits' spread grows like sqrt(D), the softmax puts almost all its mass on one key, and its Jacobian
J = diag(s) - s s^T (whose vector-Jacobian product is s * (g - <g, s>)) goes to 0: vanishing gradients.
With 1/sqrt(D), Var(q . k / sqrt(D)) = 1 for every D.

Experiment: for D = 16 ... 1024, n query rows against N = 64 keys, logits through posttrain's
``ops.softmax.softmax`` and gradients through its hand-derived ``softmax_backward``: (1) per D, a
variance test (normal approximation with the known excess kurtosis 6/D of q.k) that Var(q.k) = D (unscaled) and Var(q.k/sqrt(D)) = 1 (scaled) on independent (q, k) pairs;
(2) the norm of the softmax VJP for random unit upstream gradients g: unscaled, its mean at the largest D
is below that at the smallest D (z-test, one-sided; the ratio is reported); scaled, it stays within a factor 1.5 between all D (an effect-size statement: the
distribution of |q|/sqrt(D) still depends on D a little). ``falsify`` scales by 1/D instead.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from posttrain.labs._common import ALPHA, pyplot, z_crit
from posttrain.ops.softmax import softmax, softmax_backward

NAME = "softmax-sqrt-d"
CLAIM = (
    "The dot product of two D-dimensional unit-variance vectors has variance D, which saturates the softmax "
    "and makes its gradient vanish; dividing by sqrt(D) keeps the logit variance at 1 (and the gradient alive)."
)
FORMULA = "Var(q.k) = D;  Var(q.k / sqrt(D)) = 1;  softmax VJP: dx = s * (g - <g, s>)"
NOTES = (
    "notes 3 (Attention), Q&A 'why divide by sqrt(D)?': dot-product variance = D -> saturation -> vanishing gradient"
)

DS = (16, 32, 64, 128, 256, 512, 1024)
N_KEYS = 32


def run(ctx) -> None:
    g = torch.Generator().manual_seed(ctx.seed)
    n = 200 if ctx.quick else 1000
    alpha = ALPHA / (2 * len(DS) + 1)
    stats = {}
    for D in DS:
        q = torch.randn(n, 1, D, generator=g, dtype=torch.float64)
        k = torch.randn(n, N_KEYS, D, generator=g, dtype=torch.float64)
        raw = (q @ k.transpose(1, 2)).squeeze(1)  # (n, N)
        scale = 1.0 / D if ctx.falsify else 1.0 / math.sqrt(D)
        up = torch.randn(n, N_KEYS, generator=g, dtype=torch.float64)
        up = up / up.norm(dim=-1, keepdim=True)
        row = {}
        for tag, logits in (("unscaled", raw), ("scaled", raw * scale)):
            s = softmax(logits)
            grad = softmax_backward(up, s).norm(dim=-1)  # (n,)
            row[tag] = {
                "var": logits[:, 0].var().item(),
                "max_prob": s.max(-1).values.mean().item(),
                "grad": grad.mean().item(),
                "grad_se": (grad.std() / math.sqrt(n)).item(),
            }
        stats[D] = row
        # one logit per row: independent (q, k) pairs; q.k is a sum of D products of excess kurtosis 6 -> 6/D
        ctx.variance_check(f"D={D} Var(q.k) = D", raw[:, 0].numpy(), D, alpha, kurtosis=6 / D)
        ctx.variance_check(f"D={D} Var(q.k scaled) = 1", (raw[:, 0] * scale).numpy(), 1.0, alpha, kurtosis=6 / D)
    lo, hi = stats[DS[0]]["unscaled"], stats[DS[-1]]["unscaled"]
    z = z_crit(2 * alpha)
    zd = (lo["grad"] - hi["grad"]) / math.hypot(lo["grad_se"], hi["grad_se"])
    ctx.check(
        f"unscaled: softmax gradient norm falls from D={DS[0]} to D={DS[-1]}",
        [lo["grad"], hi["grad"]],
        f"D={DS[-1]} < D={DS[0]}",
        zd > z,
        f"one-sided z = {zd:.1f} > {z:.2f}; ratio {lo['grad'] / hi['grad']:.1f}x",
    )
    sc = [stats[D]["scaled"]["grad"] for D in DS]
    ctx.check(
        "scaled: softmax gradient norm stable over D",
        [min(sc), max(sc)],
        "max/min <= 1.5",
        max(sc) / min(sc) <= 1.5,
        f"effect size: max/min = {max(sc) / min(sc):.2f}",
    )
    ctx.numbers.update({"rows": n, "keys": N_KEYS, "per_D": stats})
    ctx.say("  D      var unscaled  var scaled  max prob (unscaled / scaled)  |grad| (unscaled / scaled)")
    for D, r in stats.items():
        ctx.say(
            f"  {D:<6} {r['unscaled']['var']:<12.1f}  {r['scaled']['var']:<10.3f}  "
            f"{r['unscaled']['max_prob']:.3f} / {r['scaled']['max_prob']:.3f}                 "
            f"{r['unscaled']['grad']:.4f} / {r['scaled']['grad']:.4f}"
        )

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    d = np.array(DS, float)
    for tag, style in (("unscaled", "o-"), ("scaled", "s-")):
        axes[0].plot(
            d, [stats[D][tag]["var"] for D in DS], style, label=f"{tag} (q.k{'' if tag == 'unscaled' else '/sqrt(D)'})"
        )
        axes[1].plot(d, [stats[D][tag]["max_prob"] for D in DS], style, label=tag)
        axes[2].errorbar(
            d,
            [stats[D][tag]["grad"] for D in DS],
            yerr=[2 * stats[D][tag]["grad_se"] for D in DS],
            fmt=style,
            capsize=3,
            label=tag,
        )
    axes[0].plot(d, d, "k:", lw=1, label="D")
    axes[0].set(xscale="log", yscale="log", title="logit variance", xlabel="head dimension D", ylabel="Var(logit)")
    axes[1].set(
        xscale="log", title=f"mean max softmax prob ({N_KEYS} keys)", xlabel="head dimension D", ylabel="max_j s_j"
    )
    axes[2].set(
        xscale="log",
        title="softmax gradient norm |s*(g - <g,s>)|, |g| = 1",
        xlabel="head dimension D",
        ylabel="mean norm (+- 2 s.e.)",
    )
    for ax in axes:
        ax.legend()
    ctx.figure(fig, "softmax_sqrt_d")
