"""Exact deduplication: a 128-bit content hash per unit (document, paragraph or line), and a Bloom
filter for bounded-memory streaming.

- :func:`content_hashes` -- BLAKE2b-128 of the normalised UTF-8 text, as (n, 2) uint64; two texts
  collide with probability ~2^-128. :func:`first_occurrence` maps each row to the first identical row
  (sort-based ``np.unique``), so a cluster's representative is its first document.
- :class:`BloomFilter` -- m bits, k hash functions from two base hashes by double hashing
  (Kirsch & Mitzenmacher 2006), sized for n items at false-positive rate p:

      m = ceil(-n ln p / (ln 2)^2),   k = round(m/n ln 2)

  ``add_and_check`` answers "seen before?" for each item of a batch in order, then inserts it. A
  false positive drops a unique unit (rate <= p while at most n items were added); nothing is kept
  per item, only m/8 bytes, and no representative is known (clusters report ``null``).
- :func:`dedup_units` -- line- or paragraph-level exact dedup of one document against all units seen
  in earlier documents (a set of 16-byte digests, or a Bloom filter).
"""

from __future__ import annotations

import hashlib
import math
import re

import numpy as np

from posttrain.errors import ConfigError

U64 = np.uint64


def content_hash(text: str) -> bytes:
    """BLAKE2b-128 digest of the UTF-8 text."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def content_hashes(texts) -> np.ndarray:
    """(n, 2) uint64 digests of ``texts``."""
    buf = b"".join(content_hash(t) for t in texts)
    return np.frombuffer(buf, dtype=np.uint64).reshape(-1, 2).copy()


def first_occurrence(digests: np.ndarray) -> np.ndarray:
    """labels (n,) int64: index of the first row equal to each row. digests (n, 2) uint64."""
    if len(digests) == 0:
        return np.empty(0, np.int64)
    view = np.ascontiguousarray(digests).view(np.dtype((np.void, 16))).ravel()
    _, first, inv = np.unique(view, return_index=True, return_inverse=True)
    return first[inv.ravel()].astype(np.int64)


class BloomFilter:
    """Bit-array Bloom filter with double hashing; ``BloomFilter(capacity=10**6, fp_rate=1e-3)``."""

    def __init__(self, capacity: int, fp_rate: float = 1e-3) -> None:
        if capacity < 1:
            raise ConfigError(f"bloom capacity={capacity} must be >= 1")
        if not 0.0 < fp_rate < 1.0:
            raise ConfigError(f"bloom fp_rate={fp_rate} must be in (0, 1)")
        self.capacity, self.fp_rate = capacity, fp_rate
        self.num_bits = max(64, int(math.ceil(-capacity * math.log(fp_rate) / math.log(2) ** 2)))
        self.num_hashes = max(1, int(round(self.num_bits / capacity * math.log(2))))
        self.bits = np.zeros((self.num_bits + 63) // 64, U64)
        self.count = 0

    @property
    def nbytes(self) -> int:
        return self.bits.nbytes

    def _positions(self, digests: np.ndarray) -> np.ndarray:
        """(n, k) bit positions h1 + i*h2 mod m from the two 64-bit halves of each digest."""
        h1, h2 = digests[:, 0:1], digests[:, 1:2] | U64(1)
        i = np.arange(self.num_hashes, dtype=U64)[None, :]
        return ((h1 + i * h2) % U64(self.num_bits)).astype(np.int64)

    def add_and_check(self, digests: np.ndarray) -> np.ndarray:
        """For each digest (n, 2) in order: was it (probably) seen before? Then insert it. -> (n,) bool."""
        pos = self._positions(digests)
        seen = np.empty(len(digests), bool)
        for r in range(len(digests)):  # in order: a batch may contain its own duplicates
            p = pos[r]
            w, b = p >> 6, (p & 63).astype(U64)
            m = U64(1) << b
            seen[r] = bool(np.all(self.bits[w] & m))
            np.bitwise_or.at(self.bits, w, m)
        self.count += len(digests)
        return seen

    def contains(self, digests: np.ndarray) -> np.ndarray:
        """(n,) bool: is each digest (probably) in the filter? Inserts nothing."""
        pos = self._positions(digests)  # (n, k)
        words = self.bits[pos >> 6]
        return ((words >> (pos & 63).astype(U64)) & U64(1)).astype(bool).all(1)

    def expected_fp_rate(self) -> float:
        """(1 - e^{-k n / m})^k for the n items added so far."""
        k, n, m = self.num_hashes, self.count, self.num_bits
        return (1.0 - math.exp(-k * n / m)) ** k


_PARA_RE = re.compile(r"\n\s*\n")
UNIT_SPLITTERS = {"line": lambda text: text.split("\n"), "paragraph": lambda text: _PARA_RE.split(text)}
UNIT_JOINERS = {"line": "\n", "paragraph": "\n\n"}


def dedup_units(text: str, unit: str, seen, normalize=lambda s: s, min_chars: int = 1) -> tuple[str, int]:
    """Drop lines/paragraphs of ``text`` already in ``seen`` (a ``set`` of digests or a BloomFilter).

    Units shorter than ``min_chars`` after normalisation (blank lines, separators) are kept and never
    recorded. Returns (new text, number of units removed). ``seen`` is updated in place.
    """
    parts = UNIT_SPLITTERS[unit](text)
    kept, removed = [], 0
    for part in parts:
        norm = normalize(part)
        if len(norm.strip()) < min_chars:
            kept.append(part)
            continue
        d = content_hash(norm)
        if isinstance(seen, BloomFilter):
            dup = bool(seen.add_and_check(np.frombuffer(d, np.uint64).reshape(1, 2))[0])
        else:
            dup = d in seen
            seen.add(d)
        if dup:
            removed += 1
        else:
            kept.append(part)
    return UNIT_JOINERS[unit].join(kept), removed
