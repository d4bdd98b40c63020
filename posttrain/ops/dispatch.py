"""One attention entry point for the models, with a switchable backend.

``attention(q, k, v, causal=True, key_padding_mask=None, scale=None, backend="sdpa")``

Shapes: q (B, H, Nq, D); k, v (B, Hkv, Nk, D) with H % Hkv == 0 (grouped-query attention).
``causal`` is aligned to the end: query i (of Nq) sees keys j <= i + (Nk - Nq), which is what
decoding with a KV cache needs. ``key_padding_mask`` (B, Nk) bool, True = a real key.
A query row with no visible key returns zeros (never NaN).

Backends are gathered in ``ATTENTION_BACKENDS``; each takes the same arguments.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F


def visible_mask(nq: int, nk: int, causal: bool, key_padding_mask: torch.Tensor | None, device) -> torch.Tensor | None:
    """Bool mask broadcastable to (B, H, Nq, Nk): True where query i may attend to key j, or None for all."""
    mask = None
    if causal:
        i = torch.arange(nq, device=device)[:, None]
        j = torch.arange(nk, device=device)[None, :]
        mask = (j <= i + (nk - nq))[None, None]  # (1, 1, Nq, Nk)
    if key_padding_mask is not None:
        kpm = key_padding_mask.to(torch.bool)[:, None, None, :]  # (B, 1, 1, Nk)
        mask = kpm if mask is None else (mask & kpm)
    return mask


def sdpa_attention(q, k, v, causal: bool = True, key_padding_mask=None, scale: float | None = None):
    """PyTorch ``scaled_dot_product_attention`` with end-aligned causality and empty-row zeros."""
    h, hkv = q.shape[1], k.shape[1]
    if h != hkv:
        k = k.repeat_interleave(h // hkv, dim=1)  # (B, H, Nk, D)
        v = v.repeat_interleave(h // hkv, dim=1)
    nq, nk = q.shape[2], k.shape[2]
    if key_padding_mask is None and (not causal or nq == nk or nq == 1):
        # fast paths: plain causal square attention, or a decode step that sees every key
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal and nq == nk and nq > 1, scale=scale)
    mask = visible_mask(nq, nk, causal, key_padding_mask, q.device)  # (B|1, 1, Nq, Nk)
    has_key = mask.any(dim=-1, keepdim=True)  # (B|1, 1, Nq, 1)
    safe = mask | ~has_key  # an empty row attends everywhere, then is zeroed: no NaN
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=safe, scale=scale)
    return out.masked_fill(~has_key, 0.0)


ATTENTION_BACKENDS: dict[str, Callable] = {
    "sdpa": sdpa_attention,
}


def attention(q, k, v, causal: bool = True, key_padding_mask=None, scale: float | None = None, backend: str = "sdpa"):
    try:
        fn = ATTENTION_BACKENDS[backend]
    except KeyError:
        raise ValueError(f"unknown attention backend {backend!r}; available: {', '.join(ATTENTION_BACKENDS)}") from None
    return fn(q, k, v, causal=causal, key_padding_mask=key_padding_mask, scale=scale)


def default_scale(d: int) -> float:
    return 1.0 / math.sqrt(d)
