"""Tiled FlashAttention (PyTorch) and every dispatch backend against SDPA and autograd through the naive oracle."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.ops import ATTENTION_BACKENDS, attention, flash_attention
from posttrain.ops.flash import FlashAttention
from posttrain.ops.naive import reference_attention


def make(b, h, hkv, nq, nk, d, dtype=torch.float64, seed=0, mult=1.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(b, h, nq, d, generator=g, dtype=torch.float64) * mult).to(dtype)
    k = (torch.randn(b, hkv, nk, d, generator=g, dtype=torch.float64) * mult).to(dtype)
    v = torch.randn(b, hkv, nk, d, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v


def grads(fn, q, k, v, go):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), go))


def assert_all_close(xs, ys, **tol):
    for name, x, y in zip(("out", "dq", "dk", "dv"), xs, ys):
        torch.testing.assert_close(x, y, msg=lambda m: f"{name}: {m}", **tol)


SHAPES = [  # (B, H, Hkv, Nq, Nk, D)
    (1, 1, 1, 1, 1, 4),  # N = 1
    (2, 4, 2, 37, 37, 16),  # odd N, GQA
    (1, 2, 1, 1, 53, 8),  # decoding: Nq = 1, long Nk
    (2, 2, 2, 45, 19, 8),  # Nq > Nk: causal rows before the first key are empty
    (1, 4, 1, 70, 70, 5),  # multi-query, N not a multiple of the block
    (2, 3, 3, 16, 32, 8),  # Nq < Nk, exact multiples of the block
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_flash_matches_autograd_of_naive_float64(shape, causal, padded):
    b, h, hkv, nq, nk, d = shape
    q, k, v = make(*shape, seed=nq + nk)
    kpm = None
    if padded:
        kpm = torch.rand(b, nk, generator=torch.Generator().manual_seed(7)) > 0.3
        if b > 1:
            kpm[-1] = False  # one sequence fully padded: zeros and zero grads
    go = torch.randn(b, h, nq, d, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    ref = grads(lambda q, k, v: reference_attention(q, k, v, causal, kpm, 0.4), q, k, v, go)
    got = grads(lambda q, k, v: flash_attention(q, k, v, causal, kpm, 0.4, block_q=8, block_k=16), q, k, v, go)
    assert_all_close(got, ref, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("shape", [(2, 4, 2, 33, 33, 16), (1, 2, 2, 1, 40, 8), (1, 2, 1, 20, 50, 8)])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_matches_pytorch_sdpa(shape, causal):
    """Against torch's own kernel: F.scaled_dot_product_attention with the expanded K/V heads."""
    b, h, hkv, nq, nk, d = shape
    q, k, v = make(*shape, dtype=torch.float32, seed=1)
    go = torch.randn(b, h, nq, d, generator=torch.Generator().manual_seed(2))

    def sdpa(q, k, v):
        mask = torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq) if causal else None
        kk, vv = k.repeat_interleave(h // hkv, 1), v.repeat_interleave(h // hkv, 1)
        return F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)

    ref = grads(sdpa, q, k, v, go)
    got = grads(lambda q, k, v: flash_attention(q, k, v, causal=causal, block_q=16, block_k=8), q, k, v, go)
    assert_all_close(got, ref, atol=2e-5, rtol=1e-4)


def test_flash_gradcheck_float64():
    q, k, v = (t.requires_grad_() for t in make(2, 2, 1, 5, 7, 3))
    kpm = torch.tensor([[True] * 7, [False, True, True, False, True, False, False]])
    # forward tiles 2x3, backward tiles 3x2: the two passes need not share a tiling
    fn = lambda q, k, v: FlashAttention.apply(q, k, v, True, kpm, 0.5, (2, 3), (3, 2))  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_fully_masked_rows_give_zeros_and_zero_grads():
    q, k, v = make(2, 2, 2, 6, 4, 8, dtype=torch.float32)
    kpm = torch.tensor([[False] * 4, [True, False, True, False]])  # batch 0: no real key at all
    go = torch.ones(2, 2, 6, 8)
    out, dq, dk, dv = grads(lambda q, k, v: flash_attention(q, k, v, True, kpm, block_q=4, block_k=2), q, k, v, go)
    assert all(torch.isfinite(t).all() for t in (out, dq, dk, dv))
    assert (out[0] == 0).all() and (dq[0] == 0).all() and (dk[0] == 0).all() and (dv[0] == 0).all()
    assert (out[1, :, :2] == 0).all() and (dq[1, :, :2] == 0).all()  # causal, Nq > Nk: rows 0, 1 see no key
    assert (dk[1][:, [1, 3]] == 0).all()  # padded keys get no gradient


def test_large_logits_do_not_overflow():
    q, k, v = make(1, 2, 2, 40, 40, 16, dtype=torch.float32, seed=3, mult=40.0)  # |logits| ~ 1e4
    s = (q @ k.transpose(-1, -2)) * 16**-0.5
    assert s.abs().max() > 5e3
    go = torch.randn(1, 2, 40, 16)
    got = grads(lambda q, k, v: flash_attention(q, k, v, causal=True, block_q=16, block_k=16), q, k, v, go)
    ref = grads(lambda q, k, v: reference_attention(q, k, v, True), q.double(), k.double(), v.double(), go.double())
    assert all(torch.isfinite(t).all() for t in got)
    torch.testing.assert_close(got[0], ref[0].float(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[3], ref[3].float(), atol=1e-3, rtol=1e-3)


def test_very_negative_logits_after_fully_masked_tiles():
    """Left padding hides the first key tiles; the visible logits are all about -1e4 (no underflow to 0/0)."""
    q, k, v = make(2, 2, 2, 8, 24, 4, dtype=torch.float32, seed=9)
    k = -k.abs() * 60
    q = q.abs() * 60  # every logit is <= 0, most around -1e3 .. -1e4
    kpm = torch.ones(2, 24, dtype=torch.bool)
    kpm[0, :17] = False  # the first two key tiles of sequence 0 are padding
    go = torch.randn(2, 2, 8, 4)
    got = grads(lambda q, k, v: flash_attention(q, k, v, False, kpm, block_q=4, block_k=8), q, k, v, go)
    ref = grads(
        lambda q, k, v: reference_attention(q, k, v, False, kpm), q.double(), k.double(), v.double(), go.double()
    )
    assert all(torch.isfinite(t).all() for t in got)
    torch.testing.assert_close(got[0], ref[0].float(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[3], ref[3].float(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_bfloat16_accumulates_in_float32(causal):
    q, k, v = make(2, 4, 2, 67, 67, 32, dtype=torch.bfloat16, seed=5)
    go = torch.randn(2, 4, 67, 32, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    got = grads(lambda q, k, v: flash_attention(q, k, v, causal=causal, block_q=32, block_k=16), q, k, v, go)
    # oracle: the same bf16 inputs in float64
    ref = grads(lambda q, k, v: reference_attention(q, k, v, causal), q.double(), k.double(), v.double(), go.double())
    assert all(t.dtype == torch.bfloat16 for t in got)
    err = [(a.double() - b).abs().max().item() for a, b in zip(got, ref)]
    # torch's bf16 SDPA on the same inputs, for scale: ours must not be worse than it by much
    sd = grads(lambda q, k, v: attention(q, k, v, causal, backend="sdpa"), q, k, v, go)
    err_sdpa = [(a.double() - b).abs().max().item() for a, b in zip(sd, ref)]
    for e, es in zip(err, err_sdpa):
        assert e <= max(2 * es, 2e-2), (err, err_sdpa)


@settings(max_examples=20, deadline=None)
@given(
    b=st.integers(1, 2),
    hkv=st.integers(1, 2),
    g=st.integers(1, 3),
    nq=st.integers(1, 24),
    nk=st.integers(1, 24),
    d=st.integers(1, 9),
    causal=st.booleans(),
    padded=st.booleans(),
    block_q=st.integers(1, 9),
    block_k=st.integers(1, 9),
    seed=st.integers(0, 2**16),
)
def test_property_random_shapes_and_blocks(b, hkv, g, nq, nk, d, causal, padded, block_q, block_k, seed):
    q, k, v = make(b, hkv * g, hkv, nq, nk, d, seed=seed)
    kpm = (torch.rand(b, nk, generator=torch.Generator().manual_seed(seed)) > 0.4) if padded else None
    go = torch.randn(b, hkv * g, nq, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    ref = grads(lambda q, k, v: reference_attention(q, k, v, causal, kpm), q, k, v, go)
    got = grads(lambda q, k, v: flash_attention(q, k, v, causal, kpm, block_q=block_q, block_k=block_k), q, k, v, go)
    assert_all_close(got, ref, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("backend", ["naive", "sdpa", "flash"])
@pytest.mark.parametrize("shape", [(2, 4, 2, 9, 9, 8), (2, 2, 1, 1, 12, 8), (1, 2, 2, 12, 5, 4)])
@pytest.mark.parametrize("causal", [False, True])
def test_dispatch_backends_agree(backend, shape, causal):
    b, h, hkv, nq, nk, d = shape
    q, k, v = make(*shape, seed=11)
    kpm = torch.ones(b, nk, dtype=torch.bool)
    kpm[0, ::3] = False
    go = torch.randn(b, h, nq, d, dtype=torch.float64, generator=torch.Generator().manual_seed(12))
    for mask in (None, kpm):
        ref = grads(lambda q, k, v: reference_attention(q, k, v, causal, mask, 0.3), q, k, v, go)
        got = grads(lambda q, k, v: attention(q, k, v, causal, mask, 0.3, backend=backend), q, k, v, go)
        assert_all_close(got, ref, atol=1e-10, rtol=1e-8)


def test_dispatch_lists_backends_and_rejects_unknown():
    assert {"naive", "sdpa", "flash", "triton"} <= set(ATTENTION_BACKENDS)
    q, k, v = make(1, 1, 1, 2, 2, 2)
    with pytest.raises(ValueError, match="available: naive, sdpa, flash, triton"):
        attention(q, k, v, backend="nope")


def test_flash_rejects_bad_inputs():
    q, k, v = make(1, 2, 2, 3, 3, 4)
    with pytest.raises(ValueError, match="block sizes"):
        flash_attention(q, k, v, block_q=0)
    with pytest.raises(ValueError, match="dtype"):
        flash_attention(q, k.float(), v)
    with pytest.raises(ValueError, match="multiple"):
        flash_attention(q, *make(1, 3, 3, 3, 3, 4)[1:])


def _flash_module():
    import importlib

    return importlib.import_module("posttrain.ops.flash")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_fast_and_rescaling_paths_both_match_the_oracle(monkeypatch, causal, padded):
    """The forward's fixed-shift fast path and its lazy-rescale fallback are each exact on their own."""
    shape = (2, 4, 2, 37, 29, 8)
    q, k, v = make(*shape, seed=21, mult=2.0)
    kpm = None
    if padded:
        kpm = torch.rand(2, 29, generator=torch.Generator().manual_seed(22)) > 0.3
    go = torch.randn(2, 4, 37, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(23))
    ref = grads(lambda q, k, v: reference_attention(q, k, v, causal, kpm), q, k, v, go)
    fast = grads(lambda q, k, v: flash_attention(q, k, v, causal, kpm, block_q=8, block_k=8), q, k, v, go)
    assert_all_close(fast, ref, atol=1e-10, rtol=1e-8)
    monkeypatch.setattr(_flash_module(), "_forward_block_fast", lambda *a: None)  # force the fallback
    safe = grads(lambda q, k, v: flash_attention(q, k, v, causal, kpm, block_q=8, block_k=8), q, k, v, go)
    assert_all_close(safe, ref, atol=1e-10, rtol=1e-8)


def test_fast_path_overflow_falls_back_to_rescaling(monkeypatch):
    """float32: the first key tile's logits are ~0, a later tile's ~+200, so exp(S - m) with m fixed at the
    first tile's max overflows; the block must be redone with rescaling and stay exact."""
    fa = _flash_module()
    g = torch.Generator().manual_seed(31)
    q = torch.zeros(1, 1, 6, 4)
    q[..., 0] = 1.0
    k = torch.randn(1, 1, 16, 4, generator=g) * 0.1
    k[:, :, 8:, 0] = 400.0 + torch.randn(8, generator=g)  # logits 0.5 * 400 = 200 > log(float32 max) = 88.7
    v = torch.randn(1, 1, 16, 4, generator=g)
    go = torch.randn(1, 1, 6, 4, generator=g)
    calls = []
    safe = fa._forward_block_safe
    monkeypatch.setattr(fa, "_forward_block_safe", lambda *a: calls.append(1) or safe(*a))
    got = grads(lambda q, k, v: flash_attention(q, k, v, causal=False, block_q=8, block_k=8), q, k, v, go)
    assert calls, "the overflow was not detected"
    ref = grads(lambda q, k, v: reference_attention(q, k, v, False), q.double(), k.double(), v.double(), go.double())
    assert all(torch.isfinite(t).all() for t in got)
    for x, y in zip(got, ref):
        torch.testing.assert_close(x, y.float(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("split", [1, 3, 4, 16])
@pytest.mark.parametrize("shape", [(1, 2, 1, 40, 40, 8), (2, 4, 2, 33, 45, 8), (1, 2, 2, 45, 30, 4)])
def test_causal_diagonal_split_is_exact(monkeypatch, split, shape):
    """Diagonal tiles cut into `split` narrower tiles that start at the first query seeing them (GQA, Nq != Nk)."""
    monkeypatch.setattr(_flash_module(), "DIAG_SPLIT", split)
    b, h, hkv, nq, nk, d = shape
    q, k, v = make(*shape, seed=split)
    go = torch.randn(b, h, nq, d, dtype=torch.float64, generator=torch.Generator().manual_seed(41))
    ref = grads(lambda q, k, v: reference_attention(q, k, v, True), q, k, v, go)
    got = grads(lambda q, k, v: flash_attention(q, k, v, causal=True, block_q=16, block_k=16), q, k, v, go)
    assert_all_close(got, ref, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("causal", [False, True])
def test_backward_tiles_differ_from_forward_tiles(causal):
    """Default-style tiling at a small N: forward 64x64, backward one partial 512x512 tile (and the reverse)."""
    q, k, v = make(1, 2, 1, 300, 300, 8, seed=51)
    go = torch.randn(1, 2, 300, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(52))
    ref = grads(lambda q, k, v: reference_attention(q, k, v, causal, None, 0.3), q, k, v, go)
    for fwd, bwd in (((64, 64), (512, 512)), ((512, 512), (64, 32))):
        got = grads(lambda q, k, v: FlashAttention.apply(q, k, v, causal, None, 0.3, fwd, bwd), q, k, v, go)
        assert_all_close(got, ref, atol=1e-10, rtol=1e-8)


def test_default_tiles(monkeypatch):
    """Pins the tile rule: backward tiles grow only when small next to dQ; the non-causal forward spends the
    default tile (BLOCK_Q queries of every head) on as few heads as possible; explicit sizes apply to both."""
    fa = _flash_module()
    seen = []
    monkeypatch.setattr(fa.FlashAttention, "apply", lambda *a: seen.append(a[-2:]))

    def call(b, h, hkv, n, d, causal=True, **kw):
        fa.flash_attention(torch.empty(b, h, n, d), torch.empty(b, hkv, n, d), torch.empty(b, hkv, n, d), causal, **kw)
        return seen[-1]

    big, small = (fa.BWD_BLOCK_Q, fa.BWD_BLOCK_K), (fa.BLOCK_Q, fa.BLOCK_K)
    assert call(1, 1, 1, 8192, 64) == ((*small, 1), big)
    assert call(1, 1, 1, 4096, 64) == ((*small, 1), small)
    assert call(1, 1, 1, 4096, 128) == ((*small, 1), big)
    assert call(1, 1, 1, 100, 64) == ((100, fa.BLOCK_K, 1), small)
    bq = fa.BLOCK_Q
    assert call(1, 4, 4, 8192, 64, causal=False) == ((4 * bq, fa.BLOCK_K, 1), big)  # one head, 4x the queries
    assert call(2, 8, 2, 8192, 64, causal=False) == ((4 * bq, fa.BLOCK_K, 1), big)  # B*Hkv = 4 (GQA)
    assert call(8, 4, 4, 100, 64, causal=False) == ((100, fa.BLOCK_K, 32), small)  # short: all heads, all queries
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # one thread: causal blocks of Nq/16 queries
        assert call(1, 4, 4, 16384, 64, causal=True) == ((4 * bq, fa.BLOCK_K, 1), big)  # Nq/16 = 1024 queries
        assert call(1, 4, 4, 8192, 64, causal=True) == ((2 * bq, fa.BLOCK_K, 2), big)  # Nq/16 = 512: two heads
        assert call(1, 4, 4, 4096, 64, causal=True) == ((bq, fa.BLOCK_K, 4), small)  # Nq/16 = 256: all heads
        assert call(1, 4, 4, 1024, 64, causal=True) == ((bq, fa.BLOCK_K, 4), small)  # at least BLOCK_Q
        torch.set_num_threads(2)  # several: BLOCK_Q queries of every head of the budget
        assert call(1, 4, 4, 16384, 64, causal=True) == ((bq, fa.BLOCK_K, 4), big)
        assert call(2, 8, 2, 8192, 64, causal=True) == ((bq, fa.BLOCK_K, 4), big)  # GQA: B*Hkv = 4
        assert call(1, 4, 4, 8192, 64, causal=False) == ((4 * bq, fa.BLOCK_K, 1), big)  # non-causal unchanged
    finally:
        torch.set_num_threads(threads)
    assert call(1, 1, 1, 8192, 64, block_q=32) == ((32, fa.BLOCK_K), (32, fa.BWD_BLOCK_K))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_forward_in_head_chunks(causal, padded):
    """The forward over chunks of (batch, K/V head) pairs (3 of 4, then 1; GQA; padding per batch) is exact."""
    fa = _flash_module()
    b, h, hkv, nq, nk, d = 2, 4, 2, 21, 26, 8
    q, k, v = make(b, h, hkv, nq, nk, d, seed=61)
    kpm = None
    if padded:
        kpm = torch.rand(b, nk, generator=torch.Generator().manual_seed(62)) > 0.3
        kpm[1, :9] = False  # left padding in the second sequence only
    go = torch.randn(b, h, nq, d, dtype=torch.float64, generator=torch.Generator().manual_seed(63))
    ref = grads(lambda q, k, v: reference_attention(q, k, v, causal, kpm, 0.3), q, k, v, go)
    for fwd in ((8, 8, 3), (nq, 8, 1), (5, 4, 2)):
        got = grads(lambda q, k, v: fa.FlashAttention.apply(q, k, v, causal, kpm, 0.3, fwd, (8, 8)), q, k, v, go)
        assert_all_close(got, ref, atol=1e-10, rtol=1e-8)
