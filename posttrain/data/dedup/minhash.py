"""MinHash signatures: Pr[sig_A[k] == sig_B[k]] = J(A, B) = |A & B| / |A | B|   (Broder 1997).

So the fraction of equal positions of two K-long signatures is an unbiased estimate of the Jaccard
similarity with variance J(1-J)/K. Two schemes, chosen through :data:`MINHASH_SCHEMES`:

- ``oph`` (default) -- one-permutation hashing with optimal densification (Li, Owen & Zhang 2012;
  Shrivastava 2017). Each shingle is hashed once, h = fmix64(x ^ seed); its top bits pick one of K
  bins, its low 32 bits are its value; ``sig[k]`` = min value in bin k. Cost O(#shingles), not
  O(#shingles x K). An empty bin k borrows the value of bin ``src(k, t)`` for the first attempt t
  whose source bin is non-empty, with ``src`` a hash of (k, t) shared by all documents, which keeps
  Pr[equal] = J. Its variance is at most J(1-J)/K while K <= |A|/2 (sampling bins without replacement helps);
  with K near or above the set size the borrowed copies are correlated and it is larger (measured by
  ``posttrain lab minhash-variance``: 1.2-1.25x at K = 1024 on 300 shingles).
  Vectorised over a whole batch: one sort of (doc, bin, value) keys, then first-of-group.
- ``perm`` -- the textbook K permutations h_k(x) = (a_k x + b_k) mod (2^61 - 1) on 32-bit shingle
  hashes, a (M x K) matrix op with exact Mersenne reduction in uint64 (no overflow), min-reduced per
  document with ``np.minimum.reduceat``. Slower; kept as the classic scheme and as an oracle.

Each has a pure-Python loop twin (:func:`oph_signature_loop`, :func:`perm_signature_loop`) used by the
tests. Signatures are uint32 (values are 32-bit), 4 bytes per permutation per document. An empty
document gets the all-``EMPTY`` row; callers keep it out of LSH.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from posttrain.data.dedup.shingles import fmix64, fmix64_int
from posttrain.errors import ConfigError
from posttrain.hashing import GOLDEN

U64 = np.uint64
EMPTY = np.uint32(0xFFFFFFFF)
MERSENNE_61 = (1 << 61) - 1
_MASK32 = U64(0xFFFFFFFF)


def _bins(h: np.ndarray, num_perm: int) -> np.ndarray:
    """Bin of each mixed hash: ((h >> 32) * K) >> 32, Lemire's multiply-shift range reduction."""
    return (((h >> U64(32)) * U64(num_perm)) >> U64(32)).astype(np.int64)


def _dens_src(k: np.ndarray, t: int, num_perm: int, seed: int) -> np.ndarray:
    """Densification source bin for empty bins ``k`` at attempt ``t`` (same for every document)."""
    x = k.astype(U64) * U64(GOLDEN) + U64((t * 0xD1B54A32D192ED03) % (1 << 64))
    return _bins(fmix64(x, seed=seed + 1), num_perm)


def oph_signatures(hashes: np.ndarray, offsets: np.ndarray, num_perm: int = 128, seed: int = 1) -> np.ndarray:
    """One-permutation MinHash with optimal densification. hashes (M,) uint64, offsets (B+1,) -> (B, K) uint32."""
    if num_perm < 1 or num_perm > (1 << 16):
        raise ConfigError(f"num_perm={num_perm} must be in 1..65536")
    B, K = len(offsets) - 1, num_perm
    if B >= (1 << 32) // K:
        raise ConfigError(f"batch of {B} documents too large for num_perm={K}")
    h = fmix64(hashes, seed)  # (M,)
    counts = np.diff(offsets)
    doc = np.repeat(np.arange(B, dtype=np.uint64), counts)  # (M,)
    if K & (K - 1) == 0:  # K = 2^m: Lemire's bin is h >> (64 - m); fewer passes, same result
        m = K.bit_length() - 1
        comb = h >> U64(64 - m) << U64(32) if m else np.zeros_like(h)
        comb |= h & _MASK32
        comb |= doc << U64(32 + m)
    else:
        key = doc * U64(K) + _bins(h, K).astype(U64)  # (M,) cell = doc*K + bin  (< 2^32)
        comb = (key << U64(32)) | (h & _MASK32)
    comb.sort()
    cell = comb >> U64(32)
    first = np.ones(len(comb), bool)
    first[1:] = cell[1:] != cell[:-1]
    sig = np.full(B * K, EMPTY, np.uint32)  # (B*K,)
    sig[cell[first].astype(np.int64)] = (comb[first] & _MASK32).astype(np.uint32)
    sig = sig.reshape(B, K)
    filled = sig != EMPTY  # (B, K) bins that saw a shingle (a value of exactly EMPTY is ~2^-32 rare)
    nonempty_doc = filled.any(1)
    todo_d, todo_k = np.nonzero(~filled & nonempty_doc[:, None])
    t = 0
    while len(todo_d):
        src = _dens_src(todo_k, t, K, seed)
        ok = filled[todo_d, src]
        sig[todo_d[ok], todo_k[ok]] = sig[todo_d[ok], src[ok]]
        todo_d, todo_k = todo_d[~ok], todo_k[~ok]
        t += 1
    return sig


def oph_signature_loop(hashes: Sequence[int], num_perm: int = 128, seed: int = 1) -> list[int]:
    """Pure-Python twin of :func:`oph_signatures` for one document (test oracle)."""
    K = num_perm
    sig = [None] * K
    for x in hashes:
        h = fmix64_int(int(x), seed)
        b = ((h >> 32) * K) >> 32
        v = h & 0xFFFFFFFF
        if sig[b] is None or v < sig[b]:
            sig[b] = v
    if all(s is None for s in sig):
        return [int(EMPTY)] * K
    out = list(sig)
    for k in range(K):
        t = 0
        while out[k] is None:
            x = (k * GOLDEN + (t * 0xD1B54A32D192ED03)) % (1 << 64)
            src = ((fmix64_int(x, seed + 1) >> 32) * K) >> 32
            if sig[src] is not None:
                out[k] = sig[src]
            t += 1
    return out


def perm_params(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) of the K permutations, a in [1, p), b in [0, p), from a seeded generator."""
    rng = np.random.default_rng(seed)
    a = rng.integers(1, MERSENNE_61, num_perm, dtype=np.int64).astype(U64)
    b = rng.integers(0, MERSENNE_61, num_perm, dtype=np.int64).astype(U64)
    return a, b


def _mod61(v: np.ndarray) -> np.ndarray:
    """v mod (2^61 - 1) for v < 2^64, in place: (v & p) + (v >> 61), then one conditional subtract."""
    p = U64(MERSENNE_61)
    v2 = (v & p) + (v >> U64(61))
    v2[v2 >= p] -= p
    return v2


def perm_signatures(hashes: np.ndarray, offsets: np.ndarray, num_perm: int = 128, seed: int = 1) -> np.ndarray:
    """Classic K-permutation MinHash on x = low 32 bits of fmix64(h). hashes (M,), offsets (B+1,) -> (B, K) uint32.

    a*x is split as (a_hi 2^32 + a_lo) x with a_hi < 2^29: u = a_hi x < 2^61 and u 2^32 = u_hi 2^61 +
    u_lo 2^32 == u_hi + u_lo 2^32 (mod p), every term below 2^64, so the reduction is exact.
    """
    B, K = len(offsets) - 1, num_perm
    a, b = perm_params(K, seed)
    a_hi, a_lo = a >> U64(32), a & _MASK32
    x = (fmix64(hashes, seed) & _MASK32)[:, None]  # (M, 1)
    sig = np.full((B, K), EMPTY, np.uint32)
    counts = np.diff(offsets)
    nz = np.flatnonzero(counts)
    if len(x) == 0:
        return sig
    chunk = max(1, (1 << 22) // K)  # bound the (rows x K) temporaries
    starts = offsets[:-1]
    mins = np.empty((len(nz), K), U64)
    # process rows in chunks aligned to document boundaries
    d0 = 0
    while d0 < len(nz):
        d1 = d0
        while d1 < len(nz) and offsets[nz[d1] + 1] - starts[nz[d0]] <= chunk:
            d1 += 1
        d1 = max(d1, d0 + 1)
        r0, r1 = starts[nz[d0]], offsets[nz[d1 - 1] + 1]
        xx = x[r0:r1]
        u = a_hi * xx  # (m, K) < 2^61
        v = (u >> U64(29)) + ((u & U64((1 << 29) - 1)) << U64(32))  # == u * 2^32 (mod p), < 2^62
        v = _mod61(v) + _mod61(a_lo * xx)  # a*x mod p (two terms < p each)
        v = _mod61(v + b)
        mins[d0:d1] = np.minimum.reduceat(v, starts[nz[d0:d1]] - r0, axis=0)
        d0 = d1
    sig[nz] = (mins & _MASK32).astype(np.uint32)
    return sig


def perm_signature_loop(hashes: Sequence[int], num_perm: int = 128, seed: int = 1) -> list[int]:
    """Pure-Python twin of :func:`perm_signatures` for one document (big-int arithmetic, test oracle)."""
    a, b = perm_params(num_perm, seed)
    xs = [fmix64_int(int(h), seed) & 0xFFFFFFFF for h in hashes]
    if not xs:
        return [int(EMPTY)] * num_perm
    return [min((int(ak) * x + int(bk)) % MERSENNE_61 for x in xs) & 0xFFFFFFFF for ak, bk in zip(a, b)]


MINHASH_SCHEMES: dict[str, Callable[..., np.ndarray]] = {"oph": oph_signatures, "perm": perm_signatures}


def estimate_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> np.ndarray:
    """Fraction of equal positions along the last axis: (..., K), (..., K) -> (...,) float."""
    return (sig_a == sig_b).mean(-1)
