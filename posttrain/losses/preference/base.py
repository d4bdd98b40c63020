"""Shared pieces of the preference losses: shape checks, the implicit-reward metrics, the log-ratios.

Not a loss itself; every family module builds on these.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def check_same_shape(**tensors: Tensor | None) -> None:
    """All given tensors are 1-D with the same length (None entries are skipped)."""
    named = {k: v for k, v in tensors.items() if v is not None}
    shapes = {k: tuple(v.shape) for k, v in named.items()}
    first = next(iter(shapes.values()))
    if len(first) != 1 or any(s != first for s in shapes.values()):
        raise ValueError(f"expected 1-D tensors of equal length (per-sequence values), got shapes {shapes}")


def _check_beta(beta: float) -> None:
    if not beta > 0:
        raise ValueError(f"beta={beta} must be > 0")


def _pair_metrics(
    chosen_rewards: Tensor, rejected_rewards: Tensor, chosen_logps: Tensor, rejected_logps: Tensor
) -> dict[str, Tensor]:
    """The metrics every paired loss reports (means over the batch, detached)."""
    cr, rr = chosen_rewards.detach(), rejected_rewards.detach()
    return {
        "rewards/chosen": cr.mean(),
        "rewards/rejected": rr.mean(),
        "rewards/margins": (cr - rr).mean(),
        "rewards/accuracies": (cr > rr).float().mean(),
        "logps/chosen": chosen_logps.detach().mean(),
        "logps/rejected": rejected_logps.detach().mean(),
    }


def _logratios(
    policy_chosen_logps: Tensor, policy_rejected_logps: Tensor, ref_chosen_logps: Tensor, ref_rejected_logps: Tensor
) -> tuple[Tensor, Tensor]:
    check_same_shape(
        policy_chosen_logps=policy_chosen_logps,
        policy_rejected_logps=policy_rejected_logps,
        ref_chosen_logps=ref_chosen_logps,
        ref_rejected_logps=ref_rejected_logps,
    )
    return policy_chosen_logps - ref_chosen_logps, policy_rejected_logps - ref_rejected_logps  # (B,), (B,)


def _smoothed_logistic(logits: Tensor, label_smoothing: float) -> Tensor:
    """-(1 - eps) log sigma(z) - eps log sigma(-z): BCE against the soft label 1 - eps. (B,) -> (B,)."""
    losses = -F.logsigmoid(logits)
    if label_smoothing:
        losses = (1 - label_smoothing) * losses - label_smoothing * F.logsigmoid(-logits)
    return losses
