"""Naive scaled dot-product attention with a hand-derived backward pass: the oracle for the fast paths.

Forward (per batch and head), with the N_q x N_k matrices materialised:

    S = scale * Q K^T,   P = softmax(S) (masked entries -> 0),   O = P V

Backward, from dO (the chain rule through each line, softmax by its VJP s * (g - <g, s>)):

    dV = P^T dO
    dP = dO V^T
    dS = P * (dP - D),   D_i = sum_j P_ij dP_ij = sum_d dO_id O_id  (= rowsum(dO * O))
    dQ = scale * dS K,   dK = scale * dS^T Q

The identity D_i = <dP_i, P_i> = <dO_i, O_i> is what lets FlashAttention's backward skip storing P.

Conventions (shared with ``dispatch.sdpa_attention``): q (B, H, Nq, D), k/v (B, Hkv, Nk, D) with
H % Hkv == 0 (grouped-query attention: query head h reads K/V head h // (H/Hkv)); ``causal`` is
aligned to the END, query i sees keys j <= i + (Nk - Nq); ``key_padding_mask`` (B, Nk) bool with
True = real key; a query row with no visible key outputs zeros and gets zero gradients.

Memory is O(B H Nq Nk): this is the slow twin, not for long sequences.
"""

from __future__ import annotations

import torch


def check_attention_inputs(q, k, v, key_padding_mask=None) -> None:
    """Raise ValueError with the offending shapes unless q/k/v/mask follow the conventions above."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"attention wants 4-D (B, H, N, D) tensors, got q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)}"
        )
    b, h, _, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(
            f"k and v must be (B, Hkv, Nk, D) matching q (B, H, Nq, D): q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)}"
        )
    if k.shape[1] == 0 or h % k.shape[1] != 0:
        raise ValueError(f"number of query heads {h} must be a multiple of K/V heads {k.shape[1]}")
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (b, k.shape[2]):
        raise ValueError(f"key_padding_mask must be (B, Nk) = {(b, k.shape[2])}, got {tuple(key_padding_mask.shape)}")


def visible_mask(nq: int, nk: int, causal: bool, key_padding_mask: torch.Tensor | None, device) -> torch.Tensor | None:
    """Bool mask broadcastable to (B, H, Nq, Nk): True where query i may attend to key j, or None for all.

    Example: nq=2, nk=3, causal -> [[1, 1, 0], [1, 1, 1]] (the last query sees every key).
    """
    mask = None
    if causal:
        i = torch.arange(nq, device=device)[:, None]
        j = torch.arange(nk, device=device)[None, :]
        mask = (j <= i + (nk - nq))[None, None]  # (1, 1, Nq, Nk)
    if key_padding_mask is not None:
        kpm = key_padding_mask.to(torch.bool)[:, None, None, :]  # (B, 1, 1, Nk)
        mask = kpm if mask is None else (mask & kpm)
    return mask


def _expand_kv(x: torch.Tensor, h: int) -> torch.Tensor:
    """(B, Hkv, N, D) -> (B, H, N, D) by repeating each K/V head for its H/Hkv query heads."""
    return x if x.shape[1] == h else x.repeat_interleave(h // x.shape[1], dim=1)


def _reduce_kv(dx: torch.Tensor, hkv: int) -> torch.Tensor:
    """(B, H, N, D) -> (B, Hkv, N, D): the gradient of ``_expand_kv`` sums each group of query heads."""
    b, h, n, d = dx.shape
    return dx if h == hkv else dx.view(b, hkv, h // hkv, n, d).sum(dim=2)


def attention_forward(q, k, v, causal: bool = False, key_padding_mask=None, scale: float | None = None):
    """Naive forward.  Returns (O (B, H, Nq, D), P (B, H, Nq, Nk)); P is what the hand backward needs."""
    check_attention_inputs(q, k, v, key_padding_mask)
    h, nq, nk = q.shape[1], q.shape[2], k.shape[2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    k, v = _expand_kv(k, h), _expand_kv(v, h)  # (B, H, Nk, D)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale  # (B, H, Nq, Nk)
    mask = visible_mask(nq, nk, causal, key_padding_mask, q.device)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    m = s.amax(dim=-1, keepdim=True).detach()  # (B, H, Nq, 1); softmax is shift-invariant
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # empty row: all -inf, shift by 0
    e = torch.exp(s - m)  # masked -> exactly 0
    denom = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(denom > 0, denom, torch.ones_like(denom))  # empty row -> all zeros
    return torch.matmul(p, v), p


def attention_backward(grad_out, q, k, v, p, scale: float | None = None):
    """Hand-derived backward of ``attention_forward`` (see the module docstring).  Returns dQ, dK, dV."""
    h, hkv = q.shape[1], k.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    ke, ve = _expand_kv(k, h), _expand_kv(v, h)  # (B, H, Nk, D)
    dv = torch.matmul(p.transpose(-1, -2), grad_out)  # (B, H, Nk, D)
    dp = torch.matmul(grad_out, ve.transpose(-1, -2))  # (B, H, Nq, Nk)
    delta = (dp * p).sum(dim=-1, keepdim=True)  # (B, H, Nq, 1) = rowsum(dO * O)
    ds = p * (dp - delta)  # (B, H, Nq, Nk); zero where P is zero (masked)
    dq = torch.matmul(ds, ke) * scale  # (B, H, Nq, D)
    dk = torch.matmul(ds.transpose(-1, -2), q) * scale  # (B, H, Nk, D)
    return dq, _reduce_kv(dk, hkv), _reduce_kv(dv, hkv)


class NaiveAttention(torch.autograd.Function):
    """``attention_forward`` with ``attention_backward`` as its backward (verified by gradcheck)."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, key_padding_mask=None, scale=None):
        out, p = attention_forward(q, k, v, causal, key_padding_mask, scale)
        ctx.save_for_backward(q, k, v, p)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, p = ctx.saved_tensors
        dq, dk, dv = attention_backward(grad_out, q, k, v, p, ctx.scale)
        return dq, dk, dv, None, None, None


def naive_attention(q, k, v, causal: bool = True, key_padding_mask=None, scale: float | None = None):
    """Backend "naive": the materialised forward with the hand-derived backward pass."""
    return NaiveAttention.apply(q, k, v, causal, key_padding_mask, scale)


def reference_attention(q, k, v, causal: bool = True, key_padding_mask=None, scale: float | None = None):
    """The same forward differentiated by autograd (no hand backward): the oracle for every backward."""
    return attention_forward(q, k, v, causal, key_padding_mask, scale)[0]
