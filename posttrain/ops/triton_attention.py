"""FlashAttention-2 in Triton: a forward kernel and two backward kernels (dK/dV, then dQ).

Key insight: the same online-softmax recurrence as ``flash_attention.py`` (see its docstring),
but one program owns one tile of BLOCK_M query rows of one head and keeps (m, l, o~) in
registers while it streams the K/V tiles through on-chip memory:

    m' = max(m, rowmax S_j),  P~ = 2^(S_j log2 e - m'),  l' = 2^(m - m') l + rowsum P~,
    o~' = 2^(m - m') o~ + P~ V_j,   O = o~ / l,   L = m + log2 l   (base 2: exp2 is the fast unit)

Backward (Dao 2023, Alg. 2), with D_i = rowsum(dO_i * O_i) computed first:
  * ``_bwd_dkdv_kernel``: one program per K/V tile (and K/V head) loops over the query tiles of
    all G query heads of its group: P = 2^(S log2 e - L), dV += P^T dO, dP = dO V^T,
    dS = P * (dP - D), dK += dS^T Q.  No atomics: each program owns its dK, dV rows.
  * ``_bwd_dq_kernel``: one program per query tile loops over the K/V tiles: dQ += dS K.

Masks: causal aligned to the end (query i sees key j <= i + Nk - Nq), a key-padding mask
(B, Nk), the ragged edges of N and of the head dim (D is padded to a power of two >= 16).
A row with no visible key gets L = +inf, so P = 0, O = 0 and zero gradients.

Runs on CUDA; on the CPU only under Triton's interpreter (``TRITON_INTERPRET=1`` set before
triton is imported), which is how CI checks it.  ``triton`` is imported when this module is.
Float32 inputs use IEEE-exact dots (no TF32) so the result matches the reference; bf16/fp16
use the tensor cores and accumulate in fp32.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from posttrain.ops.naive import check_attention_inputs

LOG2E = 1.4426950408889634


@triton.jit
def _dot(a, b, DOT: tl.constexpr):
    """DOT 0: native (tensor cores for bf16/fp16); 1: IEEE fp32 (no TF32); 2: upcast to fp32 first.

    Mode 2 is for the interpreter only, whose ``tl.dot`` on bfloat16 returns garbage (triton 3.9,
    ~1e10 errors); the products of bf16 numbers are exact in fp32 and accumulate in fp32 either way.
    """
    if DOT == 1:
        return tl.dot(a, b, input_precision="ieee")
    elif DOT == 2:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _visible(offs_m, offs_n, NQ, NK, OFFSET, kpm_row, CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr):
    """(BLOCK_M, BLOCK_N) bool: query offs_m may attend to key offs_n."""
    vis = (offs_m[:, None] < NQ) & (offs_n[None, :] < NK)
    if CAUSAL:
        vis = vis & (offs_n[None, :] <= offs_m[:, None] + OFFSET)
    if HAS_KPM:
        real = tl.load(kpm_row + offs_n, mask=offs_n < NK, other=0)
        vis = vis & (real[None, :] != 0)
    return vis


@triton.jit
def _fwd_kernel(
    Q, K, V, O, LSE, KPM,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod,
    qk_scale, NQ, NK, H, G, D, OFFSET,
    CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    start_m = tl.program_id(0) * BLOCK_M
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // G  # the K/V head this query head reads
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_ptrs = Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < NQ) & (offs_d[None, :] < D), other=0.0)  # (BLOCK_M, BLOCK_D)
    kpm_row = KPM + b * NK
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)  # running max (base 2)
    l_i = tl.zeros((BLOCK_M,), tl.float32)  # running denominator
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)  # unnormalised output
    hi = NK
    if CAUSAL:
        hi = tl.minimum(NK, start_m + BLOCK_M + OFFSET)  # later keys are hidden from every row here
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        kv_mask = (cols[:, None] < NK) & (offs_d[None, :] < D)
        k = tl.load(K + b * skb + hk * skh + cols[:, None] * skn + offs_d[None, :] * skd, mask=kv_mask, other=0.0)
        v = tl.load(V + b * svb + hk * svh + cols[:, None] * svn + offs_d[None, :] * svd, mask=kv_mask, other=0.0)
        s = _dot(q, tl.trans(k), DOT) * qk_scale  # (BLOCK_M, BLOCK_N) logits * log2 e
        s = tl.where(_visible(offs_m, cols, NQ, NK, OFFSET, kpm_row, CAUSAL, HAS_KPM), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key seen yet: shift by 0
        p = tl.math.exp2(s - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT)
        m_i = m_new
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("inf"), tl.where(empty, 0.0, m_i) + tl.math.log2(tl.where(empty, 1.0, l_i)))
    o_ptrs = O + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=(offs_m[:, None] < NQ) & (offs_d[None, :] < D))
    tl.store(LSE + pid_bh * NQ + offs_m, lse, mask=offs_m < NQ)


@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, KPM,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
    sdob, sdoh, sdom, sdod, sdkb, sdkh, sdkn, sdkd, sdvb, sdvh, sdvn, sdvd,
    qk_scale, sm_scale, NQ, NK, H, G, D, OFFSET,
    CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    start_n = tl.program_id(0) * BLOCK_N
    pid_bhk = tl.program_id(1)
    hkv = H // G
    b = pid_bhk // hkv
    hk = pid_bhk % hkv
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    kv_mask = (offs_n[:, None] < NK) & (offs_d[None, :] < D)
    k = tl.load(K + b * skb + hk * skh + offs_n[:, None] * skn + offs_d[None, :] * skd, mask=kv_mask, other=0.0)
    v = tl.load(V + b * svb + hk * svh + offs_n[:, None] * svn + offs_d[None, :] * svd, mask=kv_mask, other=0.0)
    kpm_row = KPM + b * NK
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    lo = 0
    if CAUSAL:
        lo = tl.maximum(start_n - OFFSET, 0) // BLOCK_M * BLOCK_M  # earlier queries see none of these keys
    for g in range(0, G):
        h = hk * G + g
        for start_m in range(lo, NQ, BLOCK_M):
            rows = start_m + offs_m0
            row_mask = (rows[:, None] < NQ) & (offs_d[None, :] < D)
            q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqm + offs_d[None, :] * sqd, mask=row_mask, other=0.0)
            do = tl.load(
                DO + b * sdob + h * sdoh + rows[:, None] * sdom + offs_d[None, :] * sdod, mask=row_mask, other=0.0
            )
            lse = tl.load(LSE + (b * H + h) * NQ + rows, mask=rows < NQ, other=float("inf"))
            delta = tl.load(DELTA + (b * H + h) * NQ + rows, mask=rows < NQ, other=0.0)
            s = _dot(q, tl.trans(k), DOT) * qk_scale  # (BLOCK_M, BLOCK_N)
            s = tl.where(_visible(rows, offs_n, NQ, NK, OFFSET, kpm_row, CAUSAL, HAS_KPM), s, float("-inf"))
            p = tl.math.exp2(s - lse[:, None])  # P recomputed from the saved log-sum-exp
            dv += _dot(tl.trans(p.to(do.dtype)), do, DOT)
            dp = _dot(do, tl.trans(v), DOT)
            ds = p * (dp - delta[:, None])
            dk += _dot(tl.trans(ds.to(q.dtype)), q, DOT)
    dk = dk * sm_scale
    tl.store(
        DK + b * sdkb + hk * sdkh + offs_n[:, None] * sdkn + offs_d[None, :] * sdkd,
        dk.to(DK.dtype.element_ty),
        mask=kv_mask,
    )
    tl.store(
        DV + b * sdvb + hk * sdvh + offs_n[:, None] * sdvn + offs_d[None, :] * sdvd,
        dv.to(DV.dtype.element_ty),
        mask=kv_mask,
    )


@triton.jit
def _bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, KPM,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
    sdob, sdoh, sdom, sdod, sdqb, sdqh, sdqm, sdqd,
    qk_scale, sm_scale, NQ, NK, H, G, D, OFFSET,
    CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    start_m = tl.program_id(0) * BLOCK_M
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // G
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_mask = (offs_m[:, None] < NQ) & (offs_d[None, :] < D)
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd, mask=row_mask, other=0.0)
    do = tl.load(DO + b * sdob + h * sdoh + offs_m[:, None] * sdom + offs_d[None, :] * sdod, mask=row_mask, other=0.0)
    lse = tl.load(LSE + pid_bh * NQ + offs_m, mask=offs_m < NQ, other=float("inf"))
    delta = tl.load(DELTA + pid_bh * NQ + offs_m, mask=offs_m < NQ, other=0.0)
    kpm_row = KPM + b * NK
    dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    hi = NK
    if CAUSAL:
        hi = tl.minimum(NK, start_m + BLOCK_M + OFFSET)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n0
        kv_mask = (cols[:, None] < NK) & (offs_d[None, :] < D)
        k = tl.load(K + b * skb + hk * skh + cols[:, None] * skn + offs_d[None, :] * skd, mask=kv_mask, other=0.0)
        v = tl.load(V + b * svb + hk * svh + cols[:, None] * svn + offs_d[None, :] * svd, mask=kv_mask, other=0.0)
        s = _dot(q, tl.trans(k), DOT) * qk_scale
        s = tl.where(_visible(offs_m, cols, NQ, NK, OFFSET, kpm_row, CAUSAL, HAS_KPM), s, float("-inf"))
        p = tl.math.exp2(s - lse[:, None])
        dp = _dot(do, tl.trans(v), DOT)
        ds = p * (dp - delta[:, None])
        dq += _dot(ds.to(k.dtype), k, DOT)
    dq = dq * sm_scale
    tl.store(
        DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdqm + offs_d[None, :] * sdqd,
        dq.to(DQ.dtype.element_ty),
        mask=row_mask,
    )


def _block_sizes(d: int) -> tuple[int, int, int]:
    block_d = max(16, triton.next_power_of_2(d))
    if os.environ.get("TRITON_INTERPRET") == "1":
        return 16, 16, block_d  # the interpreter runs numpy per program: small tiles, many programs
    return (64, 64, block_d) if block_d <= 64 else (64, 32, block_d)


def _dot_mode(dtype: torch.dtype) -> int:
    if dtype == torch.float32:
        return 1
    return 2 if os.environ.get("TRITON_INTERPRET") == "1" else 0


def _strides(t: torch.Tensor):
    return t.stride(0), t.stride(1), t.stride(2), t.stride(3)


class TritonAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, key_padding_mask, scale):
        b, h, nq, d = q.shape
        hkv, nk = k.shape[1], k.shape[2]
        block_m, block_n, block_d = _block_sizes(d)
        kpm = (
            torch.zeros(1, dtype=torch.int8, device=q.device)
            if key_padding_mask is None
            else key_padding_mask.to(device=q.device, dtype=torch.int8).contiguous()
        )
        out = torch.empty_like(q)
        lse = torch.empty(b, h, nq, dtype=torch.float32, device=q.device)  # base-2 log-sum-exp
        dot = _dot_mode(q.dtype)
        grid = (triton.cdiv(nq, block_m), b * h)
        _fwd_kernel[grid](
            q, k, v, out, lse, kpm, *_strides(q), *_strides(k), *_strides(v), *_strides(out),
            scale * LOG2E, nq, nk, h, h // hkv, d, nk - nq,
            CAUSAL=causal, HAS_KPM=key_padding_mask is not None, DOT=dot,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, out, lse, kpm)
        ctx.causal, ctx.scale, ctx.has_kpm = causal, scale, key_padding_mask is not None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, kpm = ctx.saved_tensors
        b, h, nq, d = q.shape
        hkv, nk = k.shape[1], k.shape[2]
        g = h // hkv
        block_m, block_n, block_d = _block_sizes(d)
        do = grad_out.contiguous()
        delta = (do.float() * out.float()).sum(-1).contiguous()  # (B, H, Nq)  D_i = rowsum(dO * O)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dot = _dot_mode(q.dtype)
        common = dict(
            CAUSAL=ctx.causal, HAS_KPM=ctx.has_kpm, DOT=dot, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d
        )
        scalars = (ctx.scale * LOG2E, ctx.scale, nq, nk, h, g, d, nk - nq)
        _bwd_dkdv_kernel[(triton.cdiv(nk, block_n), b * hkv)](
            q, k, v, do, lse, delta, dk, dv, kpm, *_strides(q), *_strides(k), *_strides(v), *_strides(do),
            *_strides(dk), *_strides(dv), *scalars, **common,
        )  # fmt: skip
        _bwd_dq_kernel[(triton.cdiv(nq, block_m), b * h)](
            q, k, v, do, lse, delta, dq, kpm, *_strides(q), *_strides(k), *_strides(v), *_strides(do),
            *_strides(dq), *scalars, **common,
        )  # fmt: skip
        return dq, dk, dv, None, None, None


def triton_attention(q, k, v, causal: bool = False, scale: float | None = None, key_padding_mask=None):
    """Exact attention by the Triton kernels; same arguments and conventions as ``flash_attention``."""
    check_attention_inputs(q, k, v, key_padding_mask)
    if not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "the triton attention backend needs CUDA tensors (or TRITON_INTERPRET=1 set before importing "
            "triton, for slow CPU checks); use backend='flash' on the CPU"
        )
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(
            f"triton attention supports float32/float16/bfloat16 q, k, v of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return TritonAttention.apply(q, k, v, bool(causal), key_padding_mask, scale)
