"""Truncated importance sampling: correct for a rollout engine whose probabilities differ from the trainer's.

Key insight: a fast inference engine (vLLM, another kernel, bf16) samples from pi_sampler, which is close to
but not the trainer's pi_old; the policy gradient is an expectation under pi_old, so each token's (or
sequence's) loss is reweighted by pi_old / pi_sampler. The weight is truncated at C so that a token the
sampler under-rates cannot blow the variance up (Yao et al. 2025, "Your efficient RL framework secretly
brings you off-policy RL training"; TRL's ``vllm_importance_sampling_correction``):

    token level:     w_t = min(exp(logp_old_t - logp_sampler_t), C)
    sequence level:  w   = min(exp(sum_t (logp_old_t - logp_sampler_t)), C)     (broadcast over the tokens)

The weights carry no gradient (they correct the sampling distribution, not the objective) and multiply the
per-token policy loss. With a matched engine (logp_old == logp_sampler) every weight is exactly 1 and the
loss is unchanged. Metrics: ``sampling_logp_difference`` (mean |logp_old - logp_sampler| over real tokens),
``is_weight_mean/min/max`` and ``is_clipped_frac`` (the fraction truncated at C).

Not handled: masking (rather than truncating) tokens with extreme ratios (MIS), per-token caps that vary.
"""

from __future__ import annotations

import torch

from posttrain.losses.logprobs import masked_mean


def truncated_is_weights(
    old_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor, cap: float = 2.0, level: str = "token"
) -> tuple[torch.Tensor, dict[str, float]]:
    """Weights (N, T) (detached, 0 where ``mask`` is 0) and their statistics.

    Example: old - sampler log-probs [[0, log 3]] with cap 2 -> token weights [[1, 2]], is_clipped_frac 0.5;
    at sequence level exp(log 3) = 3 -> 2 for both tokens.
    """
    if level not in ("token", "sequence"):
        raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")
    if not cap >= 1:
        raise ValueError(f"cap must be >= 1 (a cap below 1 would down-weight even matched tokens), got {cap}")
    m = mask.to(old_logps.dtype)
    diff = ((old_logps - sampler_logps) * m).detach()  # (N, T) log pi_old / pi_sampler, 0 where masked
    log_w = diff if level == "token" else diff.sum(-1, keepdim=True).expand_as(diff)
    raw = torch.exp(log_w.clamp(max=80.0))  # exp of a huge log-ratio would be inf; it is capped anyway
    w = raw.clamp(max=cap) * m
    real = m.bool()
    n = int(real.sum())
    stats = {
        "sampling_logp_difference": masked_mean(diff.abs(), m).item() if n else 0.0,
        "is_weight_mean": masked_mean(w, m).item() if n else 1.0,
        "is_weight_min": w[real].min().item() if n else 1.0,
        "is_weight_max": w[real].max().item() if n else 1.0,
        "is_clipped_frac": (raw[real] > cap).float().mean().item() if n else 0.0,
    }
    return w, stats
