"""The 64-bit mixing constant the hashing code shares, defined once.

``GOLDEN = floor(2^64 / phi)`` (phi the golden ratio), an odd number: multiplying by it mod 2^64
("Fibonacci hashing", Knuth 6.4) is a bijection that spreads small integers over the top bits, and
``k * GOLDEN`` for k = 0, 1, 2, ... is SplitMix64's Weyl sequence. Used by the dedup shingle hashes,
MinHash seeds and LSH band keys (:mod:`posttrain.data.dedup`) and by the Unigram trainer's substring
hashes and hash-table slots (:mod:`posttrain.tokenizers.unigram.seeds`).

:func:`stable_fraction` is the other shared piece: a text's place in [0, 1), for splits that must not depend on
seed, order or machine (the embedded task's held-out problems, SFT's validation demonstrations, the held-out
slice of a user's ``--data``).

Not handled here: the hashes themselves (each module documents its own).
"""

import hashlib

GOLDEN = 0x9E3779B97F4A7C15


def stable_fraction(text: str) -> float:
    """A number in [0, 1) fixed by ``text`` alone (blake2b), identical on every machine and process."""
    h = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64
