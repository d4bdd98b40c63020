"""Softmax from first principles: the forward, its hand-derived backward, and the online rewrites.

Key insight: softmax is shift-invariant, s = softmax(x) = softmax(x - c), so subtracting the row
max keeps every exponent <= 0 (no overflow at logits of 1e4).  Its Jacobian is
``J = diag(s) - s s^T`` and the vector-Jacobian product never needs J:

    dx = J^T g = s * (g - <g, s>)                                   (1)

Cross-entropy ``L = -log s_y`` composes with softmax into the famous ``dL/dx = s - onehot(y)``.

The *online* rewrites are what FlashAttention is built on.  A running pair (m, d) — the max so far
and the denominator relative to that max — absorbs one new element x_j with

    m' = max(m, x_j),   d' = d * exp(m - m') + exp(x_j - m')          (2)

so the max and the normaliser come out of ONE pass instead of two (``online_softmax_2pass``).
Applying the same rescale to the weighted sum of values, o' = o * d exp(m - m') / d' + ..., gives
the attention output of one query row in a single pass over the keys (``online_attention_row``).

These functions work on the last dimension and are written for clarity and as oracles; the loops in
the 3-pass / 2-pass / 1-pass variants run over elements in Python and are for small inputs only.
"""

from __future__ import annotations

import torch


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Safe softmax: exp(x - max) / sum exp(x - max).  A row that is all -inf gives zeros, not NaN.

    Example: x=[0, ln 3] -> [0.25, 0.75].
    """
    m = x.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # all -inf row: shift by 0
    e = torch.exp(x - m)
    d = e.sum(dim=dim, keepdim=True)
    return e / torch.where(d > 0, d, torch.ones_like(d))


def softmax_backward(grad: torch.Tensor, s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Vector-Jacobian product of softmax, eq. (1): dx = s * (g - <g, s>), from the OUTPUT s only."""
    return s * (grad - (grad * s).sum(dim=dim, keepdim=True))


def softmax_jacobian(s: torch.Tensor) -> torch.Tensor:
    """Explicit Jacobian ds_i/dx_j = diag(s) - s s^T for s of shape (..., n) -> (..., n, n).  The slow oracle."""
    return torch.diag_embed(s) - s[..., :, None] * s[..., None, :]


class Softmax(torch.autograd.Function):
    """Softmax whose backward is the hand-derived eq. (1) (checked with gradcheck)."""

    @staticmethod
    def forward(ctx, x, dim=-1):
        s = softmax(x, dim)
        ctx.save_for_backward(s)
        ctx.dim = dim
        return s

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        return softmax_backward(grad, s, ctx.dim), None


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """log s = x - m - log sum exp(x - m)."""
    m = x.amax(dim=dim, keepdim=True).detach()
    return x - m - torch.log(torch.exp(x - m).sum(dim=dim, keepdim=True))


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy -log softmax(logits)[target]; logits (N, V), targets (N,) int64 -> scalar."""
    if logits.ndim != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(
            f"cross_entropy wants logits (N, V) and targets (N,), got {tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    logp = log_softmax(logits, -1)  # (N, V)
    return -logp.gather(1, targets[:, None]).mean()


def cross_entropy_backward(
    logits: torch.Tensor, targets: torch.Tensor, grad: torch.Tensor | float = 1.0
) -> torch.Tensor:
    """dL/dlogits of the MEAN cross-entropy: (softmax(logits) - onehot(targets)) / N * grad."""
    n, v = logits.shape
    onehot = torch.nn.functional.one_hot(targets, v).to(logits.dtype)  # (N, V)
    return (softmax(logits, -1) - onehot) * (grad / n)


class CrossEntropy(torch.autograd.Function):
    """Cross-entropy whose backward is the hand-derived softmax - onehot."""

    @staticmethod
    def forward(ctx, logits, targets):
        ctx.save_for_backward(logits, targets)
        return cross_entropy(logits, targets)

    @staticmethod
    def backward(ctx, grad):
        logits, targets = ctx.saved_tensors
        return cross_entropy_backward(logits, targets, grad), None


# ----------------------------------------------------------------------------------------------
# Softmax variants over one row (1-D tensors), each a loop over elements as on the whiteboard.


def safe_softmax_3pass(x: torch.Tensor) -> torch.Tensor:
    """Pass 1: m = max x.  Pass 2: d = sum exp(x_j - m).  Pass 3: s_j = exp(x_j - m) / d."""
    m = torch.tensor(float("-inf"), dtype=x.dtype)
    for xj in x:  # pass 1
        m = torch.maximum(m, xj)
    d = torch.zeros((), dtype=x.dtype)
    for xj in x:  # pass 2
        d = d + torch.exp(xj - m)
    return torch.stack([torch.exp(xj - m) / d for xj in x])  # pass 3


def online_softmax_2pass(x: torch.Tensor) -> torch.Tensor:
    """Pass 1 carries (m, d) with eq. (2): d' = d exp(m - m') + exp(x_j - m').  Pass 2 normalises."""
    m = torch.tensor(float("-inf"), dtype=x.dtype)
    d = torch.zeros((), dtype=x.dtype)
    for xj in x:
        m_new = torch.maximum(m, xj)
        d = d * torch.exp(m - m_new) + torch.exp(xj - m_new)
        m = m_new
    return torch.stack([torch.exp(xj - m) / d for xj in x])


def online_attention_row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """One pass over the keys gives o = softmax(q k^T * scale) v for ONE query row.

    q (D,), k (N, D), v (N, Dv) -> (Dv,).  Keeps the unnormalised o~ = sum_j exp(x_j - m) v_j with
    o~' = o~ exp(m - m') + exp(x_j - m') v_j and divides by d once at the end (FlashAttention-2 order).
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    m = torch.tensor(float("-inf"), dtype=q.dtype)
    d = torch.zeros((), dtype=q.dtype)
    o = torch.zeros(v.shape[-1], dtype=q.dtype)
    for kj, vj in zip(k, v):
        xj = (q * kj).sum() * scale
        m_new = torch.maximum(m, xj)
        alpha, p = torch.exp(m - m_new), torch.exp(xj - m_new)
        d = d * alpha + p
        o = o * alpha + p * vj
        m = m_new
    return o / d
