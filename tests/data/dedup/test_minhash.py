"""MinHash: vectorised == loop twins; the estimator is unbiased with variance ~J(1-J)/K; determinism."""

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.data.dedup.minhash import (
    EMPTY,
    MINHASH_SCHEMES,
    estimate_jaccard,
    oph_signature_loop,
    oph_signatures,
    perm_signature_loop,
)

LOOPS = {"oph": oph_signature_loop, "perm": perm_signature_loop}
hash_sets = st.lists(st.lists(st.integers(0, 2**64 - 1), max_size=40), min_size=1, max_size=5)


@pytest.mark.parametrize("scheme", ["oph", "perm"])
@settings(max_examples=60, deadline=None)
@given(docs=hash_sets, k=st.sampled_from([1, 7, 16, 32]), seed=st.integers(0, 5))
def test_vectorised_equals_loop(scheme, docs, k, seed):
    off = np.cumsum([0] + [len(d) for d in docs])
    h = np.array([x for d in docs for x in d], np.uint64)
    sig = MINHASH_SCHEMES[scheme](h, off, k, seed)
    assert sig.shape == (len(docs), k) and sig.dtype == np.uint32
    for i, d in enumerate(docs):
        assert sig[i].tolist() == LOOPS[scheme](d, k, seed)


def _pairs_with_jaccard(rng, n_pairs, union, j):
    """Pairs of random hash sets with |A & B| / |A | B| = j exactly."""
    inter = int(round(j * union))
    rest = union - inter
    docs = []
    for _ in range(n_pairs):
        u = rng.integers(0, 2**64 - 1, union, dtype=np.uint64, endpoint=True)
        a = np.concatenate([u[:inter], u[inter : inter + rest // 2]])
        b = np.concatenate([u[:inter], u[inter + rest // 2 :]])
        docs += [a, b]
    off = np.cumsum([0] + [len(d) for d in docs])
    return np.concatenate(docs), off, inter / union


@pytest.mark.parametrize("scheme", ["oph", "perm"])
@pytest.mark.parametrize("j", [0.2, 0.5, 0.85])
def test_estimator_mean_and_variance(scheme, j):
    rng = np.random.default_rng(11)
    K, n_pairs, union = 64, 300 if scheme == "oph" else 120, 2000
    h, off, jt = _pairs_with_jaccard(rng, n_pairs, union, j)
    sig = MINHASH_SCHEMES[scheme](h, off, K, 3)
    est = estimate_jaccard(sig[0::2], sig[1::2])  # (n_pairs,)
    var = jt * (1 - jt) / K
    assert abs(est.mean() - jt) < 4 * np.sqrt(var / n_pairs)
    # sample variance has relative s.d. ~ sqrt(2/n); OPH's is ~(1 - K/union) of J(1-J)/K
    ratio = est.var(ddof=1) / var
    assert 1 - 5 * np.sqrt(2 / n_pairs) < ratio < 1 + 5 * np.sqrt(2 / n_pairs), ratio


def test_densification_handles_sparse_documents():
    # 3 shingles, 128 bins: almost all bins are filled by borrowing; identical sets stay identical
    h = np.array([5, 9, 11, 5, 9, 11, 5, 9, 12], np.uint64)
    sig = oph_signatures(h, np.array([0, 3, 6, 9]), 128, 1)
    assert (sig != EMPTY).all()
    assert estimate_jaccard(sig[0], sig[1]) == 1.0
    assert 0.2 < estimate_jaccard(sig[0], sig[2]) < 0.85  # true J = 2/4


def test_empty_document_row():
    sig = oph_signatures(np.array([1, 2], np.uint64), np.array([0, 0, 2]), 8)
    assert (sig[0] == EMPTY).all() and (sig[1] != EMPTY).all()


def test_deterministic_across_processes():
    code = (
        "import numpy as np; from posttrain.data.dedup.shingles import char_shingles;"
        "from posttrain.data.dedup.minhash import oph_signatures;"
        "h, o = char_shingles(['deterministic across processes', 'second doc'], 5);"
        "print(oph_signatures(h, o, 16, 7).tolist())"
    )
    outs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    }
    assert len(outs) == 1
    from posttrain.data.dedup.shingles import char_shingles

    h, o = char_shingles(["deterministic across processes", "second doc"], 5)
    assert outs.pop().strip() == str(oph_signatures(h, o, 16, 7).tolist())
    assert not np.array_equal(oph_signatures(h, o, 16, 7), oph_signatures(h, o, 16, 8))
