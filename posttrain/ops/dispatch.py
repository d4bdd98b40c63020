"""One attention entry point for the models, with a switchable backend.

``attention(q, k, v, causal=True, key_padding_mask=None, scale=None, backend="sdpa")``

Shapes: q (B, H, Nq, D); k, v (B, Hkv, Nk, D) with H % Hkv == 0 (grouped-query attention).
``causal`` is aligned to the end: query i (of Nq) sees keys j <= i + (Nk - Nq), which is what
decoding with a KV cache needs. ``key_padding_mask`` (B, Nk) bool, True = a real key.
A query row with no visible key returns zeros (never NaN).

Backends are gathered in ``ATTENTION_BACKENDS``; each takes the same arguments:
``naive`` (the materialised oracle with a hand-written backward), ``sdpa`` (PyTorch),
``flash`` (our tiled FlashAttention in PyTorch) and ``triton`` (our Triton kernels).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from posttrain.ops.flash import flash_attention_backend
from posttrain.ops.naive import naive_attention, visible_mask
from posttrain.ops.thread_invariant import on_one_thread


def sdpa_attention(q, k, v, causal: bool = True, key_padding_mask=None, scale: float | None = None):
    """PyTorch ``scaled_dot_product_attention`` with end-aligned causality and empty-row zeros."""
    h, hkv = q.shape[1], k.shape[1]
    if h != hkv:
        k = k.repeat_interleave(h // hkv, dim=1)  # (B, H, Nk, D)
        v = v.repeat_interleave(h // hkv, dim=1)
    nq, nk = q.shape[2], k.shape[2]
    decode = nq == 1 and not q.requires_grad
    if key_padding_mask is None and not decode and (not causal or nq == nk or nq == 1):
        # fast paths: plain causal square attention, or one query that sees every key
        is_causal = causal and nq == nk and nq > 1
        return on_one_thread(
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale), q, k, v
        )
    mask = visible_mask(nq, nk, causal, key_padding_mask, q.device)  # (B|1, 1, Nq, Nk)
    if mask is None:  # a non-causal decode step with no padding: it sees every key
        mask = torch.ones((1, 1, nq, nk), dtype=torch.bool, device=q.device)
    has_key = mask.any(dim=-1, keepdim=True)  # (B|1, 1, Nq, 1)
    safe = mask | ~has_key  # an empty row attends everywhere, then is zeroed: no NaN
    if decode:
        # a decode step, padded or not, takes this one path, so a row's result does not depend on its batch mates
        # (generate drops finished rows); two small batched matmuls beat the fused CPU kernel's masked path (~1.6x)
        s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)  # (B, H, 1, Nk)
        out = s.masked_fill(~safe, float("-inf")).softmax(-1) @ v  # (B, H, 1, D)
        return out.masked_fill(~has_key, 0.0)
    out = on_one_thread(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=safe, scale=scale), q, k, v)
    return out.masked_fill(~has_key, 0.0)


def triton_attention_backend(q, k, v, causal: bool = True, key_padding_mask=None, scale: float | None = None):
    """Backend "triton": the Triton kernels of ``triton_attention.py`` (imported on first use)."""
    from posttrain.ops.triton_attention import triton_attention

    return triton_attention(q, k, v, causal=causal, scale=scale, key_padding_mask=key_padding_mask)


ATTENTION_BACKENDS: dict[str, Callable] = {
    "naive": naive_attention,  # materialised N x N, hand-derived backward (ops/naive.py)
    "sdpa": sdpa_attention,  # torch.nn.functional.scaled_dot_product_attention
    "flash": flash_attention_backend,  # tiled online softmax in PyTorch (ops/flash.py)
    "triton": triton_attention_backend,  # Triton kernels, CUDA or TRITON_INTERPRET=1 (ops/triton_attention.py)
}


def attention(q, k, v, causal: bool = True, key_padding_mask=None, scale: float | None = None, backend: str = "sdpa"):
    try:
        fn = ATTENTION_BACKENDS[backend]
    except KeyError:
        raise ValueError(f"unknown attention backend {backend!r}; available: {', '.join(ATTENTION_BACKENDS)}") from None
    return fn(q, k, v, causal=causal, key_padding_mask=key_padding_mask, scale=scale)


def default_scale(d: int) -> float:
    return 1.0 / math.sqrt(d)
