import json
import statistics
import sys
from pathlib import Path

import torch

from posttrain.checkpoints.load import load_checkpoint
from posttrain.config import build_config
from posttrain.evaluation import evaluate
from posttrain.trainers.sft import PRESETS, SFTConfig
from posttrain.trainers.sft_restarts import validation_problems

torch.set_num_threads(1)
cfg = build_config(SFTConfig, PRESETS["tiny"])
val = validation_problems(cfg)
P, A = [p for p, _ in val], [a for _, a in val]
cache = Path("/tmp/sh/scores.json")
scores = json.loads(cache.read_text()) if cache.exists() else {}
def d(s, k):
    return Path(f"/tmp/s13/final/seed{s}/sft/restarts/{k}") if k < 3 else Path(f"/tmp/sh/seed{s}/{k}")
def sc(path):
    key = str(path)
    if key not in scores:
        ck = load_checkpoint(path)
        scores[key] = evaluate(ck.model, ck.tokenizer, P, A, max_new_tokens=8).accuracy
        cache.write_text(json.dumps(scores))
    return scores[key]
seeds = [int(x) for x in sys.argv[1:]] or [0,1,2,3,4]
R = {}
for s in seeds:
    rows = []
    for k in range(6):
        dd = d(s, k)
        if not (dd / "summary.json").exists():
            continue
        summ = json.loads((dd / "summary.json").read_text())
        rows.append({"k": k, "held": summ["heldout_accuracy"], "vfin": sc(dd / "model"),
                     "v400": sc(dd / "checkpoints/step-00000400"),
                     "v300": sc(dd / "checkpoints/step-00000300") if (dd / "checkpoints/step-00000300").exists() else None})
    R[s] = rows
    print(s, [(r["k"], round(r["held"],3), round(r["vfin"],3), round(r["v400"],3), r["v300"] and round(r["v300"],3)) for r in rows])
def pick(rows, n, probe=None, keep=1):
    c = [r for r in rows if r["k"] < n]
    if probe:
        c = sorted(c, key=lambda r: (-r[probe], r["k"]))[:keep]
    return max(c, key=lambda r: (r["vfin"], -r["k"]))["held"]
rules = {"R3 full (now; 3 runs)": (3, None, 1, 3), "R4 full (4 runs)": (4, None, 1, 4), "R6 full (6 runs)": (6, None, 1, 6),
         "R4 probe400 keep1 (3.0 runs)": (4, "v400", 1, 3.0), "R5 probe400 keep1 (3.67)": (5, "v400", 1, 3.67),
         "R6 probe400 keep1 (4.33)": (6, "v400", 1, 4.33), "R6 probe400 keep2 (4.67)": (6, "v400", 2, 4.67)}
for name, (n, probe, keep, cost) in rules.items():
    vals = {s: pick(R[s], n, probe, keep) for s in R if len(R[s]) >= n}
    if len(vals) < 2: continue
    xs = list(vals.values())
    w = min(vals, key=vals.get)
    print(f"{name:32s} " + " ".join(f"{vals[s]:.3f}" for s in sorted(vals)) + f"  mean {statistics.fmean(xs):.3f} sd {statistics.stdev(xs):.3f} worst {w}: {vals[w]:.3f}")
