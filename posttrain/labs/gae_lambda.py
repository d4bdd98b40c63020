"""gae-lambda: GAE interpolates between one-step TD (lambda = 0: biased by the critic, low variance) and the
Monte Carlo return (lambda = 1: unbiased, high variance).

Formula: delta_t = r_t + gamma V(s_{t+1}) - V(s_t), A_t = sum_l (gamma lambda)^l delta_{t+l} = delta_t +
gamma lambda A_{t+1}; the value target is R_t = A_t + V(s_t). lambda = 0: R_t = r_t + gamma V(s_{t+1});
lambda = 1: R_t = sum_l gamma^l r_{t+l}. A sparse end-of-sequence reward R with V = 0 reaches token t as
A_t = (gamma lambda)^(L - 1 - t) R.

Experiment: a 3-state Markov chain over T = 10 tokens (random transitions, a reward table plus N(0, 0.5^2)
noise and an extra reward at the last token), its true values V*_t(s) by backward induction and the true
Q_t(s, s') = E[r_t | s, s'] + gamma V*_{t+1}(s'). GAE runs with a wrong critic V = V* + 1 through posttrain's
``gae_advantages`` for lambda in [0, 1] (gamma = 0.95); bias and variance of its returns R_t against Q_t.
Checked: exact identities at lambda = 0 and 1 and for the sparse reward (float64, 1e-10); lambda = 1 is
unbiased (z-test per token, Bonferroni); lambda = 0 is biased (z-test) and |bias| at lambda = 0 exceeds that at 1;
the variance at lambda = 1 exceeds that at lambda = 0 (paired bootstrap, lower 99.9 % bound of the ratio > 1).
``falsify`` computes Q with a wrong discount (0.9 gamma).
"""

from __future__ import annotations

import numpy as np
import torch

from posttrain.labs._common import ALPHA, pyplot, z_crit
from posttrain.losses.advantages import gae_advantages

NAME = "gae-lambda"
CLAIM = (
    "GAE with lambda = 0 is the one-step TD residual (low variance, biased by the critic) and with lambda = 1 "
    "the Monte Carlo return minus V (unbiased, high variance); lambda in between trades bias for variance; "
    "a sparse final reward reaches token t discounted by (gamma lambda)^(L-1-t)."
)
FORMULA = "A_t = delta_t + gamma*lambda*A_{t+1},  delta_t = r_t + gamma V(s_{t+1}) - V(s_t),  R_t = A_t + V(s_t)"
NOTES = "notes 7 (GAE): the two extremes lambda = 0 / lambda = 1 and the bias-variance trade-off"

S, T, GAMMA, NOISE = 3, 10, 0.95, 0.5
CRITIC_ERROR = 1.0  # V = V* + 1: an over-optimistic critic, the same error in every state
LAMBDAS = (0.0, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0)


def _chain(rng):
    P = torch.distributions.Dirichlet(torch.ones(S, S, dtype=torch.float64)).sample()
    R = torch.randn(S, S, generator=rng, dtype=torch.float64)
    eos = 2 * torch.randn(S, generator=rng, dtype=torch.float64)  # extra reward on the last token, by end state
    return P, R, eos


def _values(P, R, eos, gamma):
    """V*_t(s) for t = 0..T (V*_T = 0) and Q_t(s, s') for t < T."""
    V = torch.zeros(T + 1, S, dtype=torch.float64)
    Q = torch.zeros(T, S, S, dtype=torch.float64)
    for t in reversed(range(T)):
        Q[t] = R + (eos[None, :] if t == T - 1 else 0) + gamma * V[t + 1][None, :]
        V[t] = (P * Q[t]).sum(1)
    return V, Q


def run(ctx) -> None:
    torch.manual_seed(ctx.seed)
    rng = torch.Generator().manual_seed(ctx.seed)
    B = 2000 if ctx.quick else 20000
    P, R, eos = _chain(rng)
    V, Q = _values(P, R, eos, GAMMA)
    _, Qtrue = _values(P, R, eos, 0.9 * GAMMA) if ctx.falsify else (V, Q)
    s = torch.zeros(B, T + 1, dtype=torch.long)
    for t in range(T):
        s[:, t + 1] = torch.multinomial(P[s[:, t]], 1, generator=rng).squeeze(1)
    tt = torch.arange(T)
    rewards = R[s[:, :-1], s[:, 1:]] + NOISE * torch.randn(B, T, generator=rng, dtype=torch.float64)
    rewards[:, -1] += eos[s[:, -1]]
    critic = V[tt, s[:, :-1]] + CRITIC_ERROR  # (B, T): an over-optimistic critic
    mask = torch.ones(B, T, dtype=torch.float64)
    target = Qtrue[tt, s[:, :-1], s[:, 1:]]  # (B, T)
    err, out = {}, {}
    for lam in LAMBDAS:
        adv, ret = gae_advantages(rewards, critic, mask, gamma=GAMMA, lam=lam)
        out[lam] = (adv, ret)
        err[lam] = (ret - target).numpy()  # (B, T)
    next_v = torch.cat([critic[:, 1:], torch.zeros(B, 1, dtype=torch.float64)], 1)
    td = rewards + GAMMA * next_v
    disc = GAMMA ** (tt[None, :] - tt[:, None]).clamp(min=0).double() * (tt[None, :] >= tt[:, None])
    mc = rewards @ disc.T
    e0 = (out[0.0][1] - td).abs().max().item()
    e1 = (out[1.0][1] - mc).abs().max().item()
    ctx.check("lambda=0: R_t = r_t + gamma V(s_t+1) (one-step TD)", e0, "<= 1e-10", e0 <= 1e-10, "float64, exact")
    ctx.check("lambda=1: R_t = sum_l gamma^l r_t+l (Monte Carlo)", e1, "<= 1e-10", e1 <= 1e-10, "float64, exact")
    L = torch.tensor([3, 6, 10])  # ragged lengths, reward 1 on the last real token, V = 0
    m = (tt[None, :] < L[:, None]).double()
    sparse = torch.zeros(3, T, dtype=torch.float64)
    sparse[torch.arange(3), L - 1] = 1.0
    worst = 0.0
    for gamma, lam in ((1.0, 0.95), (0.9, 1.0), (0.9, 0.5)):
        a, _ = gae_advantages(sparse, torch.zeros_like(sparse), m, gamma=gamma, lam=lam)
        want = (gamma * lam) ** (L[:, None] - 1 - tt[None, :]).clamp(min=0).double() * m
        worst = max(worst, (a - want).abs().max().item())
    ctx.check(
        "sparse EOS reward: A_t = (gamma lambda)^(L-1-t)",
        worst,
        "<= 1e-10",
        worst <= 1e-10,
        "3 (gamma, lambda) pairs, ragged lengths 3/6/10",
    )
    alpha = ALPHA / (T + 3)
    z = z_crit(alpha)
    zs1 = np.abs(err[1.0].mean(0)) / (err[1.0].std(0, ddof=1) / np.sqrt(B))
    ctx.check(
        "lambda=1 returns unbiased for Q_t",
        float(np.abs(err[1.0].mean(0)).max()),
        0.0,
        bool((zs1 <= z).all()),
        f"max |z| over {T} tokens = {zs1.max():.2f} <= {z:.2f} (level {alpha:.2g} each)",
    )
    b0 = err[0.0].mean()
    per_ep0, per_ep1 = err[0.0].mean(1), err[1.0].mean(1)  # one number per episode (independent)
    z0 = abs(per_ep0.mean()) / (per_ep0.std(ddof=1) / np.sqrt(B))
    ctx.check(
        "lambda=0 returns biased (critic V = V* + 1)",
        float(b0),
        "!= 0, |bias| > lambda=1's",
        bool(z0 > z and abs(per_ep0.mean()) > abs(per_ep1.mean())),
        f"z = {z0:.1f} > {z:.2f}",
    )
    v = {lam: float(e.var(0, ddof=1).mean()) for lam, e in err.items()}
    idx = np.random.default_rng(ctx.seed).integers(0, B, size=(400, B))
    ratios = np.array([err[1.0][i].var(0).mean() / err[0.0][i].var(0).mean() for i in idx])
    low = float(np.quantile(ratios, 1e-3))
    ctx.check(
        "variance(lambda=1) > variance(lambda=0)",
        round(v[1.0] / v[0.0], 4),
        "> 1",
        low > 1,
        f"paired bootstrap (400 resamples), lower 99.9 % bound of the ratio = {low:.3f}",
    )
    bias = {lam: float(e.mean()) for lam, e in err.items()}
    ctx.numbers.update(
        {
            "episodes": B,
            "gamma": GAMMA,
            "bias": bias,
            "variance": v,
            "mse": {lam: bias[lam] ** 2 + v[lam] for lam in LAMBDAS},
        }
    )
    ctx.say("  lambda  bias of R_t   variance   (vs true Q_t; critic V* + 1)")
    for lam in LAMBDAS:
        ctx.say(f"  {lam:<6}  {bias[lam]:+.4f}      {v[lam]:.4f}")

    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.3))
    lams = np.array(LAMBDAS)
    ax1.plot(lams, [abs(bias[x]) for x in LAMBDAS], "o-", label="|bias| of R_t (mean over tokens)")
    ax1.plot(lams, [v[x] for x in LAMBDAS], "s-", label="variance of R_t - Q_t")
    ax1.set(
        title=f"GAE returns vs true Q on a Markov chain (critic V* + 1, gamma={GAMMA})", xlabel="lambda", ylabel="value"
    )
    ax1.title.set_fontsize(10)
    ax1.legend()
    Lx = 10
    for gamma, lam in ((1.0, 1.0), (1.0, 0.95), (0.9, 1.0), (0.9, 0.95), (0.9, 0.5)):
        ax2.plot(range(Lx), (gamma * lam) ** (Lx - 1 - np.arange(Lx)), "o-", ms=3, label=f"gamma={gamma}, lambda={lam}")
    ax2.set(
        title="sparse reward 1 on the last token (V = 0): advantage per token",
        xlabel="token t",
        ylabel="A_t = (gamma lambda)^(L-1-t)",
    )
    ax2.legend(fontsize=8)
    ctx.figure(fig, "gae_lambda")
