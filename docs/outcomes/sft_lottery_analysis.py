"""Which successive-halving rule to use for `sft --preset tiny`: replayed on 60 single SFT runs.

    .venv/bin/python docs/outcomes/sft_lottery_analysis.py > docs/outcomes/sft_lottery_analysis.txt

Input (sft_restarts60_seeds0_4.jsonl): for seeds 0-4, restarts k = 0..11, one line per run of
`posttrain sft --preset single --seed restart_seed(S, k) --save-every 100 --keep-checkpoints 10`, with the greedy
accuracy on the restarts' 1024 validation problems (training split, not demonstrations) at steps 100..600 and the
held-out accuracy at step 600. A rule (R restarts, probe step P, keep K) keeps, per seed, the best at step 600
among the K best at step P of restarts 0..R-1, exactly as `sft_restarts.train_restarts` does (ties: the earliest
restart); its cost is R*P + K*(600 - P) steps, in runs of 600 steps.
"""

import json
import statistics
from pathlib import Path

rows = [json.loads(line) for line in (Path(__file__).parent / "sft_restarts60_seeds0_4.jsonl").open()]
runs: dict[int, dict[int, dict]] = {}
for r in rows:
    runs.setdefault(r["seed"], {})[r["k"]] = r
seeds = sorted(runs)


def kept(cands: list[dict], probe: int, keep: int) -> dict:
    if probe < 600:
        cands = sorted(cands, key=lambda r: (-r["val"][str(probe)], r["k"]))[:keep]
    return max(cands, key=lambda r: (r["val"]["600"], -r["k"]))


print("single runs, held-out accuracy at step 600 (restart 0..11):")
for s in seeds:
    print(f"  seed {s}: " + " ".join(f"{runs[s][k]['heldout']:.3f}" for k in sorted(runs[s])))
print("\nrule                 cost   " + "  ".join(f"seed {s}" for s in seeds) + "   mean ± sd       worst")
for restarts in (3, 5, 8, 10, 12):
    for probe in (200, 300, 400, 600):
        for keep in (1, 2) if probe < 600 else (restarts,):
            held = [kept([runs[s][k] for k in range(restarts)], probe, keep)["heldout"] for s in seeds]
            cost = (restarts * probe + keep * (600 - probe)) / 600
            name = f"R{restarts} P{probe} K{keep}" if probe < 600 else f"R{restarts} full"
            print(
                f"{name:20s} {cost:5.2f}   "
                + "  ".join(f"{h:.3f} " for h in held)
                + f"  {statistics.mean(held):.3f} ± {statistics.stdev(held):.3f}  {min(held):.3f}"
            )
