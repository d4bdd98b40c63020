"""Naive attention: forward against PyTorch SDPA, the hand-derived backward against gradcheck and autograd."""

import pytest
import torch
import torch.nn.functional as F

from posttrain.ops.naive import NaiveAttention, attention_backward, attention_forward, reference_attention


def make(b, h, hkv, nq, nk, d, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, nq, d, generator=g, dtype=dtype)
    k = torch.randn(b, hkv, nk, d, generator=g, dtype=dtype)
    v = torch.randn(b, hkv, nk, d, generator=g, dtype=dtype)
    return q, k, v


def sdpa_oracle(q, k, v, causal, kpm, scale=None):
    """F.scaled_dot_product_attention with an explicit end-aligned bool mask (rows must be non-empty)."""
    h, nq, nk = q.shape[1], q.shape[2], k.shape[2]
    k = k.repeat_interleave(h // k.shape[1], 1)
    v = v.repeat_interleave(h // v.shape[1], 1)
    mask = torch.ones(q.shape[0], 1, nq, nk, dtype=torch.bool)
    if causal:
        mask &= torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq)
    if kpm is not None:
        mask &= kpm[:, None, None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


@pytest.mark.parametrize(
    "shape", [(1, 1, 1, 1, 1, 4), (2, 4, 2, 5, 5, 8), (1, 2, 1, 1, 9, 4), (2, 3, 3, 7, 11, 6), (1, 2, 2, 9, 9, 3)]
)
@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_sdpa(shape, causal):
    b, h, hkv, nq, nk, d = shape
    q, k, v = make(*shape)
    kpm = torch.ones(b, nk, dtype=torch.bool)
    kpm[:, 0] = True
    if nk > 2:
        kpm[-1, 1] = False
    out, p = attention_forward(q, k, v, causal, kpm, scale=0.3)
    torch.testing.assert_close(out, sdpa_oracle(q, k, v, causal, kpm, scale=0.3))
    torch.testing.assert_close(p.sum(-1), torch.ones_like(p.sum(-1)))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("shape", [(1, 2, 1, 3, 5, 4), (2, 2, 2, 4, 4, 3), (1, 1, 1, 6, 2, 2)])
def test_hand_backward_gradcheck(shape, causal, padded):
    b, nk = shape[0], shape[4]
    q, k, v = (t.requires_grad_() for t in make(*shape))
    kpm = None
    if padded:
        kpm = torch.rand(b, nk, generator=torch.Generator().manual_seed(3)) > 0.3
        kpm[0] = False  # a fully padded batch row: zeros out, zero grads
    assert torch.autograd.gradcheck(lambda q, k, v: NaiveAttention.apply(q, k, v, causal, kpm, 0.7), (q, k, v))


def test_hand_backward_equals_autograd_and_empty_rows_are_zero():
    q, k, v = (t.requires_grad_() for t in make(2, 4, 2, 7, 3, 5, seed=4))  # Nq > Nk causal: first 4 rows empty
    kpm = torch.tensor([[True, False, True], [True, True, True]])
    go = torch.randn(2, 4, 7, 5, dtype=torch.float64)
    out, p = attention_forward(q, k, v, True, kpm)
    hand = attention_backward(go, q.detach(), k.detach(), v.detach(), p.detach())
    auto = torch.autograd.grad(reference_attention(q, k, v, True, kpm), (q, k, v), go)
    for a, b in zip(hand, auto):
        torch.testing.assert_close(a, b)
    assert (out[:, :, :4] == 0).all() and (hand[0][:, :, :4] == 0).all()
    assert all(torch.isfinite(t).all() for t in (*hand, out))


def test_bad_inputs_raise():
    q, k, v = make(1, 3, 2, 4, 4, 2)
    with pytest.raises(ValueError, match="multiple"):
        attention_forward(q, k, v)
    q, k, v = make(1, 2, 2, 4, 4, 2)
    with pytest.raises(ValueError, match="key_padding_mask"):
        attention_forward(q, k, v, key_padding_mask=torch.ones(1, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="4-D"):
        attention_forward(q[0], k, v)
