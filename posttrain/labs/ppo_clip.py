"""ppo-clip: PPO's pessimistic min() caps how far one batch can push the policy: the four cases of its gradient.

Formula: L = -min(r A, clip(r, 1 - eps, 1 + eps) A), r = pi / pi_old. Its gradient in r is -A where the
unclipped term is the min, else 0:
    A > 0, r > 1 + eps: 0 (already pushed up enough)     A > 0, r < 1 - eps: -A (keep raising a good action)
    A < 0, r < 1 - eps: 0 (already pushed down enough)   A < 0, r > 1 + eps: -A (keep lowering a bad action)
and inside [1 - eps, 1 + eps] it is -A. So the clip removes the incentive to move further only in the
direction the advantage asks for.

Experiment: (1) posttrain's ``clipped_objective`` on a grid of ratios for A = +1 and -1 (eps = 0.2),
gradient by autograd, against the table (exact; the kinks at 1 +- eps are left out); and the full
``policy_loss`` (per-token logps, token-mean) whose gradient in logp must be -r A / n where unclipped.
(2) Ratio drift over epochs: a softmax policy over 20 actions, a batch of 64 samples from pi_old with
normalised random advantages, 12 epochs of full-batch gradient descent (lr 2) on ``policy_loss`` with eps = 0.2 and
with no clip (``clip_eps_low=None``); over 40 seeds (quick: 12), the final max |r - 1| is smaller with the
clip in significantly many seeds (sign test, level 1e-3). ``falsify`` checks case (1) against the common
misreading "the gradient is 0 whenever r is outside [1 - eps, 1 + eps]".
"""

from __future__ import annotations

import numpy as np
import torch

from posttrain.labs._common import ALPHA, binom_two_sided_p, pyplot
from posttrain.losses.policy import clipped_objective, policy_loss

NAME = "ppo-clip"
CLAIM = (
    "PPO's clipped surrogate -min(r A, clip(r, 1-eps, 1+eps) A): for A > 0 the gradient vanishes once r > 1+eps "
    "(but not for r < 1-eps), for A < 0 once r < 1-eps (but not for r > 1+eps); over several epochs on one batch "
    "the clip keeps the ratio near 1, without it the ratio drifts."
)
FORMULA = "L = -min(r A, clip(r, 1-eps, 1+eps) A);  dL/dr = -A if the unclipped term is the min, else 0"
NOTES = "notes 8 (PPO): clip visualisation (A > 0 caps the rise, A < 0 does not spare bad actions), multi-epoch reuse"

EPS = 0.2
LR = 2.0


def _expected_grad(r: np.ndarray, A: float, falsify: bool) -> np.ndarray:
    inside = (r >= 1 - EPS) & (r <= 1 + EPS)
    if falsify:
        return np.where(inside, -A, 0.0)
    live = inside | ((r < 1 - EPS) if A > 0 else (r > 1 + EPS))
    return np.where(live, -A, 0.0)


def _drift(seed: int, clip: bool, epochs: int = 12):
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(20, generator=g, dtype=torch.float64)
    old = torch.log_softmax(theta, 0)
    a = torch.multinomial(old.exp(), 64, replacement=True, generator=g)
    adv = torch.randn(64, generator=g, dtype=torch.float64)
    adv = (adv - adv.mean()) / adv.std()
    p = theta.clone().requires_grad_(True)
    hist = []
    for _ in range(epochs):
        lp = torch.log_softmax(p, 0)[a][:, None]  # (64, 1): one token per sequence
        loss, _ = policy_loss(
            lp, old[a][:, None], adv, torch.ones_like(lp), clip_eps_low=EPS if clip else None, agg="token_mean"
        )
        (grad,) = torch.autograd.grad(loss, p)
        with torch.no_grad():
            p -= LR * grad  # plain gradient descent (torch.optim's first call costs seconds of imports)
            hist.append((torch.log_softmax(p, 0)[a] - old[a]).exp().sub(1).abs().max().item())
    return hist


def run(ctx) -> None:
    r = np.round(np.linspace(0.5, 1.5, 201), 6)
    keep = (np.abs(r - (1 - EPS)) > 1e-9) & (np.abs(r - (1 + EPS)) > 1e-9)
    curves = {}
    for A in (1.0, -1.0):
        ratio = torch.tensor(r, dtype=torch.float64, requires_grad=True)
        loss = -clipped_objective(ratio[None, :], torch.full((1, len(r)), A, dtype=torch.float64), EPS, EPS)
        (grad,) = torch.autograd.grad(loss.sum(), ratio)
        got, want = grad.numpy(), _expected_grad(r, A, ctx.falsify)
        curves[A] = (loss.detach().numpy()[0], got)
        bad = int((np.abs(got - want) > 1e-12)[keep].sum())
        ctx.check(
            f"A={A:+g}: dL/dr over r in [0.5, 1.5]",
            f"{bad} mismatches",
            "0 mismatches",
            bad == 0,
            f"exact, {int(keep.sum())} ratios (kinks at 1 +- eps left out)",
        )
    old = torch.zeros(4, 1, dtype=torch.float64)
    lp = torch.log(torch.tensor([[0.7], [1.1], [1.3], [1.3]], dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0], dtype=torch.float64)
    loss, _ = policy_loss(lp, old, adv, torch.ones_like(lp), clip_eps_low=EPS, agg="token_mean")
    (glp,) = torch.autograd.grad(loss, lp)
    rr = lp.detach().exp()[:, 0]
    want = torch.tensor([-(rr[0] * 1), -(rr[1] * 1), 0.0, rr[3]]) / 4
    err = (glp[:, 0] - want).abs().max().item()
    ctx.check(
        "policy_loss: d loss / d logp = -r A / n where unclipped, 0 where clipped",
        glp[:, 0].numpy().round(4),
        want.numpy().round(4),
        err <= 1e-12,
        "exact; r = 0.7 (A>0), 1.1 (A>0), 1.3 (A>0: clipped), 1.3 (A<0)",
    )

    seeds = 12 if ctx.quick else 40
    runs = {clip: [_drift(ctx.seed * 1000 + s, clip) for s in range(seeds)] for clip in (True, False)}
    final = {clip: np.array([h[-1] for h in hs]) for clip, hs in runs.items()}
    wins = int((final[True] < final[False]).sum())
    pv = binom_two_sided_p(wins, seeds, 0.5)
    ctx.check(
        "final max |r - 1|: clip < no clip",
        f"{wins}/{seeds} seeds",
        "significantly more than half",
        wins > seeds / 2 and pv < ALPHA,
        f"sign test p = {pv:.2g} < {ALPHA:g}",
    )
    ctx.numbers.update(
        {
            "eps": EPS,
            "drift_seeds": seeds,
            "final_max_abs_ratio_minus_1": {
                "clip": {"median": float(np.median(final[True])), "max": float(final[True].max())},
                "no_clip": {"median": float(np.median(final[False])), "max": float(final[False].max())},
            },
        }
    )
    ctx.say(
        f"  final max |r - 1| after 12 epochs: clip median {np.median(final[True]):.3f}, "
        f"no clip median {np.median(final[False]):.3f}"
    )

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for A, color in ((1.0, "C2"), (-1.0, "C3")):
        obj, grad = curves[A]
        axes[0].plot(r, -obj, color=color, label=f"min(rA, clip(r)A), A={A:+g}")
        axes[0].plot(r, r * A, color=color, ls=":", lw=1, label=f"r A (unclipped), A={A:+g}")
        axes[1].plot(r, grad, color=color, label=f"dL/dr, A={A:+g}")
    for ax in axes[:2]:
        for x in (1 - EPS, 1 + EPS):
            ax.axvline(x, color="gray", ls="--", lw=0.8)
        ax.set_xlabel("ratio r = pi / pi_old")
        ax.legend(fontsize=8)
    axes[0].set(title=f"clipped objective (eps = {EPS})", ylabel="objective")
    axes[1].set(title="gradient of the loss L = -objective", ylabel="dL/dr")
    for clip, color in ((True, "C0"), (False, "C1")):
        h = np.array(runs[clip])
        axes[2].plot(
            range(1, h.shape[1] + 1),
            np.median(h, 0),
            color=color,
            label=f"{'clip 0.2' if clip else 'no clip'} (median)",
        )
        axes[2].fill_between(range(1, h.shape[1] + 1), h.min(0), h.max(0), color=color, alpha=0.2)
    axes[2].axhline(EPS, color="gray", ls="--", lw=0.8)
    axes[2].set(
        yscale="log",
        title=f"ratio drift, one batch ({seeds} seeds; band: min-max)",
        xlabel="epoch",
        ylabel="max |r - 1| over the batch",
    )
    axes[2].legend()
    ctx.figure(fig, "ppo_clip")
