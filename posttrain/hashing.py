"""The 64-bit mixing constant the hashing code shares, defined once.

``GOLDEN = floor(2^64 / phi)`` (phi the golden ratio), an odd number: multiplying by it mod 2^64
("Fibonacci hashing", Knuth 6.4) is a bijection that spreads small integers over the top bits, and
``k * GOLDEN`` for k = 0, 1, 2, ... is SplitMix64's Weyl sequence. Used by the dedup shingle hashes,
MinHash seeds and LSH band keys (:mod:`posttrain.data.dedup`) and by the Unigram trainer's substring
hashes and hash-table slots (:mod:`posttrain.tokenizers.unigram.seeds`).

Not handled here: the hashes themselves (each module documents its own).
"""

GOLDEN = 0x9E3779B97F4A7C15
