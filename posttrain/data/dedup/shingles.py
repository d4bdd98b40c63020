"""Normalisation and shingling, vectorised over a batch of documents.

Key insight: a polynomial hash of a substring can be read off prefix sums, so *every* k-gram of a
whole batch is hashed with a handful of numpy passes and no Python loop per shingle::

    G[i]        = sum_{j<i} c_j * P^j                       (mod 2^64, c_j = code point j of the batch)
    hash(s, L)  = (G[s+L] - G[s]) * P^{-s} + L * GOLDEN     (mod 2^64)  = sum_{t<L} c_{s+t} P^t + ...

P is odd, so P^{-1} exists mod 2^64 and the hash of a substring does not depend on where it sits.
The raw polynomial hash is *not* well mixed (its low bits depend only on the low bits of the code
points); every consumer (MinHash, SimHash, exact, contamination) passes it through :func:`fmix64`
with its own seed. All arithmetic is numpy uint64 with wrap-around, so hashes are identical across
processes, runs and machines (unlike Python's salted ``hash()``).

Shingle kinds:
- ``char``: character k-grams (default k=5) of the normalised text. A non-empty text shorter than k
  gives one shingle, the whole text.
- ``word``: n-grams of whitespace-separated words (after normalisation; punctuation stays part of a
  word unless the ``punct`` step removed it). Fewer than n words gives one shingle of all words.
An empty text gives no shingles; callers report it.

Not handled here: language-aware word segmentation (CJK text should use ``char`` shingles).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence

import numpy as np

from posttrain.errors import ConfigError
from posttrain.hashing import GOLDEN

U64 = np.uint64
P = 0x100000001B3 * 0x9E3779B1 | 1  # odd multiplier of the polynomial hash (FNV prime x golden ratio)
P = P % (1 << 64)
P_INV = pow(P, -1, 1 << 64)

# --------------------------------------------------------------------------------------------
# normalisation: named steps in a visible dict, applied in the order given

_PUNCT_RE = re.compile(r"[^\w\s]", re.UNICODE)

NORMALIZERS: dict[str, Callable[[str], str]] = {
    "nfkc": lambda s: unicodedata.normalize("NFKC", s),
    "lower": str.lower,
    "punct": lambda s: _PUNCT_RE.sub(" ", s),  # punctuation -> space, so "a,b" is two words
    "whitespace": lambda s: " ".join(s.split()),  # str.split() splits on the same Unicode whitespace as \s
}
DEFAULT_NORMALIZE = ("nfkc", "lower", "whitespace")


def parse_normalize(spec: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"nfkc,lower"`` -> ``("nfkc", "lower")``; ``""``/``"none"`` -> ``()``; unknown step -> ConfigError."""
    if spec is None:
        return DEFAULT_NORMALIZE
    steps = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    steps = [s for s in steps if s and s != "none"]
    for s in steps:
        if s not in NORMALIZERS:
            raise ConfigError(f"normalize step {s!r} is not valid; choose from: {', '.join(NORMALIZERS)}")
    return tuple(steps)


def normalize(text: str, steps: Sequence[str] = DEFAULT_NORMALIZE) -> str:
    """Apply the named steps in order: ``normalize(" A\\tB ", ["lower", "whitespace"]) -> "a b"``."""
    for s in steps:
        text = NORMALIZERS[s](text)
    return text


# --------------------------------------------------------------------------------------------
# hashing primitives


def fmix64(x: np.ndarray, seed: int = 0) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser of ``x ^ seed_key`` (a bijection on uint64; new array)."""
    seed_key = U64((GOLDEN * (2 * seed + 1)) % (1 << 64))
    x = np.bitwise_xor(x, seed_key)
    x ^= x >> U64(33)
    x *= U64(0xFF51AFD7ED558CCD)
    x ^= x >> U64(33)
    x *= U64(0xC4CEB9FE1A85EC53)
    x ^= x >> U64(33)
    return x


def fmix64_int(x: int, seed: int = 0) -> int:
    """Pure-Python twin of :func:`fmix64` for one integer (test oracle)."""
    m = (1 << 64) - 1
    x = (x ^ (GOLDEN * (2 * seed + 1))) & m
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & m
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & m
    x ^= x >> 33
    return x


class _Powers:
    """Cached tables P^i and P^{-i} (mod 2^64), grown on demand."""

    def __init__(self) -> None:
        self.pw = np.ones(1, U64)
        self.pinv = np.ones(1, U64)

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.pw) < n:
            m = -(-n // 65536) * 65536  # grow to the next multiple of 64k entries, not 2x
            pw = np.full(m, P, U64)
            pw[0] = 1
            pinv = np.full(m, P_INV, U64)
            pinv[0] = 1
            self.pw, self.pinv = np.cumprod(pw, dtype=U64), np.cumprod(pinv, dtype=U64)
        return self.pw[:n], self.pinv[:n]


_POWERS = _Powers()


def substring_hashes(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray | int) -> np.ndarray:
    """Raw polynomial hash of ``values[s:s+L]`` for each (s, L): ``sum_t values[s+t] P^t + L*GOLDEN``.

    ``values`` (N,) uint64; ``starts`` (M,) int64; returns (M,) uint64. Worked example: for values
    [3, 5] the hash of (0, 2) is 3 + 5P + 2*GOLDEN (mod 2^64), equal to the hash of (1, 2) in [9, 3, 5].
    """
    n = len(values)
    pw, pinv = _POWERS.get(n + 1)
    g = np.empty(n + 1, U64)  # (N+1,) prefix sums G
    g[0] = 0
    np.cumsum(values * pw[:n], dtype=U64, out=g[1:])
    h = g[starts + lengths] - g[starts]  # (M,)
    h *= pinv[starts]
    h += np.asarray(lengths, dtype=U64) * U64(GOLDEN)
    return h


def substring_hash_int(values: Sequence[int]) -> int:
    """Pure-Python twin of :func:`substring_hashes` for one whole sequence (test oracle)."""
    m = (1 << 64) - 1
    h, p = 0, 1
    for v in values:
        h = (h + v * p) & m
        p = (p * P) & m
    return (h + len(values) * GOLDEN) & m


# --------------------------------------------------------------------------------------------
# batched shingling


def _codepoints(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated code points (N,) uint64 and document offsets (B+1,) int64."""
    lens = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
    offsets = np.zeros(len(texts) + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    cp = np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32).astype(U64)
    return cp, offsets


def ngram_hashes(values: np.ndarray, offsets: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Raw hashes of all length-k windows inside each segment ``values[offsets[i]:offsets[i+1]]``.

    Returns ``(hashes (M,) uint64, first (B+1,) int64)``. A non-empty segment shorter than k gets one
    window of its full length; an empty one gets none. Contiguous slices, no per-window gather:
    ``h = (G[k:] - G[:-k]) * P^{-pos}`` for every position, then windows crossing a boundary are masked.
    """
    n, B = len(values), len(offsets) - 1
    lens = np.diff(offsets)  # (B,)
    counts = np.where(lens >= k, lens - k + 1, np.minimum(lens, 1))  # (B,)
    first = np.zeros(B + 1, np.int64)
    np.cumsum(counts, out=first[1:])
    long_ = lens >= k
    if n >= k:
        pw, pinv = _POWERS.get(n + 1)
        g = np.empty(n + 1, U64)  # (N+1,) prefix sums
        g[0] = 0
        np.cumsum(values * pw[:n], dtype=U64, out=g[1:])
        h_all = g[k:] - g[:-k]  # (N-k+1,) window at each start position
        h_all *= pinv[: n - k + 1]
        h_all += U64((k * GOLDEN) % (1 << 64))
        if k > 1:  # drop windows that cross a segment end: starts in (end-k, end)
            valid = np.ones(n - k + 1, bool)
            bad = (offsets[1:][long_, None] - np.arange(1, k)[None, :]).ravel()  # (B_long*(k-1),)
            valid[bad[bad < n - k + 1]] = False
            short_ends = offsets[1:][~long_ & (lens > 0)]
            for j in range(1, k):  # positions inside short segments
                pos = short_ends - j
                pos = pos[(pos >= offsets[:-1][~long_ & (lens > 0)]) & (pos < n - k + 1)]
                valid[pos] = False
            h_long = h_all[valid]
        else:
            h_long = h_all
    else:
        h_long = np.empty(0, U64)
    short = ~long_ & (lens > 0)
    if not short.any():
        return h_long, first
    out = np.empty(int(first[-1]), U64)
    out[np.repeat(long_, counts)] = h_long
    out[first[:-1][short]] = substring_hashes(values, offsets[:-1][short], lens[short])
    return out, first


_WHITESPACE = np.array([i for i in range(0x3001) if chr(i).isspace()], dtype=U64)


def char_shingles(texts: Sequence[str], k: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Raw hashes of all character k-grams: ``(hashes (M,) uint64, offsets (B+1,) int64)``.

    Document ``i``'s shingles are ``hashes[offsets[i]:offsets[i+1]]`` (with repeats; MinHash is a
    set statistic so repeats do not matter).
    """
    if k < 1:
        raise ConfigError(f"ngram={k} must be >= 1")
    cp, doc_off = _codepoints(texts)
    return ngram_hashes(cp, doc_off, k)


def _words(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Raw hash of every whitespace-separated word (W,) and per-document word offsets (B+1,)."""
    cp, doc_off = _codepoints(texts)
    n = len(cp)
    is_ws = np.isin(cp, _WHITESPACE)
    # a word starts at a non-space position whose predecessor is a space or a document start
    prev_ws = np.ones(n, bool)
    prev_ws[1:] = is_ws[:-1]
    prev_ws[doc_off[:-1][doc_off[:-1] < n]] = True
    next_ws = np.ones(n, bool)
    next_ws[:-1] = is_ws[1:]
    next_ws[doc_off[1:][doc_off[1:] > 0] - 1] = True
    wstart = np.flatnonzero(~is_ws & prev_ws)
    wend = np.flatnonzero(~is_ws & next_ws) + 1
    whash = fmix64(substring_hashes(cp, wstart, wend - wstart), seed=7)  # mixed: word ids
    word_off = np.searchsorted(wstart, doc_off).astype(np.int64)
    return whash, word_off


def word_shingles(texts: Sequence[str], n: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Raw hashes of all word n-grams: ``(hashes (M,) uint64, offsets (B+1,) int64)``."""
    if n < 1:
        raise ConfigError(f"ngram={n} must be >= 1")
    whash, word_off = _words(texts)
    return ngram_hashes(whash, word_off, n)


SHINGLERS: dict[str, Callable[[Sequence[str], int], tuple[np.ndarray, np.ndarray]]] = {
    "char": char_shingles,
    "word": word_shingles,
}


def shingle_strings(text: str, k: int = 5, kind: str = "char") -> set[str]:
    """The shingle *strings* of one text (slow twin, used for exact Jaccard and by the benchmark peers)."""
    if kind == "char":
        if not text:
            return set()
        if len(text) < k:
            return {text}
        return {text[i : i + k] for i in range(len(text) - k + 1)}
    words = text.split()
    if not words:
        return set()
    if len(words) < k:
        return {" ".join(words)}
    return {" ".join(words[i : i + k]) for i in range(len(words) - k + 1)}


def jaccard(a: set, b: set) -> float:
    """Exact Jaccard |a & b| / |a | b| (1.0 for two empty sets)."""
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)
