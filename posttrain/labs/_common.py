"""What every lab shares: the run context, claim checks with statistical tolerances, figures, result.json.

A lab is a function ``run(ctx) -> None`` that measures something on posttrain's own code and records
``ctx.check(name, measured, expected, ok, tolerance)`` for each part of its claim; the lab agrees when
every check passes. Tolerances are statistical bounds at a stated level, never tuned to pass:

    mean:      |x_bar - mu| <= z_{1 - a/2} * s / sqrt(n)                      (z-test, CLT)
    variance:  s^2 / sigma^2 in [chi2_{a/2}(n-1), chi2_{1-a/2}(n-1)] / (n-1)   (chi-square, normal data)
    rate:      |k/n - p| <= z_{1 - a/2} * sqrt(p (1 - p) / n)                 (binomial, normal approx.)

with the family-wise level ``ALPHA`` split over a lab's checks (Bonferroni: a = ALPHA / number of tests).
Chi-square quantiles come from the Wilson-Hilferty cube (relative error < 1e-3 for df >= 10), so no
scipy is needed. Checks that are exact identities use a float tolerance with an absolute floor.
"""

from __future__ import annotations

import base64
import io
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from posttrain.data.io import atomic_open, atomic_write_json

ALPHA = 1e-3  # family-wise error level of one lab's statistical checks


def z_crit(alpha: float) -> float:
    """Two-sided normal critical value: z with P(|Z| > z) = alpha."""
    return NormalDist().inv_cdf(1.0 - alpha / 2.0)


def chi2_quantile(p: float, df: int) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile."""
    z = NormalDist().inv_cdf(p)
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def variance_interval(n: int, alpha: float) -> tuple[float, float]:
    """Acceptance interval of s^2 / sigma^2 for n normal samples at two-sided level alpha."""
    return chi2_quantile(alpha / 2, n - 1) / (n - 1), chi2_quantile(1 - alpha / 2, n - 1) / (n - 1)


def bootstrap_ci(x: np.ndarray, stat=np.mean, level: float = 0.95, n_boot: int = 1000, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = np.asarray(x)
    idx = rng.integers(0, len(x), size=(n_boot, len(x)))
    vals = np.array([stat(x[i]) for i in idx])
    return float(np.quantile(vals, (1 - level) / 2)), float(np.quantile(vals, 1 - (1 - level) / 2))


@dataclass
class Check:
    name: str
    measured: object
    expected: object
    ok: bool
    tolerance: str

    def row(self) -> dict:
        return {
            "name": self.name,
            "measured": _jsonable(self.measured),
            "expected": _jsonable(self.expected),
            "ok": bool(self.ok),
            "tolerance": self.tolerance,
        }


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(f"{float(x):.6g}") if math.isfinite(float(x)) else str(float(x))
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.bool_,)):
        return bool(x)
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if hasattr(x, "tolist"):  # torch tensors
        return _jsonable(x.tolist())
    return x


@dataclass
class LabContext:
    name: str
    out: Path
    quick: bool = False
    seed: int = 0
    falsify: bool = False
    verbose: bool = True
    draw: bool = True  # False: figures are built but not rendered (the tests' falsified runs)
    device: Any = None  # the trainers' DeviceConfig (trainers/device_config.py); None: their defaults
    checks: list[Check] = field(default_factory=list)
    numbers: dict = field(default_factory=dict)
    figures: list[str] = field(default_factory=list)

    def say(self, line: str = "") -> None:
        if self.verbose:
            print(line, flush=True)

    def check(self, name: str, measured, expected, ok: bool, tolerance: str) -> bool:
        self.checks.append(Check(name, measured, expected, bool(ok), tolerance))
        self.say(
            f"  [{'ok' if ok else 'FAIL'}] {name}: measured {_short(measured)}, expected {_short(expected)} "
            f"({tolerance})"
        )
        return bool(ok)

    def mean_check(self, name: str, samples, mu: float, alpha: float, what: str = "") -> bool:
        """z-test of the sample mean against mu at two-sided level alpha."""
        x = np.asarray(samples, float)
        se = x.std(ddof=1) / math.sqrt(len(x))
        z = z_crit(alpha)
        dev = abs(x.mean() - mu)
        return self.check(
            name,
            float(x.mean()),
            float(mu),
            dev <= z * se + 1e-12,
            f"|mean - expected| <= {z:.2f} s.e. = {z * se:.3g} (z-test, level {alpha:.2g}{what})",
        )

    def variance_check(self, name: str, samples, sigma2: float, alpha: float, kurtosis: float | None = None) -> bool:
        """s^2 against sigma^2: chi-square interval for normal data; with the population's known excess
        ``kurtosis`` k, the large-sample interval 1 +- z sqrt(2/(n-1) + k/n) instead."""
        x = np.asarray(samples, float)
        n = len(x)
        if kurtosis is None:
            lo, hi = variance_interval(n, alpha)
            how = "chi-square"
        else:
            half = z_crit(alpha) * math.sqrt(2 / (n - 1) + kurtosis / n)
            lo, hi, how = 1 - half, 1 + half, f"normal approx., excess kurtosis {kurtosis:.3g}"
        ratio = x.var(ddof=1) / sigma2
        return self.check(
            name,
            float(x.var(ddof=1)),
            float(sigma2),
            lo <= ratio <= hi,
            f"s^2/sigma^2 = {ratio:.3f} in [{lo:.3f}, {hi:.3f}] ({how}, n={n}, level {alpha:.2g})",
        )

    def figure(self, fig, stem: str) -> Path:
        """Save a matplotlib figure as OUT/stem.png (atomically) and close it."""
        import matplotlib.pyplot as plt

        path = self.out / f"{stem}.png"
        if not self.draw:
            plt.close(fig)
            return path
        buf = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buf, format="png", dpi=90)
        plt.close(fig)
        from PIL import Image  # matplotlib's own dependency: a 256-colour palette PNG is ~3x smaller, looks the same

        small = io.BytesIO()
        Image.open(buf).convert("RGB").quantize(256).save(small, format="PNG", optimize=True)
        with atomic_open(path, "wb", encoding=None) as f:
            f.write(small.getvalue())
        self.figures.append(path.name)
        return path

    @property
    def agrees(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)


def _short(x) -> str:
    x = _jsonable(x)
    s = repr(x) if not isinstance(x, str) else x
    return s if len(s) <= 90 else s[:87] + "..."


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def write_result(ctx: LabContext, claim: str, formula: str, notes: str, seconds: float) -> dict:
    """OUT/result.json: claim, measured, tolerance, agrees, plus the lab's numbers."""
    result = {
        "lab": ctx.name,
        "claim": claim,
        "formula": formula,
        "notes": notes,
        "agrees": ctx.agrees,
        "measured": {c.name: _jsonable(c.measured) for c in ctx.checks},
        "expected": {c.name: _jsonable(c.expected) for c in ctx.checks},
        "tolerance": {c.name: c.tolerance for c in ctx.checks},
        "checks": [c.row() for c in ctx.checks],
        "numbers": _jsonable(ctx.numbers),
        "figures": list(ctx.figures),
        "quick": ctx.quick,
        "seed": ctx.seed,
        **({} if ctx.device is None else {"device": ctx.device.device, "dtype": ctx.device.dtype}),
        "falsified": ctx.falsify,
        "seconds": round(seconds, 3),
    }
    atomic_write_json(ctx.out / "result.json", result)
    return result


def run_lab(
    lab,
    out: Path,
    quick: bool = False,
    seed: int = 0,
    falsify: bool = False,
    verbose: bool = True,
    draw: bool = True,
    device=None,
) -> dict:
    """Run one lab module (``posttrain.labs.<module>``) into ``out``; return its result dict. ``device``: a
    ``DeviceConfig`` (``trainers/device_config.py``) every trainer the lab runs gets (None: the trainers' defaults)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = LabContext(lab.NAME, out, quick=quick, seed=seed, falsify=falsify, verbose=verbose, draw=draw, device=device)
    ctx.say(f"== {lab.NAME}{' (quick)' if quick else ''}{' (FALSIFIED on purpose)' if falsify else ''}")
    ctx.say(f"claim: {lab.CLAIM}")
    ctx.say(f"formula: {lab.FORMULA}")
    t0 = time.perf_counter()
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # labs are CPU-sized and must not fight other processes for cores
    from posttrain.labs._train import on_device

    try:
        with on_device(device):
            lab.run(ctx)
    finally:
        torch.set_num_threads(threads)
    seconds = time.perf_counter() - t0
    result = write_result(ctx, lab.CLAIM, lab.FORMULA, lab.NOTES, seconds)
    ctx.say(f"agrees: {str(result['agrees']).lower()}  ({seconds:.1f} s; {out / 'result.json'})")
    return result


def png_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def binom_two_sided_p(k: int, n: int, p: float) -> float:
    """Exact two-sided binomial p-value, 2 min(P[X <= k], P[X >= k]) capped at 1 (X ~ Binomial(n, p))."""
    if p <= 0.0:
        return 1.0 if k == 0 else 0.0
    if p >= 1.0:
        return 1.0 if k == n else 0.0
    i = np.arange(n + 1)
    logpmf = (
        np.array([math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1) for j in i])
        + i * math.log(p)
        + (n - i) * math.log1p(-p)
    )
    pmf = np.exp(logpmf)
    return float(min(1.0, 2 * min(pmf[: k + 1].sum(), pmf[k:].sum())))


_MEMO: dict = {}


def memo(ctx: LabContext, label: str, fn):
    """``fn()`` once per process for (lab, label, quick, seed, device): measurements that ``falsify`` does not change
    are reused when a lab is judged again (the tests run every lab twice), never across sizes, seeds or devices."""
    key = (ctx.name, label, ctx.quick, ctx.seed, None if ctx.device is None else (ctx.device.device, ctx.device.dtype))
    if key not in _MEMO:
        _MEMO[key] = fn()
    return _MEMO[key]
