"""``posttrain dedup INPUT... --output OUT``: near-duplicate removal (MinHash/SimHash/exact), line or
paragraph dedup and a contamination check in one streaming command. The config flags are generated from
:class:`posttrain.data.dedup.run.DedupConfig` (one per field, its help, choices and bounds), as the
trainers' are; a bool field is a switch (``--bloom``, ``--no-progress``) and a tuple takes several values
(``--contamination A.jsonl B.jsonl``). Only the paths (inputs, ``--output``, ``--clusters``, ``--stats``)
are written here."""

from __future__ import annotations

import argparse
import sys

from posttrain.config import add_config_flags, build_config, overrides_from_args
from posttrain.data.io import sidecar

NAME = "dedup"
HELP = "remove near-duplicate documents (MinHash+LSH, SimHash, exact) and check benchmark contamination"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from posttrain.data.dedup.run import DedupConfig

    p.add_argument("inputs", nargs="+", metavar="INPUT", help="JSONL or Parquet files (read in order)")
    p.add_argument("--output", "-o", required=True, help="kept documents, in the input's format (.jsonl or .parquet)")
    p.add_argument("--clusters", metavar="FILE", help="write one {id, representative} line per input document")
    p.add_argument(
        "--stats",
        metavar="FILE",
        help="write the stats JSON (default: OUTPUT.stats.json; none when OUTPUT is - or a device)",
    )
    add_config_flags(p, DedupConfig, switches=True, title="DedupConfig fields")


def run(args: argparse.Namespace) -> int:
    from posttrain.data.dedup.run import DedupConfig, dedup

    cfg = build_config(DedupConfig, overrides=overrides_from_args(args))
    stats_path = args.stats or sidecar(args.output, ".stats.json")  # none beside stdout or a device
    s = dedup(args.inputs, args.output, cfg, clusters=args.clusters, stats_path=stats_path)
    if s["documents_in"] == 0:
        print(
            f"posttrain dedup: warning: no documents in {', '.join(map(str, args.inputs))} "
            f"(empty input{' or every line rejected' if s['bad_lines'] else ''}); wrote an empty {args.output}",
            file=sys.stderr,
        )
    removed = ", ".join(f"{k}={v}" for k, v in s["removed"].items())
    print(
        f"documents in: {s['documents_in']}  kept: {s['kept']}  removed: {removed}  bad lines: {s['bad_lines']}  "
        f"empty: {s['empty_documents']}"
    )
    if "lsh" in s:
        print(
            f"LSH: b={s['lsh']['bands']} r={s['lsh']['rows']} ({'auto' if s['lsh']['auto'] else 'given'}), "
            f"candidates {s['candidate_pairs']}, verified {s.get('verified_pairs_exact', s['verified_pairs'])}"
            + (f" ({s['exact_checked_pairs']} by exact Jaccard)" if "exact_checked_pairs" in s else "")
            + ", "
            f"index {s['index_bytes_per_doc']['total_peak']} B/doc"
        )
    if "contamination" in s:
        c = s["contamination"]
        print(
            f"contamination ({c['ngram']}-gram): {c['contaminated_eval_items']}/{c['eval_items']} eval items, "
            f"{c['contaminated_training_docs']} training docs"
        )
    print(f"time {s['time_s']['total']:.2f}s ({s['docs_per_s']} docs/s)")
    print(f"kept -> {args.output}")
    if args.clusters:
        print(f"clusters -> {args.clusters}")
    if stats_path is not None:
        print(f"stats -> {stats_path}")
    if s.get("rejects"):
        print(f"rejects -> {s['rejects']}")
    return 0
