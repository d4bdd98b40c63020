"""Textbook FlashAttention forward: the single-pass online-softmax recurrence over tiles, as written in the notes.

The readable twin of :mod:`posttrain.ops.flash` (the fast path, with its CPU economies) and
its test oracle for the tiling itself. Per query tile Q_i, with running row max m, denominator l and
unnormalised output o~, every key/value tile (K_j, V_j) does

    S   = scale * Q_i K_j^T              (masked entries -> -inf)
    m'  = max(m, rowmax S)
    P~  = exp(S - m')                    alpha = exp(m - m')
    l'  = alpha * l + rowsum P~          o~' = alpha * o~ + P~ V_j

and at the end O_i = o~ / l, L_i = m + log l (Dao et al. 2022, Alg. 1; FlashAttention-2, Alg. 1).
Nothing N_q x N_k is ever formed. Worked number: one query, two one-key tiles with logits 0 then
log 3 and values 1 then 2: after tile 1 m = 0, l = 1, o~ = 1; after tile 2 m' = log 3, alpha = 1/3,
l = 1/3 + 1 = 4/3, o~ = 1/3 + 2 = 7/3, so O = 7/4 = (1 * 1 + 3 * 2) / 4.

Conventions are the package's (``ops/naive.py``): q (B, H, Nq, D), k/v (B, Hkv, Nk, D), causal
aligned to the end (query i sees keys j <= i + Nk - Nq), ``key_padding_mask`` (B, Nk) True = real key,
a row with no visible key gives zeros (and L = -inf). Computed in float32 (float64 stays float64).

Not handled: the backward pass (the fast path's is tested against the naive oracle's), dropout.
"""

from __future__ import annotations

import math

import torch

from posttrain.ops.naive import check_attention_inputs


def flash_attention_reference(
    q,
    k,
    v,
    causal: bool = True,
    key_padding_mask=None,
    scale: float | None = None,
    block_q: int = 64,
    block_k: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(O (B, H, Nq, D), L (B, H, Nq)): tiled exact attention and each row's log-sum-exp of logits."""
    check_attention_inputs(q, k, v, key_padding_mask)
    b, h, nq, d = q.shape
    nk = k.shape[2]
    scale = d**-0.5 if scale is None else float(scale)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    k, v = (x.repeat_interleave(h // x.shape[1], dim=1).to(acc) for x in (k, v))  # GQA: a K/V head per query head
    out = torch.zeros(b, h, nq, d, dtype=acc, device=q.device)
    lse = torch.full((b, h, nq), -math.inf, dtype=acc, device=q.device)
    for i0 in range(0, nq, block_q):
        i1 = min(i0 + block_q, nq)
        qi = q[:, :, i0:i1].to(acc) * scale  # (B, H, bq, D)
        m = torch.full((b, h, i1 - i0), -math.inf, dtype=acc, device=q.device)  # running row max
        l = torch.zeros_like(m)  # running denominator
        o = torch.zeros(b, h, i1 - i0, d, dtype=acc, device=q.device)  # running unnormalised output
        for j0 in range(0, nk, block_k):
            j1 = min(j0 + block_k, nk)
            s = qi @ k[:, :, j0:j1].transpose(-1, -2)  # (B, H, bq, bk)
            s = s.masked_fill(~_visible(i0, i1, j0, j1, nq, nk, causal, key_padding_mask, q.device), -math.inf)
            m_new = torch.maximum(m, s.amax(-1))
            shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))  # no key seen yet: any shift
            p = torch.exp(s - shift[..., None])  # (B, H, bq, bk); hidden keys -> 0
            alpha = torch.exp(m - shift)  # rescales what was accumulated under the old max (0 when m = -inf)
            l = alpha * l + p.sum(-1)
            o = alpha[..., None] * o + p @ v[:, :, j0:j1]
            m = m_new
        seen = l > 0
        out[:, :, i0:i1] = torch.where(seen[..., None], o / l.clamp_min(1e-300)[..., None], torch.zeros_like(o))
        lse[:, :, i0:i1] = torch.where(seen, m + torch.log(l.clamp_min(1e-300)), lse[:, :, i0:i1])
    return out.to(q.dtype), lse


def _visible(i0, i1, j0, j1, nq, nk, causal, key_padding_mask, device) -> torch.Tensor:
    """(B or 1, 1, bq, bk) True where query i0 + r may attend to key j0 + c."""
    vis = torch.ones(1, 1, i1 - i0, j1 - j0, dtype=torch.bool, device=device)
    if causal:
        i = torch.arange(i0, i1, device=device)[:, None]
        j = torch.arange(j0, j1, device=device)[None, :]
        vis = vis & (j <= i + (nk - nq))
    if key_padding_mask is not None:
        vis = vis & key_padding_mask.to(torch.bool)[:, None, None, j0:j1]
    return vis
