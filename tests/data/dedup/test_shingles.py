"""Shingle hashes against a pure-Python oracle, and normalisation steps."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.data.dedup.shingles import (
    char_shingles,
    fmix64,
    fmix64_int,
    normalize,
    parse_normalize,
    shingle_strings,
    substring_hash_int,
    word_shingles,
)
from posttrain.errors import ConfigError

texts = st.lists(st.text(alphabet=st.sampled_from("ab c\u00e9\u4e2d\n\U0001f600"), max_size=30), max_size=6)


def _word_hash(w: str) -> int:
    return fmix64_int(substring_hash_int([ord(c) for c in w]), 7)


@settings(max_examples=150, deadline=None)
@given(texts, st.integers(1, 6))
def test_char_shingles_match_oracle(batch, k):
    h, off = char_shingles(batch, k)
    assert off[0] == 0 and off[-1] == len(h)
    for i, t in enumerate(batch):
        ref = {substring_hash_int([ord(c) for c in s]) for s in shingle_strings(t, k, "char")}
        assert set(h[off[i] : off[i + 1]].tolist()) == ref


@settings(max_examples=150, deadline=None)
@given(texts, st.integers(1, 4))
def test_word_shingles_match_oracle(batch, n):
    h, off = word_shingles(batch, n)
    for i, t in enumerate(batch):
        ref = {substring_hash_int([_word_hash(w) for w in s.split(" ")]) for s in shingle_strings(t, n, "word")}
        assert set(h[off[i] : off[i + 1]].tolist()) == ref


def test_hash_is_position_independent_and_distinguishes():
    h, off = char_shingles(["xxabcde", "abcde"], 5)
    assert h[off[0] + 2] == h[off[1]]
    assert len(set(h.tolist())) == 3  # xxabc, xabcd, abcde
    assert char_shingles(["abcd"], 5)[0].tolist() == [substring_hash_int([ord(c) for c in "abcd"])]
    assert char_shingles([""], 5)[1].tolist() == [0, 0]


def test_fmix_matches_int_twin():
    x = np.array([0, 1, 2**63 + 5, 2**64 - 1], np.uint64)
    assert fmix64(x, 4).tolist() == [fmix64_int(int(v), 4) for v in x]


def test_normalize_steps():
    assert normalize("  A\tB\u00a0 C ", ["whitespace"]) == "A B C"
    assert normalize("Héllo, World!", ["lower", "punct", "whitespace"]) == "héllo world"
    assert normalize("\uff21\uff22", ["nfkc"]) == "AB"
    assert parse_normalize("whitespace") == ("whitespace",)
    assert parse_normalize("none") == ()
    with pytest.raises(ConfigError, match="punctuation"):
        parse_normalize("lower,punctuation")
