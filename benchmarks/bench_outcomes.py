"""Outcomes over seeds: SFT, then GRPO / DPO / PPO / RM from each seed's own SFT run, as distributions.

For every seed S the sweep runs the CLI exactly as a user would::

    posttrain sft  --preset tiny --seed S --out WORK/seedS/sft  --threads 1 --progress false --overwrite \
                   --restart-jobs 1  SFT_ARGS
    posttrain grpo --preset tiny --seed S --out WORK/seedS/grpo --init WORK/seedS/sft ...               GRPO_ARGS
    posttrain dpo  --preset tiny --seed S --out WORK/seedS/dpo  --init WORK/seedS/sft ...               DPO_ARGS
    posttrain rm   --preset tiny --seed S --out WORK/seedS/rm   ...                                     RM_ARGS
    posttrain ppo  --preset tiny --seed S --out WORK/seedS/ppo  --init WORK/seedS/sft ...               PPO_ARGS

and reads each run's ``summary.json``: greedy held-out accuracy of the task's own held-out split (RM: held-out
pairwise accuracy). It prints a table per seed, then per stage mean ± sd (sample sd, n-1) over seeds, the
worst seed, and for GRPO/DPO the gain over the same seed's SFT (mean ± sd, worst seed). Everything goes to
``WORK/outcomes.json`` (per-seed numbers; wall, train and CPU seconds, the CPU time
being the child process's own, so a busy machine does not inflate it; commands, versions); the per-step curves
(reward, zero_std_frac, entropy, KL, held-out accuracy) of the GRPO runs with the best and the worst gain go
to ``WORK/curves_best_seedS.csv`` / ``curves_worst_seedS.csv`` (matplotlib is not a dependency: CSV only).

``--jobs`` runs that many CLI processes at once (each with ``--threads 1``, and SFT's restarts one at a time,
``--restart-jobs 1``, so a run's CPU seconds are its own); a stage starts as soon as its
seed's SFT has finished. ``--reuse`` keeps a finished run whose recorded command is identical (sweeps over
GRPO hyper-parameters then reuse the SFT runs). ``--heldout-all`` (on by default; ``--no-heldout-all`` skips
it) also scores every policy (SFT, GRPO, DPO, PPO) on the task's whole held-out split, 1,051 problems, with the
accuracy per operand layout (``posttrain eval --heldout all --by-layout``): what the trainers report since 2026-12-03
(before, a fixed sample of 256, with twice the binomial noise: sd ~0.03 against ~0.015 at p = 0.4, which is what
``--sft-args "--task.num-eval 256"`` etc. still give); it is cheap (~3 s a run) and works on reused runs, old ones
included. ``{seed}``, ``{sft}`` (the seed's SFT run) and ``{work}`` in the
extra flags are replaced per seed: ``--rm-args "--init {sft}"``, ``--ppo-args "--reward-model RMWORK/seed{seed}/rm"``.
No number is hand-entered: every one is read from a run.

    .venv/bin/python benchmarks/bench_outcomes.py --seeds 0 1 2 3 4 --stages sft grpo dpo --jobs 2 --work runs/outcomes
    .venv/bin/python benchmarks/bench_outcomes.py --seeds 0 1 2 --stages sft grpo --grpo-args "--preset rloo"

Splits: every choice is made on the task's dev split and the numbers are reported on its test (held-out) split
(``benchmarks/_outcomes_selection.py``). ``--task collatz`` (the second task; or ``octal``, ``sort``) runs every
stage on another embedded task (``--task NAME`` is added to each command), with the same recipes. ``--dev`` (on by default) also scores every policy on the
dev split (``posttrain eval RUN --heldout dev``: ``dev_accuracy`` per run, a "dev accuracy" row per stage);
``outcomes.json`` records per stage which split chose what (``selection``: ``{"chose": {"restart": "dev",
"checkpoint": "none (the last step)", "recipe": "dev"}, "selection_split": "dev", "reported_split": "test"}``), and a
sweep whose flags would choose on test (``--sft-args "--val-data F"`` with a held-out problem in F) is refused (exit
2) before any run. ``--choose A/outcomes.json B/outcomes.json --by-stage grpo`` runs nothing: A is the incumbent (the
current default), and B replaces it only when B's dev accuracy of that stage beats A's, paired by seed (the same SFT
starts), by more than ``--min-z`` (2) standard errors of the mean difference; among candidates that clear it the best
dev mean wins. It prints the chosen sweep's test numbers once; a sweep without dev scores (one from before the dev
split) is refused, since choosing on it would look at test.

``--combine A/outcomes.json B/outcomes.json ...`` runs nothing: it reports over the union of the seeds of earlier
sweeps of the same settings (seeds 0-4 one day, 5-9 another), for out-of-sample checks of a recipe. It refuses
(exit 2) sweeps whose stages' configs or CPU kernels differ (another recipe, or other trajectories), a seed
present twice with different numbers, and says so when the sweeps ran different commits. Flags are compared as the
configs the sweeps recorded (``recipes``, since 2026-12-04) or, for older files, the configs their flags resolve to with
this tree's presets (a preset since removed spelled out as its flags, ``_outcomes_combine.RETIRED_PRESETS``): ``--sft-args "--preset slots
--restarts 16"`` and ``--sft-args "--preset slots16"`` are one recipe (a note says so), ``--restarts 16`` against none
is another. ``--write FILE`` writes the union as one outcomes.json (its aggregate recomputed, ``combined_from`` naming
the sweeps), a record that ``--choose`` and ``--combine`` read as one sweep: a candidate run on seeds 0 and 2, then on
1, 3 and 4, is compared with the incumbent over all five.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the runs' working directory and PYTHONPATH
sys.path.insert(0, str(ROOT))  # run as a script: `benchmarks._outcomes_*` beside it

from benchmarks._outcomes_combine import HOW_IT_RUNS, CombineError, combine, combined_report, resolved_recipe  # noqa: E402
from benchmarks._outcomes_selection import SelectionError, choose, print_choice, refuse_test, selection, taken_sft  # noqa: E402
from posttrain.data.io import atomic_write_json  # noqa: E402

STAGES = ("sft", "grpo", "dpo", "rm", "ppo")
DEPENDS_ON_SFT = {"grpo", "dpo", "ppo"}
METRIC = {
    "sft": "heldout_accuracy",
    "grpo": "heldout_accuracy",
    "dpo": "heldout_accuracy",
    "rm": "heldout_pairwise_accuracy",
    "ppo": "heldout_accuracy",
}
_PRINT = threading.Lock()  # runs finish on worker threads: one whole line at a time


def say(msg: str) -> None:
    with _PRINT:
        print(msg, flush=True)


CURVE_KEYS = (
    "reward_mean",
    "accuracy",
    "zero_std_frac",
    "entropy",
    "approx_kl",
    "kl",
    "groups_drawn",
    "groups_kept",
    "restores",
    "lr",
    "heldout_accuracy",
)


# ----------------------------------------------------------------------------------------------- aggregation
def describe(values: dict[int, float]) -> dict:
    """{seed: value} -> mean, sd (sample, n-1; 0 for one seed), min/max and the seeds holding them."""
    if not values:
        return {"n": 0}
    xs = list(values.values())
    worst = min(values, key=lambda s: (values[s], s))
    best = max(values, key=lambda s: (values[s], -s))
    return {
        "n": len(xs),
        "mean": statistics.fmean(xs),
        "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0,
        "min": values[worst],
        "worst_seed": worst,
        "max": values[best],
        "best_seed": best,
    }


def aggregate(results: dict[int, dict[str, dict]]) -> dict:
    """results[seed][stage] = {"accuracy": float, ...} (failed runs have no "accuracy") ->
    per stage: describe(accuracy) and, for stages after SFT, describe(gain over the seed's own SFT)."""
    stages = [s for s in STAGES if any(s in r for r in results.values())]
    out = {}
    for st in stages:
        acc = {seed: r[st]["accuracy"] for seed, r in results.items() if "accuracy" in r.get(st, {})}
        full = {seed: r[st]["heldout_all"] for seed, r in results.items() if "heldout_all" in r.get(st, {})}
        dev = {seed: r[st]["dev_accuracy"] for seed, r in results.items() if "dev_accuracy" in r.get(st, {})}
        row = {
            "accuracy": describe(acc),
            "failed_seeds": sorted(seed for seed, r in results.items() if st in r and "accuracy" not in r[st]),
        }
        if dev:  # --dev: what choices are made on
            row["dev"] = describe(dev)
        if st in DEPENDS_ON_SFT:
            gain = {
                seed: r[st]["accuracy"] - r["sft"]["accuracy"]
                for seed, r in results.items()
                if "accuracy" in r.get(st, {}) and "accuracy" in r.get("sft", {})
            }
            row["gain"] = describe(gain)
            last = {  # a tail-averaged GRPO run also reports its last weights (trainers/weight_average.py)
                seed: r[st]["heldout_accuracy_last_weights"] - r["sft"]["accuracy"]
                for seed, r in results.items()
                if len(r.get(st, {}).get("weight_average_steps") or []) > 1 and "accuracy" in r.get("sft", {})
            }
            if last:
                row["gain_last_weights"] = describe(last)
        if full:  # --heldout-all: the whole held-out split, its gain over SFT on it, and each operand layout
            row["heldout_all"] = describe(full)
            if st in DEPENDS_ON_SFT:
                row["gain_heldout_all"] = describe(
                    {
                        s: v - results[s]["sft"]["heldout_all"]
                        for s, v in full.items()
                        if "heldout_all" in results[s]["sft"]
                    }
                )
            layouts = sorted({k for s in full for k in results[s][st]["by_layout"]})
            row["by_layout"] = {
                k: describe({s: results[s][st]["by_layout"][k] for s in full if k in results[s][st]["by_layout"]})
                for k in layouts
            }
        out[st] = row
    return out


def fmt(d: dict, pct: bool = False) -> str:
    if not d.get("n"):
        return "n/a"
    k = 100 if pct else 1
    p = ".1f" if pct else ".3f"
    return (
        f"{d['mean'] * k:{'+' if pct else ''}{p}} ± {d['sd'] * k:{p}}  (worst seed {d['worst_seed']}: "
        f"{d['min'] * k:{'+' if pct else ''}{p}}; best seed {d['best_seed']}: {d['max'] * k:{'+' if pct else ''}{p}})"
    )


def print_report(results: dict[int, dict[str, dict]], agg: dict) -> None:
    stages = list(agg)
    print("\nseed  " + "  ".join(f"{s:>13}" for s in stages))
    for seed in sorted(results):
        cells = []
        for st in stages:
            r = results[seed].get(st, {})
            if "accuracy" not in r:
                cells.append(f"{'failed' if st in results[seed] else '-':>13}")
                continue
            g = (
                f" ({(r['accuracy'] - results[seed]['sft']['accuracy']) * 100:+.1f})"
                if st in DEPENDS_ON_SFT and "accuracy" in results[seed].get("sft", {})
                else ""
            )
            cells.append(f"{r['accuracy']:.3f}{g}".rjust(13))
        print(f"{seed:<4}  " + "  ".join(cells))
    print()
    for st, row in agg.items():
        print(
            f"{st:<5} accuracy {fmt(row['accuracy'])}"
            + (f"; failed seeds {row['failed_seeds']}" if row["failed_seeds"] else "")
        )
        if "dev" in row:
            print(f"{st:<5} dev accuracy (what choices are made on) {fmt(row['dev'])}")
        if "gain" in row:
            print(f"{st:<5} gain over SFT, points {fmt(row['gain'], pct=True)}")
        if "gain_last_weights" in row:
            print(f"{st:<5} gain of the last weights (before averaging) {fmt(row['gain_last_weights'], pct=True)}")
        if "heldout_all" in row:
            print(f"{st:<5} all held-out problems {fmt(row['heldout_all'])}")
            if "gain_heldout_all" in row:
                print(
                    f"{st:<5} gain over SFT on all held-out problems, points {fmt(row['gain_heldout_all'], pct=True)}"
                )
            print(
                f"{st:<5} by operand layout (mean ± sd): "
                + "   ".join(f"{k} {d['mean']:.3f} ± {d['sd']:.3f}" for k, d in row["by_layout"].items())
            )
        for key in ("train_seconds", "cpu_seconds", "max_rss_mb"):
            xs = {seed: r[st][key] for seed, r in results.items() if r.get(st, {}).get(key) is not None}
            if xs:
                top = max(xs, key=xs.get)
                print(
                    f"{st:<5} {key.replace('_', ' ')}: mean {statistics.fmean(xs.values()):.0f}, max {xs[top]:.0f} (seed {top})"
                )


# ----------------------------------------------------------------------------------------------- running
def command(stage: str, seed: int, work: Path, extra: str, sft_root: Path | None = None) -> list[str]:
    out = (sft_root if stage == "sft" and sft_root else work) / f"seed{seed}" / stage
    cmd = [
        sys.executable,
        "-m",
        "posttrain",
        stage,
        "--preset",
        "tiny",
        "--seed",
        str(seed),
        "--out",
        str(out),
        "--threads",
        "1",
        "--progress",
        "false",
        "--overwrite",
    ]
    if stage == "sft":  # each CLI process has one core (--jobs at once): its restarts one at a time
        cmd += ["--restart-jobs", "1"]
    sft = (sft_root or work) / f"seed{seed}" / "sft"
    if stage in DEPENDS_ON_SFT:
        cmd += ["--init", str(sft)]
    # per-seed paths in the extra flags: {seed}, {sft} (this seed's SFT run), {work}; e.g. --rm-args "--init {sft}"
    extra = extra.replace("{seed}", str(seed)).replace("{sft}", str(sft)).replace("{work}", str(work))
    return cmd + shlex.split(extra)


def portable(cmd: list[str], roots: dict[Path, str]) -> str:
    """``cmd`` as a record shows it: ``python -m posttrain ...`` with each path under a root of ``roots`` written as
    that root's name (``{work: "WORK"}``: ``--out WORK/seed0/grpo``), so a record reads the same on any machine."""

    def one(arg: str) -> str:
        for root, name in sorted(roots.items(), key=lambda kv: -len(str(kv[0]))):  # the deepest root first
            r = str(root)
            if arg == r or arg.startswith(r + "/"):
                return name + arg[len(r) :]
        return arg

    return " ".join(shlex.quote(one(c)) for c in ["python", *cmd[1:]])


def same_run(recorded: list[str], cmd: list[str]) -> bool:
    """Whether a recorded command trains what ``cmd`` trains: equal but for ``--restart-jobs N`` (how the restarts
    share the cores; a record from before the flag was passed has none)."""

    def bare(c: list[str]) -> list[str]:
        out, i = [], 0
        while i < len(c):
            if c[i] == "--restart-jobs" and i + 1 < len(c):
                i += 2
                continue
            out.append(c[i])
            i += 1
        return out

    return bare(recorded) == bare(cmd)


def heldout_all(stage: str, seed: int, run_dir: Path, work: Path) -> dict:
    """``posttrain eval RUN --heldout all --by-layout``: {"heldout_all": accuracy, "by_layout": {layout: accuracy}}."""
    dest = work / f"seed{seed}" / f"{stage}_heldout_all"  # in this sweep's work, also for an --sft-from run
    cmd = [sys.executable, "-m", "posttrain", "eval", str(run_dir), "--heldout", "all", "--by-layout", "--show", "0"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    subprocess.run([*cmd, "--out", str(dest)], cwd=ROOT, env=env, check=True, capture_output=True)
    summ = json.loads((dest / "summary.json").read_text())
    return {"heldout_all": summ["accuracy"], "by_layout": {k: v["accuracy"] for k, v in summ["by_layout"].items()}}


def dev_score(stage: str, seed: int, run_dir: Path, work: Path) -> dict:
    """``posttrain eval RUN --heldout dev``: {"dev_accuracy": accuracy, "dev_n": problems} on the task's dev split."""
    dest = work / f"seed{seed}" / f"{stage}_dev"
    cmd = [sys.executable, "-m", "posttrain", "eval", str(run_dir), "--heldout", "dev", "--show", "0"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    subprocess.run([*cmd, "--out", str(dest)], cwd=ROOT, env=env, check=True, capture_output=True)
    summ = json.loads((dest / "summary.json").read_text())
    return {"dev_accuracy": summ["accuracy"], "dev_n": summ["n"]}


def run_one(
    stage: str,
    seed: int,
    work: Path,
    extra: str,
    reuse: bool,
    timeout: float,
    sft_root: Path | None = None,
    full: bool = False,
    dev: bool = False,
) -> dict:
    cmd = command(stage, seed, work, extra, sft_root)
    out = Path(cmd[cmd.index("--out") + 1])
    record = out.parent / f"{stage}.command.json"
    summary_path = out / "summary.json"
    if stage == "sft" and sft_root is not None:  # --sft-from: read that sweep's SFT run, never rerun it
        rec = json.loads(record.read_text())
        cmd = ["python", *rec["cmd"]]
        say(f"[seed {seed}] sft: from {out}")
    elif (
        reuse and summary_path.exists() and record.exists() and same_run(json.loads(record.read_text())["cmd"], cmd[1:])
    ):
        rec = json.loads(record.read_text())
        say(f"[seed {seed}] {stage}: reused {out}")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        record.unlink(missing_ok=True)
        t0 = time.perf_counter()
        with open(out.parent / f"{stage}.log", "w") as log:
            env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
            timer = threading.Timer(timeout, proc.kill)
            timer.start()
            _, status, usage = os.wait4(proc.pid, 0)  # this child's own CPU time, whatever else the machine runs
            timer.cancel()
            rc = os.waitstatus_to_exitcode(status)
            proc.returncode = rc
        rec = {
            "cmd": cmd[1:],
            "rc": rc,
            "wall_seconds": time.perf_counter() - t0,
            "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "max_rss_mb": usage.ru_maxrss / 1024,
        }
        record.write_text(json.dumps(rec))
    res = {
        "cmd": portable(cmd, {work: "WORK", **({sft_root: "SFT_FROM"} if sft_root else {})}),
        "rc": rec["rc"],
        "wall_seconds": rec["wall_seconds"],
        "cpu_seconds": rec.get("cpu_seconds"),
        "max_rss_mb": rec.get("max_rss_mb"),
        "run_dir": str(out),
    }
    if rec["rc"] == 0 and summary_path.exists():
        summ = json.loads(summary_path.read_text())
        res["accuracy"] = float(summ[METRIC[stage]])
        for k in (
            "train_seconds",
            "steps",
            "heldout_accuracy_start",
            "heldout_n",  # how many held-out problems the trainer scored (1,051 = all; 256 until 2026-12-03)
            "best_step",
            "stopped_early",
            "restores",
            "heldout_accuracy_last_weights",  # grpo with tail averaging: the last weights' accuracy, and
            "weight_average_steps",  # the steps the final model averages
        ):
            if k in summ:
                res[k] = summ[k]
        if full and stage != "rm":
            res.update(heldout_all(stage, seed, out, work))
        if dev and stage != "rm":
            res.update(dev_score(stage, seed, out, work))
    msg = (
        f"{res['accuracy']:.3f}" + (f" (all held-out: {res['heldout_all']:.3f})" if "heldout_all" in res else "")
        if "accuracy" in res
        else f"FAILED rc={rec['rc']} (see {out.parent / (stage + '.log')})"
    )
    cpu = f", {rec['cpu_seconds']:.0f}s CPU" if rec.get("cpu_seconds") is not None else ""
    say(f"[seed {seed}] {stage}: {msg}  ({rec['wall_seconds']:.0f}s wall{cpu})")
    return res


def sweep(
    seeds,
    stages,
    work: Path,
    extras: dict[str, str],
    jobs: int,
    reuse: bool,
    timeout: float,
    sft_root: Path | None = None,
    full: bool = False,
    dev: bool = False,
) -> dict:
    """Run every (seed, stage); a stage that needs SFT waits for its seed's SFT. -> results[seed][stage]."""
    results: dict[int, dict[str, dict]] = {s: {} for s in seeds}
    pending = [(seed, st) for st in stages for seed in seeds]  # all SFTs first: they unblock the rest
    lock, running = threading.Condition(), set()

    def ready(seed, st):
        return st not in DEPENDS_ON_SFT or "sft" not in stages or "sft" in results[seed]

    def worker(seed, st):
        try:
            r = run_one(st, seed, work, extras.get(st, ""), reuse, timeout, sft_root, full, dev)
        except Exception as e:  # noqa: BLE001  a crashed run is a failed seed, never a crashed sweep
            r = {"rc": f"error: {e}"}
        with lock:
            results[seed][st] = r
            running.discard((seed, st))
            lock.notify_all()

    with lock:
        while pending or running:
            start = next((p for p in pending if ready(*p)), None)
            if start is not None and len(running) < jobs:
                pending.remove(start)
                running.add(start)
                threading.Thread(target=worker, args=start, daemon=True).start()
                continue
            lock.wait()
    return results


def write_curves(results, agg, work: Path) -> list[str]:
    """CSV of the per-step GRPO metrics for the seeds with the best and the worst GRPO gain."""
    g = agg.get("grpo", {}).get("gain", {})
    if not g.get("n"):
        return []
    written = []
    for label, seed in (("best", g["best_seed"]), ("worst", g["worst_seed"])):
        path = Path(results[seed]["grpo"]["run_dir"]) / "metrics.jsonl"
        rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
        dest = work / f"curves_{label}_seed{seed}.csv"
        with open(dest, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["step", *CURVE_KEYS])
            for r in rows:
                w.writerow([r["step"], *(r.get(k, "") for k in CURVE_KEYS)])
        written.append(str(dest))
    return written


def versions() -> dict:
    import torch

    from posttrain.pipeline.run import cpu_description
    from posttrain.provenance import git_commit, git_dirty

    tree = ROOT / "posttrain"  # the tree the runs use (PYTHONPATH=ROOT), a checkout or a `git archive` snapshot
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "git_commit": git_commit(short=False, package_dir=tree),
        "git_dirty": git_dirty(tree),
        "machine": platform.machine(),
        "cpu": cpu_description(),  # the kernel ISA decides the rounding, so the trajectories
        "cpus": os.cpu_count(),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--stages", nargs="+", default=["sft", "grpo", "dpo"], choices=STAGES)
    ap.add_argument("--jobs", type=int, default=2, help="CLI processes at once (each --threads 1)")
    ap.add_argument("--work", default="runs/outcomes", help="directory for the runs, outcomes.json and the curves")
    for st in STAGES:
        ap.add_argument(f"--{st}-args", default="", help=f"extra flags for `posttrain {st}` (one quoted string)")
    ap.add_argument("--reuse", action="store_true", help="keep finished runs whose command is unchanged")
    ap.add_argument(
        "--sft-from",
        metavar="WORK",
        help="take each seed's SFT run from this earlier sweep's --work "
        "(not rerun; --sft-args ignored): sweeps over GRPO/DPO settings from the same SFT starts",
    )
    ap.add_argument("--timeout", type=float, default=1800, help="seconds before a run counts as failed")
    ap.add_argument(
        "--heldout-all",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also score every policy on the whole held-out split (1,051 problems), per operand layout too "
        "(default: on; ~3 s a run)",
    )
    ap.add_argument(
        "--task",
        choices=("arithmetic", "collatz", "octal", "sort"),
        default="arithmetic",
        help="the embedded task every stage runs on (--task NAME added to each command; the same recipes)",
    )
    ap.add_argument(
        "--dev",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also score every policy on the task's dev split, what choices are made on (default: on; ~3 s a run)",
    )
    ap.add_argument(
        "--choose",
        nargs="+",
        metavar="OUTCOMES_JSON",
        help="run nothing: choose among these sweeps on dev and print the chosen one's test numbers: the first is the "
        "incumbent, kept unless another's dev accuracy of --by-stage beats it, paired by seed, by more than --min-z "
        "standard errors (a sweep without dev scores is refused)",
    )
    ap.add_argument(
        "--min-z",
        type=float,
        default=2.0,
        help="--choose: standard errors of the paired dev gain a candidate must clear to replace the incumbent "
        "(default: 2; 0 = any positive paired gain)",
    )
    ap.add_argument("--by-stage", default="grpo", choices=STAGES, help="the stage --choose compares (default: grpo)")
    ap.add_argument(
        "--combine",
        nargs="+",
        metavar="OUTCOMES_JSON",
        help="run nothing: report over the union of the seeds of these earlier sweeps' outcomes.json "
        "(the same flags and CPU kernels)",
    )
    ap.add_argument(
        "--write",
        metavar="FILE",
        help="with --combine: also write the union as one outcomes.json (the first sweep's settings, every seed's "
        "runs, the aggregate over them, the files it came from), which --choose and --combine read as a sweep",
    )
    args = ap.parse_args(argv)
    if args.min_z < 0:
        ap.error(f"--min-z {args.min_z:g}: a number of standard errors, 0 or more")
    if args.write and not args.combine:  # before --choose, which would otherwise drop it unsaid
        ap.error("--write names the file --combine writes: use it with --combine")
    if args.choose:
        try:
            picked = choose(args.choose, args.by_stage, args.min_z)
        except SelectionError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print_choice(picked)
        return 0
    if args.combine:
        run_flags = ["seeds", "stages", "jobs", "work", "reuse", "sft_from", "timeout", "heldout_all", "task", "dev"]
        ignored = [n for n in run_flags + [f"{st}_args" for st in STAGES] if getattr(args, n) != ap.get_default(n)]
        if ignored:  # a sweep's flags mean nothing to a report over finished sweeps: say so rather than drop them
            ap.error(
                f"--combine runs nothing: {', '.join('--' + n.replace('_', '-') for n in ignored)} would be ignored"
            )
        try:
            results, notes = combine(args.combine)
        except CombineError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{len(results)} seeds from {len(args.combine)} sweeps: {', '.join(map(str, sorted(results)))}")
        for note in notes:
            print(f"note: {note}")
        agg = aggregate(results)
        print_report(results, agg)
        if args.write:
            atomic_write_json(args.write, combined_report(args.combine, results, agg))
            print(f"\noutcomes: {args.write}")
        return 0
    if "sft" not in args.stages and DEPENDS_ON_SFT & set(args.stages):
        args.stages = ["sft", *args.stages]  # each stage starts from its own seed's SFT
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    extras = {st: getattr(args, f"{st}_args") for st in STAGES}
    if args.task != "arithmetic":  # the default task's commands stay as they were (--reuse keeps earlier runs)
        extras = {st: f"--task {args.task} {x}".strip() for st, x in extras.items()}
    t0, started = time.perf_counter(), versions()  # the code as it was when the runs started
    # each stage's config as this tree resolves it (seed and paths aside): what --combine compares across sweeps
    recipes = {st: resolved_recipe(st, extras[st]) for st in args.stages if not (st == "sft" and args.sft_from)}
    chosen_by = {st: selection(st, recipes.get(st)) for st in args.stages}  # which split chose what, per stage
    sft_root = Path(args.sft_from).resolve() if args.sft_from else None
    runs = [sft_root / f"seed{s}" / "sft" for s in args.seeds] if sft_root else []
    missing = [r for r in runs if not ((r / "summary.json").is_file() and (r.parent / "sft.command.json").is_file())]
    if missing:  # a seed without its SFT run would only fail every stage after it
        print(f"error: --sft-from {args.sft_from}: no finished SFT run at {missing[0]}", file=sys.stderr)
        return 2
    try:
        if sft_root is not None:  # the SFT runs taken: what they chose, from their own configs
            recipes["sft"], chosen_by["sft"] = taken_sft(runs, HOW_IT_RUNS)
        refuse_test(chosen_by)
    except SelectionError as e:  # before any run: a sweep that chooses on test has nothing to report
        print(f"error: {e}", file=sys.stderr)
        return 2
    results = sweep(
        args.seeds,
        [s for s in STAGES if s in args.stages],
        work,
        extras,
        max(1, args.jobs),
        args.reuse,
        args.timeout,
        sft_root,
        args.heldout_all,
        args.dev,
    )
    agg = aggregate(results)
    print_report(results, agg)
    curves = write_curves(results, agg, work)
    report = {
        "seeds": args.seeds,
        "sft_from": str(sft_root) if sft_root else None,
        "stages": args.stages,
        "extra_args": extras,
        "recipes": recipes,
        "task": args.task,
        "selection": chosen_by,
        "jobs": args.jobs,
        "versions": started,
        "sweep_wall_seconds": time.perf_counter() - t0,
        "results": {str(k): v for k, v in results.items()},
        "aggregate": agg,
        "curves": curves,
    }
    dest = work / "outcomes.json"
    dest.write_text(
        json.dumps(report, indent=2, default=lambda x: None if isinstance(x, float) and math.isnan(x) else str(x))
    )
    print(f"\noutcomes: {dest}" + "".join(f"\ncurves:   {c}" for c in curves))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
