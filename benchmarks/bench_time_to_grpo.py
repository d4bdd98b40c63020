"""Wall time of SFT + GRPO as a user runs them, alone on the machine: `posttrain sft`, then `posttrain grpo` on it.

    .venv/bin/python benchmarks/bench_time_to_grpo.py --seeds 0 1 2 3 4 --baseline-seeds 0 --work runs/time_to_grpo

For each seed S (one after another, nothing else running: wall time is the measure):

    posttrain sft  --seed S --out WORK/seedS/sft  --progress false                  (the defaults: every usable
    posttrain grpo --seed S --out WORK/seedS/grpo --init WORK/seedS/sft --progress false     core)

and for each ``--baseline-seeds`` seed both runs once more with ``--baseline-flags`` (default ``--threads 1``, the
default before 2026-12-07: one torch thread, the second core idle outside SFT's parallel restarts), so the table
sets the two side by side in one run, and checks that each pair ends with the same weights (``model.safetensors``
byte for byte). ``--sft-flags`` / ``--grpo-flags`` add flags to the measured runs (a candidate recipe; its
baseline is then the defaults with ``--baseline-flags ""``, and "same weights" says whether the candidate ended
where the defaults do). ``--task NAME`` runs every command, baseline included, on that embedded task. ``--record FILE`` (a ``bench_outcomes.py`` record of the same
recipes) adds a column saying whether each run's held-out accuracy equals the recorded one. Prints a table (wall
seconds, held-out accuracies) and writes ``WORK/time_to_grpo.json`` with the commands, times and versions.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_outcomes import portable, versions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def run(cmd: list[str], log: Path) -> float:
    """Run ``posttrain CMD`` (this tree), output to ``log``; -> wall seconds. A failed run stops the benchmark."""
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        rc = subprocess.call([sys.executable, "-m", "posttrain", *cmd], stdout=fh, stderr=subprocess.STDOUT, env=env)
    if rc:
        raise SystemExit(f"{' '.join(cmd)} failed (rc {rc}): see {log}")
    return time.perf_counter() - t0


def heldout(run_dir: Path) -> float:
    return json.loads((run_dir / "summary.json").read_text())["heldout_accuracy"]


def same_weights(a: Path, b: Path) -> bool:
    return (a / "model" / "model.safetensors").read_bytes() == (b / "model" / "model.safetensors").read_bytes()


def recorded(path: str | None) -> dict:
    """{seed: {"sft": acc, "grpo": acc}} from a bench_outcomes.py record, or {}."""
    if not path:
        return {}
    try:
        results = json.loads(Path(path).read_text())["results"]
        return {int(s): {st: r[st]["accuracy"] for st in ("sft", "grpo") if st in r} for s, r in results.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"--record {path}: not a bench_outcomes.py outcomes.json ({type(e).__name__}: {e})") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument(
        "--baseline-seeds", type=int, nargs="*", default=[0], help="also run SFT and GRPO with the baseline flags"
    )
    ap.add_argument("--baseline-flags", default="--threads 1", help="the baseline's extra flags (default: %(default)s)")
    ap.add_argument("--sft-flags", default="", help="extra flags for the measured `posttrain sft` runs (one string)")
    ap.add_argument("--grpo-flags", default="", help="extra flags for the measured `posttrain grpo` runs (one string)")
    ap.add_argument(
        "--task",
        choices=["arithmetic", "collatz", "octal", "sort"],
        help="the embedded task of every run (default: arithmetic)",
    )
    ap.add_argument("--work", default="runs/time_to_grpo")
    ap.add_argument("--record", help="a bench_outcomes.py outcomes.json to check the accuracies against")
    args = ap.parse_args(argv)
    try:
        args.baseline_flags = shlex.split(args.baseline_flags)
        sft_flags, grpo_flags = shlex.split(args.sft_flags), shlex.split(args.grpo_flags)
        rec, rows = recorded(args.record), {}
    except ValueError as e:
        ap.error(str(e))  # exit 2, before anything runs or is written
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        d = work / f"seed{seed}"
        d.mkdir(exist_ok=True)
        task = ["--task", args.task] if args.task else []
        sft = ["sft", "--seed", str(seed), "--out", str(d / "sft"), "--progress", "false", "--overwrite", *task]
        grpo = ["grpo", "--seed", str(seed), "--out", str(d / "grpo"), "--init", str(d / "sft"), "--progress", "false"]
        grpo += task
        main_sft, main_grpo = [*sft, *sft_flags], [*grpo, *grpo_flags, "--overwrite"]
        row = {"sft_cmd": portable(["python", "-m", "posttrain", *main_sft], {work: "WORK"})}
        row["grpo_cmd"] = portable(["python", "-m", "posttrain", *main_grpo], {work: "WORK"})
        row["sft_wall"] = run(main_sft, d / "sft.log")
        row["grpo_wall"] = run(main_grpo, d / "grpo.log")
        row["sft"], row["grpo"] = heldout(d / "sft"), heldout(d / "grpo")
        if seed in args.baseline_seeds:
            base = {"sft": [*sft[:4], str(d / "sft_base"), *sft[5:], *args.baseline_flags]}
            base["grpo"] = [*grpo[:4], str(d / "grpo_base"), "--init", str(d / "sft_base"), *grpo[7:]]
            base["grpo"] += [*args.baseline_flags, "--overwrite"]
            for st, cmd in base.items():
                row[f"{st}_baseline_cmd"] = portable(["python", "-m", "posttrain", *cmd], {work: "WORK"})
                row[f"{st}_baseline_wall"] = run(cmd, d / f"{st}_base.log")
                row[f"{st}_baseline_same_weights"] = same_weights(d / st, d / f"{st}_base")
        if seed in rec:
            row["as_recorded"] = all(row[st] == rec[seed][st] for st in rec[seed])
        rows[seed] = row
        print(
            f"[seed {seed}] sft {row['sft_wall']:.0f} s ({row['sft']:.3f}) + grpo {row['grpo_wall']:.0f} s "
            f"({row['grpo']:.3f}) = {row['sft_wall'] + row['grpo_wall']:.0f} s",
            flush=True,
        )
    print(
        "\n| seed | SFT wall s (baseline) | GRPO wall s (baseline) | SFT + GRPO s (baseline) | SFT held-out | GRPO held-out | as recorded |"
    )
    print("|---|---|---|---|---|---|---|")
    for seed, r in rows.items():
        b = {st: f" ({r[f'{st}_baseline_wall']:.0f})" if f"{st}_baseline_wall" in r else "" for st in ("sft", "grpo")}
        both = f" ({r['sft_baseline_wall'] + r['grpo_baseline_wall']:.0f})" if b["sft"] else ""
        same = {st: "" if not b[st] else (" =" if r[f"{st}_baseline_same_weights"] else " DIFFERS") for st in b}
        print(
            f"| {seed} | {r['sft_wall']:.0f}{b['sft']} | {r['grpo_wall']:.0f}{b['grpo']} | "
            f"{r['sft_wall'] + r['grpo_wall']:.0f}{both} | {r['sft']:.3f}{same['sft']} | {r['grpo']:.3f}{same['grpo']} | "
            f"{r.get('as_recorded', '')} |"
        )
    if any("sft_baseline_wall" in r for r in rows.values()):
        measured = " ".join(f"{st} {' '.join(f)}" for st, f in (("sft", sft_flags), ("grpo", grpo_flags)) if f)
        print(
            f"(measured with {measured or 'the defaults'}; in brackets: the defaults with "
            f"{' '.join(args.baseline_flags) or 'no extra flags'}; = the same weights, byte for byte)"
        )
    totals = [r["sft_wall"] + r["grpo_wall"] for r in rows.values()]
    print(f"\nSFT + GRPO: median {statistics.median(totals):.0f} s, max {max(totals):.0f} s over {len(totals)} seeds")
    out = work / "time_to_grpo.json"
    out.write_text(json.dumps({"results": rows, "versions": versions(), "cpus": os.cpu_count()}, indent=1))
    print(f"record: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
