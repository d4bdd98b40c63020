"""Reward-model held-out pairwise accuracy against the number of training pairs, over seeds (mean ± sd).

For every seed S, exactly the CLI a user runs::

    posttrain sft --preset tiny --seed S --out WORK/seedS/sft                     (the policy the pairs come from)
    posttrain rm  --preset tiny --seed S --pairs.seed S --init WORK/seedS/sft --out WORK/seedS/rm_all

The second is the default recipe: on-policy samples of the SFT model on all training-split prompts, labelled by
the verifier (``posttrain rm --help``: ``--pairs.*``), held-out pairs from the task's held-out split. Then, for each
``--prompts K``, the same command on the pairs of the first K of those prompts only (``--data`` a subset of
``rm_all/pairs.jsonl``, ``--eval-data rm_all/eval_pairs.jsonl``: the same held-out pairs, the same steps), so the
table isolates the number of training pairs. Each run's ``summary.json`` gives ``heldout_pairwise_accuracy`` and
``train_pairs``; the table and every per-seed number go to ``WORK/bench_rm.json``. No number is hand-entered.

    .venv/bin/python benchmarks/bench_rm.py --seeds 0 1 2 --prompts 1000 3000 --work runs/bench_rm
    .venv/bin/python benchmarks/bench_rm.py --seeds 0 --prompts 250 --rm-args "--steps 500"          (a quick look)

``--reuse`` (default on) keeps a run whose directory has a ``summary.json`` and the same recorded command.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _util import print_table  # noqa: E402


def posttrain(args: list[str], out: Path, reuse: bool) -> dict:
    """Run ``python -m posttrain ARGS --out OUT`` (threads 1, no bar) unless reusable; return its summary."""
    cmd = [sys.executable, "-m", "posttrain", *args, "--out", str(out), "--threads", "1", "--progress", "false"]
    stamp = out / "bench_cmd.txt"
    if reuse and (out / "summary.json").is_file() and stamp.is_file() and stamp.read_text() == shlex.join(cmd[1:]):
        print(f"reuse {out}", flush=True)
        return json.loads((out / "summary.json").read_text())
    print(f"$ {shlex.join(cmd[1:])}", flush=True)
    t0 = time.perf_counter()
    log = out.with_suffix(".log")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        rc = subprocess.call(
            [*cmd, "--overwrite"] if out.exists() else cmd,
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    if rc:
        raise SystemExit(f"failed (exit {rc}): see {log}")
    stamp.write_text(shlex.join(cmd[1:]))
    s = json.loads((out / "summary.json").read_text())
    s["bench_wall_seconds"] = time.perf_counter() - t0
    return s


def first_prompts(pairs_file: Path, k: int, dest: Path) -> int:
    """The pairs of the first ``k`` distinct prompts of ``pairs_file`` (the sampler's random prompt order) -> dest."""
    keep, seen = [], set()
    for line in pairs_file.read_text().splitlines():
        p = json.loads(line)["prompt"]
        if p not in seen and len(seen) == k:
            break
        seen.add(p)
        keep.append(line)
    dest.write_text("\n".join(keep) + "\n")
    return len(keep)


def mean_sd(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--prompts", type=int, nargs="*", default=[1000, 3000], help="subset sizes (training prompts)")
    ap.add_argument("--work", default="runs/bench_rm")
    ap.add_argument("--sft-args", default="", help="extra flags for posttrain sft")
    ap.add_argument("--rm-args", default="", help="extra flags for every posttrain rm run")
    ap.add_argument("--no-reuse", action="store_true")
    a = ap.parse_args()
    work, reuse = Path(a.work).resolve(), not a.no_reuse
    per_seed: dict[int, dict] = {}
    runs: dict[int, dict] = {}
    for seed in a.seeds:  # first the default recipe on every seed, then the subsets (the table's smaller rows)
        d = work / f"seed{seed}"
        sft = posttrain(["sft", "--preset", "tiny", "--seed", str(seed), *shlex.split(a.sft_args)], d / "sft", reuse)
        base = [
            "rm",
            "--preset",
            "tiny",
            "--seed",
            str(seed),
            "--pairs.seed",
            str(seed),
            "--init",
            str(d / "sft"),
            *shlex.split(a.rm_args),
        ]
        runs[seed] = {"sft": sft, "base": base, "rows": {"all": posttrain(base, d / "rm_all", reuse)}}
    for k in a.prompts:
        for seed in a.seeds:
            d, base = work / f"seed{seed}", runs[seed]["base"]
            data = d / f"pairs_first{k}.jsonl"
            first_prompts(d / "rm_all" / "pairs.jsonl", k, data)
            runs[seed]["rows"][str(k)] = posttrain(
                [*base, "--data", str(data), "--eval-data", str(d / "rm_all" / "eval_pairs.jsonl")],
                d / f"rm_first{k}",
                reuse,
            )
    for seed in a.seeds:
        full = runs[seed]["rows"]["all"]
        per_seed[seed] = {
            "sft_heldout_accuracy": runs[seed]["sft"]["heldout_accuracy"],
            "pair_info": full.get("pairs"),
            **{
                name: {
                    "train_pairs": s["train_pairs"],
                    "heldout_pairs": s["heldout_pairs"],
                    "heldout_pairwise_accuracy": s["heldout_pairwise_accuracy"],
                    "train_seconds": s["train_seconds"],
                }
                for name, s in runs[seed]["rows"].items()
            },
        }
    names = [str(k) for k in a.prompts] + ["all"]
    table = []
    for name in names:
        accs = [per_seed[s][name]["heldout_pairwise_accuracy"] for s in a.seeds]
        pairs = [per_seed[s][name]["train_pairs"] for s in a.seeds]
        table.append(
            [
                name,
                f"{statistics.mean(pairs):.0f}",
                mean_sd(accs),
                f"{min(accs):.3f}",
                " ".join(f"{x:.3f}" for x in accs),
                f"{statistics.mean(per_seed[s][name]['train_seconds'] for s in a.seeds):.0f}",
            ]
        )
    print(
        f"\nheld-out pairwise accuracy ({per_seed[a.seeds[0]]['all']['heldout_pairs']} held-out pairs for seed "
        f"{a.seeds[0]}), seeds {a.seeds}:"
    )
    print_table(["training prompts", "train pairs (mean)", "accuracy mean ± sd", "worst", "per seed", "train s"], table)
    print(
        "SFT held-out greedy accuracy per seed: "
        + " ".join(f"{per_seed[s]['sft_heldout_accuracy']:.3f}" for s in a.seeds)
    )
    out = {
        "seeds": a.seeds,
        "table": [
            dict(zip(["prompts", "train_pairs_mean", "accuracy", "worst", "per_seed", "train_seconds_mean"], r))
            for r in table
        ],
        "per_seed": per_seed,
        "rm_args": a.rm_args,
        "sft_args": a.sft_args,
        "python": sys.version.split()[0],
    }
    (work / "bench_rm.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {work / 'bench_rm.json'}")


if __name__ == "__main__":
    main()
