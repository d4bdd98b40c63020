"""SimHash (Charikar 2002): fingerprint bit i = sign(sum_f w_f * (+1 if bit i of hash(f) else -1)).

For two documents the Hamming distance of their 64-bit fingerprints grows with the angle between
their weighted feature vectors, so near-duplicates differ in few bits (Manku et al. 2007 use k = 3).
Features are the shingle hashes of :mod:`shingles`; a feature's weight is its count in the document
(or any weights given). Vectorised over a batch: the (M, 64) sign matrix is built from the bits of the
mixed hashes and summed per document with ``np.add.reduceat``.

Search: by the pigeonhole principle, two fingerprints within Hamming distance k agree exactly on at
least one of k+1 disjoint bit blocks, so documents are bucketed by each block (sort-based, as in LSH)
and bucket pairs are verified with a popcount. :func:`simhash_loop` is the per-feature Python twin.
"""

from __future__ import annotations

import numpy as np

from posttrain.data.dedup.lsh import bucket_pairs, sorted_set
from posttrain.data.dedup.shingles import fmix64, fmix64_int

U64 = np.uint64
_BITS = U64(1) << np.arange(64, dtype=U64)  # (64,)


def simhash(hashes: np.ndarray, offsets: np.ndarray, weights: np.ndarray | None = None, seed: int = 3) -> np.ndarray:
    """64-bit fingerprints (B,) uint64 from feature hashes (M,) uint64 grouped by offsets (B+1,)."""
    B = len(offsets) - 1
    out = np.zeros(B, U64)
    nz = np.flatnonzero(np.diff(offsets))
    if len(nz) == 0:
        return out
    h = fmix64(hashes, seed)  # (M,)
    w = np.ones(len(h), np.float64) if weights is None else np.asarray(weights, np.float64)
    acc = np.empty((len(nz), 64), np.float64)
    chunk = 1 << 16
    # process in row chunks aligned to documents to bound the (rows, 64) temporary
    d0 = 0
    starts = offsets[:-1]
    while d0 < len(nz):
        d1 = int(np.searchsorted(offsets[1:][nz], starts[nz[d0]] + chunk, side="right"))
        d1 = max(d1, d0 + 1)
        r0, r1 = starts[nz[d0]], offsets[nz[d1 - 1] + 1]
        bits = (h[r0:r1, None] & _BITS[None, :]) != 0  # (m, 64)
        signed = np.where(bits, w[r0:r1, None], -w[r0:r1, None])  # (m, 64)
        acc[d0:d1] = np.add.reduceat(signed, starts[nz[d0:d1]] - r0, axis=0)
        d0 = d1
    fp = ((acc > 0).astype(U64) * _BITS[None, :]).sum(1, dtype=U64)  # (B_nz,)
    out[nz] = fp
    return out


def simhash_loop(hashes, weights=None, seed: int = 3) -> int:
    """Pure-Python twin of :func:`simhash` for one document (test oracle)."""
    v = [0.0] * 64
    for n, x in enumerate(hashes):
        h = fmix64_int(int(x), seed)
        w = 1.0 if weights is None else float(weights[n])
        for i in range(64):
            v[i] += w if (h >> i) & 1 else -w
    return sum(1 << i for i in range(64) if v[i] > 0)


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bit differences of uint64 arrays (broadcast)."""
    return np.bitwise_count(np.bitwise_xor(a, b)).astype(np.int64)


def simhash_pairs(
    fps: np.ndarray, max_distance: int = 3, valid: np.ndarray | None = None, max_bucket: int = 50
) -> np.ndarray:
    """Pairs (P, 2), i < j, of fingerprints within ``max_distance`` bits (block pigeonhole search)."""
    n = len(fps)
    idx = np.arange(n) if valid is None else np.flatnonzero(valid)
    f = fps[idx]
    blocks = max_distance + 1
    edges = np.linspace(0, 64, blocks + 1).astype(int)
    enc = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        mask = U64(((1 << (hi - lo)) - 1) << lo)
        key = fmix64((f & mask) ^ U64(lo))
        p = bucket_pairs(key, max_bucket)
        if len(p):
            enc.append(idx[p[:, 0]] * n + idx[p[:, 1]])
    if not enc:
        return np.empty((0, 2), np.int64)
    u = sorted_set(np.concatenate(enc))
    pairs = np.stack([u // n, u % n], 1)
    return pairs[hamming(fps[pairs[:, 0]], fps[pairs[:, 1]]) <= max_distance]
