"""The textbook tiled FlashAttention (ops/flash_reference.py): against the naive oracle, the notes' worked
number, and as the oracle of the fast path's forward (output and per-row log-sum-exp)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.ops.flash import _flash_forward, flash_attention
from posttrain.ops.flash_reference import flash_attention_reference
from posttrain.ops.naive import reference_attention


def _inputs(b, h, hkv, nq, nk, d, seed, padded):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(b, n_h, n, d, generator=g, dtype=torch.float64) for n_h, n in ((h, nq), (hkv, nk), (hkv, nk))
    )
    kpm = None
    if padded:
        kpm = torch.rand(b, nk, generator=g) > 0.3
        kpm[-1] = False  # a fully padded sequence: zero rows
    return q, k, v, kpm


def _naive_lse(q, k, causal, kpm, scale):
    """log sum_j exp(S_ij) over the visible keys, from the full matrix (-inf for a row with none)."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = scale * q @ k.transpose(-1, -2)
    nq, nk = q.shape[2], k.shape[2]
    vis = torch.ones(nq, nk, dtype=torch.bool)
    if causal:
        vis = torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + (nk - nq)
    vis = vis[None, None] if kpm is None else vis[None, None] & kpm[:, None, None, :]
    return torch.logsumexp(s.masked_fill(~vis, -math.inf), dim=-1)


def test_worked_example_from_the_docstring():
    q = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    k = torch.tensor([0.0, math.log(3.0)], dtype=torch.float64).view(1, 1, 2, 1)
    v = torch.tensor([1.0, 2.0], dtype=torch.float64).view(1, 1, 2, 1)
    out, lse = flash_attention_reference(q, k, v, causal=False, scale=1.0, block_k=1)
    assert out.item() == pytest.approx(7 / 4, abs=1e-12)
    assert lse.item() == pytest.approx(math.log(4.0), abs=1e-12)


@settings(max_examples=15, deadline=None)
@given(
    st.integers(1, 2),
    st.sampled_from([(1, 1), (2, 1), (4, 2)]),
    st.integers(1, 23),
    st.integers(1, 23),
    st.booleans(),
    st.booleans(),
    st.integers(1, 9),
    st.integers(1, 9),
    st.integers(0, 10**6),
)
def test_reference_equals_naive_attention(b, heads, nq, nk, causal, padded, block_q, block_k, seed):
    h, hkv = heads
    q, k, v, kpm = _inputs(b, h, hkv, nq, nk, 4, seed, padded)
    out, lse = flash_attention_reference(q, k, v, causal, kpm, 0.7, block_q=block_q, block_k=block_k)
    torch.testing.assert_close(out, reference_attention(q, k, v, causal, kpm, 0.7), atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(lse, _naive_lse(q, k, causal, kpm, 0.7), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("shape", [(2, 4, 2, 37, 37, 16), (1, 2, 1, 1, 53, 8), (2, 2, 2, 45, 19, 8)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_fast_path_forward_matches_textbook_tiling(shape, causal, padded):
    """flash_attention (fixed shift per block, split diagonal tiles, grouped rows) = the plain recurrence."""
    q, k, v, kpm = _inputs(*shape, seed=sum(shape), padded=padded)
    ref_out, ref_lse = flash_attention_reference(q, k, v, causal, kpm, 0.4, block_q=16, block_k=16)
    out = flash_attention(q, k, v, causal, kpm, 0.4, block_q=8, block_k=16)
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-10)
    _, lse = _flash_forward(q, k, v, causal, kpm if kpm is None else kpm.bool(), 0.4, 8, 16)  # (B*Hkv, G, Nq)
    b, h, nq = q.shape[:3]
    seen = torch.isfinite(ref_lse)  # the fast path leaves rows with no visible key unspecified
    torch.testing.assert_close(lse.reshape(b, h, nq)[seen], ref_lse[seen], atol=1e-12, rtol=1e-10)


def test_float32_inputs_stay_float32_and_agree():
    q, k, v, _ = _inputs(1, 2, 1, 33, 33, 8, seed=5, padded=False)
    q, k, v = q.float(), k.float(), v.float()
    out, _ = flash_attention_reference(q, k, v, True, block_q=8, block_k=8)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, reference_attention(q, k, v, True), atol=1e-5, rtol=1e-5)
