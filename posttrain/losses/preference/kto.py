"""KTO (Ethayarajh et al. 2024): the unpaired loss over labelled single completions, with the detached batch
KL estimate as its reference point.
"""

from __future__ import annotations

import torch

from posttrain.losses.preference.base import Tensor, _check_beta, check_same_shape


def kto_loss(
    *,
    policy_logps: Tensor,
    ref_logps: Tensor,
    labels: Tensor,
    policy_kl_logps: Tensor | None = None,
    ref_kl_logps: Tensor | None = None,
    kl: Tensor | float | None = None,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """KTO: L = mean_i w_i (1 - v_i), v = sigma(beta (r - z0)) if desirable else sigma(beta (z0 - r))  (Ethayarajh et al. 2024, eq. 7).

    Unpaired data: each completion is labelled desirable (``labels`` True) or undesirable, with
    r = log pi(y|x) - log pi_ref(y|x). The reference point z0 is a batch estimate of
    KL(pi || pi_ref): mean(policy_kl_logps - ref_kl_logps) over *mismatched* (x, y') pairs, clamped at 0
    and detached (no gradient flows through it). Pass the mismatched log-probs, or ``kl`` directly.
    w = desirable_weight (lambda_D) or undesirable_weight (lambda_U); the paper advises
    lambda_D n_D / (lambda_U n_U) in [1, 4/3]. Rewards logged: beta * r per group (omitted when a group is
    empty in the batch). Extra metric ``kl``.
    Example: beta=1, z0=0, one desirable r=0 -> 1 - sigma(0) = 0.5.
    """
    _check_beta(beta)
    check_same_shape(policy_logps=policy_logps, ref_logps=ref_logps, labels=labels)
    if kl is None:
        if policy_kl_logps is None or ref_kl_logps is None:
            raise ValueError("kto_loss needs policy_kl_logps and ref_kl_logps (mismatched pairs), or kl")
        check_same_shape(policy_kl_logps=policy_kl_logps, ref_kl_logps=ref_kl_logps)
        z0 = (policy_kl_logps - ref_kl_logps).mean().detach().clamp_min(0)
    else:
        z0 = torch.as_tensor(kl, dtype=policy_logps.dtype, device=policy_logps.device).detach()
    desirable = labels.bool()  # (B,)
    r = policy_logps - ref_logps  # (B,)
    losses = torch.where(
        desirable,
        desirable_weight * (1 - torch.sigmoid(beta * (r - z0))),
        undesirable_weight * (1 - torch.sigmoid(beta * (z0 - r))),
    )  # (B,)
    rewards = beta * r.detach()
    metrics: dict[str, Tensor] = {"kl": z0.detach()}
    if desirable.any():
        metrics["rewards/chosen"] = rewards[desirable].mean()
        metrics["logps/chosen"] = policy_logps.detach()[desirable].mean()
    if (~desirable).any():
        metrics["rewards/rejected"] = rewards[~desirable].mean()
        metrics["logps/rejected"] = policy_logps.detach()[~desirable].mean()
    if desirable.any() and (~desirable).any():
        metrics["rewards/margins"] = metrics["rewards/chosen"] - metrics["rewards/rejected"]
    return losses.mean(), metrics
