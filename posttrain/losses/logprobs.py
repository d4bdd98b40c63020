"""Token and sequence log-probabilities, the sampling distribution's logit warping, masked reductions.

Key insight: every loss in post-training is built from ``log pi(y_t | y_<t)`` of chosen tokens, so one
careful implementation serves SFT, reward models, DPO and RL:

    token_logps[b, t] = log_softmax(warp(logits[b, t]))[labels[b, t]]
    seq_logps[b]      = sum_t mask[b, t] * token_logps[b, t]          (or / sum_t mask, "mean")

``warp_logits`` applies temperature, top-k and top-p in that order (as Hugging Face does). The sampler
draws from ``softmax(warp(logits))`` and records these log-probs; RL recomputes them with the same
``warp`` so the importance ratio compares like with like (no untruncated-log-prob bias).

Pure tensor functions: no models, no configs (running a model to get these log-probs is
:mod:`posttrain.scoring`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None, eps: float = 0.0) -> torch.Tensor:
    """sum(x * mask) / sum(mask) over ``dim`` (all if None). An all-zero mask gives 0, not NaN."""
    mask = mask.to(x.dtype)
    num = masked_sum(x, mask, dim)
    den = mask.sum() if dim is None else mask.sum(dim)
    return num / den.clamp_min(1.0) if eps == 0.0 else num / (den + eps)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    mask = mask.to(x.dtype)
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = mask.sum()
        var = var * n / (n - 1).clamp_min(1.0)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked entries (mean added back if ``shift_mean=False``)."""
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    return out if shift_mean else out + mean


def warp_logits(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """Logits of the sampling distribution: /T, then keep the top-k, then the top-p nucleus (others -inf).

    ``temperature`` must be > 0 (greedy decoding is handled by the sampler, not here).
    Top-p keeps the smallest set of tokens whose probability reaches ``top_p`` (always at least one).
    Example: probs [0.5, 0.3, 0.2], top_p=0.7 -> keeps the first two (0.5 < 0.7 <= 0.8).
    """
    if temperature <= 0:
        raise ValueError("temperature must be > 0; use greedy decoding for T=0")
    x = logits.float() / temperature if temperature != 1.0 else logits.float()
    v = x.shape[-1]
    if top_k is not None and 0 < top_k < v:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]  # (..., 1)
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_x, idx = torch.sort(x, dim=-1, descending=True)
        probs = sorted_x.softmax(-1)
        before = probs.cumsum(-1) - probs  # mass strictly before each token
        drop_sorted = before >= top_p  # the token that crosses top_p is kept; the first is always kept
        drop = torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return x


def token_logps(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[labels] per position, computed in float32.  (B, T, V), (B, T) -> (B, T)."""
    logits = logits.float()
    picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)  # (B, T)
    return picked - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per position. (B, T, V) -> (B, T); -inf logits contribute 0."""
    logp = F.log_softmax(logits.float(), dim=-1)
    p = logp.exp()
    return -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1)


def sequence_logps(token_lp: torch.Tensor, mask: torch.Tensor, average: bool = False) -> torch.Tensor:
    """Sum (or length-normalised mean) of token log-probs over the masked positions. (B, T) -> (B,)."""
    mask = mask.to(token_lp.dtype)
    s = (token_lp * mask).sum(-1)
    return s / mask.sum(-1).clamp_min(1.0) if average else s
