"""How well does validation accuracy rank SFT restarts? Every restart of a sweep, rescored on N validation problems.

For each seed's ``WORK/seedS/sft/restarts/K`` (a ``benchmarks/bench_outcomes.py`` sweep with ``posttrain sft
--restarts R``) it scores the restart's ``model/`` greedily on the first N of ``sft_restarts.validation_problems``
(training-split problems that are not demonstrations) for each ``--val-problems`` N, reads its held-out accuracy
from its ``summary.json``, and prints per seed which restart each N would keep and that restart's held-out accuracy
against the best restart's (the oracle, which selection may not look at). ``--extra DIR`` adds more restarts
(``DIR/seedS/restarts/K``, e.g. plain ``posttrain sft --seed restart_seed(S, K)`` runs) to the candidates.

    .venv/bin/python benchmarks/bench_restarts.py --work runs/outcomes --val-problems 256 1024 --out restarts.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    import torch

    from posttrain.checkpoints.load import load_checkpoint
    from posttrain.evaluation import evaluate
    from posttrain.trainers.sft import SFTConfig
    from posttrain.trainers.sft_restarts import validation_problems

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True, help="a bench_outcomes.py work directory of an sft --restarts sweep")
    ap.add_argument("--extra", help="more restarts: DIR/seedS/restarts/K run directories")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--val-problems", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--out", help="write the table as JSON here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    val = validation_problems(SFTConfig(val_problems=max(args.val_problems)))
    table = {}
    for s in args.seeds:
        dirs = sorted(Path(args.work, f"seed{s}", "sft", "restarts").glob("*"))
        if args.extra:
            dirs += sorted(Path(args.extra, f"seed{s}", "restarts").glob("*"))
        rows = []
        for d in dirs:
            if not (d / "summary.json").is_file():
                continue
            ck = load_checkpoint(d / "model")
            row = {
                "restart": int(d.name),
                "dir": str(d),
                "heldout": json.loads((d / "summary.json").read_text())["heldout_accuracy"],
            }
            for n in args.val_problems:
                ps = val[:n]
                row[f"val{n}"] = evaluate(
                    ck.model, ck.tokenizer, [p for p, _ in ps], [a for _, a in ps], max_new_tokens=8
                ).accuracy
            rows.append(row)
        if not rows:
            continue
        oracle = max(r["heldout"] for r in rows)
        picks = {n: max(rows, key=lambda r: (r[f"val{n}"], -r["restart"])) for n in args.val_problems}
        table[s] = {
            "candidates": rows,
            "oracle_heldout": oracle,
            "kept": {n: {"restart": p["restart"], "heldout": p["heldout"]} for n, p in picks.items()},
        }
        cells = "  ".join(f"N={n}: restart {p['restart']} ({p['heldout']:.3f})" for n, p in picks.items())
        print(f"seed {s}: {len(rows)} restarts, best held-out {oracle:.3f}; kept  {cells}")
        for r in rows:
            print(
                "    restart {restart}: held-out {heldout:.3f}  ".format(**r)
                + "  ".join(f"val{n} {r[f'val{n}']:.3f}" for n in args.val_problems)
            )
    if args.out:
        Path(args.out).write_text(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
