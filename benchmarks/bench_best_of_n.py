"""Best-of-N of any reward models over a pipeline run's SFT samples, drawn exactly as the eval stage draws them.

    .venv/bin/python benchmarks/bench_best_of_n.py runs/demo runs/demo/rm/model runs/rm_other/model [--k 8]

For comparing rm-stage variants without re-running the pipeline: the SFT checkpoint of RUN samples k completions
per held-out problem with the eval stage's settings (read from its cache key, `.pipeline/eval.json`) and generator
(seeded by (seed, "sft")), so with the run's own k the SFT
row equals the run's eval row and the run's own RM gives its `rm best-of-N` number (checked on seed 0). Each RM
then picks a sample per problem by both rules, max and weighted (``pipeline.evaluate.best_of_n``), beside a
majority vote of the samples without an RM. Embedded task only.
"""

from __future__ import annotations

import argparse
import json
import zlib
from pathlib import Path

import torch

from posttrain.models.heads import weighted_best_of_n
from posttrain.pipeline.evaluate import best_of_n, evaluate_policy
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a finished `posttrain pipeline` run directory")
    ap.add_argument("rms", nargs="+", help="reward-model checkpoints (`posttrain rm` model/ directories)")
    ap.add_argument("--k", type=int, default=None, help="samples per problem (default: the run's eval samples)")
    ap.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: the run's)")
    args = ap.parse_args()
    key_file = args.run / ".pipeline" / "eval.json"
    if not key_file.is_file() or not (args.run / "sft" / "model").is_dir():
        ap.error(f"{args.run}: not a finished `posttrain pipeline` run (no {key_file} or sft/model)")  # exit 2
    key = json.loads(key_file.read_text())["fields"]  # the eval stage's cache key
    ev, seed = key["config"]["eval"], key["seed"]
    pairs = [(p.prompt, p.answer) for p in ArithmeticTask(ArithmeticConfig(**key["config"]["task"])).eval_problems()]
    k = args.k or ev["samples"]
    temperature = ev["temperature"] if args.temperature is None else args.temperature
    sample_seed = zlib.crc32(f"{seed}:sft".encode())  # as pipeline.evaluate.run_eval_stage seeds the SFT samples
    r = evaluate_policy(args.run / "sft" / "model", pairs, k, temperature, ev["max_new_tokens"], sample_seed)
    print(
        f"SFT greedy {r['greedy_accuracy']:.4f}  T={temperature}: pass@1 {r['pass@1']:.4f}  pass@{k} {r['pass@k']:.4f}"
        f"  ({len(pairs)} problems)"
    )
    flat_c = [c for row in r["samples"] for c in row]
    flat_ok = [ok for row in r["correct"] for ok in row]
    votes = weighted_best_of_n(torch.zeros(len(flat_c)), flat_c, k).tolist()  # equal scores: a majority vote
    print(f"majority vote of the {k} samples (no RM) {sum(flat_ok[i] for i in votes) / len(pairs):.4f}")
    for rm in args.rms:
        b = best_of_n(Path(rm), pairs, r["samples"], r["correct"])
        print(f"best-of-{b['N']} {b['accuracy']:.4f}  weighted {b['weighted_accuracy']:.4f}  {rm}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
