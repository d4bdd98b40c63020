"""Wall time of SFT + GRPO as a user runs them, alone on the machine: `posttrain sft`, then `posttrain grpo` on it.

    .venv/bin/python benchmarks/bench_time_to_grpo.py --seeds 0 1 2 3 4 --baseline-seeds 0 --work runs/time_to_grpo

For each seed S (one after another, nothing else running: wall time is the measure):

    posttrain sft  --seed S --out WORK/seedS/sft  --progress false                  (the defaults: the restarts
    posttrain grpo --seed S --out WORK/seedS/grpo --init WORK/seedS/sft --progress false     as the cores allow)

and for each ``--baseline-seeds`` seed the SFT run once more with ``--restart-jobs 1`` (its restarts one at a time,
the default before 2026-12-07), so the table sets the two side by side in one run, and checks that both SFT runs
end with the same held-out accuracy (the same model). ``--record FILE`` (a ``bench_outcomes.py`` record of the same
recipes) adds a column saying whether each run's held-out accuracy equals the recorded one. Prints a table (wall
seconds, held-out accuracies) and writes ``WORK/time_to_grpo.json`` with the commands, times and versions.
"""

from __future__ import annotations

import argparse
import json
import os
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
    ap.add_argument("--baseline-seeds", type=int, nargs="*", default=[0], help="also SFT with --restart-jobs 1")
    ap.add_argument("--work", default="runs/time_to_grpo")
    ap.add_argument("--record", help="a bench_outcomes.py outcomes.json to check the accuracies against")
    args = ap.parse_args(argv)
    try:
        rec, rows = recorded(args.record), {}
    except ValueError as e:
        ap.error(str(e))  # exit 2, before anything runs or is written
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        d = work / f"seed{seed}"
        d.mkdir(exist_ok=True)
        sft = ["sft", "--seed", str(seed), "--out", str(d / "sft"), "--progress", "false", "--overwrite"]
        grpo = ["grpo", "--seed", str(seed), "--out", str(d / "grpo"), "--init", str(d / "sft"), "--progress", "false"]
        row = {"sft_cmd": portable(["python", "-m", "posttrain", *sft], {work: "WORK"})}
        row["grpo_cmd"] = portable(["python", "-m", "posttrain", *grpo, "--overwrite"], {work: "WORK"})
        row["sft_wall"] = run(sft, d / "sft.log")
        row["grpo_wall"] = run([*grpo, "--overwrite"], d / "grpo.log")
        row["sft"], row["grpo"] = heldout(d / "sft"), heldout(d / "grpo")
        if seed in args.baseline_seeds:
            one = [*sft[:4], str(d / "sft_one"), *sft[5:], "--restart-jobs", "1"]
            row["sft_one_at_a_time_cmd"] = portable(["python", "-m", "posttrain", *one], {work: "WORK"})
            row["sft_one_at_a_time_wall"] = run(one, d / "sft_one.log")
            row["sft_one_at_a_time"] = heldout(d / "sft_one")
        if seed in rec:
            row["as_recorded"] = all(row[st] == rec[seed][st] for st in rec[seed])
        rows[seed] = row
        print(
            f"[seed {seed}] sft {row['sft_wall']:.0f} s ({row['sft']:.3f}) + grpo {row['grpo_wall']:.0f} s "
            f"({row['grpo']:.3f}) = {row['sft_wall'] + row['grpo_wall']:.0f} s",
            flush=True,
        )
    print(
        "\n| seed | SFT wall s (one at a time) | GRPO wall s | SFT + GRPO s | SFT held-out | GRPO held-out | as recorded |"
    )
    print("|---|---|---|---|---|---|---|")
    for seed, r in rows.items():
        one = f" ({r['sft_one_at_a_time_wall']:.0f})" if "sft_one_at_a_time_wall" in r else ""
        same = "" if "sft_one_at_a_time" not in r else (" =" if r["sft_one_at_a_time"] == r["sft"] else " DIFFERS")
        print(
            f"| {seed} | {r['sft_wall']:.0f}{one} | {r['grpo_wall']:.0f} | {r['sft_wall'] + r['grpo_wall']:.0f} | "
            f"{r['sft']:.3f}{same} | {r['grpo']:.3f} | {r.get('as_recorded', '')} |"
        )
    totals = [r["sft_wall"] + r["grpo_wall"] for r in rows.values()]
    print(f"\nSFT + GRPO: median {statistics.median(totals):.0f} s, max {max(totals):.0f} s over {len(totals)} seeds")
    out = work / "time_to_grpo.json"
    out.write_text(json.dumps({"results": rows, "versions": versions(), "cpus": os.cpu_count()}, indent=1))
    print(f"record: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
