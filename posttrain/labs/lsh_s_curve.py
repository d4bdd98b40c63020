"""lsh-s-curve: LSH banding makes a pair a candidate with probability 1 - (1 - J^r)^b, an S-curve in J.

Formula: a band of r rows matches with probability J^r (each row matches with probability J); with b
independent bands, Pr[candidate] = 1 - (1 - J^r)^b. The curve's steep part sits near tau = (1/b)^(1/r),
where Pr = 1 - (1 - 1/b)^b ~ 1 - 1/e ~ 0.63 (the notes' "tau ~ (1/b)^(1/r), the point near P = 0.5").

Experiment: for each J on a grid (and at each tau), n pairs of shingle sets with exactly that Jaccard, signed
with posttrain's default MinHash (``oph``, K = 256) and bucketed by posttrain's LSH (``band_keys``,
``candidate_pairs``) with (b, r) = (20, 5), (50, 4), (25, 10) and the optimiser's choice for the dedup
defaults (``plan_bands(0.8, 128, fn_weight=0.99)``, rows from the first b*r positions). Each empirical
candidate rate is compared to the S-curve by an exact two-sided binomial test (Bonferroni over all points).
``falsify`` swaps b and r in the formula.
"""

from __future__ import annotations

import numpy as np

from posttrain.data.dedup.lsh import band_keys, candidate_pairs, plan_bands, s_curve
from posttrain.data.dedup.minhash import oph_signatures
from posttrain.labs._common import ALPHA, binom_two_sided_p, pyplot

NAME = "lsh-s-curve"
CLAIM = (
    "LSH with b bands of r rows makes a pair of Jaccard J a candidate with probability 1 - (1 - J^r)^b "
    "(notes' table: (20,5): 0.47 at J=0.5; (50,4): 0.95; (25,10): 0.82 at J=0.8), with the threshold "
    "near (1/b)^(1/r)."
)
FORMULA = "P(candidate) = 1 - (1 - J^r)^b;  tau = (1/b)^(1/r), P(tau) = 1 - (1 - 1/b)^b"
NOTES = "notes 1 (MinHash + LSH), 'LSH banding': S-curve table and the empirical threshold tau ~ (1/b)^(1/r)"

UNION = 600  # shingles in A | B
K = 256


def _pairs(rng, j: float, n: int):
    """n disjoint pairs of hash sets with |A & B| / |A | B| = round(j U) / U exactly."""
    inter = int(round(j * UNION))
    only = (UNION - inter) // 2
    union = inter + 2 * only
    hs = []
    u = rng.choice(np.iinfo(np.int64).max, size=(n, union), replace=True).astype(np.uint64)  # collisions ~ 1e-13
    for row in u:
        hs += [row[: inter + only], np.concatenate([row[:inter], row[inter + only :]])]
    return hs, inter / union


def run(ctx) -> None:
    rng = np.random.default_rng(ctx.seed)
    n = 100 if ctx.quick else 400
    auto = plan_bands(0.8, 128, fn_weight=0.99)
    plans = [(20, 5), (50, 4), (25, 10), (auto.bands, auto.rows)]
    grid = sorted(
        set(np.round(np.arange(0.1, 0.96, 0.1 if ctx.quick else 0.05), 3))
        | {round((1 / b) ** (1 / r), 3) for b, r in plans}
    )
    hashes, js = [], []
    for j in grid:
        h, jj = _pairs(rng, j, n)
        hashes += h
        js.append(jj)
    offsets = np.concatenate([[0], np.cumsum([len(h) for h in hashes])])
    sig = oph_signatures(np.concatenate(hashes), offsets, num_perm=K, seed=ctx.seed + 1)
    n_docs = len(hashes)
    alpha = ALPHA / (len(plans) * len(grid))
    curves = {}
    for b, r in plans:
        keys = band_keys(sig[:, : b * r], b, r, seed=ctx.seed)
        cand = candidate_pairs(keys, max_bucket=10**9)
        code = set((cand[:, 0] * n_docs + cand[:, 1]).tolist())
        rates, worst = [], 1.0
        for g, j in enumerate(js):
            first = 2 * n * g + 2 * np.arange(n)
            k = sum(int(i * n_docs + i + 1 in code) for i in first)
            p = float(s_curve(j, r, b) if ctx.falsify else s_curve(j, b, r))
            pv = binom_two_sided_p(k, n, p)
            worst = min(worst, pv)
            rates.append(k / n)
            if pv < alpha:
                ctx.say(f"    ({b},{r}) J={j:.3f}: {k}/{n} candidates, formula {p:.3f}, p-value {pv:.2g}")
        tau = (1 / b) ** (1 / r)
        j50 = (1 - 0.5 ** (1 / b)) ** (1 / r)
        curves[(b, r)] = rates
        ctx.check(
            f"({b},{r}) candidate rate = S-curve at {len(js)} J values",
            round(worst, 6),
            f">= {alpha:.2g}",
            worst >= alpha,
            f"smallest exact binomial p-value over the J grid, n={n} pairs per J, Bonferroni level {ALPHA:g}",
        )
        ctx.numbers[f"({b},{r})"] = {
            "tau": tau,
            "J_at_P_half": j50,
            "P_at_tau": 1 - (1 - 1 / b) ** b,
            "rates": dict(zip([f"{j:.3f}" for j in js], rates)),
        }
        ctx.say(
            f"  ({b},{r}): tau = (1/b)^(1/r) = {tau:.3f}; P(tau) = {1 - (1 - 1 / b) ** b:.3f}; P = 0.5 at J = {j50:.3f}"
        )
    ctx.numbers.update({"pairs_per_J": n, "num_perm": K, "scheme": "oph", "auto_plan": [auto.bands, auto.rows]})

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    jj = np.linspace(0, 1, 300)
    for (b, r), color in zip(plans, ("C0", "C1", "C2", "C3")):
        label = f"b={b}, r={r}" + (" (optimiser, t=0.8)" if (b, r) == plans[-1] else "")
        ax.plot(jj, s_curve(jj, b, r), color=color, lw=1.5, label=label)
        ax.plot(js, curves[(b, r)], "o", color=color, ms=3.5)
        ax.axvline((1 / b) ** (1 / r), color=color, ls=":", lw=1)
    ax.set(
        title=f"LSH S-curves: formula (lines), measured candidate rate (dots, {n} pairs each); dotted: (1/b)^(1/r)",
        xlabel="Jaccard J of the pair",
        ylabel="P(candidate pair)",
    )
    ax.title.set_fontsize(9)
    ax.legend(loc="lower right")
    ctx.figure(fig, "lsh_s_curve")
