"""Dedup clustering: the per-document arrays of pass 1 -> labels (the index of each document's representative).

- MinHash: LSH band keys -> candidate pairs -> verification by estimated Jaccard, with the candidates
  within ``borderline_sd`` standard deviations of the threshold re-read and decided by exact Jaccard
  (:data:`EXACT_RECHECK`), optional semantic re-scoring, then union-find.
- SimHash: block search for fingerprints within ``hamming`` bits, then union-find.
- Exact: the first document of each digest.

Each method (:data:`CLUSTERERS`) takes (arrays, empty mask, config, stats, reread) and records what it
did in ``stats``; ``reread(indices)`` yields (index, normalised text) from the inputs. Empty documents
are never duplicates of anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from posttrain.data.dedup.exact import first_occurrence
from posttrain.data.dedup.lsh import (
    band_keys,
    borderline,
    candidate_pairs,
    exact_jaccard,
    plan_bands,
    sorted_set,
    verify_pairs,
)
from posttrain.data.dedup.shingles import SHINGLERS
from posttrain.data.dedup.simhash import simhash_pairs
from posttrain.data.dedup.unionfind import components

# which verified-by-estimate candidates are re-decided by exact Jaccard (re-reading those documents):
# est (P,), threshold, K, z -> mask (P,)
EXACT_RECHECK: dict[str, Callable[[np.ndarray, float, int, float], np.ndarray]] = {
    "estimate": lambda est, t, k, z: np.zeros(len(est), bool),
    "borderline": borderline,
    "exact": lambda est, t, k, z: np.ones(len(est), bool),
}


# ---------------------------------------------------------------------------------------------
# clustering methods: arrays -> labels (index of each document's representative)


def _minhash_labels(sig: np.ndarray, empty: np.ndarray, cfg, stats: dict, reread) -> np.ndarray:
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
        for s0, s1 in pair_chunks(sub, EXACT_MAX_DOCS):  # one re-read per chunk bounds the shingle sets held
            exact[s0:s1] = exact_jaccard(_shingle_sets(reread, sub[s0:s1], cfg), sub[s0:s1])
        exact_ok = exact >= cfg.threshold
        stats["exact_flipped"] = {
            "accepted": int((exact_ok & ~ok[recheck]).sum()),
            "rejected": int((~exact_ok & ok[recheck]).sum()),
        }
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


def pair_chunks(pairs: np.ndarray, max_docs: int) -> list[tuple[int, int]]:
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


def _shingle_sets(reread, pairs: np.ndarray, cfg, batch: int = 256) -> dict[int, np.ndarray]:
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


def _simhash_labels(fps: np.ndarray, empty: np.ndarray, cfg, stats: dict, reread) -> np.ndarray:
    t = time.perf_counter()
    pairs = simhash_pairs(fps, cfg.hamming, valid=~empty, max_bucket=cfg.max_bucket)
    stats["verified_pairs"] = int(len(pairs))
    stats["index_bytes_per_doc"] = {"fingerprints": 8}
    stats["time_s"]["simhash_search"] = round(time.perf_counter() - t, 4)
    return components(len(fps), pairs)


def _exact_labels(digests: np.ndarray, empty: np.ndarray, cfg, stats: dict, reread) -> np.ndarray:
    labels = np.arange(len(digests), dtype=np.int64)
    valid = np.flatnonzero(~empty)
    labels[valid] = valid[first_occurrence(digests[valid])]
    stats["index_bytes_per_doc"] = {"digests": 16}
    return labels


CLUSTERERS = {"minhash": _minhash_labels, "simhash": _simhash_labels, "exact": _exact_labels}
