"""The whole pipeline over seeds: `posttrain pipeline --preset tiny --seed S` for each seed, one table.

    .venv/bin/python benchmarks/bench_pipeline.py --seeds 0 1 2 --jobs 2 --work runs/pipeline_seeds

Each seed is one ordinary pipeline run (``WORK/seedS``, cached by content like any other: re-running the script
after it finished only re-reads the summaries; ``--pipeline-args`` passes flags through, e.g. ``--config
pipeline.toml``). It prints per seed the held-out greedy accuracy of every policy (SFT, RM best-of-N over SFT
samples, DPO, GRPO, PPO, and the raw-corpus SFT), then mean ± sd (sample sd), the worst seed and each stage's gain
over the same seed's SFT, and writes ``WORK/pipeline_outcomes.json`` (per-seed numbers, stage wall seconds, the
dedup counts, versions and the git commit). Seeds run one after another; ``--jobs`` is each pipeline's.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_outcomes import describe, portable, versions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("sft", "rm_best_of_n", "rm_weighted_best_of_n", "dpo", "grpo", "ppo", "sft_raw")
TIMED = ("sft", "sft_raw", "rm", "dpo", "grpo", "ppo")


def run_seed(seed: int, work: Path, jobs: int, extra: str, collect: bool = False) -> dict:
    out = work / f"seed{seed}"
    cmd = [sys.executable, "-m", "posttrain", "pipeline", "--preset", "tiny", "--seed", str(seed)]
    cmd += ["--jobs", str(jobs), "--quiet", "--out", str(out), *shlex.split(extra)]
    shown = portable(cmd, {work: "WORK"})  # what the record says: the same on any machine
    t0 = time.perf_counter()
    if collect:  # a finished run's summary as it is (its commit is in it), nothing re-run
        if not (out / "summary.json").is_file():
            print(f"seed {seed}: no {out / 'summary.json'}", flush=True)
            return {"failed": "missing", "command": shown}
    else:
        print("$ " + shlex.join(cmd), flush=True)
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        (work / f"seed{seed}.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            print(f"seed {seed}: failed (exit {proc.returncode}); see {work / f'seed{seed}.log'}", flush=True)
            return {"failed": proc.returncode, "command": shown}
    wall = time.perf_counter() - t0
    s = json.loads((out / "summary.json").read_text())
    dedup = s["stages"]["dedup"]["metrics"]
    return {
        "command": shown,
        "wall_seconds": wall,
        "pipeline_seconds": s.get("total_seconds"),
        "accuracy": {k: v["greedy"] for k, v in s["heldout"].items() if v.get("greedy") is not None},
        "pass@k": {k: v["pass@k"] for k, v in s["heldout"].items() if v.get("pass@k") is not None},
        "stage_seconds": {k: st["wall_s"] for k in TIMED if "wall_s" in (st := s["stages"].get(k, {}))},  # ran
        "statuses": {k: v["status"] for k, v in s["stages"].items()},
        "commit": s.get("commit"),
        "rm_pairwise_accuracy": s["stages"].get("rm", {}).get("metrics", {}).get("heldout_pairwise_accuracy"),
        "dedup_removed": {k: dedup.get(f"removed.{k}") for k in ("exact", "near", "contamination")},
    }


def aggregate(results: dict[int, dict]) -> dict:
    ok = {seed: r for seed, r in results.items() if "accuracy" in r}
    out = {}
    for p in POLICIES:
        acc = {seed: r["accuracy"][p] for seed, r in ok.items() if p in r["accuracy"]}
        row = {"accuracy": describe(acc)}
        if p != "sft":
            row["gain"] = describe({s: acc[s] - ok[s]["accuracy"]["sft"] for s in acc if "sft" in ok[s]["accuracy"]})
        out[p] = row
    out["rm_pairwise_accuracy"] = describe(
        {s: r["rm_pairwise_accuracy"] for s, r in ok.items() if r["rm_pairwise_accuracy"] is not None}
    )
    return out


def _pm(d: dict, pct: bool = False) -> str:
    if not d.get("n"):
        return "n/a"
    k, sign = (100, "+") if pct else (1, "")
    f = ".1f" if pct else ".3f"
    return f"{d['mean'] * k:{sign}{f}} ± {d['sd'] * k:{f}} (worst seed {d['worst_seed']}: {d['min'] * k:{sign}{f}})"


def print_report(results: dict[int, dict], agg: dict) -> None:
    print("\nheld-out greedy accuracy (gain over the seed's SFT, points)")
    print("seed  " + "  ".join(f"{p:>15}" for p in POLICIES) + "  RM pairwise  pipeline s")
    for seed, r in sorted(results.items()):
        if "accuracy" not in r:
            print(f"{seed:>4}  failed")
            continue
        a = r["accuracy"]
        cells = []
        for p in POLICIES:
            if p not in a:
                cells.append(f"{'–':>15}")
            elif p == "sft":
                cells.append(f"{a[p]:>15.3f}")
            else:
                cells.append(f"{a[p]:>7.3f} ({(a[p] - a['sft']) * 100:+5.1f})")
        rm = r["rm_pairwise_accuracy"]
        print(
            f"{seed:>4}  "
            + "  ".join(cells)
            + f"  {rm if rm is None else f'{rm:.3f}':>11}  {r['pipeline_seconds'] or 0:>9.0f}"
        )
    print()
    for p in POLICIES:
        row = agg[p]
        gain = f"; gain {_pm(row['gain'], pct=True)}" if "gain" in row else ""
        print(f"{p:>13}: {_pm(row['accuracy'])}{gain}")
    print(f"RM pairwise accuracy: {_pm(agg['rm_pairwise_accuracy'])}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--jobs", type=int, default=2, help="each pipeline's --jobs (results do not depend on it)")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "pipeline_seeds")
    ap.add_argument("--pipeline-args", default="", help="extra flags for every `posttrain pipeline` call")
    ap.add_argument(
        "--collect-only", action="store_true", help="read WORK/seedS/summary.json of finished runs, run nothing"
    )
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    results = {seed: run_seed(seed, args.work, args.jobs, args.pipeline_args, args.collect_only) for seed in args.seeds}
    agg = aggregate(results)
    print_report(results, agg)
    path = args.work / "pipeline_outcomes.json"
    path.write_text(json.dumps({"results": results, "aggregate": agg, "versions": versions()}, indent=1) + "\n")
    print(f"\n{path}")
    return 0 if all("accuracy" in r for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
