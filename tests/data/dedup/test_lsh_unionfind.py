"""LSH banding (S-curve, datasketch's (b, r) choice, bucket pairs vs brute force) and union-find."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.data.dedup.lsh import band_keys, bucket_pairs, candidate_pairs, optimal_bands, plan_bands, s_curve
from posttrain.data.dedup.minhash import oph_signatures
from posttrain.data.dedup.unionfind import components, components_loop
from posttrain.errors import ConfigError


@pytest.mark.parametrize("threshold,k", [(0.5, 128), (0.8, 128), (0.9, 256), (0.7, 64)])
def test_optimal_bands_matches_datasketch(threshold, k):
    from datasketch.lsh import _optimal_param

    assert optimal_bands(threshold, k) == _optimal_param(threshold, k, 0.5, 0.5)


def test_plan_bands_validation():
    assert plan_bands(0.8, 128, 16, 8).bands == 16
    with pytest.raises(ConfigError):
        plan_bands(0.8, 128, 16, 9)
    with pytest.raises(ConfigError):
        plan_bands(0.8, 128, 16, None)


def test_empirical_candidate_rate_follows_s_curve():
    rng = np.random.default_rng(5)
    b, r, n_pairs, union = 8, 4, 400, 1000
    for j in (0.3, 0.5, 0.7):
        inter = int(j * union)
        docs = []
        for _ in range(n_pairs):
            u = rng.integers(0, 2**63, union, dtype=np.uint64)
            docs += [u[: inter + (union - inter) // 2], np.concatenate([u[:inter], u[inter + (union - inter) // 2 :]])]
        off = np.cumsum([0] + [len(d) for d in docs])
        sig = oph_signatures(np.concatenate(docs), off, b * r, 2)
        keys = band_keys(sig, b, r)
        hit = (keys[0::2] == keys[1::2]).any(1).mean()
        p = s_curve(inter / union, b, r)
        assert abs(hit - p) < 4 * np.sqrt(p * (1 - p) / n_pairs) + 0.01, (j, hit, p)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=0, max_size=40), st.integers(2, 6))
def test_bucket_pairs_vs_brute_force(keys, max_bucket):
    keys = np.array(keys, np.uint64)
    got = {tuple(p) for p in bucket_pairs(keys, max_bucket).tolist()}
    want = {(i, j) for i, j in itertools.combinations(range(len(keys)), 2) if keys[i] == keys[j]}
    assert got <= want and all(i < j for i, j in got)
    # small buckets: every pair; large ones: the same connected components
    n = len(keys)
    assert components_loop(n, sorted(got)) == components_loop(n, sorted(want))
    sizes = np.bincount(keys.astype(np.int64)) if n else []
    assert all((i, j) in got for i, j in want if sizes[int(keys[i])] <= max_bucket)


def test_candidate_pairs_union_over_bands():
    keys = np.array([[1, 9], [1, 8], [2, 8], [3, 7]], np.uint64)
    assert candidate_pairs(keys).tolist() == [[0, 1], [1, 2]]


edges = st.lists(st.tuples(st.integers(0, 29), st.integers(0, 29)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(edges)
def test_components_equal_union_find_loop(pairs):
    arr = np.array(pairs, np.int64).reshape(-1, 2)
    labels = components(30, arr)
    assert labels.tolist() == components_loop(30, pairs)
    # labels are the min index of the component, and every edge is inside one component (transitive)
    assert all(labels[labels[i]] == labels[i] <= i for i in range(30))
    assert all(labels[a] == labels[b] for a, b in pairs)


def test_transitivity():
    assert components(5, np.array([[0, 1], [3, 4], [1, 4]])).tolist() == [0, 0, 2, 0, 0]
