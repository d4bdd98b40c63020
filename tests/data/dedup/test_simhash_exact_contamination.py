"""SimHash vs its loop twin and brute-force Hamming search; exact/Bloom; contamination vs brute force."""

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.data.dedup.contamination import build_eval_index, check_batch
from posttrain.data.dedup.exact import BloomFilter, content_hashes, dedup_units, first_occurrence
from posttrain.data.dedup.shingles import normalize
from posttrain.data.dedup.simhash import hamming, simhash, simhash_loop, simhash_pairs


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**64 - 1), max_size=30), min_size=1, max_size=4))
def test_simhash_equals_loop(docs):
    off = np.cumsum([0] + [len(d) for d in docs])
    fp = simhash(np.array([x for d in docs for x in d], np.uint64), off)
    assert fp.tolist() == [simhash_loop(d) if d else 0 for d in docs]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=6), st.integers(0, 2**32), st.integers(0, 4))
def test_simhash_pairs_vs_brute_force(bases, seed, k):
    rng = np.random.default_rng(seed)
    fps = []
    for b in bases:  # each base plus a few copies with 0..5 flipped bits
        for _ in range(3):
            flips = rng.choice(64, rng.integers(0, 6), replace=False)
            fps.append(b ^ int(sum(1 << int(f) for f in flips)))
    fps = np.array(fps, np.uint64)
    got = {tuple(p) for p in simhash_pairs(fps, k).tolist()}
    want = {(i, j) for i, j in itertools.combinations(range(len(fps)), 2) if hamming(fps[i], fps[j]) <= k}
    assert got == want


def test_first_occurrence_and_bloom():
    texts = ["a", "b", "a", "c", "b", "a"]
    assert first_occurrence(content_hashes(texts)).tolist() == [0, 1, 0, 3, 1, 0]
    bf = BloomFilter(capacity=1000, fp_rate=0.01)
    assert bf.add_and_check(content_hashes(texts)).tolist() == [False, False, True, False, True, True]
    # no false negatives; false-positive rate near the target at capacity
    d = content_hashes([f"doc {i}" for i in range(1000)])
    bf2 = BloomFilter(capacity=1000, fp_rate=0.01)
    first = bf2.add_and_check(d)
    assert first.mean() < 0.01  # only false positives against earlier items
    assert bf2.contains(d).all()
    assert abs(bf2.expected_fp_rate() - 0.01) < 0.003
    fp = bf2.contains(content_hashes([f"other {i}" for i in range(20000)])).mean()
    assert 0.005 < fp < 0.015, fp


def test_dedup_units_paragraphs():
    seen = set()
    t1, r1 = dedup_units("Intro.\n\nShared footer text.", "paragraph", seen, normalize)
    t2, r2 = dedup_units("Other start.\n\nshared   FOOTER text.", "paragraph", seen, normalize)
    assert (t1, r1) == ("Intro.\n\nShared footer text.", 0)
    assert (t2, r2) == ("Other start.", 1)


def _ngrams(text, n):
    w = normalize(text, ("nfkc", "lower", "punct", "whitespace")).split()
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)} if len(w) >= n else set()


words = st.lists(st.sampled_from(["the", "cat", "sat", "on", "mat", "dog", "ran"]), min_size=0, max_size=25)


@settings(max_examples=60, deadline=None)
@given(st.lists(words, min_size=1, max_size=4), st.lists(words, min_size=1, max_size=5), st.integers(5, 8))
def test_contamination_vs_brute_force(evals, train, n):
    ev = [" ".join(w) for w in evals]
    tr = [" ".join(w) for w in train]
    idx = build_eval_index([("ev", i, t) for i, t in enumerate(ev)], n=n, min_words=5)
    got = check_batch(idx, tr)
    for d, text in enumerate(tr):
        want = []
        for e, item in enumerate(ev):
            nw = len(item.split())
            if nw < 5:
                continue
            if _ngrams(text, min(n, nw)) & _ngrams(item, min(n, nw)):
                want.append(idx.item_ids.index(e))
        assert got[d] == sorted(want)
