"""The RL lineage on one task: REINFORCE -> RLOO -> A2C -> PPO -> KL-PPO -> GRPO, same SFT start, same budget.

For every seed S the benchmark trains ``posttrain sft --preset tiny --seed S`` once (or takes it from an earlier
``benchmarks/bench_outcomes.py`` sweep with ``--sft-from WORK``: ``WORK/seedS/sft``), then each method from that
checkpoint, as a user would run it (each ``--threads 1 --progress false``)::

    reinforce  posttrain grpo --preset reinforce   (REINFORCE, batch-mean baseline)
    rloo       posttrain grpo --preset rloo        (leave-one-out baseline)
    a2c        posttrain ppo  --preset a2c         (actor-critic: V(s) baseline, GAE, one on-policy update)
    ppo        posttrain ppo  --preset tiny        (clipped surrogate, mu epochs, value clip)
    kl_ppo     posttrain ppo  --preset kl_ppo      (unclipped ratio - adaptive beta KL(pi_old || pi))
    grpo       posttrain grpo --preset tiny        (group baseline, no critic)

Every method gets the SAME budget: ``--budget`` optimizer-side steps, each one rollout batch of 256 trained
samples (GRPO's 32 prompts x 8, PPO's 64 x 4; the table prints steps x batch read from each run's resolved
config, and the samples *generated*, which dynamic sampling in the policy-gradient presets raises). All other
settings are each preset's own. Held-out evaluation every ``--eval-every`` steps gives the curve.

Per run it records the greedy held-out accuracy (``summary.json``), the gain over the same seed's SFT, the
trainer's ``train_seconds``, the child process's own CPU seconds and peak RSS (``os.wait4`` on that child:
its own ``ru_maxrss``, not the cumulative RUSAGE_CHILDREN), and the held-out curve against training time
(cumulative ``step_time`` of ``metrics.jsonl`` up to each evaluation; evaluation time excluded). It prints
the table, writes ``WORK/lineage.json`` after every finished run (an interrupted sweep keeps what it has;
``--reuse`` then skips finished runs with an identical command) and one PNG, ``WORK/lineage.png`` (matplotlib,
not a posttrain dependency: without it the curves stay in the JSON).

    .venv/bin/python benchmarks/bench_lineage.py --seeds 0 1 2 --jobs 1 --work runs/lineage
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_outcomes import ROOT, describe, run_one, say, versions  # noqa: E402

METHODS: dict[str, tuple[str, list[str]]] = {  # name -> (CLI command, its flags); the lineage's order
    "reinforce": ("grpo", ["--preset", "reinforce"]),
    "rloo": ("grpo", ["--preset", "rloo"]),
    "a2c": ("ppo", ["--preset", "a2c"]),
    "ppo": ("ppo", ["--preset", "tiny"]),
    "kl_ppo": ("ppo", ["--preset", "kl_ppo"]),
    "grpo": ("grpo", ["--preset", "tiny"]),
}
_WRITE = threading.Lock()


# ----------------------------------------------------------------------------------------------- one run
def method_command(
    method: str, seed: int, work: Path, sft_dir: Path, budget: int, eval_every: int, extra: str = ""
) -> list[str]:
    sub, flags = METHODS[method]
    return [
        sys.executable,
        "-m",
        "posttrain",
        sub,
        *flags,
        "--seed",
        str(seed),
        "--out",
        str(work / f"seed{seed}" / method),
        "--init",
        str(sft_dir),
        "--steps",
        str(budget),
        "--eval-every",
        str(eval_every),
        "--threads",
        "1",
        "--progress",
        "false",
        "--overwrite",
        *shlex.split(extra),
    ]


def read_curve(metrics_path: Path) -> list[dict]:
    """metrics.jsonl -> [{step, train_seconds, heldout_accuracy}] at each evaluation (step 0 included), the
    time being the sum of ``step_time`` over steps <= that step."""
    t, curve = 0.0, []
    for line in metrics_path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        t += float(r.get("step_time", 0.0))
        if "heldout_accuracy" in r:
            curve.append({"step": int(r["step"]), "train_seconds": t, "heldout_accuracy": float(r["heldout_accuracy"])})
    return curve


def samples_of(metrics_path: Path, cfg: dict) -> tuple[int, int]:
    """(samples trained on, samples generated) over the run: steps x batch, and with dynamic sampling the
    groups actually drawn x G."""
    g, steps, generated = int(cfg["num_generations"]), 0, 0
    for line in metrics_path.read_text().splitlines():
        r = json.loads(line) if line.strip() else {}
        if "step_time" in r:
            steps += 1
            generated += int(r.get("groups_drawn", cfg["prompts_per_step"])) * g
    return steps * int(cfg["prompts_per_step"]) * g, generated


def run_method(
    method: str,
    seed: int,
    work: Path,
    sft_dir: Path,
    sft_acc: float | None,
    budget: int,
    eval_every: int,
    extra: str,
    reuse: bool,
    timeout: float,
) -> dict:
    cmd = method_command(method, seed, work, sft_dir, budget, eval_every, extra)
    out = Path(cmd[cmd.index("--out") + 1])
    record, summary_path = out.parent / f"{method}.command.json", out / "summary.json"
    if reuse and summary_path.exists() and record.exists() and json.loads(record.read_text())["cmd"] == cmd[1:]:
        rec = json.loads(record.read_text())
        say(f"[seed {seed}] {method}: reused {out}")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        record.unlink(missing_ok=True)
        t0 = time.perf_counter()
        with open(out.parent / f"{method}.log", "w") as log:
            env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
            timer = threading.Timer(timeout, proc.kill)
            timer.start()
            _, status, usage = os.wait4(proc.pid, 0)  # this child's own CPU time and peak RSS
            timer.cancel()
            proc.returncode = rc = os.waitstatus_to_exitcode(status)
        rec = {
            "cmd": cmd[1:],
            "rc": rc,
            "wall_seconds": time.perf_counter() - t0,
            "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "max_rss_mb": usage.ru_maxrss / 1024,
        }  # KiB on Linux
        record.write_text(json.dumps(rec))
    res = {
        "method": method,
        "seed": seed,
        "cmd": " ".join(shlex.quote(c) for c in ["python", *cmd[1:]]),
        "rc": rec["rc"],
        "wall_seconds": rec["wall_seconds"],
        "cpu_seconds": rec["cpu_seconds"],
        "max_rss_mb": rec["max_rss_mb"],
        "run_dir": str(out),
    }
    if rec["rc"] == 0 and summary_path.exists():
        summ = json.loads(summary_path.read_text())
        cfg = json.loads((out / "config.resolved.json").read_text())
        res.update(
            accuracy=float(summ["heldout_accuracy"]),
            train_seconds=summ.get("train_seconds"),
            steps=summ.get("steps"),
            batch=int(cfg["prompts_per_step"]) * int(cfg["num_generations"]),
            curve=read_curve(out / "metrics.jsonl"),
        )
        res["samples_trained"], res["samples_generated"] = samples_of(out / "metrics.jsonl", cfg)
        if sft_acc is not None:
            res["gain"] = res["accuracy"] - sft_acc
    msg = (
        f"{res['accuracy']:.3f}"
        if "accuracy" in res
        else f"FAILED rc={rec['rc']} (see {out.parent / (method + '.log')})"
    )
    say(
        f"[seed {seed}] {method}: {msg}  ({rec['wall_seconds']:.0f}s wall, {rec['cpu_seconds']:.0f}s CPU, "
        f"{rec['max_rss_mb']:.0f} MiB)"
    )
    return res


# ----------------------------------------------------------------------------------------------- aggregation
def aggregate(runs: list[dict], methods: list[str]) -> dict:
    """run records -> per method: describe() of accuracy and gain over seeds, means of the costs, the
    mean curve (per evaluation index, over the seeds that have it)."""
    out = {}
    for m in methods:
        ok = [r for r in runs if r["method"] == m and "accuracy" in r]
        row = {
            "accuracy": describe({r["seed"]: r["accuracy"] for r in ok}),
            "gain": describe({r["seed"]: r["gain"] for r in ok if "gain" in r}),
            "failed_seeds": sorted(r["seed"] for r in runs if r["method"] == m and "accuracy" not in r),
        }
        for key in (
            "train_seconds",
            "wall_seconds",
            "cpu_seconds",
            "max_rss_mb",
            "samples_trained",
            "samples_generated",
            "steps",
            "batch",
        ):
            xs = [r[key] for r in ok if r.get(key) is not None]
            row[key] = {"mean": statistics.fmean(xs), "max": max(xs)} if xs else None
        curves = [r["curve"] for r in ok if r.get("curve")]
        mean_curve = []
        for i in range(max((len(c) for c in curves), default=0)):
            pts = [c[i] for c in curves if len(c) > i]
            accs = [p["heldout_accuracy"] for p in pts]
            mean_curve.append(
                {
                    "step": pts[0]["step"],
                    "n": len(pts),
                    "train_seconds": statistics.fmean(p["train_seconds"] for p in pts),
                    "heldout_accuracy": statistics.fmean(accs),
                    "min": min(accs),
                    "max": max(accs),
                }
            )
        row["curve"] = mean_curve
        out[m] = row
    return out


def _pm(d: dict, pct: bool = False) -> str:
    if not d.get("n"):
        return "n/a"
    k, sign = (100, "+") if pct else (1, "")
    return f"{d['mean'] * k:{sign}.1f} ± {d['sd'] * k:.1f}" if pct else f"{d['mean']:.3f} ± {d['sd']:.3f}"


def table(agg: dict, sft: dict | None = None) -> list[str]:
    """Markdown rows: method | held-out mean ± sd | worst seed | gain | train s | CPU s | peak RSS | budget."""
    lines = [
        "| method | held-out (mean ± sd) | worst seed | gain over SFT, points | train wall s | CPU s | "
        "peak RSS MiB | budget (steps × batch; generated) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    if sft and sft.get("n"):
        lines.append(f"| SFT (start) | {_pm(sft)} | {sft['worst_seed']}: {sft['min']:.3f} | — | | | | |")
    for m, row in agg.items():
        a, g = row["accuracy"], row["gain"]
        worst = f"{a['worst_seed']}: {a['min']:.3f}" if a.get("n") else "n/a"

        def mean(key, fmt="{:.0f}", row=row):
            return fmt.format(row[key]["mean"]) if row.get(key) else "n/a"

        budget = (
            f"{row['steps']['mean']:.0f} × {row['batch']['mean']:.0f}; {row['samples_generated']['mean']:.0f}"
            if row.get("steps") and row.get("batch")
            else "n/a"
        )
        failed = f" (failed seeds {row['failed_seeds']})" if row["failed_seeds"] else ""
        lines.append(
            f"| {m}{failed} | {_pm(a)} | {worst} | {_pm(g, pct=True)} | {mean('train_seconds')} | "
            f"{mean('cpu_seconds')} | {mean('max_rss_mb')} | {budget} |"
        )
    return lines


def seed_table(runs: list[dict], sft: dict, methods: list[str]) -> list[str]:
    """Markdown rows: seed | SFT | each method's held-out accuracy (gain over that seed's SFT, points)."""
    lines = ["| seed | SFT | " + " | ".join(methods) + " |", "|---" * (len(methods) + 2) + "|"]
    for seed in sorted(sft):
        cells = []
        for m in methods:
            r = next((r for r in runs if r["seed"] == seed and r["method"] == m), None)
            cells.append(
                "—"
                if r is None
                else "failed"
                if "accuracy" not in r
                else f"{r['accuracy']:.3f}" + (f" ({r['gain'] * 100:+.1f})" if "gain" in r else "")
            )
        s = sft[seed]
        lines.append(f"| {seed} | {s['accuracy']:.3f} | " if "accuracy" in s else f"| {seed} | failed | ")
        lines[-1] += " | ".join(cells) + " |"
    return lines


def plot(runs: list[dict], agg: dict, dest: Path) -> Path:
    """One PNG: held-out accuracy against training seconds, per method the mean over seeds (bold) and each
    seed's own curve (thin, same colour)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for i, (m, row) in enumerate(agg.items()):
        colour = f"C{i}"
        for r in runs:
            if r["method"] == m and r.get("curve"):
                ax.plot(
                    [p["train_seconds"] for p in r["curve"]],
                    [p["heldout_accuracy"] for p in r["curve"]],
                    color=colour,
                    alpha=0.25,
                    linewidth=0.8,
                )
        if row["curve"]:
            n = row["accuracy"].get("n", 0)
            ax.plot(
                [p["train_seconds"] for p in row["curve"]],
                [p["heldout_accuracy"] for p in row["curve"]],
                color=colour,
                linewidth=2,
                marker="o",
                markersize=3,
                label=f"{m} (mean of {n} seed{'s' * (n != 1)})",
            )
    ax.set_xlabel("training time, s (sum of step times; evaluation excluded; one CPU thread)")
    ax.set_ylabel("greedy held-out accuracy")
    ax.set_title("REINFORCE → RLOO → A2C → PPO → KL-PPO → GRPO, same SFT start and budget")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    dest.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(dest)
    plt.close(fig)
    return dest


def write_report(
    work: Path, args, runs: list[dict], sft: dict, started: dict, t0: float, png: Path | None = None
) -> dict:
    methods = [m for m in METHODS if m in args.methods]
    agg = aggregate(runs, methods)
    report = {
        "seeds": args.seeds,
        "methods": methods,
        "budget_steps": args.budget,
        "eval_every": args.eval_every,
        "method_commands": {m: ["posttrain", METHODS[m][0], *METHODS[m][1]] for m in methods},
        "extra_args": args.extra_args,
        "sft_args": args.sft_args,
        "sft_from": args.sft_from,
        "jobs": args.jobs,
        "versions": started,
        "sweep_wall_seconds": time.perf_counter() - t0,
        "sft": {str(k): v for k, v in sft.items()},
        "runs": runs,
        "aggregate": agg,
        "table": table(agg, describe({s: r["accuracy"] for s, r in sft.items() if "accuracy" in r})),
        "table_per_seed": seed_table(runs, sft, methods),
        "png": str(png) if png else None,
    }
    with _WRITE:
        tmp = work / "lineage.json.tmp"
        tmp.write_text(json.dumps(report, indent=2))
        tmp.replace(work / "lineage.json")
    return report


# ----------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument(
        "--budget",
        type=int,
        default=200,
        help="steps per method, each one rollout batch of 256 trained samples (200: PPO ~3 min CPU on one thread)",
    )
    ap.add_argument("--eval-every", type=int, default=25, help="steps between held-out evaluations (the curve)")
    ap.add_argument("--jobs", type=int, default=1, help="CLI processes at once (each --threads 1)")
    ap.add_argument("--work", default="runs/lineage", help="directory for the runs, lineage.json and lineage.png")
    ap.add_argument("--sft-from", metavar="WORK", help="take each seed's SFT from WORK/seedS/sft (not rerun)")
    ap.add_argument("--sft-args", default="", help="extra flags for `posttrain sft` (one quoted string)")
    ap.add_argument("--extra-args", default="", help="extra flags for every method's run (one quoted string)")
    ap.add_argument("--reuse", action="store_true", help="keep finished runs whose command is unchanged")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds before a run counts as failed")
    args = ap.parse_args(argv)
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    sft_root = Path(args.sft_from).resolve() if args.sft_from else None
    t0, started = time.perf_counter(), versions()
    sft: dict[int, dict] = {}
    runs: list[dict] = []
    ready = {s: threading.Event() for s in args.seeds}

    def do_sft(seed):
        try:
            sft[seed] = run_one("sft", seed, work, args.sft_args, args.reuse, args.timeout, sft_root)
        except Exception as e:  # noqa: BLE001  a crashed run is a failed seed, never a crashed sweep
            sft[seed] = {"rc": f"error: {e}"}
        ready[seed].set()

    def do_method(seed, method):
        ready[seed].wait()
        s = sft[seed]
        if "accuracy" not in s:
            r = {"method": method, "seed": seed, "rc": "sft failed"}
        else:
            try:
                r = run_method(
                    method,
                    seed,
                    work,
                    Path(s["run_dir"]),
                    s["accuracy"],
                    args.budget,
                    args.eval_every,
                    args.extra_args,
                    args.reuse,
                    args.timeout,
                )
            except Exception as e:  # noqa: BLE001
                r = {"method": method, "seed": seed, "rc": f"error: {e}"}
        with _WRITE:
            runs.append(r)
        write_report(
            work, args, sorted(runs, key=lambda r: (r["seed"], list(METHODS).index(r["method"]))), sft, started, t0
        )

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:  # FIFO: every SFT starts before any method
        futs = [pool.submit(do_sft, s) for s in args.seeds]
        futs += [pool.submit(do_method, s, m) for s in args.seeds for m in METHODS if m in args.methods]
        for f in futs:
            f.result()
    runs.sort(key=lambda r: (r["seed"], list(METHODS).index(r["method"])))
    agg = aggregate(runs, [m for m in METHODS if m in args.methods])
    try:
        png = plot(runs, agg, work / "lineage.png")
    except ImportError:  # matplotlib is not a dependency of posttrain: the curves stay in lineage.json
        png = None
        print("matplotlib not installed: no PNG (the curves are in lineage.json)")
    report = write_report(work, args, runs, sft, started, t0, png)
    print()
    print("\n".join(report["table_per_seed"]) + "\n")
    print("\n".join(report["table"]))
    print(f"\nbudget: {args.budget} steps per method, held-out every {args.eval_every}; seeds {args.seeds}")
    print(f"report: {work / 'lineage.json'}" + (f"\nplot:   {png}" if png else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
