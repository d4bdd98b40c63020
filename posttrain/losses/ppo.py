"""PPO's actor objectives beyond the clip, and the critic's diagnostics: the KL-penalty surrogate, explained variance.

Key insight: the PPO paper (Schulman et al. 2017) offers two ways to keep the new policy near pi_old. Sec. 3
clips the ratio (:func:`posttrain.losses.policy.policy_loss`); sec. 4 keeps the *unclipped* surrogate and
subtracts a KL penalty whose coefficient adapts toward a target (``PPOKLController`` in :mod:`kl`):

    L_KLPEN = -( r_t A_t - beta * KL_t(pi_old || pi_theta) ),   r_t = pi_theta / pi_old

KL(pi_old || pi) is estimated per sampled token (tokens drawn from pi_old) with k3 in the ratio,
``(r - 1) - log r`` >= 0: unbiased, 0 with zero gradient at r = 1, so the first update of a rollout is
exactly the policy gradient. With beta = 0 and one update per batch this is A2C's loss (Mnih et al. 2016).

Critic diagnostics (:func:`value_metrics`): explained variance ``1 - Var(R - V) / Var(R)`` over real
tokens (1: perfect, 0: no better than a constant, < 0: worse), the value range, return statistics.

Pure tensor functions: no models, no configs. Not handled: the value loss itself (``policy.value_loss``).
"""

from __future__ import annotations

import torch

from posttrain.losses.logprobs import masked_mean, masked_var
from posttrain.losses.policy import _MAX_LOG_RATIO, aggregate, policy_loss


def kl_old_k3(logps: torch.Tensor, old_logps: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi_old || pi) from tokens sampled by pi_old: (r - 1) - log r, r = pi / pi_old.

    Example: logps = old_logps -> 0 (and zero gradient); log r = 1 -> e - 2 = 0.718.
    """
    log_r = (logps - old_logps.detach()).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return torch.expm1(log_r) - log_r


def kl_penalty_policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    beta: float,
    agg: str = "token_mean",
    num_seqs: float | None = None,
    num_tokens: float | None = None,
    max_len: int | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    is_weights: torch.Tensor | None = None,
):
    """PPO sec. 4: unclipped ``-r A + beta * KL(pi_old || pi)`` per token, aggregated like :func:`policy_loss`.

    Returns ``(loss, metrics)``: policy_loss's metrics (clip fractions 0: nothing is clipped) plus
    ``kl_old`` (the per-token mean of the k3 estimate) and ``kl_old_loss`` (beta times it, aggregated).
    Example: on-policy (r = 1) the loss is -mean(A) and its gradient is REINFORCE's -A grad log pi.
    """
    norms = dict(num_seqs=num_seqs, num_tokens=num_tokens, max_len=max_len)
    loss, metrics = policy_loss(
        logps,
        old_logps,
        advantages,
        mask,
        clip_eps_low=None,
        agg=agg,
        entropy=entropy,
        entropy_coef=entropy_coef,
        is_weights=is_weights,
        **norms,
    )
    kl_tok = kl_old_k3(logps, old_logps)  # (B, T)
    m = mask.to(logps.dtype)
    kl_loss = aggregate(beta * kl_tok, m, agg, **norms)
    loss = loss + kl_loss
    with torch.no_grad():
        metrics.update(loss=loss.item(), kl_old=masked_mean(kl_tok, m).item(), kl_old_loss=kl_loss.item())
    return loss, metrics


@torch.no_grad()
def value_metrics(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Explained variance 1 - Var(R - V)/Var(R), value range and return/value statistics over the real tokens.

    values, returns, mask: (B, T). Var(R) = 0 (e.g. every return equal) gives explained variance NaN, as the
    definition does (no variance to explain). Example: V = R -> 1; V = mean(R) everywhere -> 0.
    """
    m = mask.to(values.dtype)
    real = m > 0
    if not real.any():
        return {"explained_variance": float("nan")}
    var_r = masked_var(returns, m, unbiased=False)
    var_err = masked_var(returns - values, m, unbiased=False)
    ev = (1.0 - var_err / var_r).item() if var_r > 0 else float("nan")
    return {
        "explained_variance": ev,
        "value_mean": masked_mean(values, m).item(),
        "value_min": values[real].min().item(),
        "value_max": values[real].max().item(),
        "returns_mean": masked_mean(returns, m).item(),
        "returns_std": masked_var(returns, m).sqrt().item(),
    }


def advantage_metrics(advantages: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Per-token mean / std / |max| of the advantages over the real tokens (after whitening: 0 / 1 / ...)."""
    m = mask.to(advantages.dtype)
    real = m > 0
    return {
        "advantage_mean": masked_mean(advantages, m).item(),
        "advantage_std": masked_var(advantages, m).sqrt().item(),
        "advantage_abs_max": advantages[real].abs().max().item() if real.any() else 0.0,
    }
