"""minhash-variance: the fraction of equal MinHash positions is an unbiased estimate of Jaccard, variance J(1-J)/K.

Formula: each of K independent permutations has Pr[min_A == min_B] = J, so X ~ Binomial(K, J) and
J_hat = X / K has E[J_hat] = J, Var[J_hat] = J (1 - J) / K (at J = 0.5: K = 64 -> +-6.3 %, 128 -> +-4.4 %,
256 -> +-3.1 %, 1024 -> +-1.6 %).

Experiment: two sets of shingle hashes with J = 0.5 exactly (|A & B| = 200, |A | B| = 400), signed by
posttrain's textbook K-permutation scheme (``perm_signatures``) under S different seeds; per K, a z-test of
the mean against J and a chi-square test of the variance against J(1-J)/K. The default one-permutation
scheme (``oph``) is measured too: the module claims variance *at most* J(1-J)/K (bins are sampled without
replacement), tested one-sided where each set has at least 2K shingles. Measured finding: for K close
to or above the set size most bins are empty and densification copies them, and the variance is then
*above* J(1-J)/K (K = 1024, 300 shingles: 1.2x), so that docstring bound needs |A| >> K. ``falsify`` checks against a wrong formula, J(1-J)/(4K).
"""

from __future__ import annotations

import numpy as np

from posttrain.data.dedup.minhash import estimate_jaccard, oph_signatures, perm_signatures
from posttrain.labs._common import ALPHA, memo, pyplot, variance_interval

NAME = "minhash-variance"
CLAIM = (
    "MinHash's estimate of Jaccard is unbiased, E[J_hat] = J, with variance J(1-J)/K: at J = 0.5 the s.d. is "
    "6.3 %, 4.4 %, 3.1 %, 1.6 % for K = 64, 128, 256, 1024."
)
FORMULA = "J_hat = X/K, X ~ Binomial(K, J): E = J, Var = J(1-J)/K"
NOTES = "notes 1 (MinHash + LSH), 'estimation precision': E[J_hat] = J (unbiased), Var[J_hat] = J(1-J)/K"

KS = (64, 128, 256, 1024)


SET_SIZE = 300  # shingles per document


def _pair(rng, inter: int = 200, only: int = 100):
    """Shingle hashes of A and B with |A & B| = inter, |A - B| = |B - A| = only: J = inter / (inter + 2 only)."""
    u = rng.choice(np.iinfo(np.int64).max, size=inter + 2 * only, replace=False).astype(np.uint64)
    a = np.concatenate([u[:inter], u[inter : inter + only]])
    b = np.concatenate([u[:inter], u[inter + only :]])
    return np.concatenate([a, b]), np.array([0, len(a), len(a) + len(b)])


def run(ctx) -> None:
    rng = np.random.default_rng(ctx.seed)
    hashes, offsets = _pair(rng)
    J = 200 / 400
    seeds = 60 if ctx.quick else 500
    tests = 2 * len(KS) + sum(K <= SET_SIZE // 2 for K in KS)
    alpha = ALPHA / tests
    rows = {}

    def estimates(K):
        est = {}
        for scheme, fn in (("perm", perm_signatures), ("oph", oph_signatures)):
            vals = np.empty(seeds)
            for s in range(seeds):
                sig = fn(hashes, offsets, num_perm=K, seed=ctx.seed * 100003 + s + 1)
                vals[s] = estimate_jaccard(sig[0], sig[1])
            est[scheme] = vals
        return est

    for K in KS:
        est = memo(ctx, f"K={K}", lambda: estimates(K))
        var_formula = J * (1 - J) / K / (4 if ctx.falsify else 1)
        x = est["perm"]
        rows[K] = {
            "mean_perm": x.mean(),
            "sd_perm": x.std(ddof=1),
            "sd_formula": np.sqrt(var_formula),
            "mean_oph": est["oph"].mean(),
            "sd_oph": est["oph"].std(ddof=1),
        }
        ctx.mean_check(f"K={K} perm mean", x, J, alpha)
        ctx.variance_check(f"K={K} perm variance", x, var_formula, alpha)
        lo, hi = variance_interval(seeds, 2 * alpha)  # one-sided upper bound at level alpha
        ratio = est["oph"].var(ddof=1) / var_formula
        rows[K]["oph_var_ratio"] = ratio
        if K <= SET_SIZE // 2:  # bins mostly filled; for K ~ |A| densification copies bins (see the docstring)
            ctx.check(
                f"K={K} oph variance <= J(1-J)/K",
                float(est["oph"].var(ddof=1)),
                float(var_formula),
                ratio <= hi,
                f"s^2/sigma^2 = {ratio:.3f} <= {hi:.3f} (one-sided chi-square, n={seeds}, "
                f"level {alpha:.2g}; only K <= |A|/2)",
            )
        rows[K]["_vals"] = est
    ctx.numbers.update(
        {"J": J, "seeds": seeds, "per_K": {K: {k: v for k, v in r.items() if k != "_vals"} for K, r in rows.items()}}
    )
    ctx.say("  K     mean(perm)  sd(perm)  sd formula  sd(oph)")
    for K, r in rows.items():
        ctx.say(
            f"  {K:<5} {r['mean_perm']:.4f}      {r['sd_perm']:.4f}    {r['sd_formula']:.4f}      {r['sd_oph']:.4f}"
        )

    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for K, r in rows.items():
        ax1.hist(r["_vals"]["perm"], bins=30, histtype="step", density=True, label=f"K={K}")
    ax1.axvline(J, color="k", ls="--", lw=1, label=f"true J = {J}")
    ax1.set(title=f"Estimated Jaccard over {seeds} seeds (perm scheme)", xlabel="J_hat", ylabel="density")
    ax1.legend()
    k = np.array(KS, float)
    kk = np.geomspace(k[0], k[-1], 100)
    ax2.plot(kk, np.sqrt(J * (1 - J) / kk), "k-", label="sqrt(J(1-J)/K)")
    ax2.plot(k, [rows[K]["sd_perm"] for K in KS], "o", label="measured, perm")
    ax2.plot(k, [rows[K]["sd_oph"] for K in KS], "s", mfc="none", label="measured, oph (default)")
    ax2.set(xscale="log", yscale="log", title="Standard deviation of J_hat", xlabel="K (num_perm)", ylabel="s.d.")
    ax2.legend()
    ctx.figure(fig, "minhash_variance")
