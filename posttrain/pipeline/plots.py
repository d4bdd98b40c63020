"""The report's figures (matplotlib, Agg backend, PNG): one function per figure, each returning the file it
wrote or None when the run holds nothing to draw (a skipped stage).

Figures: training loss of every trained stage; reward / held-out accuracy / KL / entropy / completion length
against step for each RL method (overlaid); DPO's chosen and rejected log-probs and margin; reward-model
accuracy and its scores of correct vs incorrect samples; the LSH S-curve with the chosen (b, r) and the
measured Jaccard of merged and injected pairs; tokens per word; the held-out accuracy comparison.
"""

from __future__ import annotations

import json
from pathlib import Path

COLORS = {
    "sft": "#4c72b0",
    "sft_raw": "#8c8c8c",
    "rm": "#dd8452",
    "dpo": "#55a868",
    "grpo": "#c44e52",
    "ppo": "#8172b3",
    "rm_best_of_n": "#dd8452",
    "rm_weighted_best_of_n": "#e8a87c",
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def metrics(stage_dir: Path) -> list[dict]:
    """A stage's per-step metrics; for SFT restarts, the kept restart's (``restarts/K/metrics.jsonl``)."""
    f = stage_dir / "metrics.jsonl"
    summary = stage_dir / "summary.json"
    if not f.is_file() and summary.is_file():
        kept = json.loads(summary.read_text(encoding="utf-8")).get("selected_restart")
        f = stage_dir / "restarts" / str(kept) / "metrics.jsonl"
    if not f.is_file():
        return []
    return [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]


def _series(rows: list[dict], key: str) -> tuple[list, list]:
    pts = [
        (r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)
    ]
    return [p[0] for p in pts], [p[1] for p in pts]


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def training_loss(run: Path, stages: list[str], out: Path) -> Path | None:
    rows = {s: metrics(run / s) for s in stages}
    rows = {s: r for s, r in rows.items() if _series(r, "loss")[0]}
    if not rows:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows), 2.8), squeeze=False)
    for ax, (s, r) in zip(axes[0], rows.items()):
        x, y = _series(r, "loss")
        ax.plot(x, y, color=COLORS.get(s), lw=1.2)
        rl = s == "grpo"
        ax.set_title(
            f"{s}: " + ("policy loss (~0 on-policy by design;\nsee the RL curves)" if rl else "training loss"),
            fontsize=9,
        )
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    return _save(fig, out / "training_loss.png")


RL_KEYS = (
    ("reward_mean", "reward (mean)"),
    ("heldout_accuracy", "held-out accuracy (greedy)"),
    ("kl", "KL to reference"),
    ("entropy", "entropy (nats/token)"),
    ("completion_length", "completion length (tokens)"),
)


def rl_curves(run: Path, methods: list[str], out: Path) -> Path | None:
    rows = {m: metrics(run / m) for m in methods}
    rows = {m: r for m, r in rows.items() if r}
    if not rows:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(RL_KEYS), figsize=(16, 3), squeeze=False)
    for ax, (key, title) in zip(axes[0], RL_KEYS):
        drawn = False
        for m, r in rows.items():
            x, y = _series(r, key)
            if x:
                ax.plot(x, y, color=COLORS.get(m), lw=1.2, label=m, marker="o" if len(x) < 12 else None, ms=3)
                drawn = True
        if not drawn:
            ax.text(
                0.5,
                0.5,
                "not logged\n(beta = 0: no reference model)" if key == "kl" else "not logged",
                ha="center",
                va="center",
                fontsize=8,
                transform=ax.transAxes,
                color="gray",
            )
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    return _save(fig, out / "rl_curves.png")


def dpo_logps(run: Path, out: Path) -> Path | None:
    r = metrics(run / "dpo")
    xc, yc = _series(r, "logps/chosen")
    if not xc:
        return None
    xr, yr = _series(r, "logps/rejected")
    xm, ym = _series(r, "rewards/margins")
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 2.8))
    a.plot(xc, yc, color="#55a868", label="chosen")
    a.plot(xr, yr, color="#c44e52", label="rejected")
    a.set_title("DPO: policy log-prob of chosen / rejected", fontsize=9)
    a.legend(fontsize=7)
    b.plot(xm, ym, color="#4c72b0")
    b.set_title("DPO: reward margin beta * (chosen - rejected)", fontsize=9)
    for ax in (a, b):
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    return _save(fig, out / "dpo_logps.png")


def rm_plot(run: Path, eval_summary: dict | None, out: Path) -> Path | None:
    r = metrics(run / "rm")
    if not r:
        return None
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 2.8))
    x, y = _series(r, "accuracy")
    a.plot(x, y, color="#dd8452", lw=1, label="training batch")
    x, y = _series(r, "heldout/accuracy")
    if x:
        a.plot(x, y, color="black", marker="o", ms=3, label="held-out pairs")
    a.set_title("RM pairwise accuracy", fontsize=9)
    a.set_ylim(0, 1.02)
    a.legend(fontsize=7)
    sc = (eval_summary or {}).get("rm_scores")
    if sc and (sc["correct"] or sc["incorrect"]):
        b.hist(
            [sc["correct"], sc["incorrect"]],
            bins=30,
            color=["#55a868", "#c44e52"],
            label=["correct samples", "incorrect samples"],
            histtype="stepfilled",
            alpha=0.6,
        )
        b.legend(fontsize=7)
    b.set_title("RM score of SFT samples (held-out prompts)", fontsize=9)
    for ax in (a, b):
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    a.set_xlabel("step", fontsize=8)
    b.set_xlabel("reward-model score", fontsize=8)
    return _save(fig, out / "rm.png")


def lsh_curve(dedup: dict | None, out: Path) -> Path | None:
    if not dedup or not dedup.get("lsh"):
        return None
    import numpy as np

    from posttrain.data.dedup.lsh import s_curve

    b, r, t = dedup["lsh"]["bands"], dedup["lsh"]["rows"], dedup["lsh"]["threshold"]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3))
    j = np.linspace(0, 1, 201)
    ax.plot(j, s_curve(j, b, r), color="#4c72b0", label=f"P(candidate) = 1 - (1 - J^{r})^{b}")
    ax.axvline(t, color="gray", ls="--", lw=1, label=f"threshold {t}")
    merged = dedup.get("merged_pair_jaccard") or []
    injected = dedup.get("injected_near_jaccard") or []
    if injected:
        ax.plot(
            injected,
            [-0.04] * len(injected),
            "|",
            color="#c44e52",
            ms=10,
            label=f"injected near pairs ({len(injected)})",
        )
    if merged:
        ax.plot(merged, [-0.10] * len(merged), "|", color="#55a868", ms=10, label=f"pairs dedup merged ({len(merged)})")
    ax.set_ylim(-0.15, 1.05)
    ax.set_xlabel("Jaccard similarity (5-char shingles)", fontsize=8)
    ax.set_title(f"MinHash LSH S-curve, b={b} r={r}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    return _save(fig, out / "lsh_s_curve.png")


def tokens_per_word(tok: dict | None, out: Path) -> Path | None:
    hist = (tok or {}).get("tokens_per_word_histogram")
    if not hist:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 2.8))
    xs = [int(k) for k in hist]
    total = sum(hist.values())
    ax.bar(xs, [hist[str(x)] / total for x in xs], color="#4c72b0")
    ax.axvline(tok["tokens_per_word"], color="#c44e52", ls="--", label=f"mean {tok['tokens_per_word']:.2f} tokens/word")
    ax.set_xlabel("tokens per word", fontsize=8)
    ax.set_ylabel("fraction of words", fontsize=8)
    ax.set_title(f"Byte-level BPE, vocabulary {tok['vocab_size']}", fontsize=9)
    ax.legend(fontsize=7)
    ax.tick_params(labelsize=7)
    return _save(fig, out / "tokens_per_word.png")


def accuracy_bars(table: dict, labels: dict, out: Path) -> Path | None:
    if not table:
        return None
    plt = _plt()
    names = list(table)
    fig, ax = plt.subplots(figsize=(max(7.0, 1.2 * len(names)), 3))  # ~1.2 in per model: the labels do not touch
    width = 0.27
    for i, (key, title) in enumerate(
        (("greedy", "greedy (RM: best-of-N pick)"), ("pass@1", "pass@1 (T=1)"), ("pass@k", "pass@k"))
    ):
        vals = [table[n].get(key) or 0.0 for n in names]
        ax.bar([x + (i - 1) * width for x in range(len(names))], vals, width, label=title, alpha=0.85)
    ax.set_xticks(range(len(names)))
    import textwrap

    ax.set_xticklabels([textwrap.fill(labels.get(n, n), 14) for n in names], fontsize=7)
    ax.set_ylim(0, 1)
    ax.set_ylabel("held-out accuracy", fontsize=8)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    ax.tick_params(labelsize=7)
    return _save(fig, out / "heldout_accuracy.png")
